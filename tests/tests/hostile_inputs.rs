//! Through real Envoy: what a client or an operator's mistake can feed
//! fleetroute stays bounded — an empty admin token, huge request ids — and a
//! replica that breaks its streams leaves even a two-replica fleet.
#![cfg(feature = "e2e")] // needs Envoy and the built binaries: scripts/test.sh

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use fleetroute_tests::harness::client::{
    blocking_get, chat_body, chat_body_tokens, client, metric_sum, post,
};
use fleetroute_tests::harness::scenario::{
    FAST_ENGINES as FAST, TWO_FLEETS, chat_url as url, two_fleets_tolerant_health,
};
use fleetroute_tests::harness::{Binaries, Lab, LabSpec, pace, wait_for_value, wait_until};

const ENGINE: &str = env!("CARGO_BIN_EXE_fleetroute-engine");

/// The longest client request id fleetroute keeps (docs/operations/operate.md, "Debug").
const MAX_REQUEST_ID: usize = 128;
/// The most bytes one `/debug/decisions` response carries.
const DECISIONS_RESPONSE_BYTES: usize = 256 << 10;

fn lab(router: &str, token: Option<&str>) -> Lab {
    Lab::start(
        ENGINE,
        LabSpec {
            router,
            engine_args: FAST,
            admin_token: token,
            ..Default::default()
        },
    )
}

/// Resident memory of a process, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmRSS")
        * 1024
}

