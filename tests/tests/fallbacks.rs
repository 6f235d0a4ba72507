//! Through real Envoy: a stage that cannot serve hands its request to its
//! fallback instead of failing. A prompt longer than its context goes to the
//! longer stage at decision time; a replica that answers 503 or refuses the
//! connection before its first byte is retried once by Envoy on the
//! fallback's replica, with the fallback's model name (each engine refuses
//! any other, as vLLM does); the client reads `x-fleetroute-fallback` and the
//! model that answered; nothing ever leaves the named stage's residency; and
//! a fallback list that loops is refused.
#![cfg(feature = "e2e")] // needs Envoy and the built binaries: scripts/test.sh

use fleetroute_tests::harness::client::{self, chat_body, post};
use fleetroute_tests::harness::scenario::{FAST_ENGINES, chat_url as url};
use std::time::Duration;

use fleetroute_tests::harness::{Lab, LabSpec, wait_until};
use serde_json::Value;

const ENGINE: &str = env!("CARGO_BIN_EXE_fleetroute-engine");

/// `big` (eu) falls back to `small` for every condition; `small` prefers
/// its US fleet, which `big`'s residency never reaches. Health checks are
/// slow, so a failing replica is met by requests before fleetroute sees it.
const ROUTER: &str = r#"
health_check: { interval_ms: 60000, timeout_ms: 500, healthy_threshold: 1, unhealthy_threshold: 3 }
fleets:
  - { name: big, region: eu, endpoints: ["{b1}"] }
  - { name: small, region: eu, endpoints: ["{s1}"] }
  - { name: small-us, region: us, endpoints: ["{u1}"] }
stages:
  - name: big
    models: [big-model]
    fleets: [big]
    residency: eu
    context_tokens: 300
    fallbacks: [{ stage: small, on: [saturated, unhealthy, context, upstream] }]
  - name: small
    models: [small-model]
    fleets: [small-us, small]
    routing: { policy: priority }
"#;

fn lab() -> Lab {
    let mut args: Vec<&'static str> = FAST_ENGINES.to_vec();
    args.extend([
        "--served-model",
        "b1=big-model",
        "--served-model",
        "s1=small-model",
        "--served-model",
        "u1=small-model",
    ]);
    Lab::start(
        ENGINE,
        LabSpec {
            router: ROUTER,
            engine_args: Vec::leak(args),
            ..Default::default()
        },
    )
}

/// The model a response names, JSON or SSE.
fn model_of(body: &str, stream: bool) -> String {
    let json = if stream {
        body.split("\n\n")
            .find_map(|e| e.strip_prefix("data: "))
            .unwrap_or("{}")
    } else {
        body
    };
    let v: Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {body}"));
    v["model"].as_str().unwrap_or_default().to_string()
}

fn served(lab: &Lab, replica: &str) -> u64 {
    let (_, body) = client::blocking_get(&format!("{}/replicas", lab.control)).expect("control");
    let all: Value = serde_json::from_str(&body).expect("JSON");
    all.as_array()
        .expect("replicas")
        .iter()
        .find(|r| r["name"] == replica)
        .expect("replica")["requests_served"]
        .as_u64()
        .unwrap_or(0)
}

fn metric(lab: &Lab, reason: &str) -> f64 {
    let (_, text) = client::blocking_get(&format!("{}/metrics", lab.admin)).expect("metrics");
    let series = format!(
        "fleetroute_fallbacks_total{{stage=\"big\",fallback=\"small\",reason=\"{reason}\"}}"
    );
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

fn ask(lab: &Lab, text: &str, stream: bool) -> client::Reply {
    post(
        &url(lab),
        chat_body("big-model", Some("alice"), text, stream),
        &[],
    )
}

#[test]
fn the_stage_degrades_to_its_fallback_and_the_client_is_told() {
    let lab = lab();
    // Served as named: no header, the stage's own model.
    let r = ask(&lab, "hello", false);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("x-fleetroute-fallback"), None);
    assert_eq!(model_of(&r.body, false), "big-model");

    // Longer than big's 300 tokens: small answers, under its own name.
    let long = "word ".repeat(400);
    for stream in [false, true] {
        let r = ask(&lab, &long, stream);
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(
            r.header("x-fleetroute-fallback"),
            Some("small; reason=context")
        );
        assert_eq!(model_of(&r.body, stream), "small-model");
    }
    assert!(metric(&lab, "context") >= 2.0);

    // big's replica fails before its first byte: Envoy retries once on
    // small's replica fleetroute chose, renamed for it.
    for fault in [r#"{"status": 503}"#, r#"{"refuse": true}"#] {
        lab.fault("b1", fault);
        for stream in [false, true] {
            let r = ask(&lab, "hello again", stream);
            assert_eq!(r.status, 200, "{fault}: {}", r.body);
            assert_eq!(
                r.header("x-fleetroute-fallback"),
                Some("small; reason=upstream"),
                "{fault}"
            );
            assert_eq!(model_of(&r.body, stream), "small-model");
        }
        lab.clear_fault("b1");
    }
    assert_eq!(served(&lab, "u1"), 0, "a request left big's residency");
    assert!(served(&lab, "s1") >= 6);
    // Counted from the access log: the answer came from small's replica.
    wait_until("upstream fallbacks counted", Duration::from_secs(5), || {
        metric(&lab, "upstream") >= 4.0
    });
}

#[test]
fn a_fallback_loop_is_refused_by_check_config() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("router.yaml");
    std::fs::write(
        &path,
        r#"
fleets:
  - { name: a, region: eu, endpoints: ["127.0.0.1:1"] }
stages:
  - { name: x, fleets: [a], fallbacks: [{ stage: y }] }
  - { name: y, fleets: [a], fallbacks: [{ stage: x }] }
"#,
    )
    .unwrap();
    let bins = fleetroute_tests::harness::Binaries::locate(ENGINE);
    let out = std::process::Command::new(&bins.fleetroute)
        .args(["check-config"])
        .arg(&path)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("fallbacks loop: x -> y -> x"), "{text}");
}
