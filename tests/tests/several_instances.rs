//! Two fleetroute instances behind one real Envoy: Envoy's access log
//! reaches either instance, and the deciding one must still learn each
//! request's end (forwarded over the peer link); killing one instance under
//! load fails no request, and a restarted one takes calls again.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use fleetroute_tests::harness::client::{chat_body, post};
use fleetroute_tests::harness::scenario::{FAST_ENGINES, chat_url};
use fleetroute_tests::harness::{Lab, LabSpec, pace, wait_for_value, wait_until};

const ENGINE: &str = env!("CARGO_BIN_EXE_fleetroute-engine");

/// One stage over one fleet of four replicas.
const ONE_FLEET: &str = r#"
health_check: { interval_ms: 500, timeout_ms: 500, healthy_threshold: 1, unhealthy_threshold: 3 }
default_stage: chat
fleets:
  - name: pool
    region: us
    endpoints: ["{r1}", "{r2}", "{r3}", "{r4}"]
stages:
  - { name: chat, models: [m1], fleets: [pool] }
"#;

fn lab(peers_redis: bool) -> Lab {
    Lab::start(
        ENGINE,
        LabSpec {
            router: ONE_FLEET,
            engine_args: FAST_ENGINES,
            instances: Some(2),
            peers_redis,
            ..Default::default()
        },
    )
}

fn both(lab: &Lab, metric: &str, labels: &[&str]) -> f64 {
    (0..2)
        .map(|i| lab.instance_metric(i, metric, labels).unwrap_or(0.0))
        .sum()
}

/// Entries any instance received from Envoy, whatever became of them.
fn entries(lab: &Lab) -> f64 {
    both(lab, "fleetroute_access_log_entries_total", &[])
}

/// A conversation's turn: its opening (four blocks of its own text) plus
/// four blocks per earlier turn, so every turn extends the last one's
/// prefix by more than the replica choice's tie band.
fn turn(conv: usize, t: usize) -> String {
    let mut text = format!("conversation {conv} ").repeat(240);
    for k in 0..t {
        text.push_str(&format!("turn {k} of {conv}: ").repeat(280));
    }
    text
}

/// Four conversations of `turns` turns each, one thread each, turns in
/// sequence: (requests, turns served by the replica that served the
/// conversation's first turn).
fn conversations(lab: &Lab, turns: usize) -> (usize, usize) {
    let url = chat_url(lab);
    std::thread::scope(|s| {
        let threads: Vec<_> = (0..4)
            .map(|c| {
                let url = &url;
                s.spawn(move || {
                    let mut first = None;
                    let mut stayed = 0;
                    for t in 0..turns {
                        let r = post(url, chat_body("m1", None, &turn(c, t), false), &[]);
                        assert_eq!(r.status, 200, "conversation {c} turn {t}: {}", r.body);
                        let by = r.served_by().to_string();
                        if first.get_or_insert_with(|| by.clone()) == &by {
                            stayed += 1;
                        }
                    }
                    stayed
                })
            })
            .collect();
        let stayed = threads.into_iter().map(|t| t.join().unwrap()).sum();
        (4 * turns, stayed)
    })
}

/// Figures of one run: (foreign entries, leases held once every entry had
/// arrived, seconds until no instance held a lease, turns that stayed).
fn access_log_run(peers_redis: bool) -> (f64, u64, f64, usize, usize) {
    let lab = lab(peers_redis);
    let before = entries(&lab);
    let (sent, stayed) = conversations(&lab, 20);
    wait_until(
        "every access log entry to reach an instance",
        Duration::from_secs(10),
        || entries(&lab) >= before + sent as f64,
    );
    let arrived = Instant::now();
    // The load each instance still counts (its leases), read live.
    let held: u64 = (0..2).filter_map(|i| lab.instance_inflight(i)).sum();
    let foreign = both(
        &lab,
        "fleetroute_access_log_entries_total",
        &["result=\"foreign\""],
    );
    wait_until("every lease to end", Duration::from_secs(30), || {
        (0..2).all(|i| lab.instance_inflight(i) == Some(0))
    });
    let drained = arrived.elapsed().as_secs_f64();
    if peers_redis {
        let sent_fwd = both(
            &lab,
            "fleetroute_access_log_forwards_total",
            &["result=\"sent\""],
        );
        let received = both(
            &lab,
            "fleetroute_access_log_forwards_total",
            &["result=\"received\""],
        );
        let bytes = both(&lab, "fleetroute_peer_bytes_total", &["result=\"sent\""]);
        let updates = both(
            &lab,
            "fleetroute_peer_prefix_updates_total",
            &["result=\"applied\""],
        );
        println!(
            "peer link: {sent_fwd} entries forwarded, {received} received; {updates} prefix changes applied; {bytes} bytes sent ({:.0} per routed request)",
            bytes / sent as f64
        );
        assert!(
            received > 0.0 && received <= sent_fwd,
            "{received} of {sent_fwd}"
        );
        assert!(updates > 0.0, "no prefix change crossed the link");
        assert_eq!(both(&lab, "fleetroute_peers_up", &[]), 2.0);
    }
    (foreign, held, drained, sent, stayed)
}

