//! Through real Envoy with fleetroute stopped: the fail-open routes keep the
//! stage's proportions, skip a fleet whose replicas are dead, and never leave
//! the stage's residency; retries stay within the retry budget.
#![cfg(feature = "e2e")] // needs Envoy and the built binaries: scripts/test.sh

use std::collections::BTreeMap;
use std::time::Duration;

use fleetroute_tests::harness::client::{chat_body, post};
use fleetroute_tests::harness::scenario::{FAST_ENGINES, chat_url as url};
use fleetroute_tests::harness::{Lab, LabSpec, wait_for_value, wait_until};

const ENGINE: &str = env!("CARGO_BIN_EXE_fleetroute-engine");

/// `chat` (residency us) over `base` and `burst` weighted 3:1, and a fleet
/// in another region that only the `eu` stage may use.
const RESIDENCY: &str = r#"
health_check: { interval_ms: 200, timeout_ms: 150, healthy_threshold: 2, unhealthy_threshold: 2 }
default_stage: chat
fleets:
  - name: base
    region: us
    endpoints: ["{b1}", "{b2}"]
  - name: burst
    region: us
    endpoints: ["{u1}", "{u2}"]
  - name: far
    region: eu
    endpoints: ["{f1}"]
stages:
  - name: chat
    models: [m1]
    fleets: [base, burst]
    residency: us
    routing: { policy: weighted, weights: { base: 3, burst: 1 } }
  - name: eu
    models: [m2]
    fleets: [far]
    residency: eu
"#;

fn lab(router: &str) -> Lab {
    Lab::start(
        ENGINE,
        LabSpec {
            router,
            engine_args: FAST_ENGINES,
            ..Default::default()
        },
    )
}

/// Hosts of stage `chat` that Envoy's health checks pass (its fail-open
/// cluster holds both fleets' replicas).
fn healthy_hosts(lab: &Lab) -> u64 {
    lab.envoy_stat("cluster.fallback/chat.membership_healthy")
}

/// Waits until Envoy's health checks show `state`, then for two more rounds
/// of checks: the workers' view of health follows the health checker's by
/// up to a round (measured with Envoy 1.40: right after a change, a few
/// requests can still pick a host by the previous state).
fn settle(lab: &Lab, what: &str, state: impl Fn(&Lab) -> bool) {
    wait_until(what, Duration::from_secs(10), || state(lab));
    let attempts = |lab: &Lab| lab.envoy_stat("cluster.fallback/chat.health_check.attempt");
    let seen = attempts(lab);
    // Two rounds over the stage's four replicas.
    wait_until(
        "two more rounds of health checks",
        Duration::from_secs(10),
        || attempts(lab) >= seen + 8,
    );
    assert!(state(lab), "{what} no longer holds");
}

/// Polls with batches of fail-open requests until one batch reaches both
/// fleets (at 3:1, a batch of 20 misses `burst` by chance 0.3% of the time).
fn wait_for_both_fleets(lab: &Lab, tag: &str) {
    let mut round = 0;
    let both = wait_for_value(Duration::from_secs(15), || {
        round += 1;
        let by = spread(lab, 20, &format!("{tag}-{round}"));
        (by.contains_key(&'b') && by.contains_key(&'u')).then_some(())
    });
    assert!(
        both.is_some(),
        "fail-open traffic never reached both fleets ({tag})"
    );
}

/// Requests served per replica-name prefix (`b`, `u`, `f`).
fn spread(lab: &Lab, n: usize, tag: &str) -> BTreeMap<char, usize> {
    let mut by = BTreeMap::new();
    for i in 0..n {
        let r = post(
            &url(lab),
            chat_body("m1", Some(&format!("{tag}-{i}")), "hi", false),
            &[],
        );
        assert_eq!(r.status, 200, "fail-open request {i}: {}", r.body);
        *by.entry(r.served_by().chars().next().unwrap()).or_default() += 1;
    }
    by
}

