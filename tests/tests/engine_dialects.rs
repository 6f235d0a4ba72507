//! A fleet whose `engine:` does not match what its replicas export: the
//! signals its dialect names are reported missing (metric and snapshot),
//! never read as zeros, while the fleet that matches reports nothing.
#![cfg(feature = "e2e")] // needs Envoy and the built binaries: scripts/test.sh

use std::time::Duration;

use fleetroute_tests::harness::client::{self, metric_sum};
use fleetroute_tests::harness::scenario::FAST_ENGINES as FAST;
use fleetroute_tests::harness::{Lab, LabSpec, wait_for_value};
use serde_json::Value;

const ENGINE: &str = env!("CARGO_BIN_EXE_fleetroute-engine");

/// The simulated engines speak vLLM's names; `burst` says it runs llama.cpp.
const ROUTER: &str = r#"
health_check: { interval_ms: 500, timeout_ms: 500, healthy_threshold: 1, unhealthy_threshold: 3 }
engine_metrics: { interval_ms: 100, timeout_ms: 100 }
default_stage: chat
fleets:
  - name: base
    region: us
    endpoints: ["{b1}"]
  - name: burst
    region: us
    engine: llamacpp
    endpoints: ["{u1}"]
stages:
  - name: chat
    models: [m1]
    fleets: [base, burst]
"#;

#[test]
fn a_wrong_engine_is_reported_not_read_as_zero() {
    let lab = Lab::start(
        ENGINE,
        LabSpec {
            router: ROUTER,
            engine_args: FAST,
            ..Default::default()
        },
    );
    let m = wait_for_value(Duration::from_secs(10), || {
        let (_, m) = client::blocking_get(&format!("{}/metrics", lab.admin))?;
        (metric_sum(&m, "fleetroute_engine_signal_missing", &["fleet=\"burst\""]) > 0.0)
            .then_some(m)
    })
    .expect("the mismatched fleet was never reported");
    for signal in [
        "running",
        "waiting",
        "prefix_cache_hits",
        "prefix_cache_queries",
    ] {
        let want = format!("signal=\"{signal}\"");
        assert_eq!(
            metric_sum(
                &m,
                "fleetroute_engine_signal_missing",
                &["fleet=\"burst\"", &want]
            ),
            1.0,
            "{signal}"
        );
    }
    assert_eq!(
        metric_sum(&m, "fleetroute_engine_signal_missing", &["fleet=\"base\""]),
        0.0,
        "the vLLM fleet reads every signal"
    );
    assert!(
        metric_sum(
            &m,
            "fleetroute_engine_scrapes_total",
            &["fleet=\"burst\"", "engine=\"llamacpp\"", "result=\"ok\""]
        ) > 0.0,
        "the scrape itself succeeds: what is wrong is the names"
    );
    let (_, body) = client::blocking_get(&format!("{}/debug/snapshot", lab.admin)).unwrap();
    let v: Value = serde_json::from_str(&body).unwrap();
    let burst = v["fleets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "burst")
        .unwrap();
    assert_eq!(burst["engine"], "llamacpp");
    let missing: Vec<&str> = burst["engine_signals_missing"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(missing.contains(&"running"), "{missing:?}");
    // The log names the fleet once, with what to change.
    let log = std::fs::read_to_string(&lab.fleetroute.log).unwrap();
    let lines = log
        .lines()
        .filter(|l| l.contains("lack what its dialect names") && l.contains("burst"))
        .count();
    assert_eq!(lines, 1, "one log line for the fleet, not one per scrape");
}
