//! Through real Envoy: priority spill and return, failover of a dead fleet,
//! residency under total failure, outlier ejection and re-admission, warmup
//! before rejoining, and prefix locality until the holder is overloaded.
#![cfg(feature = "e2e")] // needs Envoy and the built binaries: scripts/test.sh

use std::collections::{HashMap, HashSet};
use std::thread;
use std::time::{Duration, Instant};

use fleetroute_tests::harness::client::{blocking_get, chat_body, post};
use fleetroute_tests::harness::scenario::{FAST_ENGINES, TWO_FLEETS, chat_url as url};
use fleetroute_tests::harness::{Lab, LabSpec, wait_for_value, wait_until};

const ENGINE: &str = env!("CARGO_BIN_EXE_fleetroute-engine");

fn lab(router: &str, engine_args: &'static [&'static str]) -> Lab {
    Lab::start(
        ENGINE,
        LabSpec {
            router,
            engine_args,
            ..Default::default()
        },
    )
}

fn snapshot(lab: &Lab) -> serde_json::Value {
    let (_, body) = blocking_get(&format!("{}/debug/snapshot", lab.admin)).expect("snapshot");
    serde_json::from_str(&body).expect("snapshot JSON")
}

/// A replica's view in `/debug/snapshot`, by fleet index and address.
fn replica_view(lab: &Lab, fleet: usize, addr: &str) -> serde_json::Value {
    let snap = snapshot(lab);
    snap["fleets"][fleet]["replicas"]
        .as_array()
        .and_then(|all| all.iter().find(|r| r["addr"] == addr).cloned())
        .unwrap_or_else(|| panic!("no replica {addr} in fleet {fleet}: {snap}"))
}

/// Waits until the router's view of replica `name` (lab placeholder) in
/// fleet `fleet` satisfies `ok`.
fn wait_replica(
    lab: &Lab,
    fleet: usize,
    name: &str,
    what: &str,
    ok: impl Fn(&serde_json::Value) -> bool,
) {
    let addr = lab.replicas[name].clone();
    wait_until(&format!("{name} {what}"), Duration::from_secs(20), || {
        ok(&replica_view(lab, fleet, &addr))
    });
}

/// Replica names (engine-side) of a fleet, by the lab's placeholder prefix.
fn in_fleet(name: &str, prefix: &str) -> bool {
    name.starts_with(prefix)
}

const PRIORITY: &str = r#"
health_check: { interval_ms: 200, timeout_ms: 150 }
fleets:
  - name: base
    region: us
    endpoints: ["{b1}", "{b2}"]
    capacity: { max_inflight: 2 }
  - name: burst
    region: us
    endpoints: ["{u1}", "{u2}"]
    capacity: { max_inflight: 8 }
stages:
  - name: chat
    models: [m1]
    fleets: [base, burst]
    routing: { policy: priority, order: [base, burst], resume_below: 0.5 }
"#;

