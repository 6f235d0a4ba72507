//! Decisions while a fleet's membership changes: keys move only as
//! rendezvous hashing says, a joiner takes new keys at once without being
//! flooded, a leaver takes nothing, an emptied fleet fails over.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use fleetroute_filter::contract::KeySource;
use futures::executor::block_on;

use super::key::RouteKey;
use super::{Reject, decide};
use crate::config::RouterConfig;
use crate::membership::Member;
use crate::request::place::place;
use crate::state::load::RequestGuard;
use crate::state::{Event, Shared, Writer};
use crate::topology::{FleetId, Pick, ReplicaId};

fn addr(i: u16) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, i as u8 + 1], 80))
}

struct Rig {
    shared: Arc<Shared>,
    w: Writer,
    now: Instant,
}

impl Rig {
    fn new(yaml: &str) -> Rig {
        let (shared, w) = Writer::new(&RouterConfig::parse_valid(yaml).unwrap());
        Rig {
            shared,
            w,
            now: Instant::now(),
        }
    }

    /// Fleet `f`'s source says these are its members; joiners pass their probes.
    fn members(&mut self, f: usize, ids: &[u16]) {
        let cfg = self.shared.snapshot().config.clone();
        self.w.apply(
            Event::Membership {
                fleet: cfg.fleets[f].name.clone(),
                source: cfg.fleets[f].source(),
                members: ids.iter().map(|&i| Member::by_addr(addr(i))).collect(),
            },
            self.now,
        );
        let topo = self.shared.snapshot().topo.clone();
        for r in topo.fleets[f].replicas.ids() {
            for _ in 0..2 {
                self.w.apply(
                    Event::Health {
                        generation: topo.generation,
                        fleet: FleetId(f),
                        replica: r,
                        ok: true,
                    },
                    self.now,
                );
            }
        }
        self.w.drain(self.now);
    }

    /// Where each key's request (no prefix anywhere) goes now.
    fn homes(&self, keys: std::ops::Range<u64>) -> Vec<String> {
        let snap = self.shared.snapshot();
        keys.map(|k| {
            let d = decide(&snap, &key(k, Vec::new()), k).unwrap();
            snap.topo.fleets[d.fleet].replicas[*d.replicas.head()]
                .addr
                .clone()
        })
        .collect()
    }
}

fn key(k: u64, blocks: Vec<u64>) -> RouteKey<'static> {
    RouteKey {
        model: Some("m"),
        key: k.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        key_source: Some(KeySource::User),
        prompt_tokens: (blocks.len() as u32 * 256).max(64),
        block_tokens: 256,
        blocks,
        ..Default::default()
    }
}

const DNS_FLEET: &str = "fleets:\n  - { name: pool, region: us, dns: { name: pool.test, port: 80 }, capacity: { max_inflight: 32 } }\n\
                         stages: [{ name: s, models: [m], fleets: [pool] }]\n";

/// The share of `keys` that moved, and whether every move was one rendezvous
/// hashing must make (off a leaver, onto a joiner).
fn moved(before: &[String], after: &[String], left: &[u16], joined: &[u16]) -> f64 {
    let is = |set: &[u16], a: &str| set.iter().any(|&i| addr(i).to_string() == a);
    let mut n = 0;
    for (b, a) in before.iter().zip(after) {
        if b != a {
            n += 1;
            assert!(
                is(left, b) || is(joined, a),
                "a key moved from {b} to {a}, neither leaving nor joining"
            );
        }
        assert!(!is(left, a), "a key went to leaving {a}");
    }
    n as f64 / before.len() as f64
}

#[test]
fn keys_move_only_off_leavers_and_onto_joiners_in_the_ideal_share() {
    const KEYS: u64 = 30_000;
    // 6 → 4: the two leavers' keys move, a third of them; nobody else's.
    let mut rig = Rig::new(DNS_FLEET);
    rig.members(0, &[0, 1, 2, 3, 4, 5]);
    let before = rig.homes(0..KEYS);
    rig.members(0, &[0, 1, 2, 3]);
    let after = rig.homes(0..KEYS);
    let share = moved(&before, &after, &[4, 5], &[]);
    assert!((share - 2.0 / 6.0).abs() < 0.012, "6 -> 4 moved {share}");
    // Once removed, nothing changes for anyone.
    rig.now += crate::state::TICK * 2;
    rig.w.tick(rig.now);
    assert_eq!(rig.shared.snapshot().topo.fleets[0].replicas.len(), 4);
    assert_eq!(rig.homes(0..KEYS), after);

    // 2 → 4: the joiners take half the keys, from both old members alike.
    let mut rig = Rig::new(DNS_FLEET);
    rig.members(0, &[0, 1]);
    let before = rig.homes(0..KEYS);
    rig.members(0, &[0, 1, 2, 3]);
    let after = rig.homes(0..KEYS);
    let share = moved(&before, &after, &[], &[2, 3]);
    assert!((share - 0.5).abs() < 0.012, "2 -> 4 moved {share}");
    for old in [0, 1] {
        let a = addr(old).to_string();
        let kept = after.iter().filter(|x| **x == a).count() as f64 / KEYS as f64;
        assert!((kept - 0.25).abs() < 0.012, "{a} kept {kept}");
    }
}

