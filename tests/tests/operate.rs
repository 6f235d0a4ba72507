//! Through real Envoy: operating a stage at runtime with the admin API and
//! the CLI — split changes, drain, host bounds, A/B tests, shadow traffic,
//! hot reload under load, and autoscaling signals.
#![cfg(feature = "e2e")] // needs Envoy and the built binaries: scripts/test.sh

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use fleetroute_tests::harness::client::{
    blocking_get, blocking_send, chat_body, chat_body_tokens, client, metric_sum, post,
};
use fleetroute_tests::harness::scenario::{FAST_ENGINES as FAST, chat_url as url};
use fleetroute_tests::harness::{Lab, LabSpec, pace, wait_for_value, wait_until};

const ENGINE: &str = env!("CARGO_BIN_EXE_fleetroute-engine");
const TOKEN: &str = "s3cret-token";

const WEIGHTED: &str = r#"
health_check: { interval_ms: 200, timeout_ms: 150 }
fleets:
  - name: base
    region: us
    endpoints: ["{b1}", "{b2}"]
    cost: { gpu_hour_usd: 9.5, gpus_per_replica: 8, tokens_per_sec: 4000 }
  - name: burst
    region: us
    endpoints: ["{u1}", "{u2}"]
    cost: { gpu_hour_usd: 4.2, gpus_per_replica: 8, tokens_per_sec: 2000 }
stages:
  - name: chat/prod
    models: [m1]
    fleets: [base, burst]
    routing: { policy: weighted }
"#;

fn lab(router: &str, engine_args: &'static [&'static str]) -> Lab {
    Lab::start(
        ENGINE,
        LabSpec {
            router,
            engine_args,
            admin_token: Some(TOKEN),
            ..Default::default()
        },
    )
}

/// The replica each of `keys` lands on.
fn placement(lab: &Lab, keys: &[String]) -> HashMap<String, String> {
    keys.iter()
        .map(|k| {
            let r = post(&url(lab), chat_body("m1", Some(k), "hi", false), &[]);
            assert_eq!(r.status, 200, "{}", r.body);
            (k.clone(), r.served_by().to_string())
        })
        .collect()
}

fn stage_view(lab: &Lab, stage: &str) -> serde_json::Value {
    let (_, body) =
        blocking_get(&format!("{}/v1/stage?name={stage}", lab.admin)).expect("stage view");
    serde_json::from_str(&body).expect("stage JSON")
}

