//! LoRA adapters in the replica choice: a request goes to the replica that
//! holds its adapter, a new adapter to one with room for it rather than one
//! whose GPU slots are taken, an adapter's prompt blocks are its own, and
//! an adapter keeps its name on a fleet that renames its base model.

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
    lora: {{ max_loras: 1, max_cpu_loras: 2 }}
stages:
  - {{ name: s, models: [base], adapters: [sql, chat, legal], fleets: [{{ name: pool, model: org/base }}] }}
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

/// Places (and commits) one request; its replica.
async fn send(shared: &Shared, model: &str, k: u64) -> usize {
    let mut key = key(model, k);
    stage::adapter(&shared.snapshot().topo, &mut key);
    let p = place(shared, key, 0).await.unwrap();
    p.decision.replicas.head().0
}

#[tokio::test]
async fn requests_follow_their_adapter_and_new_ones_find_room() {
    let (shared, _w) = rig(3);
    let sql = send(&shared, "sql", 1).await;
    // Other users of the adapter, whatever their key, go where it is.
    for k in 2..20 {
        assert_eq!(send(&shared, "sql", k).await, sql, "key {k}");
    }
    // A second adapter takes a replica with a free GPU slot, not the one
    // it would evict sql from; a third the last free one.
    let chat = send(&shared, "chat", 1).await;
    assert_ne!(chat, sql);
    let legal = send(&shared, "legal", 1).await;
    assert!(legal != sql && legal != chat, "{sql} {chat} {legal}");
    for k in 30..40 {
        assert_eq!(send(&shared, "chat", k).await, chat);
        assert_eq!(send(&shared, "legal", k).await, legal);
        assert_eq!(send(&shared, "sql", k).await, sql);
    }
    // The base model is not held back by any of it.
    let snap = shared.snapshot();
    let d = super::decide(&snap, &key("base", 5), 0).unwrap();
    assert_eq!(d.adapter, None);
}

#[tokio::test]
async fn an_adapters_blocks_are_its_own_and_its_name_is_kept() {
    let (shared, _w) = rig(1);
    let topo = &shared.snapshot().topo;
    let mut k = key("sql", 1);
    stage::adapter(topo, &mut k);
    let sql = AdapterId::of("sql");
    assert_eq!(k.adapter, Some(sql));
    assert_eq!(k.blocks, vec![sql.block(11), sql.block(12)]);
    let mut base = key("base", 1);
    stage::adapter(topo, &mut base);
    assert_eq!((base.adapter, base.blocks), (None, vec![11, 12]));
    // The fleet serves `base` as `org/base`; `sql` keeps its own name.
    let snap = shared.snapshot();
    let d = super::decide(&snap, &k, 0).unwrap();
    let reply = crate::request::reply::route(&snap.topo, &d, 1, "t", Some("sql"));
    assert!(
        !format!("{reply:?}").contains(SERVED_MODEL),
        "an adapter request must not be renamed to the base model"
    );
    let d = super::decide(&snap, &key("base", 1), 0).unwrap();
    let reply = crate::request::reply::route(&snap.topo, &d, 1, "t", Some("base"));
    assert!(format!("{reply:?}").contains(SERVED_MODEL));
}
