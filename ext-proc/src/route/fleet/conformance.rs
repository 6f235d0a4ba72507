//! One suite, every policy: the properties each fleet policy must keep,
//! checked over random fleets, health, load and figures.

use std::sync::Arc;

use proptest::prelude::*;

use crate::config::RouterConfig;
use crate::route::key::RouteKey;
use crate::route::{Reject, decide};
use crate::state::figures::FleetFigures;
use crate::state::health::Health;
use crate::state::prefix_index::PrefixIndex;
use crate::state::{FleetState, ReplicaState, Snapshot};
use crate::topology::load::RequestGuard;
use crate::topology::{FleetId, ReplicaId, Topology};

const POLICIES: [&str; 4] = ["priority", "weighted", "latency", "cost"];

fn config(policy: &str) -> RouterConfig {
    let routing = match policy {
        "priority" => "{ policy: priority, order: [f2, f0, f1, f3] }".to_string(),
        "weighted" => "{ policy: weighted, weights: { f0: 1, f1: 2, f2: 0, f3: 1 } }".to_string(),
        p => format!("{{ policy: {p}, exploration: 0, tolerance: 0 }}"),
    };
    let fleets: String = (0..4)
        .map(|f| {
            let region = if f == 3 { "us2" } else { "us" };
            let eps: Vec<String> = (0..3).map(|r| format!("\"10.0.{f}.{r}:8000\"")).collect();
            format!(
                "  - name: f{f}\n    region: {region}\n    endpoints: [{}]\n    cost: {{ usd_per_million_tokens: {} }}\n    capacity: {{ max_inflight: 4 }}\n",
                eps.join(", "),
                1.0 + f as f64
            )
        })
        .collect();
    let yaml = format!(
        "fleets:\n{fleets}stages:\n  - name: s\n    models: [m]\n    fleets: [f0, f1, f2, f3]\n    alarms: {{ ttft_p95_ms: 1000, min_samples: 1 }}\n    routing: {routing}\n"
    );
    RouterConfig::parse(&yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"))
}

/// Random readiness, load, saturation and figures for a topology.
#[derive(Clone, Debug)]
struct World {
    ready: Vec<Vec<bool>>,
    inflight: Vec<Vec<u8>>,
    spilling: Vec<bool>,
    latency: Vec<Option<f64>>,
    p95: Vec<f64>,
}

fn world() -> impl Strategy<Value = World> {
    (
        proptest::collection::vec(proptest::collection::vec(any::<bool>(), 3), 4),
        proptest::collection::vec(proptest::collection::vec(0u8..6, 3), 4),
        proptest::collection::vec(any::<bool>(), 4),
        proptest::collection::vec(proptest::option::of(1.0f64..500.0), 4),
        proptest::collection::vec(100.0f64..2000.0, 4),
    )
        .prop_map(|(ready, inflight, spilling, latency, p95)| World {
            ready,
            inflight,
            spilling,
            latency,
            p95,
        })
}

fn snapshot(policy: &str, w: &World) -> (Snapshot, Vec<RequestGuard>) {
    let cfg = config(policy);
    let topo = Arc::new(Topology::from_config(
        &crate::config::validate(cfg.clone()).unwrap(),
        1,
    ));
    let mut guards = Vec::new();
    for (f, fleet) in topo.fleets.iter().enumerate() {
        for (r, rep) in fleet.replicas.iter() {
            for _ in 0..w.inflight[f][r.index()] {
                guards.push(rep.load.start(100));
            }
        }
    }
    let snap = Snapshot {
        failed_keys: Default::default(),
        replicas: w
            .ready
            .iter()
            .map(|fr| {
                fr.iter()
                    .map(|&ok| ReplicaState {
                        health: if ok {
                            Health::Healthy
                        } else {
                            Health::Unhealthy
                        },
                        warm: true,
                        ejected: false,
                        draining: false,
                        leaving: false,
                    })
                    .collect()
            })
            .collect(),
        fleets: (0..4)
            .map(|f| FleetState {
                prefix: Arc::new(PrefixIndex::default()),
                figures: FleetFigures {
                    latency: w.latency[f],
                    ttft_p95_ms: Some(w.p95[f]),
                    samples: 10,
                    usd_per_mtok: Some(1.0 + f as f64),
                    ..Default::default()
                },
                spilling: w.spilling[f],
                utilisation: 0.0,
                desired_replicas: 3,
            })
            .collect(),
        stages: vec![vec![Default::default(); 4]],
        config: Arc::new(cfg),
        topo,
    };
    (snap, guards)
}

fn key(k: u64, residency: Option<&'static str>) -> RouteKey<'static> {
    RouteKey {
        model: Some("m"),
        key: k,
        residency,
        prompt_tokens: 1000,
        block_tokens: 16,
        ..Default::default()
    }
}

fn ready_fleets(snap: &Snapshot, region: Option<&str>) -> Vec<FleetId> {
    FleetId::all(snap.topo.fleets.len())
        .filter(|&f| snap.replicas[f].values().any(ReplicaState::ready))
        .filter(|&f| region.is_none_or(|r| snap.topo.fleets[f].region == r))
        .collect()
}

/// Whether the policy input would count this fleet as saturated.
fn saturated(snap: &Snapshot, f: FleetId) -> bool {
    let ready: Vec<ReplicaId> = ReplicaId::all(3)
        .filter(|&r| snap.replicas[f][r].ready())
        .collect();
    snap.fleets[f].spilling
        || crate::state::saturation::utilisation(&snap.topo.fleets[f], ready) >= 1.0
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn every_policy_keeps_the_common_contract(w in world(), k in any::<u64>(), rng in any::<u64>(),
                                               narrow in any::<bool>()) {
        for policy in POLICIES {
            let (snap, _guards) = snapshot(policy, &w);
            let residency = narrow.then_some("us2");
            let key = key(k, residency);
            let eligible = ready_fleets(&snap, residency);
            match decide(&snap, &key, rng) {
                Ok(d) => {
                    prop_assert!(eligible.contains(&d.fleet), "{policy}: fleet {} not eligible", d.fleet);
                    for &r in &d.replicas {
                        prop_assert!(snap.replicas[d.fleet][r].ready(), "{policy}: replica not ready");
                    }
                    // Deterministic for a key and a seed.
                    let again = decide(&snap, &key, rng).unwrap();
                    prop_assert_eq!((again.fleet, again.replicas), (d.fleet, d.replicas));
                }
                Err(Reject::NoReadyReplica { .. }) => prop_assert!(eligible.is_empty(), "{policy}: refused with {eligible:?} eligible"),
                Err(Reject::PolicyRefused { .. }) => {
                    // Only weighted may refuse: every eligible fleet weighs 0.
                    prop_assert_eq!(policy, "weighted");
                    prop_assert!(eligible.iter().all(|&f| f == FleetId(2)));
                }
                Err(e) => prop_assert!(false, "{policy}: unexpected {e:?}"),
            }
        }
    }

    #[test]
    fn priority_fills_in_order(w in world(), k in any::<u64>()) {
        let (snap, _g) = snapshot("priority", &w);
        let Ok(d) = decide(&snap, &key(k, None), 0) else { return Ok(()) };
        let order = [2, 0, 1, 3].map(FleetId);
        let eligible = ready_fleets(&snap, None);
        let first_free = order.iter().copied().find(|f| eligible.contains(f) && !saturated(&snap, *f));
        if let Some(f) = first_free {
            prop_assert_eq!(d.fleet, f);
        }
    }

    #[test]
    fn latency_takes_the_fastest(w in world(), k in any::<u64>(), rng in any::<u64>()) {
        let (snap, _g) = snapshot("latency", &w);
        let Ok(d) = decide(&snap, &key(k, None), rng) else { return Ok(()) };
        let eligible = ready_fleets(&snap, None);
        let free: Vec<FleetId> = eligible.iter().copied().filter(|&f| !saturated(&snap, f)).collect();
        let pool = if free.is_empty() { eligible } else { free };
        // Expected time to first token: the fleet's speed times the prefill
        // queued on its least-queued ready replica (100 tokens per request in
        // flight in this world) plus the prompt (1000 tokens, nothing cached).
        let queued = |f: FleetId| (0..3).filter(|&r| w.ready[f][r]).map(|r| u64::from(w.inflight[f][r]) * 100).min().unwrap_or(0);
        let expected = |f: FleetId| w.latency[f].map(|l| l * (1000.0 + queued(f) as f64 + 256.0) / 1000.0);
        let known: Vec<f64> = pool.iter().filter_map(|&f| expected(f)).collect();
        let neutral = if known.is_empty() { 0.0 } else { known.iter().sum::<f64>() / known.len() as f64 };
        let ttft = |f: FleetId| expected(f).unwrap_or(neutral);
        let best = pool.iter().map(|&f| ttft(f)).fold(f64::INFINITY, f64::min);
        prop_assert!(pool.contains(&d.fleet));
        prop_assert!(ttft(d.fleet) <= best + 1e-9, "chose {} ({}) over best {best}", d.fleet, ttft(d.fleet));
    }

    #[test]
    fn cost_takes_the_cheapest_within_alarms(w in world(), k in any::<u64>(), rng in any::<u64>()) {
        let (snap, _g) = snapshot("cost", &w);
        let Ok(d) = decide(&snap, &key(k, None), rng) else { return Ok(()) };
        let eligible = ready_fleets(&snap, None);
        let free: Vec<FleetId> = eligible.iter().copied().filter(|&f| !saturated(&snap, f)).collect();
        let pool = if free.is_empty() { eligible } else { free };
        let meeting: Vec<FleetId> = pool.iter().copied().filter(|&f| w.p95[f] <= 1000.0).collect();
        if let Some(&cheapest) = meeting.iter().min_by_key(|&&f| f) {
            // Cost grows with the fleet index in this world.
            prop_assert_eq!(d.fleet, cheapest);
        } else {
            prop_assert!(pool.contains(&d.fleet));
        }
    }
}

#[test]
fn weighted_shares_follow_weight_times_ready_replicas() {
    let w = World {
        ready: vec![
            vec![true, true, true],
            vec![true, true, false],
            vec![true; 3],
            vec![true; 3],
        ],
        inflight: vec![vec![0; 3]; 4],
        spilling: vec![false; 4],
        latency: vec![None; 4],
        p95: vec![100.0; 4],
    };
    let (snap, _g) = snapshot("weighted", &w);
    let mut counts = [0u32; 4];
    let n = 40_000u64;
    for k in 0..n {
        let d = decide(&snap, &key(k.wrapping_mul(0x9E37_79B9_7F4A_7C15), None), 0).unwrap();
        counts[d.fleet] += 1;
    }
    // weights 1, 2, 0, 1 × ready 3, 2, 3, 3 = 3 : 4 : 0 : 3
    let expect = [0.3, 0.4, 0.0, 0.3];
    for f in 0..4 {
        let share = f64::from(counts[f]) / n as f64;
        assert!(
            (share - expect[f]).abs() < 0.01,
            "fleet {f}: {share} vs {}",
            expect[f]
        );
    }
}

#[test]
fn exploration_reaches_every_fleet_and_stays_a_small_share() {
    let mut cfg = config("latency");
    let crate::config::RoutingConfig::Latency(r) = &mut cfg.stages[0].routing else {
        panic!("a latency stage");
    };
    r.exploration = 0.1;
    let topo = Arc::new(Topology::from_config(
        &crate::config::validate(cfg.clone()).unwrap(),
        1,
    ));
    let w = World {
        ready: vec![vec![true; 3]; 4],
        inflight: vec![vec![0; 3]; 4],
        spilling: vec![false; 4],
        latency: vec![Some(10.0), Some(100.0), Some(100.0), Some(100.0)],
        p95: vec![100.0; 4],
    };
    let (mut snap, _g) = snapshot("latency", &w);
    snap.topo = topo;
    let mut counts = [0u32; 4];
    for i in 0..20_000u64 {
        let d = decide(&snap, &key(i, None), i.wrapping_mul(0x2545_F491_4F6C_DD1D)).unwrap();
        counts[d.fleet] += 1;
    }
    assert!(counts.iter().all(|&c| c > 0), "{counts:?}");
    let others = f64::from(counts[1] + counts[2] + counts[3]) / 20_000.0;
    assert!(
        (others - 0.075).abs() < 0.015,
        "exploration share to slow fleets {others}: {counts:?}"
    );
}