#[test]
fn priority_spills_when_the_base_saturates_and_returns() {
    let lab = lab(PRIORITY, FAST_ENGINES);
    let quiet = post(&url(&lab), chat_body("m1", Some("q"), "hi", false), &[]);
    assert!(
        quiet.served_by().starts_with('b'),
        "an idle base takes the request"
    );
    lab.wait_settled();

    // Every replica holds what it is sent until the fault is cleared, so each
    // request stays in flight however slow the machine; each is sent once the
    // router counts the one before it.
    for r in ["b1", "b2", "u1", "u2"] {
        lab.fault(r, r#"{"hang": true}"#);
    }
    let burst: Vec<_> = (0..10u64)
        .map(|i| {
            let u = url(&lab);
            let body = chat_body("m1", Some(&format!("load-{i}")), "work", false);
            let h = thread::spawn(move || post(&u, body, &[]));
            wait_until(
                &format!("the router to hold request {i}"),
                Duration::from_secs(20),
                || lab.router_inflight() == Some(i + 1),
            );
            h
        })
        .collect();
    for r in ["b1", "b2", "u1", "u2"] {
        lab.clear_fault(r);
    }
    let served: Vec<String> = burst
        .into_iter()
        .map(|h| h.join().unwrap().served_by().to_string())
        .collect();
    let on_base = served.iter().filter(|s| in_fleet(s, "b")).count();
    // A routing call that timed out fails open to the base: say so if it did.
    let failed_open = lab.envoy_stat("http.inference.ext_proc.failure_mode_allowed");
    assert_eq!(
        on_base, 4,
        "base (2 replicas × 2) fills first, the rest spills: {served:?} ({failed_open} failed open)"
    );
    assert_eq!(served.len() - on_base, 6);

    // Freed: the base takes traffic again once the writer's saturation tick
    // has seen every request end.
    lab.wait_settled();
    wait_until("the base to stop spilling", Duration::from_secs(10), || {
        snapshot(&lab)["fleets"][0]["saturated"] == false
    });
    let r = post(&url(&lab), chat_body("m1", Some("after"), "hi", false), &[]);
    assert!(
        r.served_by().starts_with('b'),
        "base never took traffic back"
    );
}

#[test]
fn a_dead_fleets_traffic_moves_to_the_others() {
    let lab = lab(
        TWO_FLEETS,
        &[
            "--prefill-tokens-per-sec",
            "10000000",
            "--decode-ms-per-token",
            "1",
        ],
    );
    let before: HashSet<String> = (0..30)
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
    assert!(before.iter().any(|s| s.starts_with('b')) && before.iter().any(|s| s.starts_with('u')));
    let killed = Instant::now();
    lab.fault("b1", r#"{"refuse": true}"#);
    lab.fault("b2", r#"{"refuse": true}"#);
    // Detection: two failed probes in a row.
    for r in ["b1", "b2"] {
        wait_replica(&lab, 0, r, "not ready", |v| v["ready"] == false);
    }
    for i in 0..60 {
        let r = post(
            &url(&lab),
            chat_body("m1", Some(&format!("k{i}")), "hi", false),
            &[],
        );
        assert_eq!(
            r.status,
            200,
            "request {i} {:?} after the fleet died: {}",
            killed.elapsed(),
            r.body
        );
        assert!(r.served_by().starts_with('u'), "served by dead fleet?");
    }
    let snap = snapshot(&lab);
    let base = &snap["fleets"][0]["replicas"];
    assert!(
        base.as_array().unwrap().iter().all(|r| r["ready"] == false),
        "{base}"
    );
}

const RESIDENCY: &str = r#"
health_check: { interval_ms: 200, timeout_ms: 150, healthy_threshold: 2, unhealthy_threshold: 2 }
fleets:
  - name: us-pool
    region: us
    endpoints: ["{us1}", "{us2}"]
  - name: eu-pool
    region: eu
    endpoints: ["{eu1}", "{eu2}"]
stages:
  - name: eu-chat
    models: [eu-model]
    fleets: [eu-pool]
    residency: eu
  - name: global-chat
    models: [global-model]
    fleets: [us-pool, eu-pool]
    residency: [us, eu]
"#;

#[test]
fn residency_is_never_left_even_with_every_fleet_inside_it_down() {
    let lab = lab(
        RESIDENCY,
        &[
            "--prefill-tokens-per-sec",
            "10000000",
            "--decode-ms-per-token",
            "1",
        ],
    );
    let mut seen = HashMap::<String, u32>::new();
    for i in 0..40 {
        let r = post(
            &url(&lab),
            chat_body("eu-model", Some(&format!("k{i}")), "hi", false),
            &[],
        );
        assert_eq!(r.status, 200);
        *seen.entry(r.served_by().to_string()).or_default() += 1;
        let r = post(
            &url(&lab),
            chat_body("global-model", Some(&format!("k{i}")), "hi", false),
            &[("x-residency", "eu")],
        );
        assert!(
            r.served_by().starts_with("eu"),
            "residency header eu served by {}",
            r.served_by()
        );
        *seen.entry(r.served_by().to_string()).or_default() += 1;
    }
    assert!(seen.keys().all(|k| k.starts_with("eu")), "{seen:?}");

    lab.fault("eu1", r#"{"refuse": true}"#);
    lab.fault("eu2", r#"{"refuse": true}"#);
    for r in ["eu1", "eu2"] {
        wait_replica(&lab, 1, r, "not ready", |v| v["ready"] == false);
    }
    for i in 0..20 {
        for (model, hdr) in [("eu-model", None), ("global-model", Some("eu"))] {
            let headers: Vec<(&str, &str)> =
                hdr.map(|h| vec![("x-residency", h)]).unwrap_or_default();
            let r = post(
                &url(&lab),
                chat_body(model, Some(&format!("k{i}")), "hi", false),
                &headers,
            );
            assert_eq!(
                r.status, 503,
                "{model} with eu down: {} {}",
                r.status, r.body
            );
            assert!(
                r.header("x-served-by").is_none(),
                "served outside the residency by {:?}",
                r.header("x-served-by")
            );
            let err = r.json();
            assert_eq!(err["error"]["code"], "no_ready_replica");
            assert!(
                err["error"]["message"].as_str().unwrap().contains("[eu]"),
                "{err}"
            );
        }
    }
    // The unrestricted stage still uses us.
    let r = post(
        &url(&lab),
        chat_body("global-model", Some("free"), "hi", false),
        &[],
    );
    assert_eq!(r.status, 200);
    assert!(r.served_by().starts_with("us"));
}

const FOUR: &str = r#"
health_check: { interval_ms: 200, timeout_ms: 150 }
fleets:
  - name: pool
    region: us
    endpoints: ["{r1}", "{r2}", "{r3}", "{r4}"]
stages:
  - name: chat
    models: [m1]
    fleets: [pool]
    outlier: { factor: 3.0, window_s: 10, min_samples: 4, base_ejection_s: 2, max_ejection_s: 8, max_ejected_share: 0.25 }
"#;

fn stream_many(lab: &Lab, n: usize, tag: &str) -> Vec<String> {
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let u = url(lab);
            let body = chat_body(
                "m1",
                Some(&format!("{tag}-{i}")),
                // The tag too: a prompt seen before would follow the prefix
                // cache to the replica that served it.
                &format!("question {tag} {i} {}", "word ".repeat(300)),
                true,
            );
            thread::spawn(move || post(&u, body, &[]))
        })
        .collect();
    handles
        .into_iter()
        .map(|h| {
            let r = h.join().unwrap();
            assert_eq!(r.status, 200);
            r.served_by().to_string()
        })
        .collect()
}

#[test]
fn a_slow_replica_is_ejected_and_readmitted() {
    let lab = lab(
        FOUR,
        &[
            "--prefill-tokens-per-sec",
            "200000",
            "--decode-ms-per-token",
            "5",
            "--max-batch",
            "32",
        ],
    );
    lab.fault("r1", r#"{"slow_factor": 8.0}"#);
    let r1 = lab.replicas["r1"].clone();
    let ejected = || replica_view(&lab, 0, &r1)["ejected"] == true;
    // New keys each round: the same keys would stick to the same replicas
    // (rendezvous and their cached prefixes), and might never reach r1. The
    // bound is in samples r1 served, not in time: a slow machine only makes
    // the rounds longer.
    let (mut round, mut on_r1) = (0, 0);
    while !ejected() {
        round += 1;
        on_r1 += stream_many(&lab, 8, &format!("warm{round}"))
            .iter()
            .filter(|s| *s == "r1")
            .count();
        assert!(
            on_r1 <= 40 && round <= 200,
            "r1 served {on_r1} slow requests in {round} rounds and was never ejected: {}\n\
             routing calls that failed open: {}, that timed out: {}",
            snapshot(&lab),
            lab.envoy_stat("http.inference.ext_proc.failure_mode_allowed"),
            lab.envoy_stat("http.inference.ext_proc.message_timeouts"),
        );
    }
    let others = snapshot(&lab)["fleets"][0]["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["ejected"] == true)
        .count();
    assert_eq!(others, 1, "only the slow replica is ejected");
    // A request decided while r1 was ejected both before and after it must
    // not reach r1; the ejection lasts seconds, so count only those.
    let mut bracketed = 0;
    for i in 0..12 {
        if !ejected() {
            break;
        }
        let r = post(
            &url(&lab),
            chat_body("m1", Some(&format!("during-{i}")), "hi", true),
            &[],
        );
        assert_eq!(r.status, 200);
        if ejected() {
            bracketed += 1;
            assert_ne!(r.served_by(), "r1", "an ejected replica got traffic");
        }
    }
    assert!(
        bracketed >= 3,
        "only {bracketed} requests were decided while r1 was ejected"
    );

    lab.clear_fault("r1");
    wait_replica(&lab, 0, "r1", "re-admitted", |v| v["ejected"] == false);
    // New keys and prompts each round: repeated ones would follow the prefix
    // cache to the replicas that served them while r1 was out.
    let mut round = 0;
    let back = wait_for_value(Duration::from_secs(10), || {
        round += 1;
        stream_many(&lab, 12, &format!("after{round}"))
            .contains(&"r1".to_string())
            .then_some(())
    });
    assert!(back.is_some(), "r1 never re-admitted: {}", snapshot(&lab));
}

const WARMUP: &str = r#"
health_check: { interval_ms: 200, timeout_ms: 150, healthy_threshold: 2, unhealthy_threshold: 2 }
fleets:
  - name: pool
    region: us
    endpoints: ["{r1}", "{r2}"]
stages:
  - name: chat
    models: [m1]
    fleets: [pool]
    warmup:
      timeout_ms: 300
      prompts:
        - body: { model: m1, messages: [{ role: user, content: "golden" }], max_tokens: 2 }
"#;

#[test]
fn a_rejoining_replica_must_pass_warmup_first() {
    let lab = lab(
        WARMUP,
        &[
            "--prefill-tokens-per-sec",
            "10000000",
            "--decode-ms-per-token",
            "1",
        ],
    );
    let served = |n: usize, tag: &str| -> HashSet<String> {
        (0..n)
            .map(|i| {
                post(
                    &url(&lab),
                    chat_body("m1", Some(&format!("{tag}{i}")), "hi", false),
                    &[],
                )
                .served_by()
                .to_string()
            })
            .collect()
    };
    assert!(served(30, "a").contains("r1"));
    // r1 fails its health checks, then comes back healthy but unable to answer.
    lab.fault("r1", r#"{"health_status": 503}"#);
    wait_replica(&lab, 0, "r1", "unhealthy", |v| v["health"] == "unhealthy");
    lab.fault("r1", r#"{"hang": true}"#);
    // Healthy again, and its warmup prompt hangs past the warmup timeout.
    wait_replica(&lab, 0, "r1", "healthy but cold", |v| {
        v["health"] == "healthy" && v["warm"] == false
    });
    assert!(
        !served(30, "b").contains("r1"),
        "a replica that fails warmup got traffic"
    );
    lab.clear_fault("r1");
    let back = wait_for_value(Duration::from_secs(5), || {
        served(30, "c").contains("r1").then_some(())
    });
    assert!(back.is_some(), "r1 never rejoined after passing warmup");
}

const PREFIX: &str = r#"
health_check: { interval_ms: 200, timeout_ms: 150 }
engine_metrics: { interval_ms: 100, timeout_ms: 90 }
fleets:
  - name: pool
    region: us
    endpoints: ["{r1}", "{r2}", "{r3}", "{r4}"]
stages:
  - name: chat
    models: [m1]
    fleets: [pool]
"#;

#[test]
fn a_conversation_follows_its_prefix_until_the_holder_is_overloaded() {
    let lab = lab(
        PREFIX,
        &[
            "--prefill-tokens-per-sec",
            "1000000",
            "--decode-ms-per-token",
            "1",
            "--max-batch",
            "2",
        ],
    );
    let system = format!(
        "You are the assistant of a long shared context. {}",
        "Context line. ".repeat(700)
    );
    let mut messages = vec![
        serde_json::json!({ "role": "system", "content": system }),
        serde_json::json!({ "role": "user", "content": "first question" }),
    ];
    let ask = |messages: &[serde_json::Value], user: &str| {
        let body = serde_json::json!({ "model": "m1", "messages": messages, "max_tokens": 2, "user": user });
        post(&url(&lab), body.to_string(), &[])
    };
    let first = ask(&messages, "turn-0");
    let home = first.served_by().to_string();
    // Later turns carry other sampling keys: only the cached prefix keeps them home.
    for turn in 1..6 {
        messages
            .push(serde_json::json!({ "role": "assistant", "content": format!("answer {turn}") }));
        messages.push(serde_json::json!({ "role": "user", "content": format!("question {turn}") }));
        lab.wait_settled();
        let r = ask(&messages, &format!("turn-{turn}"));
        assert_eq!(
            r.served_by(),
            home,
            "turn {turn} left the replica holding its prefix"
        );
        let cached = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        assert!(cached > 2000, "turn {turn} reused only {cached} tokens");
    }

    // Overload the holder from outside the router: long requests sent to it
    // directly fill its batch of 2 and queue; the engine reports the queue.
    // Under load a cached prefix is worth more (the prefix weight grows with
    // the queue), so the holder is left only once its queue is well past
    // the bounded-load guard; 24 requests keep it there for about 30 s.
    let addr = lab.replicas[&home].clone();
    let flood: Vec<_> = (0..24)
        .map(|i| {
            let u = format!("http://{addr}/v1/chat/completions");
            thread::spawn(move || {
                let body = serde_json::json!({ "model": "m1", "messages": [{ "role": "user", "content": format!("busy {i}") }], "max_tokens": 3000 });
                post(&u, body.to_string(), &[])
            })
        })
        .collect();
    // The engine's queue shows in a scrape (every 100 ms here): most of the
    // flood waits behind the batch of 2.
    wait_replica(&lab, 0, &home, "queueing", |v| {
        v["engine_waiting"].as_u64().is_some_and(|w| w >= 12)
    });
    // A turn still routed to the holder waits behind the flood, so each try
    // can take seconds on a loaded machine; the flood lasts about 18 s.
    let moved = wait_for_value(Duration::from_secs(12), || {
        messages.push(serde_json::json!({ "role": "user", "content": "and now?" }));
        let r = ask(&messages, "turn-busy");
        (r.served_by() != home).then(|| r.served_by().to_string())
    });
    assert!(
        moved.is_some(),
        "the conversation stayed on an overloaded holder: {}",
        snapshot(&lab)
    );
    lab.fault(&home, r#"{"refuse": true}"#); // ends the flood quickly
    for h in flood {
        let _ = h.join();
    }
}

#[test]
fn a_stream_from_a_dying_replica_ends_in_error_and_the_conversation_moves() {
    let lab = lab(
        PREFIX,
        &[
            "--prefill-tokens-per-sec",
            "1000000",
            "--decode-ms-per-token",
            "20",
        ],
    );
    let system = format!("Shared context. {}", "Background fact. ".repeat(400));
    let body = |turn: usize, stream: bool| {
        let mut v = serde_json::json!({
            "model": "m1",
            "messages": [
                { "role": "system", "content": system },
                { "role": "user", "content": format!("question {turn}") }
            ],
            "max_tokens": 20,
            "stream": stream,
            "stream_options": { "include_usage": true },
            "user": "conv-1"
        });
        if !stream {
            v.as_object_mut().unwrap().remove("stream_options");
        }
        v.to_string()
    };
    let first = post(&url(&lab), body(0, false), &[]);
    let home = first.served_by().to_string();
    let again = post(&url(&lab), body(1, false), &[]);
    assert_eq!(again.served_by(), home);

    // The replica dies mid-stream and stops answering health checks. Its
    // headers reach the client once ext_proc has reported the first byte (a
    // round trip): 100 ms of tokens leave them time to.
    lab.fault(&home, r#"{"die_after_tokens": 5, "health_status": 503}"#);
    let r = post(&url(&lab), body(2, true), &[]);
    assert_eq!(r.status, 200, "headers were already sent");
    assert!(
        !r.body.contains("[DONE]"),
        "a dying stream must not look complete: {}",
        r.body
    );
    assert!(r.body.matches("data: ").count() <= 6, "{}", r.body);

    wait_replica(&lab, 0, &home, "not ready", |v| v["ready"] == false);
    let next = post(&url(&lab), body(3, false), &[]);
    assert_eq!(next.status, 200);
    assert_ne!(
        next.served_by(),
        home,
        "the next turn went back to the dead replica"
    );
    let cached = next.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(cached, 0, "the new replica had to recompute the prefix");
    let counted = wait_for_value(Duration::from_secs(3), || {
        let snap = snapshot(&lab);
        (snap["fleets"][0]["error_rate"].as_f64().unwrap() > 0.0).then_some(())
    });
    assert!(
        counted.is_some(),
        "the broken stream never counted as an error: {}",
        snapshot(&lab)
    );
    let released = wait_for_value(Duration::from_secs(3), || {
        let snap = snapshot(&lab);
        let all = snap["fleets"][0]["replicas"].as_array().unwrap().clone();
        all.iter().all(|r| r["inflight"] == 0).then_some(())
    });
    assert!(
        released.is_some(),
        "the broken stream's load leaked: {}",
        snapshot(&lab)
    );
}
