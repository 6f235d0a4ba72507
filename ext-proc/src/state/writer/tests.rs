//! Tests of `writer.rs`.

use std::time::Duration;

use super::*;
use crate::state::Decided;
use crate::topology::{Arm, StageId};

fn failure(key: u64, fleet: &str, replica: &str, decided: Option<Decided>) -> Event {
    Event::Observed(Box::new(Observation {
        stage: "s".into(),
        fleet: fleet.into(),
        replica: replica.into(),
        served_by: None,
        status: Some(503),
        time_to_first_byte: None,
        total: Duration::from_millis(1),
        usage: None,
        predicted_cached_tokens: 0,
        uncached_tokens: 0,
        queued_tokens: 0,
        arm: Arm::None,
        stream: false,
        ended_early: false,
        key: Some(key),
        decided,
    }))
}

#[test]
fn an_observation_resolves_by_its_decision_not_by_names() {
    let cfg = RouterConfig::parse_valid(
        "fleets:\n  - { name: a, region: us, endpoints: [\"10.0.0.1:1\"] }\n  \
             - { name: b, region: us, endpoints: [\"10.0.1.1:1\", \"10.0.1.2:1\"] }\n\
             stages: [{ name: s, models: [m], fleets: [a, b] }]\n",
    )
    .unwrap();
    let (shared, mut w) = Writer::new(&cfg);
    let now = Instant::now();
    let decided = |generation, replica| Decided {
        generation,
        stage: StageId(0),
        fleet: FleetId(1),
        replica: ReplicaId(replica),
        adapter: false,
    };
    // The names say fleet a; the decision (found by nonce) says b's second.
    w.apply(failure(7, "a", "10.0.0.1:1", Some(decided(1, 1))), now);
    // No decision (its lease had ended): the names decide.
    w.apply(failure(8, "b", "10.0.1.1:1", None), now);
    // A decision of another topology generation is not applied.
    w.apply(failure(9, "b", "10.0.1.1:1", Some(decided(0, 1))), now);
    w.tick(now);
    let keys = shared.snapshot().failed_keys.clone();
    let a7 = keys.avoid(7, 1).expect("key 7 remembered");
    assert_eq!((a7.fleet, a7.mask), (FleetId(1), 0b10));
    let a8 = keys.avoid(8, 1).expect("key 8 remembered");
    assert_eq!((a8.fleet, a8.mask), (FleetId(1), 0b01));
    assert!(keys.avoid(9, 1).is_none());
}

#[test]
fn the_replica_view_moves_with_members_and_state_flips_only() {
    let one = "fleets:\n  - { name: a, region: us, endpoints: [\"10.0.0.1:1\"] }\n\
                   stages: [{ name: s, models: [m], fleets: [a] }]\n";
    let (shared, mut w) = Writer::new(&RouterConfig::parse_valid(one).unwrap());
    let mut view = shared.watch_replicas();
    let now = Instant::now();
    w.tick(now);
    assert!(!view.has_changed().unwrap(), "a tick changed nothing");
    let healthy = |generation| Event::Health {
        generation,
        fleet: FleetId(0),
        replica: ReplicaId(0),
        ok: true,
    };
    w.apply(healthy(1), now);
    w.drain(now);
    assert!(view.has_changed().unwrap(), "a replica turned healthy");
    view.mark_unchanged();
    w.apply(healthy(1), now);
    w.tick(now);
    assert!(
        !view.has_changed().unwrap(),
        "still healthy: nothing flipped"
    );
    let two = one.replace("[\"10.0.0.1:1\"]", "[\"10.0.0.1:1\", \"10.0.0.2:1\"]");
    w.apply(
        Event::Change {
            change: Box::new(crate::state::Change::Reload {
                config: Box::new(RouterConfig::parse_valid(&two).unwrap()),
                source: "test".into(),
            }),
            reply: None,
        },
        now,
    );
    assert!(view.has_changed().unwrap(), "a new member");
    assert_eq!(shared.snapshot().topo.fleets[0].replicas.len(), 2);
}

impl Writer {
    /// Test setup: `replicas` of `fleet` pass their health checks (twice,
    /// the default threshold) in the current topology, then the writer
    /// publishes.
    pub fn healthy(
        &mut self,
        fleet: FleetId,
        replicas: impl IntoIterator<Item = ReplicaId>,
        now: Instant,
    ) {
        let generation = self.topo.generation;
        for replica in replicas {
            for _ in 0..2 {
                self.apply(
                    Event::Health {
                        generation,
                        fleet,
                        replica,
                        ok: true,
                    },
                    now,
                );
            }
        }
        self.drain(now);
    }
}
