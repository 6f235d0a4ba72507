//! Through real Envoy: a fleet that grows and shrinks under a steady,
//! bounded load loses no request. The fleet's `endpoints` change by reload;
//! Envoy's static cluster lists the superset of replicas from the start (the
//! override-host policy sends each request where fleetroute chose), so what
//! is tested is fleetroute's membership: joiners take traffic once probed,
//! leavers take no new request, their streams in flight finish, and they
//! leave the topology once idle.
#![cfg(feature = "e2e")] // needs Envoy and the built binaries: scripts/test.sh

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use fleetroute_tests::harness::client::{blocking_get, chat_body_tokens, client};
use fleetroute_tests::harness::scenario::chat_url;
use fleetroute_tests::harness::{Lab, LabSpec, pace, wait_until};

const ENGINE: &str = env!("CARGO_BIN_EXE_fleetroute-engine");
const TOKEN: &str = "membership-token";

/// Every replica listed, so the rendered Envoy cluster holds the superset.
const ALL: &str = r#"
health_check: { interval_ms: 500, timeout_ms: 500, healthy_threshold: 1, unhealthy_threshold: 3 }
membership: { removal_grace_ms: 60000 }
fleets:
  - name: pool
    region: us
    endpoints: ["{p1}", "{p2}", "{p3}", "{p4}"]
stages:
  - name: chat
    models: [m1]
    fleets: [pool]
"#;

/// One finished request of the load.
struct Done {
    sent: Instant,
    ok: bool,
    served_by: Option<String>,
    what: String,
}

