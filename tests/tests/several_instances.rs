//! Two fleetroute instances behind one real Envoy: Envoy's access log
//! reaches either instance, and the deciding one must still learn each
//! request's end (forwarded over the peer link); each sees the other's load
//! and stops counting a dead one's; killing one instance under load fails
//! no request, and a restarted one takes calls again.
#![cfg(feature = "e2e")] // needs Envoy and the built binaries: scripts/test.sh

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use fleetroute_tests::harness::client::{blocking_get, chat_body, chat_body_tokens, post};
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

/// Requests (one per poll, for at most 10 s) until each instance has
/// routed one and every entry has arrived. Envoy's workers may keep calling
/// the first instance that passed its health checks for a second or two
/// after the other passes too; a run in that time has nothing foreign.
fn warm_up(lab: &Lab) {
    let url = chat_url(lab);
    let mut sent = 0.0;
    wait_until(
        "both instances to route calls",
        Duration::from_secs(10),
        || {
            let r = post(&url, chat_body("m1", None, "warm-up", false), &[]);
            assert_eq!(r.status, 200, "warm-up: {}", r.body);
            sent += 1.0;
            (0..2).all(|i| {
                lab.instance_metric(i, "fleetroute_requests_total", &[])
                    .unwrap_or(0.0)
                    > 0.0
            })
        },
    );
    wait_until("the warm-up's entries", Duration::from_secs(10), || {
        entries(lab) >= sent
    });
}

/// Figures of one run: (foreign entries, leases held once every entry had
/// arrived, seconds until no instance held a lease, turns that stayed).
fn access_log_run(peers_redis: bool) -> (f64, u64, f64, usize, usize) {
    let lab = lab(peers_redis);
    warm_up(&lab);
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
        // Nothing to forward when Envoy sent every entry to the deciding
        // instance; `access_log_run_mixed` runs again then.
        assert!(received <= sent_fwd, "{received} of {sent_fwd}");
        if foreign > 0.0 {
            assert!(received > 0.0, "{foreign} foreign entries, none forwarded");
        }
        assert!(updates > 0.0, "no prefix change crossed the link");
        assert_eq!(both(&lab, "fleetroute_peers_up", &[]), 2.0);
    }
    (foreign, held, drained, sent, stayed)
}

/// `access_log_run`, again (at most three runs) while no entry reached the
/// instance that did not decide it: which instance Envoy's access log
/// streams go to is Envoy's choice, and it sometimes sends every entry of a
/// run to one, which leaves nothing to test.
fn access_log_run_mixed(forward: bool) -> (f64, u64, f64, usize, usize) {
    let mut run = access_log_run(forward);
    for _ in 1..3 {
        if run.0 > 0.0 {
            break;
        }
        println!("no entry reached the other instance; running again");
        run = access_log_run(forward);
    }
    run
}

#[test]
fn the_deciding_instance_learns_every_end() {
    let (foreign, held, drained, sent, stayed) = access_log_run_mixed(false);
    println!(
        "alone: {sent} requests, {foreign} entries reached the other instance; {held} leases still held once every entry had arrived, all ended after {drained:.1} s; {stayed} turns stayed on their first replica"
    );
    // Envoy's workers each log to one instance while their routing calls
    // alternate: entries do reach the instance that did not decide them,
    // and without forwarding their leases outlive the requests.
    assert!(foreign > 0.0, "no entry reached the other instance");
    assert!(held > 0, "no lease outlived its request without forwarding");

    let (foreign, held, drained, sent, stayed) = access_log_run_mixed(true);
    println!(
        "forwarded: {sent} requests, {foreign} entries reached the other instance; {held} leases still held once every entry had arrived, all ended after {drained:.1} s; {stayed} turns stayed on their first replica"
    );
    assert!(foreign > 0.0, "no entry reached the other instance");
    // Forwarded, every lease ends long before its 10 s floor.
    assert!(drained < 5.0, "leases ended only after {drained:.1} s");
}