/// The in-flight guard's bound on a replica (see `prefix_load`): 1.25 × the
/// mean over the fleet's ready replicas plus an eighth of `max_inflight` (32 here).
fn inflight_bound(shared: &Shared) -> (f64, Vec<u32>) {
    let snap = shared.snapshot();
    let loads: Vec<u32> = snap.topo.fleets[0]
        .replicas
        .iter()
        .filter(|&(r, _)| snap.replicas[0][r].ready())
        .map(|(_, rep)| rep.load.inflight())
        .collect();
    let mean = loads.iter().map(|&l| f64::from(l)).sum::<f64>() / loads.len() as f64;
    (1.25 * mean + 4.0, loads)
}

#[test]
fn a_joiner_takes_new_keys_at_once_and_the_guard_bounds_what_it_takes() {
    let mut rig = Rig::new(DNS_FLEET);
    rig.members(0, &[0, 1, 2, 3]);
    // Forty conversations find their homes and leave their prefix there.
    let blocks = |c: u64| (0..8).map(|b| c * 1000 + b).collect::<Vec<u64>>();
    let mut home = HashMap::new();
    for c in 0..40 {
        let p = block_on(place(&rig.shared, key(c, blocks(c)), c)).unwrap();
        home.insert(c, *p.decision.replicas.head());
        p.guard.release();
        rig.w.drain(rig.now);
    }
    // Every old replica is busy: 8 requests with long prefills each.
    let snap = rig.shared.snapshot_full();
    let mut held: Vec<RequestGuard> = snap.topo.fleets[0]
        .replicas
        .values()
        .flat_map(|r| (0..8).map(|_| r.load.start(12_000)).collect::<Vec<_>>())
        .collect();
    // Replica 3 leaves and replica 4 joins: 3's conversations have no
    // prefix anywhere now, and the joiner is the least loaded by far.
    rig.members(0, &[0, 1, 2, 4]);
    let snap = rig.shared.snapshot_full();
    let joiner = snap.topo.fleets[0]
        .replica_index(&addr(4).to_string())
        .unwrap();
    let leaver = ReplicaId(3);
    assert!(snap.replicas[0][leaver].leaving);
    let orphans: Vec<u64> = (0..40).filter(|c| home[c] == leaver).collect();
    let stayers: Vec<u64> = (0..40).filter(|c| home[c] != leaver).take(16).collect();
    assert!(orphans.len() >= 5, "{orphans:?}");
    // A burst, nothing answered yet: orphans, new keys, returning stayers.
    let mut burst: Vec<(u64, Vec<u64>)> = orphans.iter().map(|&c| (c, blocks(c))).collect();
    burst.extend((100..120).map(|c| (c, blocks(c))));
    burst.extend(stayers.iter().map(|&c| (c, blocks(c))));
    let mut to_joiner = Vec::new();
    for (i, (c, b)) in burst.iter().enumerate() {
        let p = block_on(place(&rig.shared, key(*c, b.clone()), *c)).unwrap();
        let r = *p.decision.replicas.head();
        assert_ne!(r, leaver, "a decision went to the leaving replica");
        if r == joiner {
            to_joiner.push(i);
        }
        if stayers.contains(c) {
            assert_eq!(r, home[c], "conversation {c} left its cache");
        }
        held.push(p.guard);
        rig.w.drain(rig.now);
        let (bound, loads) = inflight_bound(&rig.shared);
        let j = rig.shared.snapshot().topo.fleets[0].replicas[joiner]
            .load
            .inflight();
        assert!(
            f64::from(j) <= bound + 1.0,
            "the joiner holds {j} in flight, above the guard's {bound}: {loads:?}"
        );
    }
    // Not starved: the first request with nowhere better to go is its.
    assert_eq!(to_joiner.first(), Some(&0), "{to_joiner:?}");
    // Not flooded: it took what the guard allows (checked after every
    // decision above), the rest spread over the busy replicas.
    let n = to_joiner.len();
    assert!(
        n >= 8 && n < orphans.len() + 20,
        "the joiner took {n} of {}",
        burst.len()
    );
    let others = burst.len() - n - stayers.len();
    assert!(
        others > 0,
        "every request without a home went to the joiner"
    );
    drop(held);
}

