//! Each tenant's recent tokens in one stage, so capacity under overload is
//! shared by tokens: a tenant that sent little recently goes before one that
//! floods (`queue` orders and evicts by it).
//!
//! A count-min sketch of decaying counters: two rows of [`WIDTH`] atomic
//! slots, a tenant's account the lesser of its two slots. Bounded (16 KiB
//! per stage, whatever the number of tenants) and lock-free: a charge is a
//! compare-and-swap per row. Two tenants share an account only when they
//! collide in both rows; a collision can only overstate an account, never
//! hide a flood.
//!
//! Decay: every counter halves each [`EPOCH`] (a step, applied lazily when
//! the slot is next read or charged), so "recent" is the last ~10 s. Each
//! slot packs its epoch (20 bits) with its count (44 bits).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Slots per row.
pub const WIDTH: usize = 1024;
const ROWS: usize = 2;
/// A counter halves this often.
pub const EPOCH: Duration = Duration::from_secs(2);
const EPOCH_BITS: u32 = 20;
const COUNT_BITS: u32 = 64 - EPOCH_BITS;
const COUNT_MAX: u64 = (1 << COUNT_BITS) - 1;
const EPOCH_MASK: u64 = (1 << EPOCH_BITS) - 1;

pub struct Shares {
    start: Instant,
    rows: Box<[[AtomicU64; WIDTH]; ROWS]>,
}

impl std::fmt::Debug for Shares {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shares").finish_non_exhaustive()
    }
}

fn epoch_of(start: Instant, now: Instant) -> u64 {
    (now.saturating_duration_since(start).as_millis() / EPOCH.as_millis()) as u64 & EPOCH_MASK
}

/// `packed` as of epoch `now`: halved once per epoch since it was written.
fn decayed(packed: u64, now: u64) -> u64 {
    let count = packed & COUNT_MAX;
    let then = packed >> COUNT_BITS;
    let age = now.wrapping_sub(then) & EPOCH_MASK;
    if age >= u64::from(COUNT_BITS) {
        0
    } else {
        count >> age
    }
}

impl Shares {
    /// `start` is the clock's origin (the replay passes its simulated one).
    pub fn new(start: Instant) -> Shares {
        Shares {
            start,
            rows: Box::new(std::array::from_fn(|_| {
                std::array::from_fn(|_| AtomicU64::new(0))
            })),
        }
    }

    fn slot(&self, row: usize, tenant: u64) -> &AtomicU64 {
        let h = xxh3_64_with_seed(&tenant.to_le_bytes(), row as u64);
        &self.rows[row][(h % WIDTH as u64) as usize]
    }

    /// Adds `tokens` to `tenant`'s account.
    pub fn charge(&self, tenant: u64, tokens: u64, now: Instant) {
        let epoch = epoch_of(self.start, now);
        for row in 0..ROWS {
            let slot = self.slot(row, tenant);
            // Never fails: the closure always returns a value.
            let _ = slot.fetch_update(Relaxed, Relaxed, |packed| {
                let count = decayed(packed, epoch).saturating_add(tokens).min(COUNT_MAX);
                Some(epoch << COUNT_BITS | count)
            });
        }
    }

    /// `tenant`'s recent tokens (at least the true figure; see the module
    /// doc for when it is more).
    pub fn account(&self, tenant: u64, now: Instant) -> u64 {
        let epoch = epoch_of(self.start, now);
        (0..ROWS)
            .map(|row| decayed(self.slot(row, tenant).load(Relaxed), epoch))
            .min()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounts_add_up_and_halve_each_epoch() {
        let t0 = Instant::now();
        let s = Shares::new(t0);
        s.charge(1, 1000, t0);
        s.charge(1, 24, t0 + Duration::from_millis(10));
        s.charge(2, 10, t0);
        assert_eq!(s.account(1, t0), 1024);
        assert_eq!(s.account(2, t0), 10);
        assert_eq!(s.account(3, t0), 0, "never charged");
        assert_eq!(s.account(1, t0 + EPOCH), 512);
        assert_eq!(s.account(1, t0 + 3 * EPOCH), 128);
        // A charge after decay adds to the decayed count.
        s.charge(1, 100, t0 + 3 * EPOCH);
        assert_eq!(s.account(1, t0 + 3 * EPOCH), 228);
        // Long idle: nothing left.
        assert_eq!(s.account(1, t0 + 60 * EPOCH), 0);
    }

    #[test]
    fn many_tenants_stay_bounded_and_a_flood_stays_visible() {
        let t0 = Instant::now();
        let s = Shares::new(t0);
        // 20,000 tenants in 2 × 1024 slots: collisions only ever overstate.
        for t in 0..20_000u64 {
            s.charge(t, 1, t0);
        }
        s.charge(99_999, 1_000_000, t0);
        assert!(s.account(99_999, t0) >= 1_000_000);
        let light = (0..20_000u64)
            .filter(|&t| s.account(t, t0) < 1_000_000)
            .count();
        assert!(
            light > 19_000,
            "{light} light tenants read as light; a collision in both rows is rare"
        );
        assert!((0..20_000u64).all(|t| s.account(t, t0) >= 1));
    }

    #[test]
    fn counts_saturate_instead_of_wrapping() {
        let t0 = Instant::now();
        let s = Shares::new(t0);
        s.charge(5, u64::MAX, t0);
        s.charge(5, u64::MAX, t0);
        assert_eq!(s.account(5, t0), COUNT_MAX);
    }

    #[test]
    fn concurrent_charges_are_not_lost() {
        let t0 = Instant::now();
        let s = std::sync::Arc::new(Shares::new(t0));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        s.charge(7, 1, t0);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(s.account(7, t0), 40_000);
    }
}
