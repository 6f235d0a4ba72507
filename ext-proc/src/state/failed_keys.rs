//! Conversations a replica failed: sampling key → the replicas of one fleet
//! that answered it with an error or a stream that ended early. The next turn
//! of that conversation skips them (the next replica in its order takes it),
//! instead of waiting for the fleet to eject a replica that may fail only
//! some requests.
//!
//! Readers (the decision path) see one lock-free map; only the writer task
//! changes it, and keeps it bounded in entries and in age.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nohash_hasher::BuildNoHashHasher;

use crate::topology::{FleetId, ReplicaId};

/// Most conversations remembered.
pub const CAPACITY: usize = 65_536;
/// How long a failure steers its conversation away.
pub const TTL: Duration = Duration::from_secs(300);

/// Sampling keys are uniform xxh3 values: hashing them again is waste.
type Map = papaya::HashMap<u64, Avoid, BuildNoHashHasher<u64>>;

/// The replicas of one fleet a key should not return to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Avoid {
    /// The topology generation the indices belong to.
    pub generation: u64,
    pub fleet: FleetId,
    /// One bit per replica index (fleets hold at most 64).
    pub mask: u64,
    at: Instant,
}

/// The readers' half.
#[derive(Debug, Default)]
pub struct FailedKeys {
    map: Map,
}

impl FailedKeys {
    /// The replicas of `fleet` that `key` should skip (a bitmask, 0 = none).
    #[inline]
    pub fn avoid(&self, key: u64, generation: u64) -> Option<Avoid> {
        self.map
            .pin()
            .get(&key)
            .copied()
            .filter(|a| a.generation == generation)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// The writer's half: insertion order, for the bounds.
#[derive(Debug, Default)]
pub struct FailedKeysWriter {
    keys: Arc<FailedKeys>,
    order: VecDeque<(Instant, u64)>,
}

impl FailedKeysWriter {
    pub fn keys(&self) -> Arc<FailedKeys> {
        self.keys.clone()
    }

    /// `replica` of `fleet` failed the conversation `key`.
    pub fn record(
        &mut self,
        now: Instant,
        key: u64,
        generation: u64,
        fleet: FleetId,
        replica: ReplicaId,
    ) {
        let replica = replica.index();
        if replica >= 64 {
            return;
        }
        {
            let map = self.keys.map.pin();
            let mask = match map.get(&key) {
                Some(a) if a.generation == generation && a.fleet == fleet => a.mask,
                _ => 0,
            } | (1 << replica);
            map.insert(
                key,
                Avoid {
                    generation,
                    fleet,
                    mask,
                    at: now,
                },
            );
        }
        self.order.push_back((now, key));
        while self.order.len() > CAPACITY {
            self.pop();
        }
    }

    /// Forgets failures older than [`TTL`].
    pub fn expire(&mut self, now: Instant) {
        while self
            .order
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) > TTL)
        {
            self.pop();
        }
    }

    fn pop(&mut self) {
        let Some((at, key)) = self.order.pop_front() else {
            return;
        };
        // A later failure of the same key re-queued it: only the newest
        // queue entry removes it.
        let map = self.keys.map.pin();
        if map.get(&key).is_some_and(|a| a.at == at) {
            map.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_accumulate_per_fleet_and_expire() {
        let now = Instant::now();
        let mut w = FailedKeysWriter::default();
        let keys = w.keys();
        w.record(now, 7, 1, FleetId(0), ReplicaId(1));
        w.record(now, 7, 1, FleetId(0), ReplicaId(3));
        assert_eq!(
            keys.avoid(7, 1).map(|a| (a.fleet, a.mask)),
            Some((FleetId(0), 0b1010))
        );
        // Another generation's indices mean nothing.
        assert_eq!(keys.avoid(7, 2), None);
        // A failure in another fleet replaces the entry.
        w.record(now, 7, 1, FleetId(2), ReplicaId(0));
        assert_eq!(
            keys.avoid(7, 1).map(|a| (a.fleet, a.mask)),
            Some((FleetId(2), 1))
        );
        let later = now + TTL / 2;
        w.record(later, 8, 1, FleetId(0), ReplicaId(0));
        // Failed again later: its first failure's expiry does not remove it.
        w.record(now, 9, 1, FleetId(0), ReplicaId(0));
        w.record(later, 9, 1, FleetId(0), ReplicaId(1));
        w.expire(now + TTL + Duration::from_secs(1));
        assert_eq!(keys.avoid(7, 1), None);
        assert!(keys.avoid(8, 1).is_some());
        assert_eq!(keys.avoid(9, 1).map(|a| a.mask), Some(0b11));
        w.expire(later + TTL + Duration::from_secs(1));
        assert!(keys.is_empty());
    }

    #[test]
    fn the_map_is_bounded() {
        let now = Instant::now();
        let mut w = FailedKeysWriter::default();
        let keys = w.keys();
        for k in 0..CAPACITY as u64 + 100 {
            w.record(now, k, 1, FleetId(0), ReplicaId(0));
        }
        assert!(keys.len() <= CAPACITY, "{}", keys.len());
        assert_eq!(keys.avoid(0, 1), None, "the oldest went first");
        assert!(keys.avoid(CAPACITY as u64 + 99, 1).is_some());
    }
}