#[test]
fn a_fleet_left_with_no_member_fails_over_within_residency_else_503() {
    let yaml = "fleets:\n  \
        - { name: dyn, region: us, dns: { name: dyn.test, port: 80 } }\n  \
        - { name: spare, region: us, endpoints: ['10.9.0.1:80'] }\n  \
        - { name: far, region: eu, endpoints: ['10.8.0.1:80'] }\n\
        stages:\n  \
        - { name: s, models: [m], fleets: [dyn, spare], routing: { policy: priority, order: [dyn, spare] } }\n  \
        - { name: alone, models: [a], fleets: [dyn] }\n";
    let mut rig = Rig::new(yaml);
    rig.members(0, &[0, 1]);
    for (f, r) in [(1, 0), (2, 0)] {
        for _ in 0..2 {
            rig.w.apply(
                Event::Health {
                    generation: rig.shared.snapshot().topo.generation,
                    fleet: FleetId(f),
                    replica: ReplicaId(r),
                    ok: true,
                },
                rig.now,
            );
        }
    }
    rig.w.drain(rig.now);
    let shared = rig.shared.clone();
    let fleet_of = |model: &'static str| {
        let snap = shared.snapshot();
        let k = RouteKey {
            model: Some(model),
            key: 7,
            ..Default::default()
        };
        decide(&snap, &k, 0).map(|d| snap.topo.fleets[d.fleet].name.clone())
    };
    assert_eq!(fleet_of("m").unwrap(), "dyn");
    // The source answers empty (twice, for DNS): every member leaves.
    rig.members(0, &[]);
    assert_eq!(fleet_of("m").unwrap(), "spare");
    match fleet_of("a") {
        Err(Reject::NoReadyReplica { stage, residency }) => {
            assert_eq!((stage.as_str(), residency.as_str()), ("alone", "us"));
        }
        other => panic!("{other:?}"),
    }
    // Back: the stage returns to its first fleet once a member is ready.
    rig.members(0, &[3]);
    assert_eq!(fleet_of("m").unwrap(), "dyn");
}

#[test]
fn a_decision_says_whether_the_key_or_load_picked_its_replica() {
    let mut rig = Rig::new(DNS_FLEET);
    rig.members(0, &[0, 1, 2, 3]);
    let snap = rig.shared.snapshot_full();
    // No prefix, no load: every key goes to its rendezvous choice.
    for k in 0..50 {
        assert_eq!(
            decide(&snap, &key(k, Vec::new()), k).unwrap().pick,
            Pick::Key
        );
    }
    // Key 7's home is past the bounded-load guard: load picks another.
    let home = *decide(&snap, &key(7, Vec::new()), 7)
        .unwrap()
        .replicas
        .head();
    let held: Vec<RequestGuard> = (0..12)
        .map(|_| snap.topo.fleets[0].replicas[home].load.start(64))
        .collect();
    let d = decide(&snap, &key(7, Vec::new()), 7).unwrap();
    assert_ne!(*d.replicas.head(), home);
    assert_eq!(d.pick, Pick::LoadGuard);
    drop(held);
    // A prompt cached on another replica only: the prefix picks it.
    let blocks: Vec<u64> = (0..8).collect();
    let p = block_on(place(&rig.shared, key(1, blocks.clone()), 1)).unwrap();
    let cached_on = *p.decision.replicas.head();
    p.guard.release();
    rig.w.drain(rig.now);
    let other = (2..200)
        .find(|&k| {
            *decide(&rig.shared.snapshot_full(), &key(k, Vec::new()), k)
                .unwrap()
                .replicas
                .head()
                != cached_on
        })
        .unwrap();
    let d = decide(&rig.shared.snapshot_full(), &key(other, blocks), other).unwrap();
    assert_eq!(*d.replicas.head(), cached_on);
    assert_eq!(d.pick, Pick::Prefix);
}
