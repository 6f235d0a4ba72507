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

use crate::topology::{FleetId, ReplicaId, Topology};

/// Most conversations remembered.
pub const CAPACITY: usize = 65_536;
/// How long a failure steers its conversation away.
pub const TTL: Duration = Duration::from_secs(300);

/// Sampling keys are uniform xxh3 values: hashing them again is waste.
type Map = papaya::HashMap<u64, Avoid, BuildNoHashHasher<u64>>;

/// The replicas of one fleet a key should not return to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Avoid {
    /// The topology generation the slots belong to: a bit counts only while
    /// its slot holds a member that was there then (`Replica::since`).
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
    /// The replicas of `fleet` that `key` should skip (a bitmask, 0 = none),
    /// unless fleet ids changed meaning since (`Topology::layout`).
    #[inline]
    pub fn avoid(&self, key: u64, layout: u64) -> Option<Avoid> {
        self.map
            .pin()
            .get(&key)
            .copied()
            .filter(|a| a.generation >= layout)
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

    /// `replica` of `fleet` (in `topo`, the topology in effect) failed the
    /// conversation `key`.
    pub fn record(
        &mut self,
        now: Instant,
        key: u64,
        topo: &Topology,
        fleet: FleetId,
        replica: ReplicaId,
    ) {
        let generation = topo.generation;
        let replica = replica.index();
        if replica >= 64 {
            return;
        }
        {
            let map = self.keys.map.pin();
            let mask = match map.get(&key) {
                // Earlier failures of members still in their slots.
                Some(a) if a.generation >= topo.layout && a.fleet == fleet => {
                    still_there(topo, fleet, a.generation, a.mask)
                }
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

/// The bits of `mask` whose slots hold the member they held in `generation`.
pub fn still_there(topo: &Topology, fleet: FleetId, generation: u64, mask: u64) -> u64 {
    let mut out = 0;
    let mut rest = mask;
    while rest != 0 {
        let bit = rest.trailing_zeros() as usize;
        if topo.resolves(generation, fleet, ReplicaId(bit)).is_some() {
            out |= 1 << bit;
        }
        rest &= rest - 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three fleets of four replicas, generation 1.
    fn topo() -> Topology {
        let fleet = |n: u8| {
            format!(
                "  - {{ name: f{n}, region: r, endpoints: ['10.0.{n}.1:1', '10.0.{n}.2:1', '10.0.{n}.3:1', '10.0.{n}.4:1'] }}\n"
            )
        };
        let yaml = format!(
            "fleets:\n{}{}{}stages: [{{ name: s, fleets: [f0, f1, f2] }}]\n",
            fleet(0),
            fleet(1),
            fleet(2)
        );
        Topology::from_config(&crate::config::RouterConfig::parse_valid(&yaml).unwrap(), 1)
    }

    #[test]
    fn failures_accumulate_per_fleet_and_expire() {
        let t = topo();
        let now = Instant::now();
        let mut w = FailedKeysWriter::default();
        let keys = w.keys();
        w.record(now, 7, &t, FleetId(0), ReplicaId(1));
        w.record(now, 7, &t, FleetId(0), ReplicaId(3));
        assert_eq!(
            keys.avoid(7, 1).map(|a| (a.fleet, a.mask)),
            Some((FleetId(0), 0b1010))
        );
        // Fleet ids that changed meaning (a reload reordered fleets) mean nothing.
        assert_eq!(keys.avoid(7, 2), None);
        // A failure in another fleet replaces the entry.
        w.record(now, 7, &t, FleetId(2), ReplicaId(0));
        assert_eq!(
            keys.avoid(7, 1).map(|a| (a.fleet, a.mask)),
            Some((FleetId(2), 1))
        );
        let later = now + TTL / 2;
        w.record(later, 8, &t, FleetId(0), ReplicaId(0));
        // Failed again later: its first failure's expiry does not remove it.
        w.record(now, 9, &t, FleetId(0), ReplicaId(0));
        w.record(later, 9, &t, FleetId(0), ReplicaId(1));
        w.expire(now + TTL + Duration::from_secs(1));
        assert_eq!(keys.avoid(7, 1), None);
        assert!(keys.avoid(8, 1).is_some());
        assert_eq!(keys.avoid(9, 1).map(|a| a.mask), Some(0b11));
        w.expire(later + TTL + Duration::from_secs(1));
        assert!(keys.is_empty());
    }

    #[test]
    fn a_slot_taken_by_a_new_member_loses_its_old_failures() {
        let t1 = topo();
        let now = Instant::now();
        let mut w = FailedKeysWriter::default();
        let keys = w.keys();
        w.record(now, 7, &t1, FleetId(0), ReplicaId(1));
        w.record(now, 7, &t1, FleetId(0), ReplicaId(2));
        // Generation 2: slot 2 holds a new member; slot 1's stays.
        let mut reps = t1.fleets[0].replicas.clone();
        reps.remove(ReplicaId(2));
        reps.insert(
            ReplicaId(2),
            crate::topology::Replica::joining("f0", "10.0.0.9:1".into(), "10.0.0.9:1".into(), 2),
        );
        let t2 = t1.with_replicas(2, [(FleetId(0), reps)]);
        assert_eq!(still_there(&t2, FleetId(0), 1, 0b110), 0b010);
        w.record(now, 7, &t2, FleetId(0), ReplicaId(3));
        let a = keys.avoid(7, t2.layout).unwrap();
        assert_eq!((a.generation, a.mask), (2, 0b1010));
    }

    #[test]
    fn the_map_is_bounded() {
        let t = topo();
        let now = Instant::now();
        let mut w = FailedKeysWriter::default();
        let keys = w.keys();
        for k in 0..CAPACITY as u64 + 100 {
            w.record(now, k, &t, FleetId(0), ReplicaId(0));
        }
        assert!(keys.len() <= CAPACITY, "{}", keys.len());
        assert_eq!(keys.avoid(0, 1), None, "the oldest went first");
        assert!(keys.avoid(CAPACITY as u64 + 99, 1).is_some());
    }
}
