//! A DNS-sourced fleet in a running `fleetroute serve` (in process, on
//! loopback ports): its replicas come from SRV records on a loopback DNS
//! server, show in `/debug/snapshot`, take decisions over the ext_proc
//! stream, and follow the records when they change: a joiner takes
//! decisions once probed, a leaver takes none and leaves the topology.
#![allow(clippy::unwrap_used)] // test code says what it expects

mod grpc;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::google::protobuf::value::Kind;
use fleetroute::serve::{ServeOptions, serve};
use fleetroute_filter::contract::{self, RouteTag};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

#[path = "common/dns.rs"]
mod dns;
use dns::DnsServer;

const DEADLINE: Duration = Duration::from_secs(30);
const SRV_NAME: &str = "_llm._tcp.pool.test.";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A model server that only answers health checks.
async fn replica() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().route("/health", axum::routing::get(|| async { "ok" }));
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (addr, task)
}

/// Points the SRV name at these loopback ports (one target name each).
fn publish(server: &DnsServer, ports: &[u16]) {
    let records: Vec<(u16, String)> = ports
        .iter()
        .map(|p| {
            let target = format!("r{p}.pool.test.");
            server.set_addrs(&target, &[("127.0.0.1", 1)]);
            (*p, target)
        })
        .collect();
    let refs: Vec<(u16, &str)> = records.iter().map(|(p, t)| (*p, t.as_str())).collect();
    server.set_srv(SRV_NAME, &refs);
}

/// `(addr, state)` of the fleet's replicas in `/debug/snapshot`.
async fn replicas(admin: SocketAddr) -> Option<BTreeSet<(String, String)>> {
    let body = reqwest::get(format!("http://{admin}/debug/snapshot"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    let fleet = v["fleets"].as_array()?.first()?;
    Some(
        fleet["replicas"]
            .as_array()?
            .iter()
            .map(|r| {
                (
                    r["addr"].as_str().unwrap_or_default().to_string(),
                    r["state"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect(),
    )
}

async fn wait_replicas(admin: SocketAddr, want: &[(SocketAddr, &str)]) {
    let want: BTreeSet<(String, String)> = want
        .iter()
        .map(|(a, s)| (a.to_string(), s.to_string()))
        .collect();
    let start = Instant::now();
    let mut last = None;
    while start.elapsed() < DEADLINE {
        last = replicas(admin).await;
        if last.as_ref() == Some(&want) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for replicas {want:?}; last: {last:?}");
}

/// The replicas `n` requests were routed to, over one ext_proc stream each.
async fn decisions(grpc: SocketAddr, n: usize) -> BTreeSet<String> {
    let mut client = ExternalProcessorClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();
    let mut hosts = BTreeSet::new();
    for i in 0..n {
        let (tx, rx) = mpsc::channel(1);
        let id = format!("req-{i}-{}", fastrand::u64(..));
        let headers = [
            (":path", "/v1/chat/completions"),
            ("x-request-id", id.as_str()),
            (contract::MODEL, "m"),
        ];
        tx.send(grpc::headers(&headers)).await.unwrap();
        let mut replies = client
            .process(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        let reply = tokio::time::timeout(DEADLINE, replies.message())
            .await
            .unwrap()
            .unwrap()
            .expect("a reply");
        let meta = reply.dynamic_metadata.expect("a routed request");
        let Some(Kind::StructValue(ns)) = &meta.fields[contract::ROUTE_NAMESPACE].kind else {
            panic!("no route namespace");
        };
        let Some(Kind::StringValue(tag)) = &ns.fields[contract::ROUTE_KEY].kind else {
            panic!("no route tag");
        };
        hosts.insert(
            RouteTag::decode(tag)
                .expect("a route tag")
                .replica
                .to_string(),
        );
    }
    hosts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dns_fleet_follows_its_records_into_the_snapshot_and_the_decisions() {
    let server = DnsServer::start().await;
    let (a, _ta) = replica().await;
    let (b, _tb) = replica().await;
    let (c, _tc) = replica().await;
    publish(&server, &[a.port(), b.port()]);

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("router.yaml");
    std::fs::write(
        &config,
        format!(
            "health_check: {{ interval_ms: 100, timeout_ms: 100, healthy_threshold: 1 }}\n\
             engine_metrics: {{ interval_ms: 0 }}\n\
             membership: {{ removal_grace_ms: 3000 }}\n\
             fleets:\n  - name: pool\n    region: us\n    \
             dns: {{ name: '{SRV_NAME}', interval_s: 1, nameserver: '{}' }}\n\
             stages: [{{ name: s, models: [m], fleets: [pool] }}]\n",
            server.addr
        ),
    )
    .unwrap();
    let grpc: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let router = tokio::spawn(serve(ServeOptions {
        config,
        grpc,
        admin,
        admin_token: None,
        envoy_admin: None,
        instance_id: None,
        drain: fleetroute::shutdown::DRAIN,
    }));

    // The records' members appear, are probed, and take decisions.
    wait_replicas(admin, &[(a, "ready"), (b, "ready")]).await;
    let hosts = decisions(grpc, 40).await;
    assert_eq!(hosts, [a.to_string(), b.to_string()].into(), "{hosts:?}");

    // b leaves, c joins: c takes decisions once probed, b takes none. b
    // still holds the leases of its decisions (no access log reports their
    // end here), so it stays, leaving, until the grace ends.
    publish(&server, &[a.port(), c.port()]);
    wait_replicas(admin, &[(a, "ready"), (b, "leaving"), (c, "ready")]).await;
    // These requests carry no key (each id hashes anew), so how they split
    // between a and c is not what is tested here: only that c takes some
    // and b none.
    let hosts = decisions(grpc, 20).await;
    assert!(hosts.contains(&c.to_string()), "{hosts:?}");
    assert!(
        hosts.is_subset(&[a.to_string(), c.to_string()].into()),
        "{hosts:?}"
    );
    wait_replicas(admin, &[(a, "ready"), (c, "ready")]).await;

    // The source's counters and the fleet's size are exported.
    let metrics = reqwest::get(format!("http://{admin}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let value = |name: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}{{fleet=\"pool\"}} ")))
            .and_then(|v| v.parse::<f64>().ok())
    };
    assert!(
        value("fleetroute_membership_updates_total") >= Some(2.0),
        "{metrics}"
    );
    assert_eq!(value("fleetroute_membership_failures_total"), Some(0.0));
    assert_eq!(value("fleetroute_fleet_members"), Some(2.0));
    router.abort();
}
