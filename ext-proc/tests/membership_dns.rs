//! DNS membership against a real DNS server on loopback: an authoritative
//! UDP responder for a test zone whose records the tests change at runtime,
//! speaking the wire protocol through hickory-proto's message codec.
#![allow(clippy::unwrap_used)] // test code says what it expects

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fleetroute::membership::dns::DnsWatch;
use fleetroute::membership::{self, MembershipRx, SourceCounters};
use tokio::net::UdpSocket;
use tokio::task::JoinHandle;

#[path = "common/dns.rs"]
mod dns;
use dns::{DnsServer, Zone, serve};

const DEADLINE: Duration = Duration::from_secs(15);

async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until the fleet's published set is exactly `want`.
async fn wait_members(rx: &mut MembershipRx, want: &[&str]) {
    let want: BTreeSet<SocketAddr> = want.iter().map(|s| s.parse().unwrap()).collect();
    let got = tokio::time::timeout(
        DEADLINE,
        rx.wait_for(|u| {
            u.as_ref()
                .is_some_and(|u| u.members.iter().map(|m| m.addr).collect::<BTreeSet<_>>() == want)
        }),
    )
    .await
    .is_ok_and(|r| r.is_ok());
    assert!(
        got,
        "timed out waiting for members {want:?}; last: {:?}",
        rx.borrow()
    );
}

fn watch(server: &DnsServer, name: &str, port: Option<u16>, interval: Duration) -> DnsWatch {
    DnsWatch {
        name: name.to_string(),
        port,
        interval,
        min_interval: Duration::from_millis(20),
        nameserver: Some(server.addr),
    }
}

fn start(w: DnsWatch) -> (MembershipRx, Arc<SourceCounters>, JoinHandle<()>) {
    let (tx, rx) = membership::channel("base");
    let counters = Arc::new(SourceCounters::default());
    let task = w.spawn(tx, counters.clone()).unwrap();
    (rx, counters, task)
}

#[tokio::test]
async fn dns_follows_records_that_grow_and_shrink() {
    let server = DnsServer::start().await;
    server.set_addrs("fleet.test.", &[("127.0.0.1", 30), ("127.0.0.2", 30)]);
    let (mut rx, counters, task) = start(watch(
        &server,
        "fleet.test.",
        Some(9000),
        Duration::from_millis(100),
    ));

    wait_members(&mut rx, &["127.0.0.1:9000", "127.0.0.2:9000"]).await;
    server.set_addrs(
        "fleet.test.",
        &[
            ("127.0.0.1", 30),
            ("127.0.0.2", 30),
            ("127.0.0.3", 30),
            ("::1", 30),
        ],
    );
    wait_members(
        &mut rx,
        &[
            "127.0.0.1:9000",
            "127.0.0.2:9000",
            "127.0.0.3:9000",
            "[::1]:9000",
        ],
    )
    .await;
    server.set_addrs("fleet.test.", &[("127.0.0.3", 30)]);
    wait_members(&mut rx, &["127.0.0.3:9000"]).await;

    let c = counters.snapshot();
    assert_eq!(c.updates, 3, "{c:?}");
    assert_eq!(c.failures, 0, "{c:?}");
    // Nobody listens any more: the source stops.
    drop(rx);
    let stopped = tokio::time::timeout(DEADLINE, task).await;
    assert!(stopped.is_ok_and(|r| r.is_ok()), "the source did not stop");
}

#[tokio::test]
async fn dns_resolves_again_when_the_ttl_ends_before_the_interval() {
    let server = DnsServer::start().await;
    server.set_addrs("ttl.test.", &[("127.0.0.1", 1)]);
    // An hour-long interval: only the 1 s TTL can bring the change in time.
    let (mut rx, _counters, task) = start(watch(
        &server,
        "ttl.test.",
        Some(80),
        Duration::from_secs(3600),
    ));
    wait_members(&mut rx, &["127.0.0.1:80"]).await;
    server.set_addrs("ttl.test.", &[("127.0.0.2", 1)]);
    wait_members(&mut rx, &["127.0.0.2:80"]).await;
    task.abort();
}

#[tokio::test]
async fn dns_zero_ttl_is_held_to_the_floor() {
    let server = DnsServer::start().await;
    server.set_addrs("zero.test.", &[("127.0.0.1", 0)]);
    let mut w = watch(&server, "zero.test.", Some(80), Duration::from_secs(3600));
    w.min_interval = Duration::from_millis(150);
    let (mut rx, _counters, task) = start(w);
    wait_members(&mut rx, &["127.0.0.1:80"]).await;
    let (since, t0) = (server.a_queries(), Instant::now());
    server.wait_queries(since, 4).await;
    // Four lookups after the first cannot come faster than four floors (minus the first wait's head start).
    assert!(
        t0.elapsed() >= Duration::from_millis(150 * 3),
        "{:?}",
        t0.elapsed()
    );
    task.abort();
}