#[test]
fn the_deciding_instance_learns_every_end() {
    let (foreign, held, drained, sent, stayed) = access_log_run(false);
    println!(
        "alone: {sent} requests, {foreign} entries reached the other instance; {held} leases still held once every entry had arrived, all ended after {drained:.1} s; {stayed} turns stayed on their first replica"
    );
    // Envoy's workers each log to one instance while their routing calls
    // alternate: entries do reach the instance that did not decide them,
    // and without forwarding their leases outlive the requests.
    assert!(foreign > 0.0, "no entry reached the other instance");
    assert!(held > 0, "no lease outlived its request without forwarding");

    let (foreign, held, drained, sent, stayed) = access_log_run(true);
    println!(
        "forwarded: {sent} requests, {foreign} entries reached the other instance; {held} leases still held once every entry had arrived, all ended after {drained:.1} s; {stayed} turns stayed on their first replica"
    );
    assert!(foreign > 0.0, "no entry reached the other instance");
    // Forwarded, every lease ends long before its 10 s floor.
    assert!(drained < 5.0, "leases ended only after {drained:.1} s");
}

#[test]
fn killing_one_of_two_instances_fails_no_request() {
    let mut lab = lab(false);
    let url = chat_url(&lab);
    let stop = AtomicBool::new(false);
    let (done, failed) = (AtomicU64::new(0), AtomicU64::new(0));
    let fail_open = |lab: &Lab| lab.envoy_stat("http.inference.ext_proc.failure_mode_allowed");
    let decided = |lab: &Lab, i: usize| {
        lab.instance_metric(i, "fleetroute_requests_total", &[])
            .unwrap_or(0.0)
    };
    std::thread::scope(|s| {
        // Bounded steady load: 4 clients, one request at a time each, at
        // most 3000 each, about 100 requests per second in all.
        for w in 0..4 {
            let (url, stop, done, failed) = (&url, &stop, &done, &failed);
            s.spawn(move || {
                for i in 0..3000 {
                    if stop.load(Relaxed) {
                        break;
                    }
                    let body = chat_body("m1", Some(&format!("c{w}-{}", i % 16)), "hi", false);
                    let r = post(url, body, &[]);
                    if r.status != 200 {
                        failed.fetch_add(1, Relaxed);
                        eprintln!("request {w}/{i}: {} {}", r.status, r.body);
                    }
                    done.fetch_add(1, Relaxed);
                    pace(Duration::from_millis(40));
                }
            });
        }
        wait_until(
            "both instances taking calls",
            Duration::from_secs(20),
            || decided(&lab, 0) > 20.0 && decided(&lab, 1) > 20.0,
        );
        let opened_before = fail_open(&lab);
        let done_before = done.load(Relaxed);
        let killed = Instant::now();
        lab.kill_instance(1);
        // Until no call has failed open for 2 s of load: the last one marks
        // when every call went to the survivor.
        let mut last = (opened_before, killed);
        wait_until(
            "calls to stop failing open",
            Duration::from_secs(30),
            || {
                let now = fail_open(&lab);
                if now != last.0 {
                    last = (now, Instant::now());
                }
                last.1.elapsed() > Duration::from_secs(2)
            },
        );
        let opened = last.0 - opened_before;
        let gap = last.1.duration_since(killed);
        let during = done.load(Relaxed) - done_before;
        let unhealthy = lab.envoy_stat("cluster.fleetroute.health_check.failure");
        let ejected =
            lab.envoy_stat("cluster.fleetroute.outlier_detection.ejections_enforced_total");
        println!(
            "killed instance 1 under load: {opened} of {during} requests since failed open; the last {:.0} ms after the kill; {unhealthy} failed health checks, {ejected} outlier ejections",
            gap.as_secs_f64() * 1000.0
        );

        // Back: it takes calls again.
        lab.restart_instance(1);
        let restarted = Instant::now();
        let back = wait_for_value(Duration::from_secs(20), || {
            (decided(&lab, 1) > 5.0).then(|| restarted.elapsed())
        });
        stop.store(true, Relaxed);
        let back = back.expect("the restarted instance never took calls");
        println!(
            "restarted instance 1 took calls again {:.0} ms after it was ready",
            back.as_secs_f64() * 1000.0
        );
    });
    let (done, failed) = (done.load(Relaxed), failed.load(Relaxed));
    println!("{done} requests in all, {failed} failed");
    assert!(done > 100, "too little load: {done} requests");
    assert_eq!(failed, 0, "requests failed while an instance died");
}
