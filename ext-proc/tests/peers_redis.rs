//! Two instances' state linked through a real `redis-server`: a decision's
//! prefix reaches the other instance's index (and not its own twice), an
//! access log entry that reached the wrong instance ends its lease at the
//! owner, and Redis going away and coming back loses neither; each sees the
//! other's load, once, and stops counting it when Redis goes away.
#![allow(clippy::unwrap_used)] // test code says what it expects

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::envoy::data::accesslog::v3::{
    AccessLogCommon, HttpAccessLogEntry, HttpResponseProperties,
};
use envoy_types::pb::google::protobuf::UInt32Value;
use envoy_types::pb::google::protobuf::value::Kind;
use fleetroute::config::RouterConfig;
use fleetroute::observe::access_log;
use fleetroute::peers::{self, PeerLink};
use fleetroute::request::{place::place, reply};
use fleetroute::route::key::RouteKey;
use fleetroute::state::lease::LeaseInput;
use fleetroute::state::prefix_index::Matches;
use fleetroute::state::{Event, Shared, Writer};
use fleetroute::topology::{FleetId, ReplicaId};
use fleetroute_test_kit::RedisServer as Redis;

struct Node {
    shared: Arc<Shared>,
    link: PeerLink,
}

fn node(url: &str, name: &str) -> Node {
    let cfg = RouterConfig::parse_valid(&format!(
        "peers: {{ redis_url: \"{url}\", flush_ms: 10, load_stale_ms: 300 }}\n\
         fleets: [{{ name: pool, region: r, endpoints: [\"10.0.0.1:1\", \"10.0.0.2:1\"] }}]\n\
         stages: [{{ name: s, models: [m], fleets: [pool] }}]\n"
    ))
    .unwrap();
    let (shared, mut writer) = Writer::named(&cfg, name.into());
    for r in 0..2 {
        shared.emit(Event::Health {
            generation: shared.snapshot().topo.generation,
            fleet: FleetId(0),
            replica: ReplicaId(r),
            ok: true,
        });
    }
    let updates = writer.share_updates();
    tokio::spawn(writer.run());
    let started = peers::start(shared.clone(), &cfg.peers, name, updates).unwrap();
    tokio::spawn(fleetroute::observe::access_log::receive(
        shared.clone(),
        started.forwarded,
    ));
    Node {
        shared,
        link: started.link,
    }
}

/// Blocks of `blocks` the node's index holds for replica `r`.
fn held(n: &Node, blocks: &[u64], r: usize) -> u16 {
    let mut m = Matches::default();
    n.shared.snapshot().fleets[0].prefix.matches(blocks, &mut m);
    m[ReplicaId(r)]
}

/// Leases held (the cache counts after its pending work has run).
fn leases(n: &Node) -> u64 {
    n.shared.leases.run_pending();
    n.shared.leases.held()
}

