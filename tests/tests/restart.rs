//! A restart is a restart: on SIGTERM fleetroute withdraws its readiness at
//! once, keeps serving through its drain, then ends Envoy's EDS and access
//! log streams (which Envoy never ends itself) and exits, so a new process
//! takes the same ports within the drain plus its start time. Requests in
//! between follow the fail-open policy: none fails.
#![cfg(feature = "e2e")] // needs Envoy and the built binaries: scripts/test.sh

use std::time::{Duration, Instant};

use fleetroute_tests::harness::client::{blocking_get, chat_body, post};
use fleetroute_tests::harness::scenario::{FAST_ENGINES, chat_url, two_fleets_tolerant_health};
use fleetroute_tests::harness::steady_load::{LoadSpec, SteadyLoad};
use fleetroute_tests::harness::{Lab, LabSpec, pace, wait_until};

const ENGINE: &str = env!("CARGO_BIN_EXE_fleetroute-engine");
const DRAIN: Duration = Duration::from_millis(1000);

fn ready(lab: &Lab) -> Option<u16> {
    blocking_get(&format!("{}/ready", lab.admin)).map(|(s, _)| s)
}

#[test]
fn a_stopped_instance_exits_within_its_drain_and_comes_back_on_its_ports() {
    let router = two_fleets_tolerant_health();
    let drain_ms = DRAIN.as_millis().to_string();
    let mut lab = Lab::start(
        ENGINE,
        LabSpec {
            router: &router,
            engine_args: FAST_ENGINES,
            serve_args: &["--drain-ms", &drain_ms],
            ..Default::default()
        },
    );
    // Envoy holds its EDS stream and its workers' access log streams open.
    wait_until("Envoy's streams", Duration::from_secs(10), || {
        lab.envoy_stat("cluster.fleetroute.upstream_cx_active") >= 1
    });
    let load = SteadyLoad::start(
        &lab,
        LoadSpec {
            threads: 2,
            streamed: true,
            ..LoadSpec::default()
        },
    );
    pace(Duration::from_millis(500));

    let stopping = Instant::now();
    lab.fleetroute.terminate();
    // Not ready at once, while it still serves.
    let mut saw_unready = false;
    while stopping.elapsed() < DRAIN / 2 {
        saw_unready |= ready(&lab) == Some(503);
        pace(Duration::from_millis(20));
    }
    assert!(saw_unready, "/ready did not turn 503 on SIGTERM");
    assert!(
        lab.fleetroute.wait_exit(DRAIN + Duration::from_secs(4)),
        "fleetroute still runs {:?} after SIGTERM",
        stopping.elapsed()
    );
    // The drain, then the calls in flight: well within the 5 s grace.
    let exited = stopping.elapsed();
    assert!(
        exited < DRAIN + Duration::from_secs(3),
        "exited {exited:?} after SIGTERM"
    );
    let restarted = Instant::now();
    lab.start_router();
    let back = restarted.elapsed();
    pace(Duration::from_millis(500));
    let (sent, failed) = load.finish();
    println!(
        "exited {:.2} s after SIGTERM (drain {:.1} s), ready again {:.2} s later; {sent} requests, {failed} failed",
        exited.as_secs_f64(),
        DRAIN.as_secs_f64(),
        back.as_secs_f64()
    );
    assert!(
        back < Duration::from_secs(10),
        "not ready {back:?} after restart"
    );
    assert!(sent > 50, "only {sent} requests during the restart");
    assert_eq!(failed, 0, "requests failed across the restart");
    // Routing by fleetroute again: Envoy found the new process.
    wait_until("a routed request", Duration::from_secs(10), || {
        let r = post(
            &chat_url(&lab),
            chat_body("m1", Some("after"), "hi", false),
            &[],
        );
        r.status == 200
            && r.header("x-request-id")
                .is_some_and(|id| lab.decision(id).is_some())
    });
}