#[test]
fn the_split_changes_at_runtime_and_only_the_keys_that_must_move_do() {
    let lab = lab(WEIGHTED, FAST);
    let keys: Vec<String> = (0..120).map(|i| format!("user-{i}")).collect();
    let before = placement(&lab, &keys);

    // Read-only commands show the stage.
    let (ok, out, err) = lab.cli(&["endpoint", "get", "chat/prod"], None);
    assert!(ok, "{err}");
    for want in ["policy weighted", "base", "burst", "READY/TOTAL", "2/2"] {
        assert!(out.contains(want), "endpoint get lacks {want:?}:\n{out}");
    }
    let (ok, out, err) = lab.cli(&["metrics", "chat/prod"], None);
    assert!(ok, "{err}");
    for want in ["HIT RATE (PREDICTED)", "$ / GPU-HOUR", "9.50", "4.20"] {
        assert!(out.contains(want), "metrics lacks {want:?}:\n{out}");
    }
    let (ok, out, _) = lab.cli(&["metrics", "chat/prod", "--json"], None);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&out).expect("--json is JSON");
    assert!(
        v["fleets"][0]["traffic_share"].as_f64().unwrap() > 0.2,
        "{v}"
    );

    // Changes need the token, and bad weights are refused with a reason.
    let (ok, _, err) = lab.cli(
        &["split", "set", "chat/prod", "base", "--weight", "3"],
        None,
    );
    assert!(!ok && err.contains("admin token"), "{err}");
    for bad in ["-1", "NaN", "inf"] {
        let (ok, _, err) = lab.cli(
            &["split", "set", "chat/prod", "base", "--weight", bad],
            Some(TOKEN),
        );
        assert!(!ok && err.contains("finite"), "weight {bad}: {err}");
    }
    let (status, body) = blocking_send(
        "POST",
        &format!("{}/v1/split", lab.admin),
        r#"{"stage":"chat/prod","fleet":"base","weight":-2}"#,
    )
    .unwrap();
    assert_eq!(status, 401, "no token: {body}");
    let (ok, _, err) = lab.cli(
        &["split", "set", "chat/prod", "nope", "--weight", "1"],
        Some(TOKEN),
    );
    assert!(!ok && err.contains("not in stage"), "{err}");

    // base 1 → 3: keys only move from burst to base.
    let (ok, out, err) = lab.cli(
        &["split", "set", "chat/prod", "base", "--weight", "3"],
        Some(TOKEN),
    );
    assert!(ok, "{err}");
    assert!(out.contains("1 -> 3"), "{out}");
    let after = placement(&lab, &keys);
    let mut moved = 0;
    for k in &keys {
        let (b, a) = (&before[k], &after[k]);
        if b != a {
            moved += 1;
            assert!(
                b.starts_with('u') && a.starts_with('b'),
                "{k} moved {b} -> {a}: only burst keys may move, to base"
            );
        }
    }
    // Ideal: burst's share goes from 1/2 to 1/4, so a quarter of all keys move.
    let share = f64::from(moved) / keys.len() as f64;
    assert!(
        (0.12..0.4).contains(&share),
        "{moved} of {} keys moved",
        keys.len()
    );
    let view = stage_view(&lab, "chat/prod");
    assert_eq!(view["fleets"][0]["weight"].as_f64(), Some(3.0), "{view}");
    assert_eq!(
        view["fleets"][1]["weight"].as_f64(),
        Some(1.0),
        "the other weight is kept"
    );

    // Weight 0 takes burst out of the split; it keeps running.
    let (ok, _, err) = lab.cli(
        &["split", "set", "chat/prod", "burst", "--weight", "0"],
        Some(TOKEN),
    );
    assert!(ok, "{err}");
    let now = placement(&lab, &keys);
    assert!(
        now.values().all(|r| r.starts_with('b')),
        "weight 0 still served: {now:?}"
    );
    let view = stage_view(&lab, "chat/prod");
    assert!(
        view["fleets"][1]["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["ready"] == true)
    );
}

#[test]
fn a_drained_replica_finishes_its_streams_and_takes_no_new_ones() {
    let lab = lab(
        WEIGHTED,
        &[
            "--prefill-tokens-per-sec",
            "10000000",
            "--decode-ms-per-token",
            "20",
        ],
    );
    // A long stream that is running on its replica when the drain starts.
    let key = "long-user";
    let first = post(&url(&lab), chat_body("m1", Some(key), "warm", false), &[]);
    let host_name = first.served_by().to_string();
    let host = lab.replicas[&host_name].clone();
    lab.wait_settled();
    let u = url(&lab);
    let stream =
        thread::spawn(move || post(&u, chat_body_tokens("m1", Some(key), "long", true, 60), &[]));
    // Decided (its load is held) before the drain starts.
    wait_until(
        "the long stream to be routed",
        Duration::from_secs(20),
        || lab.router_inflight() == Some(1),
    );
    let (ok, out, err) = lab.cli(&["replica", "drain", &host], Some(TOKEN));
    assert!(ok, "{err}");
    assert!(out.contains("draining"), "{out}");
    let served: HashSet<String> = (0..40)
        .map(|i| {
            post(
                &url(&lab),
                chat_body("m1", Some(&format!("k{i}")), "hi", false),
                &[],
            )
            .served_by()
            .to_string()
        })
        .collect();
    assert!(
        !served.contains(&host_name),
        "a drained replica took new requests"
    );
    let long = stream.join().unwrap();
    assert_eq!(long.served_by(), host_name);
    assert!(
        long.body.trim_end().ends_with("[DONE]"),
        "the in-flight stream was cut: {}",
        long.body
    );
    let view = stage_view(&lab, "chat/prod");
    let states: Vec<&str> = view["fleets"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|f| f["replicas"].as_array().unwrap())
        .filter_map(|r| r["state"].as_str())
        .collect();
    assert!(states.contains(&"draining"), "{states:?}");
    let (ok, _, err) = lab.cli(&["replica", "drain", &host, "--undo"], Some(TOKEN));
    assert!(ok, "{err}");
    let (ok, _, err) = lab.cli(&["replica", "drain", "10.9.9.9:1"], Some(TOKEN));
    assert!(!ok && err.contains("no replica"), "{err}");
    // Host bounds for the autoscaling signal.
    let (ok, _, err) = lab.cli(
        &["fleet", "scale", "burst", "--min", "1", "--max", "6"],
        Some(TOKEN),
    );
    assert!(ok, "{err}");
    let (ok, _, err) = lab.cli(
        &["fleet", "scale", "burst", "--min", "7", "--max", "6"],
        Some(TOKEN),
    );
    assert!(!ok && err.contains("above max"), "{err}");
    let view = stage_view(&lab, "chat/prod");
    assert_eq!(
        view["fleets"][1]["hosts"],
        serde_json::json!({ "min": 1, "max": 6 })
    );
}