/// `(addr, state)` of the fleet's replicas in fleetroute's snapshot.
fn members(lab: &Lab) -> Vec<(String, String)> {
    let (_, body) = blocking_get(&format!("{}/debug/snapshot", lab.admin)).expect("snapshot");
    let v: serde_json::Value = serde_json::from_str(&body).expect("snapshot JSON");
    let mut out: Vec<(String, String)> = v["fleets"][0]["replicas"]
        .as_array()
        .expect("replicas")
        .iter()
        .map(|r| {
            (
                r["addr"].as_str().unwrap().to_string(),
                r["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    out.sort();
    out
}

/// Rewrites the fleet's endpoints to these replicas and reloads now.
fn set_endpoints(lab: &Lab, names: &[&str]) {
    let list: Vec<String> = names
        .iter()
        .map(|n| format!("\"{}\"", lab.replicas[*n]))
        .collect();
    let mut text = ALL.to_string();
    for (name, addr) in &lab.replicas {
        text = text.replace(&format!("{{{name}}}"), addr);
    }
    let all: Vec<String> = ["p1", "p2", "p3", "p4"]
        .iter()
        .map(|n| format!("\"{}\"", lab.replicas[*n]))
        .collect();
    let text = text.replace(&all.join(", "), &list.join(", "));
    std::fs::write(&lab.router_path, text).expect("write router config");
    let (ok, out, err) = lab.cli(&["reload"], Some(TOKEN));
    assert!(ok, "reload: {out}{err}");
}

fn states(lab: &Lab, want: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut w: Vec<(String, String)> = want
        .iter()
        .map(|(n, s)| (lab.replicas[*n].clone(), s.to_string()))
        .collect();
    w.sort();
    w
}

fn wait_members(lab: &Lab, want: &[(&str, &str)]) {
    let want = states(lab, want);
    wait_until(
        &format!("fleetroute's members to be {want:?}"),
        Duration::from_secs(30),
        || members(lab) == want,
    );
}

#[test]
fn a_fleet_grows_and_shrinks_under_load_without_failing_a_request() {
    let lab = Lab::start(
        ENGINE,
        LabSpec {
            router: ALL,
            engine_args: &[
                "--prefill-tokens-per-sec",
                "10000000",
                "--decode-ms-per-token",
                "5",
            ],
            admin_token: Some(TOKEN),
            ..Default::default()
        },
    );
    // Start with two: p3 and p4 are idle and leave at once.
    set_endpoints(&lab, &["p1", "p2"]);
    wait_members(&lab, &[("p1", "ready"), ("p2", "ready")]);

    // Steady, bounded load: 3 clients, a request every 10 ms each at most,
    // every third a 20-token stream (about 100 ms on its replica).
    let stop = Arc::new(AtomicBool::new(false));
    let done: Arc<Mutex<Vec<Done>>> = Arc::default();
    let load: Vec<_> = (0..3)
        .map(|t| {
            let (stop, done, url) = (stop.clone(), done.clone(), chat_url(&lab));
            thread::spawn(move || {
                let mut i = 0u32;
                while !stop.load(Ordering::Relaxed) && i < 4000 {
                    let stream = i.is_multiple_of(3);
                    let body = chat_body_tokens(
                        "m1",
                        Some(&format!("user-{t}-{}", i % 16)),
                        &format!("turn {i}"),
                        stream,
                        if stream { 20 } else { 4 },
                    );
                    let sent = Instant::now();
                    let r = client()
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(body)
                        .send();
                    let d = match r {
                        Ok(r) => {
                            let status = r.status().as_u16();
                            let served_by = r
                                .headers()
                                .get("x-served-by")
                                .and_then(|v| v.to_str().ok())
                                .map(str::to_string);
                            let text = r.text().unwrap_or_default();
                            let complete = !stream || text.trim_end().ends_with("[DONE]");
                            Done {
                                sent,
                                ok: status == 200 && complete,
                                served_by,
                                what: format!("{status} stream={stream}: {text:.200}"),
                            }
                        }
                        Err(e) => Done {
                            sent,
                            ok: false,
                            served_by: None,
                            what: e.to_string(),
                        },
                    };
                    done.lock().unwrap().push(d);
                    i += 1;
                    pace(Duration::from_millis(10));
                }
            })
        })
        .collect();
    let served = |names: &[&str], after: Instant| {
        done.lock()
            .unwrap()
            .iter()
            .filter(|d| d.sent >= after)
            .filter_map(|d| d.served_by.as_deref())
            .filter(|s| names.contains(s))
            .count()
    };
    let t0 = Instant::now();
    wait_until("load on the first two", Duration::from_secs(30), || {
        served(&["p1"], t0) >= 10 && served(&["p2"], t0) >= 10
    });

    // Grow to four: the joiners take traffic once probed.
    set_endpoints(&lab, &["p1", "p2", "p3", "p4"]);
    wait_members(
        &lab,
        &[
            ("p1", "ready"),
            ("p2", "ready"),
            ("p3", "ready"),
            ("p4", "ready"),
        ],
    );
    let grown = Instant::now();
    wait_until("load on the joiners", Duration::from_secs(30), || {
        served(&["p3"], grown) >= 10 && served(&["p4"], grown) >= 10
    });

    // Shrink to the two that joined: p1 and p2 leave with streams in flight.
    set_endpoints(&lab, &["p3", "p4"]);
    wait_until(
        "p1 and p2 to be out of rotation",
        Duration::from_secs(30),
        || {
            members(&lab).iter().all(|(a, s)| {
                !(a == &lab.replicas["p1"] || a == &lab.replicas["p2"]) || s == "leaving"
            })
        },
    );
    let left = Instant::now();
    // Their requests end, so they leave the topology long before the grace.
    wait_members(&lab, &[("p3", "ready"), ("p4", "ready")]);
    let removed = Instant::now();
    wait_until("load after the shrink", Duration::from_secs(30), || {
        served(&["p3", "p4"], removed) >= 60
    });
    stop.store(true, Ordering::Relaxed);
    for h in load {
        h.join().unwrap();
    }

    let done = done.lock().unwrap();
    let failed: Vec<&str> = done
        .iter()
        .filter(|d| !d.ok)
        .map(|d| d.what.as_str())
        .collect();
    assert!(done.len() > 100, "only {} requests under load", done.len());
    assert!(
        failed.is_empty(),
        "{} of {} requests failed while the fleet changed: {:?}",
        failed.len(),
        done.len(),
        &failed[..failed.len().min(5)]
    );
    let late: Vec<&str> = done
        .iter()
        .filter(|d| d.sent >= left)
        .filter_map(|d| d.served_by.as_deref())
        .filter(|s| *s == "p1" || *s == "p2")
        .collect();
    assert!(
        late.is_empty(),
        "leaving replicas took new requests: {late:?}"
    );
    // Every member change was one log line with its counts.
    let log = std::fs::read_to_string(&lab.fleetroute.log).unwrap_or_default();
    let changes = log.matches("fleet membership changed").count();
    assert!(changes >= 3, "{changes} membership log lines:\n{log}");
}
