//! A tenant's local share of its per-minute limit when several instances
//! share it through Redis (`shared.rs` claims and refills it): what the
//! ledger spends on the hot path, atomics only, no Redis.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use tokio::sync::Notify;

use super::clock::Clock;
use super::window::Epoched;

/// Counters and the degraded flag, read by the ledger on the hot path.
#[derive(Debug)]
pub struct SharedState {
    pub instances: u64,
    pub(super) degraded: AtomicBool,
    /// Decisions taken on the fallback share (Redis unreachable).
    pub fallback_decisions: AtomicU64,
    /// Successful slice claims.
    pub refills: AtomicU64,
    /// Failed round trips.
    pub redis_errors: AtomicU64,
    /// Tokens reported to Redis after an outage.
    pub caught_up_tokens: AtomicU64,
    /// Tokens Redis had lost of this instance's claims and learned back.
    pub restored_tokens: AtomicU64,
}

impl SharedState {
    pub fn degraded(&self) -> bool {
        self.degraded.load(Relaxed)
    }
}

/// One tenant's local share of its per-minute limit (epoch = minute).
#[derive(Debug, Default)]
pub struct Allowance {
    pub(super) avail: Epoched,
    /// minute + 1 when this minute's fallback share was granted.
    pub(super) fallback_minute: AtomicU64,
    /// Spend on the fallback share this minute, not yet in Redis.
    pub(super) unsynced: Epoched,
    /// What Redis holds for this instance this minute: its grants, and its
    /// fallback spend once caught up.
    pub(super) claimed: Epoched,
    /// One refill at a time per tenant: a decision that runs out while a
    /// background refill is in flight waits for it instead of claiming a
    /// second slice (which would leave one slice stranded locally while the
    /// decision is refused).
    pub(super) refilling: AtomicBool,
    pub(super) refilled: Notify,
}

impl Allowance {
    /// Takes `n` tokens for this minute; the minute, or how long to wait.
    pub(crate) fn take(
        &self,
        s: &SharedState,
        clock: &Clock,
        limit: u64,
        n: u64,
    ) -> Result<u64, Duration> {
        let m = clock.minute();
        let degraded = s.degraded();
        if degraded {
            s.fallback_decisions.fetch_add(1, Relaxed);
            if self.fallback_minute.swap(m + 1, Relaxed) != m + 1 {
                // The share less what Redis already granted this instance
                // this minute (whose unspent part it still holds).
                let share = limit / s.instances.max(1);
                self.avail.add(m, share.saturating_sub(self.claimed.get(m)));
            }
        }
        if self.avail.take(m, n) {
            if degraded {
                self.unsynced.add(m, n);
            }
            return Ok(m);
        }
        Err(Duration::from_millis(60_000 - clock.now_ms() % 60_000))
    }

    /// Returns an unused estimate taken at `minute`.
    pub(crate) fn give_back(&self, minute: u64, n: u64) {
        self.avail.add_same(minute, n);
        self.unsynced.sub(minute, n);
    }

    /// Real usage beyond the estimate, charged now.
    pub(crate) fn spend(&self, s: Option<&SharedState>, clock: &Clock, n: u64) {
        let m = clock.minute();
        self.avail.sub(m, n);
        if s.is_some_and(SharedState::degraded) {
            self.unsynced.add(m, n);
        }
    }

    pub fn available(&self, clock: &Clock) -> u64 {
        self.avail.get(clock.minute())
    }
}
