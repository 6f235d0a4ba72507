//! Packed fleets in the replica choice: every request of a stage whose
//! fleet packs models holds its model; it goes where the model is loaded,
//! even to a busier replica, rather than loading it elsewhere; a model no
//! replica holds goes to one with a free slot; an alias is renamed to the
//! name the replicas know; a dedicated fleet of the same stage ignores it.

use std::sync::Arc;
use std::time::Instant;

use fleetroute_filter::contract::{KeySource, SERVED_MODEL};

use super::key::RouteKey;
use super::stage;
use crate::config::RouterConfig;
use crate::request::place::place;
use crate::state::{Event, Shared, Writer};
use crate::topology::{AdapterId, FleetId, ReplicaId};

fn rig(replicas: usize) -> (Arc<Shared>, Writer) {
    let eps: Vec<String> = (1..=replicas)
        .map(|i| format!("\"10.0.0.{i}:1\""))
        .collect();
    let text = format!(
        r#"
grpc: {{ trusted_network: true }}
fleets:
  - name: pool
    region: us
    endpoints: [{}]
    packing: {{ max_models: 1, load_ms: 2000 }}
stages:
  - {{ name: a, models: [a, a-latest], fleets: [pool] }}
  - {{ name: b, fleets: [pool] }}
  - {{ name: c, fleets: [pool] }}
"#,
        eps.join(", ")
    );
    let cfg = RouterConfig::parse_valid(&text).unwrap();
    let (shared, mut w) = Writer::new(&cfg);
    let now = Instant::now();
    for r in 0..replicas {
        for _ in 0..2 {
            w.apply(
                Event::Health {
                    generation: 1,
                    fleet: FleetId(0),
                    replica: ReplicaId(r),
                    ok: true,
                },
                now,
            );
        }
    }
    w.drain(now);
    (shared, w)
}

fn key(model: &str, k: u64) -> RouteKey<'_> {
    RouteKey {
        model: Some(model),
        key: k,
        key_source: Some(KeySource::User),
        blocks: vec![11, 12],
        block_tokens: 16,
        prompt_tokens: 40,
        ..Default::default()
    }
}

/// Places (and commits) one request, kept in flight: its replica.
async fn send(
    shared: &Shared,
    model: &str,
    k: u64,
    keep: &mut Vec<crate::request::place::Placed>,
) -> usize {
    let mut key = key(model, k);
    stage::adapter(&shared.snapshot().topo, &mut key);
    let p = place(shared, key, 0).await.unwrap();
    let r = p.decision.replicas.head().0;
    keep.push(p);
    r
}

#[tokio::test]
async fn requests_stay_where_their_model_is_loaded_and_new_models_find_room() {
    let (shared, _w) = rig(3);
    let mut inflight = Vec::new();
    let a = send(&shared, "a", 1, &mut inflight).await;
    // Twenty more in flight for a: its replica is far busier than the
    // idle ones, and still cheaper than a two-second load.
    for k in 2..22 {
        assert_eq!(send(&shared, "a", k, &mut inflight).await, a, "key {k}");
    }
    let b = send(&shared, "b", 1, &mut inflight).await;
    assert_ne!(b, a, "b would evict a");
    let c = send(&shared, "c", 1, &mut inflight).await;
    assert!(c != a && c != b, "{a} {b} {c}");
    for k in 30..35 {
        assert_eq!(send(&shared, "b", k, &mut inflight).await, b);
        assert_eq!(send(&shared, "a-latest", k, &mut inflight).await, a);
    }
}

#[tokio::test]
async fn a_packed_stage_holds_its_model_under_the_name_the_replicas_know() {
    let (shared, _w) = rig(1);
    let snap = shared.snapshot();
    let mut k = key("a-latest", 1);
    stage::adapter(&snap.topo, &mut k);
    let a = AdapterId::of("a");
    assert_eq!(k.adapter, Some(a));
    assert_eq!(k.blocks, vec![a.block(11), a.block(12)]);
    let d = super::decide(&snap, &k, 0).unwrap();
    assert_eq!(d.adapter.map(|x| x.0), Some(a));
    // Nothing loaded yet: the decision expects the load.
    assert_eq!(d.adapter.map(|x| x.1), Some(20_000.0));
    // The alias goes upstream as the stage's model.
    let reply = crate::request::reply::route(&snap.topo, &d, 1, "t", Some("a-latest"));
    let text = format!("{reply:?}");
    assert!(text.contains(SERVED_MODEL), "{text}");
    let reply = crate::request::reply::route(&snap.topo, &d, 1, "t", Some("a"));
    assert!(!format!("{reply:?}").contains(SERVED_MODEL));
}