const AB: &str = r#"
health_check: { interval_ms: 200, timeout_ms: 150 }
fleets:
  - name: stable
    region: us
    endpoints: ["{s1}", "{s2}"]
  - name: canary
    region: us
    endpoints: ["{c1}"]
  - name: next
    region: us
    endpoints: ["{n1}"]
stages:
  - name: chat
    models: [m1]
    fleets: [stable, canary]
    routing: { policy: priority, order: [stable, canary] }
    experiment:
      ab: { control: stable, variants: [{ fleet: canary, percent: 30 }] }
"#;

#[test]
fn an_ab_test_keeps_each_user_in_one_arm_and_counts_arms() {
    let lab = lab(AB, FAST);
    let mut arms: HashMap<String, HashSet<String>> = HashMap::new();
    for round in 0..3 {
        for i in 0..80 {
            let user = format!("user-{i}");
            let r = post(
                &url(&lab),
                chat_body("m1", Some(&user), &format!("round {round}"), false),
                &[],
            );
            let fleet = if r.served_by().starts_with('c') {
                "canary"
            } else {
                "stable"
            };
            arms.entry(user).or_default().insert(fleet.to_string());
        }
    }
    assert!(arms.values().all(|a| a.len() == 1), "a user changed arms");
    let canary = arms.values().filter(|a| a.contains("canary")).count();
    assert!(
        (12..=38).contains(&canary),
        "{canary} of 80 users in the 30% arm"
    );
    let metrics = blocking_get(&format!("{}/metrics", lab.admin)).unwrap().1;
    // Counted per arm: every user's three requests, in the arm it is in.
    let control = metric_sum(&metrics, "fleetroute_requests_total", &["arm=\"control\""]);
    let variant = metric_sum(&metrics, "fleetroute_requests_total", &["arm=\"variant\""]);
    assert_eq!(
        (control as usize, variant as usize),
        (3 * (80 - canary), 3 * canary),
        "{metrics}"
    );
    // Through the CLI: a shadow outside the residency is refused, percentages over 100 too.
    let (ok, _, err) = lab.cli(
        &[
            "experiment",
            "set",
            "chat",
            "--control",
            "stable",
            "--variant",
            "canary=101",
        ],
        Some(TOKEN),
    );
    assert!(!ok && err.contains("percent"), "{err}");
    let (ok, _, err) = lab.cli(
        &[
            "experiment",
            "set",
            "chat",
            "--control",
            "stable",
            "--variant",
            "nope=10",
        ],
        Some(TOKEN),
    );
    assert!(!ok && err.contains("unknown fleet"), "{err}");
    let (ok, _, err) = lab.cli(&["experiment", "clear", "chat"], Some(TOKEN));
    assert!(ok, "{err}");
    let all_stable = (0..40).all(|i| {
        post(
            &url(&lab),
            chat_body("m1", Some(&format!("user-{i}")), "x", false),
            &[],
        )
        .served_by()
        .starts_with('s')
    });
    assert!(
        all_stable,
        "after the test ends the priority policy alone decides"
    );
}