#[test]
fn an_empty_admin_token_refuses_to_start() {
    let bins = Binaries::locate(ENGINE);
    let dir = tempfile::tempdir().unwrap();
    let router = dir.path().join("router.yaml");
    std::fs::write(
        &router,
        "fleets: [{ name: f, region: us, endpoints: [\"127.0.0.1:9\"] }]\n\
         stages: [{ name: s, models: [m], fleets: [f] }]\n",
    )
    .unwrap();
    let serve = |flag: Option<&str>, env: Option<&str>| {
        let mut cmd = Command::new(&bins.fleetroute);
        cmd.args(["serve", "--config"])
            .arg(&router)
            .args(["--grpc", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
            .env_remove("FLEETROUTE_ADMIN_TOKEN");
        if let Some(t) = flag {
            cmd.args(["--admin-token", t]);
        }
        if let Some(t) = env {
            cmd.env("FLEETROUTE_ADMIN_TOKEN", t);
        }
        // Exits at once when refused; a started server would run until the
        // deadline below and fail the test.
        let mut child = cmd
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start fleetroute");
        let exited = wait_for_value(Duration::from_secs(10), || child.try_wait().unwrap());
        let Some(status) = exited else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("fleetroute started with an empty admin token");
        };
        let out = child.wait_with_output().unwrap();
        (status, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    for (flag, env) in [(Some(""), None), (None, Some("")), (Some("  "), None)] {
        let (status, stderr) = serve(flag, env);
        assert!(!status.success(), "exit {status:?}");
        assert!(
            stderr.contains("admin token is empty"),
            "no clear message: {stderr}"
        );
    }
}

#[test]
fn the_bearer_scheme_is_case_insensitive_and_empty_tokens_never_match() {
    let lab = lab(TWO_FLEETS, Some("s3cret"));
    let addr = &lab.replicas["b1"];
    let drain = |auth: &str, undo: bool| {
        let r = client()
            .post(format!("{}/v1/drain", lab.admin))
            .header("authorization", auth)
            .header("content-type", "application/json")
            .body(format!(r#"{{"replica":"{addr}","drain":{}}}"#, !undo))
            .send()
            .expect("admin API");
        r.status().as_u16()
    };
    for refused in [
        "Bearer ",
        "Bearer",
        "bearer ",
        "Basic s3cret",
        "Bearer s3cre",
    ] {
        assert_eq!(drain(refused, false), 401, "{refused:?} was accepted");
    }
    assert_eq!(drain("bearer s3cret", false), 200);
    assert_eq!(drain("BEARER s3cret", true), 200);
    assert_eq!(drain("Bearer  s3cret", false), 200, "extra spaces");
    assert_eq!(drain("Bearer s3cret", true), 200);
}

#[test]
fn envoy_makes_the_request_id_of_external_clients() {
    let lab = lab(TWO_FLEETS, None);
    let sent = "chosen-by-the-client";
    let r = post(
        &url(&lab),
        chat_body("m1", Some("u"), "hi", false),
        &[("x-request-id", sent)],
    );
    assert_eq!(r.status, 200);
    let id = r
        .header("x-request-id")
        .expect("Envoy returns the request id");
    assert_ne!(id, sent, "a client chose its request id");
    assert!(lab.decision(id).is_some(), "no decision under Envoy's id");
    let (_, by_sent) = blocking_get(&format!("{}/debug/decisions?id={sent}", lab.admin)).unwrap();
    assert_eq!(by_sent, "[]");
}

/// The bootstrap of a deployment behind a trusted front proxy that sets
/// request ids: Envoy keeps every client's `x-request-id`, so only
/// fleetroute's own bounds stand between a 50 KB id and its memory.
fn keep_client_request_ids(bootstrap: &str) -> String {
    let line = bootstrap
        .lines()
        .find(|l| l.trim_start().starts_with("use_remote_address: true"))
        .expect("the bootstrap sets use_remote_address");
    let indent = &line[..line.len() - line.trim_start().len()];
    bootstrap.replace(
        line,
        &format!("{line}\n{indent}preserve_external_request_id: true"),
    )
}

#[test]
fn huge_request_ids_are_truncated_and_the_decision_log_is_bounded() {
    let router = two_fleets_tolerant_health();
    let lab = Lab::start(
        ENGINE,
        LabSpec {
            router: &router,
            engine_args: FAST,
            envoy_edit: Some(keep_client_request_ids),
            ..Default::default()
        },
    );
    let pid = lab.fleetroute.pid().expect("fleetroute runs");
    // Warm up (allocator arenas, connection pools) before the baseline.
    for i in 0..50 {
        let r = post(
            &url(&lab),
            chat_body("m1", Some(&format!("w{i}")), "hi", false),
            &[],
        );
        assert_eq!(r.status, 200);
    }
    let before = rss(pid);
    let big = |i: usize| format!("{i:06}-{}", "r".repeat(50 << 10));
    let threads = 4;
    let per_thread = 500;
    std::thread::scope(|s| {
        for t in 0..threads {
            let lab = &lab;
            s.spawn(move || {
                for i in 0..per_thread {
                    let id = big(t * per_thread + i);
                    let r = post(
                        &url(lab),
                        chat_body("m1", Some(&format!("k{t}-{i}")), "hi", false),
                        &[("x-request-id", &id)],
                    );
                    assert_eq!(r.status, 200, "{}", r.body);
                    assert_eq!(r.header("x-request-id"), Some(id.as_str()), "id kept");
                }
            });
        }
    });
    let after = rss(pid);
    let grew = after.saturating_sub(before);
    println!(
        "fleetroute RSS {} MB before, {} MB after {} requests with 50 KB ids (+{} MB)",
        before >> 20,
        after >> 20,
        threads * per_thread,
        grew >> 20
    );
    // Stored verbatim, 2 000 ids are 100 MB in the decision log alone.
    assert!(grew < 32 << 20, "RSS grew by {} MB", grew >> 20);

    let (status, body) =
        blocking_get(&format!("{}/debug/decisions?limit=100000", lab.admin)).unwrap();
    assert_eq!(status, 200);
    println!("/debug/decisions: {} bytes", body.len());
    assert!(
        body.len() <= DECISIONS_RESPONSE_BYTES,
        "{} bytes",
        body.len()
    );
    let log: serde_json::Value = serde_json::from_str(&body).unwrap();
    let log = log.as_array().unwrap();
    assert!(log.len() > 100, "{} records", log.len());
    for d in log {
        let id = d["request_id"].as_str().unwrap();
        assert!(
            id.len() <= MAX_REQUEST_ID,
            "a {}-byte id was kept",
            id.len()
        );
        assert_eq!(d["decision_id"].as_str().map(str::len), Some(16), "{d}");
    }
    // The full id still finds its decision (fleetroute cuts the query the
    // same way), and so does the decision id.
    let full = big(threads * per_thread - 1);
    assert!(
        wait_for_value(Duration::from_secs(2), || {
            let (_, b) = client()
                .get(format!("{}/debug/decisions", lab.admin))
                .query(&[("id", full.as_str())])
                .send()
                .ok()
                .map(|r| (r.status(), r.text().unwrap_or_default()))?;
            (b != "[]").then_some(())
        })
        .is_some()
    );
    let decision = log[0]["decision_id"].as_str().unwrap();
    let (_, one) = blocking_get(&format!(
        "{}/debug/decisions?decision={decision}",
        lab.admin
    ))
    .unwrap();
    let one: serde_json::Value = serde_json::from_str(&one).unwrap();
    assert_eq!(one.as_array().map(Vec::len), Some(1));
}

/// Streams `n` requests on distinct keys, in order; returns how many failed
/// (an error status or a stream that ended without `[DONE]`).
fn failures(lab: &Lab, tag: &str, n: usize) -> usize {
    (0..n)
        .filter(|i| {
            let r = post(
                &url(lab),
                chat_body_tokens("m1", Some(&format!("{tag}-{i}")), "hello", true, 8),
                &[],
            );
            r.status != 200 || !r.body.contains("[DONE]")
        })
        .count()
}

fn replica_state(lab: &Lab, addr: &str) -> Option<String> {
    let (_, body) = blocking_get(&format!("{}/debug/snapshot", lab.admin))?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    v["fleets"]
        .as_array()?
        .iter()
        .flat_map(|f| f["replicas"].as_array().cloned().unwrap_or_default())
        .find(|r| r["addr"] == addr)
        .and_then(|r| r["state"].as_str().map(str::to_string))
}

#[test]
fn a_replica_that_breaks_streams_leaves_its_two_replica_fleet() {
    let lab = lab(TWO_FLEETS, None);
    lab.fault("b2", r#"{"die_after_tokens": 2}"#);
    let b2 = lab.replicas["b2"].clone();
    let started = Instant::now();
    let n = 200;
    // The ejection lasts its base time (10 s); on a slow machine the load can
    // outlast it, so a watcher records whether b2 was ejected while it ran.
    let done = AtomicBool::new(false);
    let (failed, seen) = std::thread::scope(|s| {
        let watcher = s.spawn(|| {
            let mut seen = false;
            while !done.load(Ordering::Relaxed) && !seen {
                seen = replica_state(&lab, &b2).as_deref() == Some("ejected");
                pace(Duration::from_millis(50));
            }
            seen
        });
        let failed = failures(&lab, "load", n);
        done.store(true, Ordering::Relaxed);
        (failed, watcher.join().unwrap())
    });
    let share = failed as f64 / n as f64;
    println!(
        "{failed} of {n} streamed requests failed ({:.1}%) in {:.1} s with b2 dying after 2 tokens",
        share * 100.0,
        started.elapsed().as_secs_f64()
    );
    let ejected = seen
        || wait_for_value(Duration::from_secs(5), || {
            (replica_state(&lab, &b2)? == "ejected").then_some(())
        })
        .is_some();
    assert!(
        ejected,
        "b2 is {:?}, never seen ejected",
        replica_state(&lab, &b2)
    );
    // One in four keys lands on b2 without protection.
    assert!(share < 0.10, "{:.1}% failed", share * 100.0);
}

#[test]
fn a_conversation_its_replica_failed_moves_on_next_turn() {
    let lab = lab(TWO_FLEETS, None);
    lab.fault("b2", r#"{"die_after_tokens": 2}"#);
    let metrics = || blocking_get(&format!("{}/metrics", lab.admin)).unwrap().1;
    let ended_early = || {
        metric_sum(
            &metrics(),
            "fleetroute_responses_total",
            &["class=\"ended_early\""],
        )
    };
    // A user whose conversation b2 holds: its first turn breaks.
    let turn = |user: &str, text: &str| {
        post(
            &url(&lab),
            chat_body_tokens("m1", Some(user), text, true, 8),
            &[],
        )
    };
    let mut found = None;
    for i in 0..60 {
        let user = format!("conv-{i}");
        let r = turn(&user, "first turn of a conversation");
        if r.status == 200 && !r.body.contains("[DONE]") {
            assert_eq!(r.served_by(), "b2");
            found = Some(user);
            break;
        }
    }
    let user = found.expect("no key landed on b2 in 60 tries");
    wait_until(
        "the broken stream is observed",
        Duration::from_secs(5),
        || ended_early() >= 1.0,
    );
    for k in 0..3 {
        let r = turn(
            &user,
            "first turn of a conversation, and the next turn after it",
        );
        assert_eq!(r.status, 200, "{}", r.body);
        assert!(
            r.body.contains("[DONE]"),
            "turn {k} failed again: {}",
            r.body
        );
        assert_ne!(r.served_by(), "b2");
    }
    // Other conversations still reach b2 while it is not ejected: the move is
    // per key, not a fleet-wide verdict.
    let snapshot_state = replica_state(&lab, &lab.replicas["b2"]);
    assert_eq!(snapshot_state.as_deref(), Some("ready"));
}
