//! Lock-free counters that reset with a time epoch, and the per-minute window.
//!
//! A counter packs (epoch, count) in one `AtomicU64` (24 + 40 bits), so a
//! reset at a new epoch and an add are one compare-and-swap: no lock, no
//! lost update at the boundary.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

const COUNT_BITS: u32 = 40;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
const EPOCH_MASK: u64 = (1 << 24) - 1;

/// Width of one per-minute bucket.
pub const BUCKET_MS: u64 = 10_000;
/// Buckets counted: the current one and six before it, so the window always
/// covers at least the last 60 s (60–70 s). A tenant never gets more than its
/// limit in any 60 s; it may be refused up to 10 s early.
const BUCKETS: u64 = 7;

#[derive(Debug, Default)]
pub struct Epoched(AtomicU64);

fn pack(epoch: u64, count: u64) -> u64 {
    ((epoch & EPOCH_MASK) << COUNT_BITS) | count.min(COUNT_MASK)
}

impl Epoched {
    /// The count at `epoch` (0 when the counter is at another epoch).
    pub fn get(&self, epoch: u64) -> u64 {
        let v = self.0.load(Relaxed);
        if v >> COUNT_BITS == epoch & EPOCH_MASK {
            v & COUNT_MASK
        } else {
            0
        }
    }

    /// Adds `n` at `epoch` (resetting an older epoch first); the new count.
    pub fn add(&self, epoch: u64, n: u64) -> u64 {
        let mut cur = self.0.load(Relaxed);
        loop {
            let base = if cur >> COUNT_BITS == epoch & EPOCH_MASK {
                cur & COUNT_MASK
            } else {
                0
            };
            let next = base.saturating_add(n).min(COUNT_MASK);
            match self
                .0
                .compare_exchange_weak(cur, pack(epoch, next), Relaxed, Relaxed)
            {
                Ok(_) => return next,
                Err(v) => cur = v,
            }
        }
    }

    /// Subtracts `n` if the counter is still at `epoch` (an older epoch's
    /// count is already gone).
    pub fn sub(&self, epoch: u64, n: u64) {
        let _ = self.0.fetch_update(Relaxed, Relaxed, |cur| {
            (cur >> COUNT_BITS == epoch & EPOCH_MASK)
                .then(|| pack(epoch, (cur & COUNT_MASK).saturating_sub(n)))
        });
    }

    /// Takes `n` at `epoch` if at least `n` is there.
    pub fn take(&self, epoch: u64, n: u64) -> bool {
        self.0
            .fetch_update(Relaxed, Relaxed, |cur| {
                let have = if cur >> COUNT_BITS == epoch & EPOCH_MASK {
                    cur & COUNT_MASK
                } else {
                    0
                };
                (have >= n).then(|| pack(epoch, have - n))
            })
            .is_ok()
    }
}

/// Tokens used in the last 60–70 s, in 10 s buckets.
#[derive(Debug, Default)]
pub struct MinuteWindow {
    buckets: [Epoched; BUCKETS as usize],
}

impl MinuteWindow {
    pub fn epoch(now_ms: u64) -> u64 {
        now_ms / BUCKET_MS
    }

    pub fn used(&self, now_ms: u64) -> u64 {
        let e = Self::epoch(now_ms);
        (0..BUCKETS.min(e + 1))
            .map(|k| self.buckets[((e - k) % BUCKETS) as usize].get(e - k))
            .sum()
    }

    /// Adds `n` to the current bucket; its epoch (to subtract later).
    pub fn add(&self, now_ms: u64, n: u64) -> u64 {
        let e = Self::epoch(now_ms);
        self.buckets[(e % BUCKETS) as usize].add(e, n);
        e
    }

    pub fn sub(&self, epoch: u64, n: u64) {
        self.buckets[(epoch % BUCKETS) as usize].sub(epoch, n);
    }

    /// How long until `need` more tokens fit under `limit`: when enough of
    /// the oldest buckets have left the window. `None` when they never will.
    pub fn retry_after_ms(&self, now_ms: u64, need: u64, limit: u64) -> Option<u64> {
        if need > limit {
            return None;
        }
        let e = Self::epoch(now_ms);
        let mut used = self.used(now_ms);
        for j in 0..BUCKETS {
            if used + need <= limit {
                return Some(if j == 0 {
                    0
                } else {
                    (e + j) * BUCKET_MS - now_ms
                });
            }
            let oldest = e + j + 1 - BUCKETS;
            if e + j + 1 >= BUCKETS {
                used -= self.buckets[(oldest % BUCKETS) as usize]
                    .get(oldest)
                    .min(used);
            }
        }
        Some((e + BUCKETS) * BUCKET_MS - now_ms)
    }
}

impl Epoched {
    /// Adds `n` only if the counter is still at `epoch`.
    pub fn add_same(&self, epoch: u64, n: u64) {
        let _ = self.0.fetch_update(Relaxed, Relaxed, |cur| {
            (cur >> COUNT_BITS == epoch & EPOCH_MASK)
                .then(|| pack(epoch, (cur & COUNT_MASK).saturating_add(n)))
        });
    }
}
