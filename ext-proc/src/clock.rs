//! The router's two sources of nondeterminism, each in one place: the
//! monotonic clock and random numbers. Everything else takes a `now` or a
//! seed from its caller (clippy's `disallowed-methods` keeps it so), which is
//! what lets the trace replay drive the real code on simulated time.

use std::time::Instant;

/// The monotonic clock.
#[allow(clippy::disallowed_methods)] // the one place it is read
pub fn now() -> Instant {
    Instant::now()
}

/// A random 64-bit number (decision seeds, nonces, instance ids).
#[allow(clippy::disallowed_methods)] // the one place it is drawn
pub fn random_u64() -> u64 {
    fastrand::u64(..)
}