/// `ONE_FLEET` with replicas that take at most 4 requests at once before
/// the bounded-load guard sends new ones elsewhere.
fn capped_fleet() -> String {
    ONE_FLEET.replace(
        "endpoints: [\"{r1}\", \"{r2}\", \"{r3}\", \"{r4}\"]",
        "endpoints: [\"{r1}\", \"{r2}\", \"{r3}\", \"{r4}\"]\n    capacity: { max_inflight: 4 }",
    )
}

/// Long requests in the burst: 15000 tokens at 1 ms each, so all of them
/// are still running when the burst's last one is placed.
const BURST: usize = 12;
const BURST_TOKENS: u32 = 15_000;

struct BurstRun {
    /// Bytes written to Redis per routed request of 40 conversation turns.
    bytes_per_request: f64,
    /// Burst requests in flight per replica once all were placed.
    placed: BTreeMap<String, u64>,
    /// Milliseconds until the survivor stopped counting a killed peer's load.
    dead_peer_dropped_ms: Option<f64>,
    /// Burst requests each instance decided (its own leases).
    decided: [u64; 2],
    /// Replicas that served the burst, by requests.
    served: BTreeMap<String, u64>,
}

/// Per replica, the requests in flight that instance `i` counts (its own
/// plus its peers' fresh reports), or that all instances hold (`None`).
fn view(lab: &Lab, i: Option<usize>) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for k in 0..2 {
        if i.is_some_and(|i| i != k) {
            continue;
        }
        for (addr, (own, peer)) in lab.instance_replica_load(k).unwrap_or_default() {
            *out.entry(addr).or_default() += own + if i.is_some() { peer } else { 0 };
        }
    }
    out
}

/// Hosts of Envoy's `fleetroute` cluster that pass its health checks.
fn envoy_healthy_instances(lab: &Lab) -> usize {
    let url = format!("{}/clusters", lab.envoy_admin);
    blocking_get(&url).map_or(0, |(_, body)| {
        body.lines()
            .filter(|l| l.starts_with("fleetroute::") && l.ends_with("::health_flags::healthy"))
            .count()
    })
}

fn total(v: &BTreeMap<String, u64>) -> u64 {
    v.values().sum()
}

