use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use crate::config::RouterConfig;
use crate::membership::{Member, MemberId};
use crate::state::health::Health;
use crate::state::{Change, Event, Routed, Shared, TICK, Writer};
use crate::topology::{FleetId, ReplicaId, StageId};

const F: FleetId = FleetId(0);

fn writer(yaml: &str) -> (Arc<Shared>, Writer) {
    Writer::new(&RouterConfig::parse_valid(yaml).unwrap())
}

fn dns_config(grace_ms: u64) -> String {
    format!(
        "membership: {{ removal_grace_ms: {grace_ms} }}\n\
         fleets:\n  - name: pool\n    region: us\n    dns: {{ name: pool.test, port: 80 }}\n    \
         capacity: {{ kv_cache_tokens: 80 }}\n\
         stages: [{{ name: s, models: [m], fleets: [pool] }}]\n"
    )
}

fn addr(i: u16) -> SocketAddr {
    SocketAddr::from(([10, 0, (i / 200) as u8, (i % 200) as u8 + 1], 80))
}

fn members(ids: impl IntoIterator<Item = u16>) -> Vec<Member> {
    ids.into_iter().map(|i| Member::by_addr(addr(i))).collect()
}

fn pod(name: &str, uid: &str, at: SocketAddr) -> Member {
    Member {
        addr: at,
        identity: MemberId::Target {
            name: name.into(),
            uid: uid.into(),
        },
    }
}

impl Writer {
    /// A source's set for fleet 0, from its configured source.
    fn set(&mut self, members: Vec<Member>, now: Instant) {
        let source = self.config.fleets[0].source();
        let fleet = self.config.fleets[0].name.clone();
        self.apply(
            Event::Membership {
                fleet,
                source,
                members,
            },
            now,
        );
    }

    fn slot_of(&self, a: SocketAddr) -> Option<ReplicaId> {
        self.topo.fleets[0].replica_index(&a.to_string())
    }

    fn probe(&mut self, r: ReplicaId, ok: bool, now: Instant) {
        let generation = self.topo.generation;
        for _ in 0..2 {
            self.apply(
                Event::Health {
                    generation,
                    fleet: F,
                    replica: r,
                    ok,
                },
                now,
            );
        }
    }

    fn route_to(&mut self, r: ReplicaId, blocks: Vec<u64>, now: Instant) {
        let generation = self.topo.generation;
        self.apply(
            Event::Routed(Box::new(Routed {
                generation,
                decision_id: 1,
                request_id: String::new(),
                stage: StageId(0),
                fleet: F,
                replica: r,
                key_source: None,
                arm: crate::topology::Arm::None,
                pick: crate::topology::Pick::Key,
                shadow: None,
                blocks,
                block_tokens: 10,
                prompt_tokens: 100,
                predicted_cached_tokens: 0,
                adapter: None,
                fallback: None,
            })),
            now,
        );
    }

    fn reload(&mut self, yaml: &str, now: Instant) {
        self.apply(
            Event::Change {
                change: Box::new(Change::Reload {
                    config: Box::new(RouterConfig::parse_valid(yaml).unwrap()),
                    source: "test".into(),
                }),
                reply: None,
            },
            now,
        );
    }

    /// Mask of the slots that are members and not leaving.
    fn live(&self) -> u64 {
        self.fleets[0]
            .replicas
            .iter()
            .filter(|(_, m)| m.leaving.is_none())
            .fold(0, |m, (r, _)| m | 1 << r.index())
    }
}

#[test]
fn a_dynamic_fleet_starts_empty_and_takes_its_sources_set() {
    let (shared, mut w) = writer(&dns_config(30_000));
    assert!(shared.snapshot().topo.fleets[0].replicas.is_empty());
    let mut changes = shared.watch_replicas();
    let now = Instant::now();
    w.set(members([0, 1, 2]), now);
    let snap = shared.snapshot();
    assert_eq!(snap.topo.fleets[0].replicas.len(), 3);
    assert_eq!(
        snap.replicas[0]
            .values()
            .map(|s| s.health)
            .collect::<Vec<_>>(),
        [Health::Unknown; 3]
    );
    // The snapshot that holds the change wakes the replica watchers (EDS).
    assert!(changes.has_changed().unwrap());
    changes.mark_unchanged();
    // The same set again changes nothing.
    w.set(members([2, 1, 0]), now);
    assert!(!changes.has_changed().unwrap());
}

