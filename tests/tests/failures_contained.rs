//! Failures contained: a replica of a two-replica fleet that dies (stops
//! listening and drops its connections, as a crashed process does) fails
//! only the requests it had in flight. A request that cannot connect to it
//! is retried once on the fleet's other replica (the decision's ordered host
//! list), never after the first response byte; the dead replica is ejected
//! and stays out while its probe fails.
#![cfg(feature = "e2e")] // needs Envoy and the built binaries: scripts/test.sh

use std::time::Duration;

use fleetroute_tests::harness::client::blocking_get;
use fleetroute_tests::harness::scenario::FAST_ENGINES;
use fleetroute_tests::harness::steady_load::{LoadSpec, SteadyLoad};
use fleetroute_tests::harness::{Lab, LabSpec, pace, wait_until};

const ENGINE: &str = env!("CARGO_BIN_EXE_fleetroute-engine");

const ONE_FLEET: &str = r#"
health_check: { interval_ms: 500, timeout_ms: 500, healthy_threshold: 1, unhealthy_threshold: 3 }
fleets:
  - name: pool
    region: us
    endpoints: ["{r1}", "{r2}"]
stages:
  - name: chat
    models: [m1]
    fleets: [pool]
"#;

fn state(lab: &Lab, addr: &str) -> Option<String> {
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
fn a_dying_replica_fails_only_what_it_had_in_flight() {
    let lab = Lab::start(
        ENGINE,
        LabSpec {
            router: ONE_FLEET,
            engine_args: FAST_ENGINES,
            ..Default::default()
        },
    );
    let threads = 4;
    let load = SteadyLoad::start(
        &lab,
        LoadSpec {
            threads,
            streamed: true,
            max_tokens: 16,
            ..LoadSpec::default()
        },
    );
    pace(Duration::from_secs(1));
    lab.fault("r2", r#"{"refuse": true}"#);
    let r2 = lab.replicas["r2"].clone();
    wait_until("r2 to leave", Duration::from_secs(10), || {
        state(&lab, &r2).is_some_and(|s| s != "ready")
    });
    pace(Duration::from_secs(2));
    let (sent, failed) = load.finish();
    println!("{sent} requests, {failed} failed with r2 dying under {threads} clients");
    // At most what was in flight on r2 when it died: one per client.
    assert!(failed <= threads as u64, "{failed} failed");
    assert!(sent > 100, "only {sent} sent");
}

#[test]
fn a_replica_that_fails_its_probe_stays_out_after_its_ejection() {
    // Short ejections, so the test sees several of them end.
    let router = ONE_FLEET.replace(
        "    fleets: [pool]\n",
        "    fleets: [pool]\n    outlier: { base_ejection_s: 1, max_ejection_s: 1 }\n",
    );
    let lab = Lab::start(
        ENGINE,
        LabSpec {
            router: &router,
            engine_args: FAST_ENGINES,
            ..Default::default()
        },
    );
    // r2 answers /health but breaks every stream after two tokens.
    lab.fault("r2", r#"{"die_after_tokens": 2}"#);
    let r2 = lab.replicas["r2"].clone();
    let load = SteadyLoad::start(
        &lab,
        LoadSpec {
            threads: 2,
            streamed: true,
            max_tokens: 16,
            prefix: "before",
            ..LoadSpec::default()
        },
    );
    wait_until("r2 ejected", Duration::from_secs(20), || {
        state(&lab, &r2).as_deref() == Some("ejected")
    });
    let (_, failed_before) = load.finish();
    // Its one-second ejections end again and again; each time it fails its
    // probe, so no client request reaches it.
    let load = SteadyLoad::start(
        &lab,
        LoadSpec {
            threads: 2,
            streamed: true,
            max_tokens: 16,
            prefix: "after",
            ..LoadSpec::default()
        },
    );
    pace(Duration::from_secs(5));
    let served_by_r2 = load.served("r2");
    let (sent, failed) = load.finish();
    println!(
        "{failed_before} failed until r2 was ejected; then {failed} of {sent} failed over 5 s of 1 s ejections"
    );
    assert_eq!(failed, 0, "a re-admitted broken replica failed requests");
    assert_eq!(served_by_r2, 0);
    assert_ne!(state(&lab, &r2).as_deref(), Some("ready"));
    // Mended, it passes its probe and takes traffic again.
    lab.clear_fault("r2");
    wait_until("r2 back", Duration::from_secs(20), || {
        state(&lab, &r2).as_deref() == Some("ready")
    });
}

/// The bootstrap without its access log: Envoy reports no request's end.
fn no_access_log(bootstrap: &str) -> String {
    let mut doc: yaml_serde::Value = yaml_serde::from_str(bootstrap).expect("bootstrap YAML");
    doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        .as_mapping_mut()
        .expect("the connection manager")
        .remove("access_log")
        .expect("an access log to remove");
    yaml_serde::to_string(&doc).unwrap()
}

#[test]
fn without_the_access_log_leases_end_on_their_bound_and_a_metric_says_so() {
    let router = format!("leases: {{ min_ms: 1000, max_ms: 3000 }}\n{ONE_FLEET}");
    let lab = Lab::start(
        ENGINE,
        LabSpec {
            router: &router,
            engine_args: FAST_ENGINES,
            envoy_edit: Some(no_access_log),
            ..Default::default()
        },
    );
    let missing = || {
        let (_, m) = blocking_get(&format!("{}/metrics", lab.admin)).expect("/metrics");
        fleetroute_tests::harness::client::metric_sum(&m, "fleetroute_access_log_missing", &[])
    };
    assert_eq!(missing(), 0.0);
    for i in 0..10 {
        let r = fleetroute_tests::harness::client::post(
            &fleetroute_tests::harness::scenario::chat_url(&lab),
            fleetroute_tests::harness::client::chat_body("m1", Some(&format!("k{i}")), "hi", false),
            &[],
        );
        assert_eq!(r.status, 200, "{}", r.body);
    }
    // Nothing reports their ends: their load lasts until the bound (3 s).
    assert_eq!(lab.router_inflight(), Some(10));
    wait_until("the leases' bound", Duration::from_secs(10), || {
        lab.router_inflight() == Some(0)
    });
    wait_until("the metric to say so", Duration::from_secs(15), || {
        missing() == 1.0
    });
}