#[test]
fn fail_open_keeps_proportions_and_skips_a_dead_fleet() {
    let mut lab = lab(RESIDENCY);
    lab.stop_router();
    settle(&lab, "every replica healthy", |lab| healthy_hosts(lab) == 4);

    // Both fleets healthy: 3:1, as configured (80 requests: 60 expected on
    // base; 45..=75 is beyond 3.8 standard deviations).
    // A fleet that turns healthy reaches the workers' balancers up to about
    // a second later than the health checker's stats (measured with Envoy
    // 1.40, at start-up as on recovery): wait until fail-open traffic on this
    // client's connection reaches both fleets.
    wait_for_both_fleets(&lab, "start");
    let healthy = spread(&lab, 80, "both");
    println!("fail-open, both fleets healthy: {healthy:?}");
    let base = healthy.get(&'b').copied().unwrap_or(0);
    assert!((45..=75).contains(&base), "{healthy:?}");
    assert!(healthy.get(&'u').copied().unwrap_or(0) > 0, "{healthy:?}");
    assert!(
        !healthy.contains_key(&'f'),
        "left the residency: {healthy:?}"
    );

    // The preferred fleet dies: its replicas refuse connections.
    lab.fault("b1", r#"{"refuse": true}"#);
    lab.fault("b2", r#"{"refuse": true}"#);
    settle(&lab, "base's replicas failing health checks", |lab| {
        healthy_hosts(lab) == 2
    });
    let failed_over = spread(&lab, 10, "dead");
    println!("fail-open, base refusing: {failed_over:?}");
    assert_eq!(failed_over.get(&'u'), Some(&10), "{failed_over:?}");

    // The other stage is still served from its own fleet only.
    let r = post(&url(&lab), chat_body("m2", Some("eu"), "hi", false), &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.served_by(), "f1");

    // base comes back and takes its share again.
    lab.clear_fault("b1");
    lab.clear_fault("b2");
    settle(&lab, "base healthy again", |lab| healthy_hosts(lab) == 4);
    wait_for_both_fleets(&lab, "back");
}

/// 320 requests, 32 at a time, while fleetroute keeps choosing `b1`, which
/// refuses connections (health checks too slow to notice during the run):
/// (failed requests, retries, retry overflows).
fn load_with_a_refusing_replica(envoy_section: &str) -> (usize, u64, u64) {
    let router = format!(
        "{envoy_section}\n{}",
        fleetroute_tests::harness::scenario::TWO_FLEETS.replace(
            "health_check: { interval_ms: 200, timeout_ms: 150, healthy_threshold: 2, unhealthy_threshold: 2 }",
            "health_check: { interval_ms: 30000, timeout_ms: 500, healthy_threshold: 2, unhealthy_threshold: 2 }",
        )
    );
    assert!(router.contains("interval_ms: 30000"));
    let lab = lab(&router);
    lab.fault("b1", r#"{"refuse": true}"#);
    let lab = &lab;
    let failures: usize = std::thread::scope(|s| {
        let workers: Vec<_> = (0..32)
            .map(|w| {
                s.spawn(move || {
                    (0..10)
                        .filter(|i| {
                            let r = post(
                                &url(lab),
                                chat_body("m1", Some(&format!("load-{w}-{i}")), "hi", false),
                                &[],
                            );
                            r.status != 200
                        })
                        .count()
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).sum()
    });
    let retries = lab.envoy_stat("cluster.base.upstream_rq_retry");
    let overflow = lab.envoy_stat("cluster.base.upstream_rq_retry_overflow")
        + lab.envoy_stat("cluster.burst.upstream_rq_retry_overflow");
    (failures, retries, overflow)
}

/// Envoy retries on the next host of fleetroute's decision; every request
/// succeeds and the retry budget never overflows under this modest load.
#[test]
fn retries_stay_within_the_budget_while_a_replica_refuses() {
    let (failures, retries, overflow) = load_with_a_refusing_replica("");
    println!(
        "320 requests, 32 at a time, b1 refusing: {failures} failed, {retries} retries, {overflow} retry overflows"
    );
    assert!(
        retries > 0,
        "no request was retried: the test did not exercise retries"
    );
    assert_eq!((failures, overflow), (0, 0));
}

/// The same load with a budget as tight as Envoy's old fixed limit: retries
/// overflow and requests fail, so the counter above is live.
#[test]
fn a_tight_retry_budget_overflows() {
    let (failures, retries, overflow) = load_with_a_refusing_replica(
        "envoy: { retries: { budget_percent: 1, min_concurrency: 1 } }",
    );
    println!(
        "same load, budget 1% / floor 1: {failures} failed, {retries} retries, {overflow} retry overflows"
    );
    assert!(overflow > 0 && failures > 0);
}