#[test]
fn a_member_that_stays_keeps_everything_and_a_leaver_loses_its_entries() {
    let (shared, mut w) = writer(&dns_config(30_000));
    let now = Instant::now();
    w.set(members([0, 1, 2]), now);
    for r in ReplicaId::all(3) {
        w.probe(r, true, now);
        w.route_to(
            r,
            vec![r.index() as u64 * 10 + 1, r.index() as u64 * 10 + 2],
            now,
        );
    }
    w.drain(now);
    let before = shared.snapshot_full();
    let stay = before.topo.fleets[0].replicas[ReplicaId(0)].clone();
    let _held = stay.load.start(500);
    // 1 leaves, 3 joins: 0 and 2 keep everything.
    w.set(members([0, 2, 3]), now);
    let snap = shared.snapshot_full();
    let fleet = &snap.topo.fleets[0];
    for (r, a) in [(ReplicaId(0), addr(0)), (ReplicaId(2), addr(2))] {
        let (old, new) = (&before.topo.fleets[0].replicas[r], &fleet.replicas[r]);
        assert_eq!(w.slot_of(a), Some(r), "{a} kept its slot");
        assert!(
            Arc::ptr_eq(&old.load, &new.load),
            "{a} kept its load counters"
        );
        assert_eq!((old.seed, old.since), (new.seed, new.since));
        assert_eq!(snap.replicas[0][r].health, Health::Healthy);
        assert_eq!(w.fleets[0].index.held(r), 2, "{a} kept its prefix entries");
    }
    assert_eq!(fleet.replicas[ReplicaId(0)].load.inflight(), 1);
    // The leaver: still in its slot, leaving, no entries, no decisions.
    let st = snap.replicas[0][ReplicaId(1)];
    assert!(st.leaving && !st.ready() && st.label() == "leaving");
    assert_eq!(w.fleets[0].index.held(ReplicaId(1)), 0);
    // The joiner: the lowest free slot, unknown until probed, no entries.
    assert_eq!(w.slot_of(addr(3)), Some(ReplicaId(3)));
    assert_eq!(snap.replicas[0][ReplicaId(3)].health, Health::Unknown);
    assert_eq!(w.fleets[0].index.held(ReplicaId(3)), 0);
    w.fleets[0].index.check_union(w.live()).unwrap();
}

#[test]
fn a_leaver_is_removed_once_idle_or_after_the_grace() {
    let (shared, mut w) = writer(&dns_config(5_000));
    let t0 = Instant::now();
    w.set(members([0, 1, 2]), t0);
    let busy = shared.snapshot().topo.fleets[0].replicas[ReplicaId(1)]
        .load
        .clone();
    let guard = busy.start(100);
    w.set(members([0]), t0);
    // Seen on this tick's snapshot only: not removed in the same instant.
    w.tick(t0);
    assert_eq!(shared.snapshot().topo.fleets[0].replicas.len(), 3);
    // The idle leaver goes at the first tick after it started leaving; the
    // busy one stays for its request.
    w.tick(t0 + TICK);
    let snap = shared.snapshot();
    assert_eq!(w.slot_of(addr(2)), None);
    assert_eq!(w.slot_of(addr(1)), Some(ReplicaId(1)));
    assert!(snap.replicas[0][ReplicaId(1)].leaving);
    w.tick(t0 + Duration::from_millis(4_900));
    assert_eq!(w.slot_of(addr(1)), Some(ReplicaId(1)));
    // The grace passes: removed with its request still counted on it.
    w.tick(t0 + Duration::from_millis(5_000));
    assert_eq!(w.slot_of(addr(1)), None);
    assert_eq!(shared.snapshot().topo.fleets[0].replicas.len(), 1);
    assert_eq!(busy.inflight(), 1, "the request's lease keeps counting");
    drop(guard);
    // Its series go with it.
    let text = shared.metrics.render();
    assert!(!text.contains(&addr(1).to_string()), "{text}");
    assert!(text.contains(&addr(0).to_string()), "{text}");
}

