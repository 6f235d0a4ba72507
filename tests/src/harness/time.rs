//! Time in scenarios. A scenario waits for a condition (`wait_until`,
//! `wait_for_value`: poll with a deadline), never for a fixed time: a loaded
//! machine makes fixed times too short. `pace` is the one exception, for time
//! that is the scenario itself: a client that trickles bytes, a load loop's
//! rate, a sampling interval. This file is the only place in the harness and
//! the scenarios that may sleep (`tests/tests/no_fixed_sleeps.rs` checks).

use std::time::{Duration, Instant};

/// How often a condition is polled.
const POLL: Duration = Duration::from_millis(20);

/// Polls `ok` until it holds; panics naming `what` after `timeout`.
pub fn wait_until(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(POLL);
    }
}

/// Polls `f` until it gives a value; `None` after `timeout`.
pub fn wait_for_value<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if start.elapsed() > timeout {
            return None;
        }
        std::thread::sleep(POLL);
    }
}

/// Spends `d` as part of the scenario (pacing, not synchronisation).
pub fn pace(d: Duration) {
    std::thread::sleep(d);
}