fn metric(n: &Node, name: &str, label: &str) -> f64 {
    n.shared
        .metrics
        .render()
        .lines()
        .filter(|l| l.starts_with(name) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn until(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Routes a request with `blocks` at `n`; (replica, its lease's metadata).
async fn route(n: &Node, blocks: Vec<u64>, name: &str) -> (usize, Metadata) {
    let key = RouteKey {
        model: Some("m"),
        key: 7,
        blocks,
        block_tokens: 16,
        prompt_tokens: 64,
        ..Default::default()
    };
    let p = place(&n.shared, key, 1).await.expect("routed");
    let replica = p.decision.replicas.head().index();
    let reply = reply::route(&p.snapshot.topo, &p.decision, p.nonce, name, None);
    let decided = p.decided();
    n.shared
        .hold_load(p.nonce, p.guard, decided, &LeaseInput::default(), None);
    let mut md = Metadata::default();
    for (ns, v) in reply.dynamic_metadata.unwrap().fields {
        if let Some(Kind::StructValue(s)) = v.kind {
            md.filter_metadata.insert(ns, s);
        }
    }
    (replica, md)
}

fn entry(md: Metadata) -> HttpAccessLogEntry {
    HttpAccessLogEntry {
        common_properties: Some(AccessLogCommon {
            metadata: Some(md),
            custom_tags: HashMap::from([("ttfb_us".to_string(), "1000".to_string())]),
            ..Default::default()
        }),
        response: Some(HttpResponseProperties {
            response_code: Some(UInt32Value { value: 200 }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_prefixes_and_ends_through_redis() {
    let Some(mut redis) = Redis::start() else {
        return;
    };
    let url = format!("redis://127.0.0.1:{}/", redis.port);
    let (a, b) = (node(&url, "a"), node(&url, "b"));
    until("both ready", || {
        [&a, &b]
            .iter()
            .all(|n| n.shared.snapshot().replicas[0].values().all(|r| r.ready()))
    })
    .await;

    // A routes; B learns where the prefix went; A does not apply its own.
    let blocks = vec![11, 12, 13];
    let (r, _) = route(&a, blocks.clone(), "a").await;
    until("B to hold A's prefix", || held(&b, &blocks, r) == 3).await;
    assert_eq!(
        metric(&a, "fleetroute_peer_prefix_updates_total", "applied"),
        0.0
    );
    assert!(metric(&b, "fleetroute_peer_bytes_total", "received") > 0.0);

    // B decided; Envoy logged the entry to A: A forwards it, B ends the lease.
    let (_, md) = route(&b, vec![21, 22], "b").await;
    assert_eq!(leases(&b), 1);
    access_log::observe(&a.shared, Some(&a.link), &entry(md));
    until("B's lease to end", || leases(&b) == 0).await;
    // B published its own change only: A's, applied at B, did not echo.
    assert_eq!(
        metric(&b, "fleetroute_peer_prefix_updates_total", "queued"),
        1.0
    );
    assert_eq!(
        metric(&a, "fleetroute_peer_prefix_updates_total", "queued"),
        1.0
    );
    assert_eq!(
        metric(&b, "fleetroute_access_log_forwards_total", "received"),
        1.0
    );
    assert_eq!(leases(&a), 1, "A's own lease is untouched");

    // Redis goes away: both say so and route alone; A's change waits.
    redis.stop();
    until("both to see Redis gone", || {
        metric(&a, "fleetroute_peers_up", "") == 0.0 && metric(&b, "fleetroute_peers_up", "") == 0.0
    })
    .await;
    let later = vec![31, 32, 33, 34];
    let (r, _) = route(&a, later.clone(), "a").await;
    assert_eq!(held(&b, &later, r), 0);
    // Back (empty): A's pending change reaches B.
    redis.restart();
    until("B to catch up", || held(&b, &later, r) == 4).await;
    assert_eq!(metric(&a, "fleetroute_peers_up", ""), 1.0);
}

/// (requests in flight, prefill tokens) `n` counts from its peers on `r`.
fn peer_load(n: &Node, r: usize) -> (u32, u64) {
    let p = n.shared.snapshot().topo.fleets[0].replicas[ReplicaId(r)]
        .load
        .peers();
    (p.inflight, p.pending_prefill)
}

fn total_inflight(n: &Node, r: usize) -> u32 {
    n.shared.snapshot().topo.fleets[0].replicas[ReplicaId(r)]
        .load
        .inflight()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_see_each_others_load_while_it_is_fresh() {
    let Some(mut redis) = Redis::start() else {
        return;
    };
    let url = format!("redis://127.0.0.1:{}/", redis.port);
    let (a, b) = (node(&url, "a"), node(&url, "b"));
    until("both ready", || {
        [&a, &b]
            .iter()
            .all(|n| n.shared.snapshot().replicas[0].values().all(|r| r.ready()))
    })
    .await;

    // A holds a request: B counts it on the same replica, A only once.
    let (r, md) = route(&a, vec![41, 42], "a").await;
    until("B to see A's request", || peer_load(&b, r).0 == 1).await;
    assert!(peer_load(&b, r).1 > 0, "A's queued prefill is shared too");
    assert_eq!(total_inflight(&b, r), 1);
    assert_eq!(peer_load(&b, 1 - r), (0, 0));
    assert_eq!(peer_load(&a, r), (0, 0), "A's own report is not read back");
    assert_eq!(total_inflight(&a, r), 1);
    assert_eq!(metric(&b, "fleetroute_peer_load_peers", ""), 1.0);
    assert!(metric(&a, "fleetroute_peer_load_reports_total", "result=\"sent\"") > 0.0);

    // Its end (logged at B, forwarded to A) clears it at B at once, long
    // before the staleness bound.
    access_log::observe(&b.shared, Some(&b.link), &entry(md));
    until("A's lease to end", || leases(&a) == 0).await;
    until("B to see it end", || peer_load(&b, r).0 == 0).await;

    // Redis goes away while A holds load: B drops it within the bound.
    let (r, _) = route(&a, vec![51, 52], "a").await;
    until("B to see A's second request", || peer_load(&b, r).0 == 1).await;
    redis.stop();
    let gone = Instant::now();
    until("B to stop counting A", || {
        peer_load(&b, r) == (0, 0) && metric(&b, "fleetroute_peer_load_peers", "") == 0.0
    })
    .await;
    let dropped_after = gone.elapsed();
    assert_eq!(total_inflight(&a, r), 1, "A still counts its own");
    // Back: A's unchanged report is refreshed and counts again.
    redis.restart();
    until("B to see A's load again", || peer_load(&b, r).0 == 1).await;
    eprintln!(
        "B dropped A's load {} ms after Redis went away",
        dropped_after.as_millis()
    );
}