#[test]
fn a_leaver_listed_again_is_back_in_rotation_with_its_health() {
    let (shared, mut w) = writer(&dns_config(30_000));
    let now = Instant::now();
    w.set(members([0, 1]), now);
    w.probe(ReplicaId(1), true, now);
    w.set(members([0]), now);
    assert!(!shared.snapshot().replicas[0][ReplicaId(1)].ready());
    w.set(members([0, 1]), now);
    let st = shared.snapshot().replicas[0][ReplicaId(1)];
    assert!(st.ready() && !st.leaving, "{st:?}");
}

#[test]
fn a_new_pod_on_an_old_address_is_a_new_replica() {
    let yaml = "fleets:\n  - { name: pool, region: us, kubernetes: { namespace: llm, service: pool } }\n\
                stages: [{ name: s, models: [m], fleets: [pool] }]\n";
    let (shared, mut w) = writer(yaml);
    let now = Instant::now();
    let at = addr(5);
    w.set(vec![pod("p-a", "u-a", at), pod("p-b", "u-b", addr(6))], now);
    let r = w.slot_of(at).unwrap();
    w.probe(r, true, now);
    w.route_to(r, vec![1, 2, 3], now);
    w.drain(now);
    let old = shared.snapshot().topo.fleets[0].replicas[r].clone();
    let _inflight = old.load.start(10);
    assert_eq!(&*old.identity, "p-a/u-a");
    // Pod a is replaced by pod c on the same IP, in one update.
    w.set(vec![pod("p-c", "u-c", at), pod("p-b", "u-b", addr(6))], now);
    let snap = shared.snapshot();
    let r2 = w.slot_of(at).unwrap();
    let new = &snap.topo.fleets[0].replicas[r2];
    assert_eq!(&*new.identity, "p-c/u-c");
    assert_eq!(snap.replicas[0][r2].health, Health::Unknown);
    assert!(!Arc::ptr_eq(&old.load, &new.load), "fresh counters");
    assert_eq!(new.load.inflight(), 0);
    assert_eq!(w.fleets[0].index.held(r2), 0, "empty cache");
    assert_eq!(
        snap.topo.fleets[0].replicas.len(),
        2,
        "the old pod is gone at once"
    );
    // A health result for the old pod, probed before, does not land on the new one.
    w.apply(
        Event::Health {
            generation: old.since,
            fleet: F,
            replica: r2,
            ok: true,
        },
        now,
    );
    w.drain(now);
    assert_eq!(shared.snapshot().replicas[0][r2].health, Health::Unknown);
}

#[test]
fn events_of_an_earlier_generation_apply_to_members_that_stayed() {
    let (shared, mut w) = writer(&dns_config(0));
    let t0 = Instant::now();
    w.set(members([0, 1]), t0);
    let g = shared.snapshot().topo.generation;
    // Membership changes twice while a probe of generation g is in flight.
    w.set(members([0, 1, 2]), t0);
    w.set(members([0, 2]), t0);
    w.tick(t0 + TICK); // 1 removed
    w.set(members([0, 2, 3]), t0 + TICK); // 3 takes 1's slot
    assert_eq!(w.slot_of(addr(3)), Some(ReplicaId(1)));
    for r in [ReplicaId(0), ReplicaId(1)] {
        w.apply(
            Event::Health {
                generation: g,
                fleet: F,
                replica: r,
                ok: true,
            },
            t0,
        );
    }
    w.drain(t0);
    let snap = shared.snapshot();
    assert_eq!(snap.replicas[0][ReplicaId(0)].health, Health::Healthy);
    assert_eq!(
        snap.replicas[0][ReplicaId(1)].health,
        Health::Unknown,
        "slot 1 holds another member now"
    );
}

#[test]
fn members_beyond_the_slots_wait_for_one() {
    let (shared, mut w) = writer(&dns_config(0));
    let t0 = Instant::now();
    w.set(members(0..70), t0);
    assert_eq!(shared.snapshot().topo.fleets[0].replicas.len(), 64);
    assert_eq!(w.fleets[0].waiting.len(), 6);
    w.tick(t0);
    let text = shared.metrics.render();
    assert!(
        text.contains("fleetroute_fleet_members_ignored{fleet=\"pool\"} 6"),
        "{text}"
    );
    assert!(text.contains("fleetroute_fleet_members{fleet=\"pool\"} 64"));
    // Two leave: once removed, two waiting members take their slots.
    let mut rest: Vec<u16> = (0..70).collect();
    rest.retain(|&i| i != 3 && i != 9);
    w.set(members(rest), t0);
    assert_eq!(w.fleets[0].waiting.len(), 6, "no slot free yet");
    w.tick(t0 + TICK);
    assert_eq!(w.fleets[0].waiting.len(), 4);
    let snap = shared.snapshot();
    assert_eq!(snap.topo.fleets[0].replicas.len(), 64);
    assert!(w.slot_of(addr(3)).is_none() && w.slot_of(addr(9)).is_none());
    assert_eq!(w.slot_of(addr(64)), Some(ReplicaId(3)));
    assert_eq!(w.slot_of(addr(65)), Some(ReplicaId(9)));
}