/// Two instances with the peer link (sharing load or not): 40 conversation
/// turns to weigh the link's bytes, then a burst of long requests with one
/// conversation key, which both instances' rendezvous order sends to the
/// same replica until its load says otherwise. Each is placed only once
/// the one before is counted (and, sharing load, once both instances see
/// it), so what decides is what each instance knows, not timing.
fn burst_run(share_load: bool) -> BurstRun {
    let router = capped_fleet();
    let mut lab = Lab::start(
        ENGINE,
        LabSpec {
            router: &router,
            engine_args: FAST_ENGINES,
            instances: Some(2),
            peers_redis: true,
            peers_options: if share_load { "" } else { "load_stale_ms: 0" },
            ..Default::default()
        },
    );
    let sent_bytes = |lab: &Lab| both(lab, "fleetroute_peer_bytes_total", &["result=\"sent\""]);
    let bytes_before = sent_bytes(&lab);
    let (turns, _) = conversations(&lab, 10);
    let bytes_per_request = (sent_bytes(&lab) - bytes_before) / turns as f64;
    wait_until("the turns' leases to end", Duration::from_secs(30), || {
        total(&view(&lab, None)) == 0 && (0..2).all(|i| total(&view(&lab, Some(i))) == 0)
    });

    let url = chat_url(&lab);
    let mut dead_peer_dropped_ms = None;
    let mut decided = [0; 2];
    let mut placed = BTreeMap::new();
    let mut served = BTreeMap::new();
    // Envoy picks the instance, and sometimes sends a whole burst to one
    // (seen both with one instance's health check timed out on a loaded
    // machine and with both healthy), which shows nothing. Such a burst is
    // run again (at most three in all).
    for attempt in 1..=3 {
        wait_until(
            "Envoy to check both instances healthy",
            Duration::from_secs(30),
            || envoy_healthy_instances(&lab) == 2,
        );
        served = std::thread::scope(|s| {
            let mut threads = Vec::new();
            for k in 0..BURST {
                let url = &url;
                threads.push(s.spawn(move || {
                    let body =
                        chat_body_tokens("m1", Some("hot"), "a long answer", false, BURST_TOKENS);
                    let r = post(url, body, &[]);
                    assert_eq!(r.status, 200, "burst request {k}: {}", r.body);
                    r.served_by().to_string()
                }));
                let n = k as u64 + 1;
                wait_until(
                    "the burst request to be placed",
                    Duration::from_secs(20),
                    || total(&view(&lab, None)) == n,
                );
                if share_load {
                    wait_until(
                        "both instances to count it",
                        Duration::from_secs(10),
                        || (0..2).all(|i| total(&view(&lab, Some(i))) == n),
                    );
                }
            }
            placed = view(&lab, None);
            for (i, d) in decided.iter_mut().enumerate() {
                *d = lab
                    .instance_replica_load(i)
                    .map_or(0, |v| v.values().map(|&(own, _)| own).sum());
            }
            let both_decided = decided.iter().all(|&d| d > 0);
            if share_load && both_decided {
                // Both see every replica's load as it is.
                for i in 0..2 {
                    assert_eq!(view(&lab, Some(i)), placed, "instance {i}'s view");
                }
                // A killed peer's load stops counting within the bound.
                lab.kill_instance(1);
                let killed = Instant::now();
                wait_until(
                    "the survivor to drop the dead peer's load",
                    Duration::from_secs(10),
                    || {
                        lab.instance_replica_load(0)
                            .is_some_and(|v| v.values().all(|&(_, peer)| peer == 0))
                            && lab.instance_metric(0, "fleetroute_peer_load_peers", &[])
                                == Some(0.0)
                    },
                );
                dead_peer_dropped_ms = Some(killed.elapsed().as_secs_f64() * 1000.0);
            }
            let mut served = BTreeMap::new();
            for t in threads {
                *served.entry(t.join().unwrap()).or_default() += 1;
            }
            served
        });
        if decided.iter().all(|&d| d > 0) || attempt == 3 {
            break;
        }
        eprintln!("burst {attempt} decided {decided:?} by the two instances; again");
        wait_until("the burst's leases to end", Duration::from_secs(30), || {
            total(&view(&lab, None)) == 0
        });
    }
    BurstRun {
        bytes_per_request,
        placed,
        dead_peer_dropped_ms,
        decided,
        served,
    }
}

#[test]
fn each_instance_sees_the_others_load() {
    let runs = [burst_run(false), burst_run(true)];
    for (run, name) in runs.iter().zip(["prefixes + log", "prefixes + log + load"]) {
        println!(
            "{name}: {:.0} bytes to Redis per routed request; {BURST} long requests of one key, decided {:?} by the two instances, placed {:?} (in flight per replica), served by {:?}{}",
            run.bytes_per_request,
            run.decided,
            run.placed.values().collect::<Vec<_>>(),
            run.served.values().collect::<Vec<_>>(),
            run.dead_peer_dropped_ms
                .map(|ms| format!("; a killed peer's load dropped after {ms:.0} ms"))
                .unwrap_or_default(),
        );
    }
    let hottest = |r: &BurstRun| r.placed.values().copied().max().unwrap_or(0);
    // Alone, each instance fills the key's replica to its own cap.
    assert!(
        hottest(&runs[0]) > 4,
        "no pile-on without load: {:?}",
        runs[0].placed
    );
    // Sharing load, the two together keep it within its cap.
    assert!(hottest(&runs[1]) <= 4, "piled on: {:?}", runs[1].placed);
    assert_eq!(total(&runs[1].placed), BURST as u64);
    // Both decided some of it, so each had the other's load to see.
    assert!(
        runs[1].decided.iter().all(|&d| d > 0),
        "{:?}",
        runs[1].decided
    );
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