const SHADOW: &str = r#"
health_check: { interval_ms: 200, timeout_ms: 150 }
fleets:
  - name: primary
    region: us
    endpoints: ["{p1}", "{p2}"]
  - name: shadow-pool
    region: us
    endpoints: ["{x1}"]
  - name: abroad
    region: eu
    endpoints: ["{e1}"]
stages:
  - name: chat
    models: [m1]
    fleets: [primary]
    residency: us
    experiment:
      shadow: { fleet: shadow-pool, percent: 50 }
"#;

fn served_counts(lab: &Lab) -> HashMap<String, u64> {
    let (_, body) = blocking_get(&format!("{}/replicas", lab.control)).unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap().to_string(),
                r["requests_served"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn shadow_traffic_is_mirrored_for_a_sample_and_never_answers() {
    let lab = lab(SHADOW, FAST);
    for i in 0..60 {
        let r = post(
            &url(&lab),
            chat_body("m1", Some(&format!("user-{i}")), "hi", false),
            &[],
        );
        assert_eq!(r.status, 200);
        assert!(
            r.served_by().starts_with('p'),
            "a client got the shadow's answer"
        );
    }
    // Mirrors are sent off the client's path and may land after its answer:
    // wait until every mirror counted at decision time reached the shadow.
    let shadowed = || -> u64 {
        let metrics = blocking_get(&format!("{}/metrics", lab.admin)).unwrap().1;
        metrics
            .lines()
            .filter(|l| {
                l.starts_with("fleetroute_shadow_requests_total") && l.contains("shadow-pool")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    let counts = wait_for_value(Duration::from_secs(10), || {
        let c = served_counts(&lab);
        (c["x1"] > 0 && c["x1"] == shadowed()).then_some(c)
    })
    .unwrap_or_else(|| {
        let (_, stats) = blocking_get(&format!("{}/stats?filter=shadow", lab.envoy_admin)).unwrap();
        let (_, d) = blocking_get(&format!("{}/debug/decisions?limit=5", lab.admin)).unwrap();
        let stats: String = stats
            .lines()
            .filter(|l| !l.ends_with(": 0"))
            .collect::<Vec<_>>()
            .join("\n");
        panic!(
            "the shadow replica did not receive every mirror counted ({} served, {} counted); decisions {d}\nEnvoy: {stats}\n{}",
            served_counts(&lab)["x1"],
            shadowed(),
            lab.envoy_proc.log_tail(20)
        )
    });
    assert!(
        (15..=45).contains(&counts["x1"]),
        "{} of 60 mirrored at 50%",
        counts["x1"]
    );
    assert_eq!(counts["e1"], 0);
    // Shadow traffic never enters the primary fleets' state: the shadow fleet
    // was never routed to, so it has no load and no predicted cache.
    let (_, snap) = blocking_get(&format!("{}/debug/snapshot", lab.admin)).unwrap();
    let snap: serde_json::Value = serde_json::from_str(&snap).unwrap();
    let pool = snap["fleets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "shadow-pool")
        .unwrap()
        .clone();
    assert_eq!(pool["prefix_blocks"], 0, "{pool}");
    assert_eq!(pool["replicas"][0]["inflight"], 0);
    // A shadow outside the stage's residency is refused.
    let (ok, _, err) = lab.cli(
        &["experiment", "set", "chat", "--shadow", "abroad=10"],
        Some(TOKEN),
    );
    assert!(
        !ok && err.contains("outside the stage's residency"),
        "{err}"
    );
}

#[test]
fn the_config_reloads_under_load_without_failing_a_request() {
    let mut lab = lab(WEIGHTED, FAST);
    let keys: Vec<String> = (0..60).map(|i| format!("user-{i}")).collect();
    let before = placement(&lab, &keys);
    let original = std::fs::read_to_string(&lab.router_path).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let (sent, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let load: Vec<_> = (0..4)
        .map(|t| {
            let (stop, sent, failed, u) = (stop.clone(), sent.clone(), failed.clone(), url(&lab));
            thread::spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) && i < 5000 {
                    let r = client()
                        .post(&u)
                        .body(chat_body(
                            "m1",
                            Some(&format!("load-{t}-{}", i % 50)),
                            "hi",
                            false,
                        ))
                        .send();
                    sent.fetch_add(1, Ordering::Relaxed);
                    if !r.is_ok_and(|r| r.status() == 200) {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                    i += 1;
                }
            })
        })
        .collect();
    let generation = |lab: &Lab| -> u64 {
        let (_, s) = blocking_get(&format!("{}/debug/snapshot", lab.admin)).unwrap();
        serde_json::from_str::<serde_json::Value>(&s).unwrap()["generation"]
            .as_u64()
            .unwrap()
    };
    let applied_after = |g: u64, what: &str| {
        let applied = wait_for_value(Duration::from_secs(5), || {
            (generation(&lab) > g).then_some(())
        });
        assert!(applied.is_some(), "{what} not applied");
    };
    let g0 = generation(&lab);
    // 1. The file changes: burst weighs 2 (picked up by the watcher).
    std::fs::write(
        &lab.router_path,
        original.replace(
            "routing: { policy: weighted }",
            "routing: { policy: weighted, weights: { burst: 2 } }",
        ),
    )
    .unwrap();
    applied_after(g0, "the file change");
    // 2. An invalid file is refused; the running config stays.
    let g1 = generation(&lab);
    std::fs::write(
        &lab.router_path,
        original.replace("policy: weighted", "policy: weigthed"),
    )
    .unwrap();
    // The watcher read the file and refused it.
    wait_until(
        "the watcher to refuse the file",
        Duration::from_secs(20),
        || {
            let metrics = blocking_get(&format!("{}/metrics", lab.admin)).unwrap().1;
            metric_sum(
                &metrics,
                "fleetroute_config_reloads_total",
                &["result=\"refused\""],
            ) >= 1.0
        },
    );
    assert_eq!(generation(&lab), g1, "an invalid file was applied");
    let (status, body) = blocking_send("POST", &format!("{}/v1/reload", lab.admin), "").unwrap();
    assert_eq!(status, 401, "{body}");
    let (ok, _, err) = lab.cli(&["reload"], Some(TOKEN));
    assert!(
        !ok && err.contains("stages[0].routing.policy"),
        "the refusal names the field: {err}"
    );
    // 3. SIGHUP with the original back.
    std::fs::write(&lab.router_path, &original).unwrap();
    let pid = lab.fleetroute.pid().unwrap();
    std::process::Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .unwrap();
    applied_after(g1, "SIGHUP");
    // 4. Through the API.
    let g2 = generation(&lab);
    let (ok, out, err) = lab.cli(&["reload"], Some(TOKEN));
    assert!(ok && out.contains("reloaded"), "{out}{err}");
    assert!(generation(&lab) > g2);
    // Requests keep flowing on the reloaded config.
    let s0 = sent.load(Ordering::Relaxed);
    wait_until("load after the reloads", Duration::from_secs(30), || {
        sent.load(Ordering::Relaxed) >= (s0 + 40).max(120)
    });
    stop.store(true, Ordering::Relaxed);
    for h in load {
        h.join().unwrap();
    }
    let (sent, failed) = (sent.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    assert!(sent > 100, "only {sent} requests under load");
    assert_eq!(
        failed, 0,
        "{failed} of {sent} requests failed during reloads"
    );
    // Same fleets, same members, same weights: every key keeps its replica.
    let after = placement(&lab, &keys);
    assert_eq!(
        before, after,
        "keys moved although the config is back to the original"
    );
    let metrics = blocking_get(&format!("{}/metrics", lab.admin)).unwrap().1;
    // The invalid file was seen by the watcher and by `fleetroute reload`.
    let refused = metric_sum(
        &metrics,
        "fleetroute_config_reloads_total",
        &["result=\"refused\""],
    );
    assert!(refused >= 2.0, "refusals are counted: {refused}");
    lab.wait_router_ready();
}

const SCALING: &str = r#"
health_check: { interval_ms: 200, timeout_ms: 150 }
fleets:
  - name: base
    region: us
    endpoints: ["{b1}", "{b2}"]
    capacity: { max_inflight: 2 }
    hosts: { min: 1, max: 3 }
  - name: burst
    region: us
    endpoints: ["{u1}", "{u2}"]
    capacity: { max_inflight: 2 }
    hosts: { min: 0, max: 3 }
stages:
  - name: chat
    models: [m1]
    fleets: [base, burst]
    replicas: { min: 1, max: 6 }
    routing: { policy: priority, order: [base, burst] }
"#;

#[test]
fn autoscaling_signals_grow_the_base_first_and_shrink_the_burst_first() {
    let lab = lab(
        SCALING,
        &[
            "--prefill-tokens-per-sec",
            "10000000",
            "--decode-ms-per-token",
            "10",
            "--max-batch",
            "64",
        ],
    );
    let samples = Arc::new(std::sync::Mutex::new(Vec::<(u64, u64, bool)>::new()));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (samples, done, admin) = (samples.clone(), done.clone(), lab.admin.clone());
        thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                if let Some((_, body)) = blocking_get(&format!("{admin}/v1/stage?name=chat")) {
                    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
                    let d = |i: usize| v["fleets"][i]["desired_replicas"].as_u64().unwrap();
                    samples
                        .lock()
                        .unwrap()
                        .push((d(0), d(1), v["fleets"][0]["saturated"] == true));
                }
                // The sampling interval.
                pace(Duration::from_millis(100));
            }
        })
    };
    // Load in waves: 2, 6, 12 concurrent long requests, then nothing.
    let start = Instant::now();
    for wave in [2usize, 6, 12, 6, 2, 0] {
        let handles: Vec<_> = (0..wave)
            .map(|i| {
                let u = url(&lab);
                let body = chat_body_tokens("m1", Some(&format!("w{wave}-{i}")), "work", false, 80);
                thread::spawn(move || post(&u, body, &[]))
            })
            .collect();
        // The whole wave is in flight at once before it is awaited.
        wait_until(
            &format!("a wave of {wave}"),
            Duration::from_secs(20),
            || lab.router_inflight().is_some_and(|n| n >= wave as u64),
        );
        for h in handles {
            assert_eq!(h.join().unwrap().status, 200);
        }
    }
    // Idle: the signal falls back and the sampler has seen it.
    lab.wait_settled();
    wait_until(
        "the burst signal back to 0",
        Duration::from_secs(20),
        || samples.lock().unwrap().last().is_some_and(|s| s.1 == 0),
    );
    done.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let samples = samples.lock().unwrap().clone();
    assert!(start.elapsed() < Duration::from_secs(30));
    let peak_base = samples.iter().map(|s| s.0).max().unwrap();
    let peak_burst = samples.iter().map(|s| s.1).max().unwrap();
    assert!(
        peak_base >= 2 && peak_burst >= 1,
        "load never raised the signals: {samples:?}"
    );
    for &(base, burst, saturated) in &samples {
        assert!(
            (1..=3).contains(&base) && burst <= 3,
            "outside host bounds: {samples:?}"
        );
        if burst > 0 {
            assert!(
                base == 3 || saturated,
                "burst grew while base could still grow: {samples:?}"
            );
        }
    }
    // On the way down, burst reaches 0 before base leaves its peak.
    let last_burst = samples.iter().rposition(|s| s.1 > 0).unwrap();
    let base_drop = samples.iter().rposition(|s| s.0 == peak_base).unwrap();
    assert!(
        last_burst <= base_drop,
        "base shrank before burst: {samples:?}"
    );
    assert_eq!(samples.last().unwrap().1, 0, "idle: burst back to 0");
    let metrics = blocking_get(&format!("{}/metrics", lab.admin)).unwrap().1;
    let base_now = metric_sum(&metrics, "fleetroute_desired_replicas", &["fleet=\"base\""]);
    assert!(
        (1.0..=3.0).contains(&base_now),
        "the metric carries the signal: {base_now}"
    );
}