#[test]
fn an_update_from_a_replaced_source_is_ignored() {
    let (shared, mut w) = writer(&dns_config(30_000));
    let now = Instant::now();
    w.set(members([0, 1]), now);
    let old_source = w.config.fleets[0].source();
    w.reload(&dns_config(30_000).replace("pool.test", "other.test"), now);
    // The running members stay until the new source answers.
    assert_eq!(shared.snapshot().topo.fleets[0].replicas.len(), 2);
    w.apply(
        Event::Membership {
            fleet: "pool".into(),
            source: old_source,
            members: members([7]),
        },
        now,
    );
    assert_eq!(w.slot_of(addr(7)), None);
    w.set(members([7]), now);
    assert_eq!(w.slot_of(addr(7)), Some(ReplicaId(2)));
}

#[test]
fn a_reload_that_edits_endpoints_is_a_membership_change() {
    let cfg = |eps: &str| {
        format!(
            "fleets:\n  - {{ name: a, region: us, endpoints: [{eps}] }}\n  \
             - {{ name: b, region: us, endpoints: ['10.9.0.1:80'] }}\n\
             stages: [{{ name: s, models: [m], fleets: [a, b], routing: {{ policy: weighted }} }}]\n"
        )
    };
    let (shared, mut w) = writer(&cfg("'10.0.0.1:80', '10.0.0.2:80', '10.0.0.3:80'"));
    let now = Instant::now();
    for r in ReplicaId::all(3) {
        w.probe(r, true, now);
        w.route_to(r, vec![r.index() as u64 + 100], now);
    }
    w.drain(now);
    let layout = shared.snapshot().topo.layout;
    // Reordered, one gone, one new: slots follow the members, not the list.
    w.reload(&cfg("'10.0.0.4:80', '10.0.0.3:80', '10.0.0.1:80'"), now);
    let snap = shared.snapshot();
    assert_eq!(snap.topo.layout, layout, "fleet and stage ids kept");
    let slot = |a: &str| snap.topo.fleets[0].replica_index(a);
    assert_eq!(slot("10.0.0.1:80"), Some(ReplicaId(0)));
    assert_eq!(slot("10.0.0.3:80"), Some(ReplicaId(2)));
    assert_eq!(slot("10.0.0.4:80"), Some(ReplicaId(3)));
    assert!(snap.replicas[0][ReplicaId(1)].leaving);
    assert_eq!(w.fleets[0].index.held(ReplicaId(0)), 1);
    assert_eq!(w.fleets[0].index.held(ReplicaId(2)), 1);
    assert!(snap.replicas[0][ReplicaId(2)].ready());
    // An admin change (a weight) leaves every member as it was.
    let g = snap.topo.generation;
    drop(snap);
    w.apply(
        Event::Change {
            change: Box::new(Change::SetWeight {
                stage: "s".into(),
                fleet: "b".into(),
                weight: 2.0,
            }),
            reply: None,
        },
        now,
    );
    let snap = shared.snapshot();
    assert!(snap.topo.generation > g);
    assert_eq!(snap.topo.fleets[0].replicas.len(), 4);
    assert!(snap.replicas[0][ReplicaId(2)].ready());
    // Reordering the fleets changes their ids: earlier events mean nothing.
    drop(snap);
    w.reload(
        "fleets:\n  - { name: b, region: us, endpoints: ['10.9.0.1:80'] }\n  \
         - { name: a, region: us, endpoints: ['10.0.0.1:80'] }\n\
         stages: [{ name: s, models: [m], fleets: [a, b] }]\n",
        now,
    );
    let snap = shared.snapshot();
    assert!(snap.topo.layout > layout);
    assert!(!snap.topo.knows(g));
    // Fleet a (now id 1) kept its member's health and entries.
    assert!(snap.replicas[1][ReplicaId(0)].ready());
    assert_eq!(w.fleets[1].index.held(ReplicaId(0)), 1);
}