#[tokio::test]
async fn dns_failure_keeps_the_last_good_set() {
    let server = DnsServer::start().await;
    server.set_addrs("fail.test.", &[("127.0.0.1", 30), ("127.0.0.2", 30)]);
    let (mut rx, counters, task) = start(watch(
        &server,
        "fail.test.",
        Some(80),
        Duration::from_millis(50),
    ));
    wait_members(&mut rx, &["127.0.0.1:80", "127.0.0.2:80"]).await;
    rx.borrow_and_update();

    server.set_servfail(true);
    wait_for("two failed lookups", || counters.snapshot().failures >= 2).await;
    assert!(
        !rx.has_changed().unwrap(),
        "a failed lookup changed the set: {:?}",
        rx.borrow()
    );

    // The server goes away entirely: still the last good set.
    let before = counters.snapshot().failures;
    let addr = server.addr;
    drop(server);
    wait_for("failed lookups against a stopped server", || {
        counters.snapshot().failures >= before + 2
    })
    .await;
    assert!(
        !rx.has_changed().unwrap(),
        "a lost server changed the set: {:?}",
        rx.borrow()
    );
    assert_eq!(rx.borrow().as_ref().unwrap().members.len(), 2);

    // A server on the same port again: the source recovers with the new records.
    // The aborted server task releases its socket asynchronously: retry the bind.
    let start = Instant::now();
    let socket = loop {
        match UdpSocket::bind(addr).await {
            Ok(s) => break s,
            Err(e) => assert!(start.elapsed() < DEADLINE, "rebinding {addr}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let zone = Arc::new(Mutex::new(Zone::default()));
    zone.lock().unwrap().addrs.insert(
        "fail.test.".into(),
        vec![("127.0.0.9".parse().unwrap(), 30)],
    );
    let revived = tokio::spawn(serve(socket, zone, Arc::new(AtomicU64::new(0))));
    wait_members(&mut rx, &["127.0.0.9:80"]).await;
    revived.abort();
    task.abort();
}

#[tokio::test]
async fn dns_empty_answer_empties_the_fleet_only_when_confirmed() {
    let server = DnsServer::start().await;
    server.set_addrs("empty.test.", &[("127.0.0.1", 30)]);
    let (mut rx, counters, task) = start(watch(
        &server,
        "empty.test.",
        Some(80),
        Duration::from_millis(50),
    ));
    wait_members(&mut rx, &["127.0.0.1:80"]).await;
    rx.borrow_and_update();

    // One empty answer, then records again: the set never changes.
    let since = server.a_queries();
    server.zone.lock().unwrap().empty_a_budget = 1;
    server.wait_queries(since, 3).await;
    assert_eq!(counters.snapshot().empty_answers, 1);
    assert!(
        !rx.has_changed().unwrap(),
        "one empty answer changed the set: {:?}",
        rx.borrow()
    );

    // Empty for good: the second empty answer in a row empties the fleet.
    server.set_addrs("empty.test.", &[]);
    wait_members(&mut rx, &[]).await;
    let c = counters.snapshot();
    assert!(c.empty_answers >= 3, "{c:?}");
    assert_eq!(c.failures, 0, "{c:?}");
    task.abort();
}

#[tokio::test]
async fn dns_srv_records_give_targets_and_ports() {
    let server = DnsServer::start().await;
    server.set_addrs("a.fleet.test.", &[("127.0.0.1", 30)]);
    server.set_addrs("b.fleet.test.", &[("127.0.0.2", 30)]);
    server.set_srv(
        "_llm._tcp.fleet.test.",
        &[(9001, "a.fleet.test."), (9002, "b.fleet.test.")],
    );
    let (mut rx, _counters, task) = start(watch(
        &server,
        "_llm._tcp.fleet.test.",
        None,
        Duration::from_millis(100),
    ));
    wait_members(&mut rx, &["127.0.0.1:9001", "127.0.0.2:9002"]).await;

    server.set_srv(
        "_llm._tcp.fleet.test.",
        &[(9001, "a.fleet.test."), (9003, "b.fleet.test.")],
    );
    wait_members(&mut rx, &["127.0.0.1:9001", "127.0.0.2:9003"]).await;
    task.abort();
}

#[test]
fn dns_watch_from_config_takes_the_port_from_srv() {
    let cfg = fleetroute::config::RouterConfig::parse(
        "fleets: [{ name: f, region: r, dns: { name: _llm._tcp.fleet.test., interval_s: 7, nameserver: '127.0.0.1:5353' } }]\n\
         stages: [{ name: s, fleets: [f] }]\n",
    )
    .unwrap();
    let fleetroute::config::Source::Dns(d) = cfg.fleets[0].source() else {
        panic!("not a dns source");
    };
    let w = DnsWatch::from_source(&d);
    assert_eq!(w.port, None);
    assert_eq!(w.interval, Duration::from_secs(7));
    assert_eq!(w.nameserver, Some("127.0.0.1:5353".parse().unwrap()));
}