#[derive(Clone, Debug)]
enum Op {
    /// The source's set: members 0..12 whose bit is set.
    Set(u16),
    /// A decision to the `n`th occupied slot, with these blocks.
    Route(u8, Vec<u64>),
    /// A probe result for the `n`th occupied slot.
    Probe(u8, bool),
    /// Time passes (ms) and the writer ticks.
    Tick(u16),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => any::<u16>().prop_map(|m| Op::Set(m & 0xfff)),
        4 => (any::<u8>(), proptest::collection::vec(0u64..40, 1..10)).prop_map(|(r, b)| Op::Route(r, b)),
        1 => (any::<u8>(), any::<bool>()).prop_map(|(r, ok)| Op::Probe(r, ok)),
        2 => (0u16..400).prop_map(Op::Tick),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Across random joins, leaves, decisions and removals: the prefix index
    /// is exactly the union of the members' LRUs, only members that are not
    /// leaving have entries, a member keeps its slot for as long as it is
    /// one, and a change leaves the entries of everyone who stays untouched.
    #[test]
    fn the_index_stays_the_union_of_the_members_caches(ops in proptest::collection::vec(op(), 1..80)) {
        let (shared, mut w) = writer(&dns_config(300));
        let mut now = Instant::now();
        let mut slots: HashMap<SocketAddr, ReplicaId> = HashMap::new();
        for op in ops {
            let occupied: Vec<ReplicaId> = w.topo.fleets[0].replicas.ids().collect();
            let pick = |n: u8| occupied.get(n as usize % occupied.len().max(1)).copied();
            match op {
                Op::Set(mask) => {
                    let before: HashMap<ReplicaId, usize> = occupied
                        .iter()
                        .map(|&r| (r, w.fleets[0].index.held(r)))
                        .collect();
                    let listed: Vec<u16> = (0..12).filter(|i| mask & (1 << i) != 0).collect();
                    w.set(members(listed.iter().copied()), now);
                    for &i in &listed {
                        let r = w.slot_of(addr(i));
                        prop_assert!(r.is_some(), "member {i} has no slot");
                        // A member that stayed (same slot before and after, not
                        // coming back from leaving) kept its entries.
                        if let Some(r) = r
                            && let Some(was) = before.get(&r)
                            && slots.get(&addr(i)) == Some(&r)
                            && w.fleets[0].replicas[r].leaving.is_none()
                        {
                            prop_assert_eq!(w.fleets[0].index.held(r), *was, "a stayer's entries changed");
                        }
                    }
                }
                Op::Route(n, blocks) => {
                    if let Some(r) = pick(n) {
                        w.route_to(r, blocks, now);
                    }
                }
                Op::Probe(n, ok) => {
                    if let Some(r) = pick(n) {
                        w.probe(r, ok, now);
                    }
                }
                Op::Tick(ms) => {
                    now += Duration::from_millis(u64::from(ms));
                    w.tick(now);
                }
            }
            w.drain(now);
            // Topology and models hold the same slots.
            let topo_ids: Vec<ReplicaId> = w.topo.fleets[0].replicas.ids().collect();
            let model_ids: Vec<ReplicaId> = w.fleets[0].replicas.ids().collect();
            prop_assert_eq!(&topo_ids, &model_ids);
            prop_assert_eq!(shared.snapshot().topo.generation, w.topo.generation);
            // Slots are stable while a member stays.
            for (r, rep) in w.topo.fleets[0].replicas.iter() {
                let a: SocketAddr = rep.addr.parse().unwrap();
                if let Some(&was) = slots.get(&a) {
                    prop_assert_eq!(was, r, "{} moved", a);
                }
            }
            slots = w.topo.fleets[0]
                .replicas
                .iter()
                .map(|(r, rep)| (rep.addr.parse().unwrap(), r))
                .collect();
            if let Err(e) = w.fleets[0].index.check_union(w.live()) {
                return Err(TestCaseError::fail(e));
            }
            for (r, m) in w.fleets[0].replicas.iter() {
                if m.leaving.is_some() {
                    prop_assert_eq!(w.fleets[0].index.held(r), 0);
                }
            }
        }
    }
}
