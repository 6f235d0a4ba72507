//! Outcomes reach fleetroute through Envoy's gRPC access log (real Envoy).
//! The log is lossy: when its entries never arrive, every decision's load
//! lease still ends (by its bound, or by the engine's own count), so no
//! replica stays loaded.
#![cfg(feature = "e2e")] // needs Envoy and the built binaries: scripts/test.sh

use std::io::Read;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use fleetroute_tests::harness::client::{blocking_get, chat_body_tokens, client, metric_sum, post};
use fleetroute_tests::harness::scenario::chat_url as url;
use fleetroute_tests::harness::{Lab, LabSpec, wait_until};

const ENGINE: &str = env!("CARGO_BIN_EXE_fleetroute-engine");

const ROUTER: &str = r#"
health_check: { interval_ms: 200, timeout_ms: 150 }
engine_metrics: { interval_ms: ENGINE_MS, timeout_ms: 150 }
leases: { min_ms: LEASE_MIN, max_ms: LEASE_MAX }
fleets:
  - name: pool
    region: us
    endpoints: ["{r1}", "{r2}"]
stages:
  - name: chat
    models: [m1]
    fleets: [pool]
"#;

fn router(engine_ms: u64, lease_min_ms: u64, lease_max_ms: u64) -> String {
    ROUTER
        .replace("ENGINE_MS", &engine_ms.to_string())
        .replace("LEASE_MIN", &lease_min_ms.to_string())
        .replace("LEASE_MAX", &lease_max_ms.to_string())
}

/// Points the access log at a fleet cluster, which does not speak
/// AccessLogService: every entry is lost, routing still works.
fn log_service_down(yaml: &str) -> String {
    let at = yaml.find("access_log:").expect("an access_log block");
    let name = "cluster_name: fleetroute";
    // The first reference after `access_log:` (ADS names it earlier).
    let first = at + yaml[at..].find(name).expect("the access log's cluster");
    assert!(
        first < yaml.find("http_filters:").unwrap(),
        "the first fleetroute cluster reference after access_log: is the access log's"
    );
    format!(
        "{}cluster_name: pool{}",
        &yaml[..first],
        &yaml[first + name.len()..]
    )
}

fn metrics(lab: &Lab) -> String {
    blocking_get(&format!("{}/metrics", lab.admin))
        .expect("/metrics")
        .1
}

fn send(lab: &Lab, n: usize, stream: bool) {
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let u = url(lab);
            let body = chat_body_tokens("m1", Some(&format!("u{i}")), "hello there", stream, 4);
            thread::spawn(move || post(&u, body, &[]))
        })
        .collect();
    for h in handles {
        let r = h.join().unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
    }
}

/// The tokens fleetroute counts queued for prefill, over every replica.
fn queued_tokens(lab: &Lab) -> Option<u64> {
    let (_, body) = blocking_get(&format!("{}/debug/snapshot", lab.admin))?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    let mut sum = 0;
    for f in v["fleets"].as_array()? {
        for r in f["replicas"].as_array()? {
            sum += r["queued_tokens"].as_u64()?;
        }
    }
    Some(sum)
}

/// A counter of the engine's, summed over the lab's replicas.
fn engine_counter(lab: &Lab, metric: &str) -> f64 {
    lab.replicas
        .values()
        .filter_map(|a| blocking_get(&format!("http://{a}/metrics")))
        .map(|(_, m)| metric_sum(&m, metric, &[]))
        .sum()
}

/// The engine sends a stream's headers before it queues the request (as
/// vLLM does). The rename root holds them until the first body byte, so
/// the ext_proc report of them ends the replica's prefill share at the
/// first token: not while the prompt is still prefilling, and long before
/// the share's estimate.
#[test]
fn the_first_token_ends_the_replicas_prefill_share() {
    let lab = Lab::start(
        ENGINE,
        LabSpec {
            router: &router(200, 1500, 600_000),
            engine_args: &[
                "--prefill-tokens-per-sec",
                "10000",
                "--decode-ms-per-token",
                "50",
            ],
            ..Default::default()
        },
    );
    // 20k tokens: 2 s of prefill here; fleetroute's default estimate is
    // 4 s, which keeps the share for 8 s when no report comes.
    let text = "abcd".repeat(20_000);
    let body = chat_body_tokens("m1", Some("long"), &text, true, 40);
    let u = url(&lab);
    let (headers_tx, headers_rx) = mpsc::channel();
    let reader = thread::spawn(move || {
        let mut r = client()
            .post(&u)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .expect("a response");
        headers_tx.send(r.status().as_u16()).unwrap();
        let mut all = String::new();
        r.read_to_string(&mut all).expect("the stream");
        all
    });
    wait_until("the replica prefills", Duration::from_secs(10), || {
        engine_counter(&lab, "vllm:prompt_tokens_total") > 0.0
    });
    let queued = queued_tokens(&lab).expect("snapshot");
    assert_eq!(
        engine_counter(&lab, "vllm:generation_tokens_total"),
        0.0,
        "still prefilling when fleetroute was asked"
    );
    assert!(
        queued >= 20_000,
        "the prompt is queued while it prefills: {queued}"
    );
    assert!(
        headers_rx.try_recv().is_err(),
        "the engine's early headers reached the client before the first token"
    );
    assert_eq!(
        headers_rx.recv_timeout(Duration::from_secs(20)),
        Ok(200),
        "headers with the first token"
    );
    wait_until(
        "the prefill share ends at the first token",
        Duration::from_secs(2),
        || queued_tokens(&lab) == Some(0),
    );
    assert!(
        engine_counter(&lab, "vllm:generation_tokens_total") < 40.0,
        "the stream still decodes"
    );
    let m = metrics(&lab);
    let ended = |r: &str| {
        metric_sum(
            &m,
            "fleetroute_prefill_ended_total",
            &[&format!("result=\"{r}\"")],
        )
    };
    assert_eq!((ended("first_byte"), ended("estimate")), (1.0, 0.0), "{m}");
    assert_eq!(
        lab.router_inflight(),
        Some(1),
        "the request still holds its slot"
    );
    let all = reader.join().unwrap();
    assert!(all.contains("[DONE]"), "{all}");
}

#[test]
fn outcomes_usage_and_time_to_first_token_arrive_through_the_log() {
    let lab = Lab::start(
        ENGINE,
        LabSpec {
            router: &router(200, 1500, 600_000),
            engine_args: &["--decode-ms-per-token", "5"],
            ..Default::default()
        },
    );
    send(&lab, 4, true);
    send(&lab, 3, false);
    wait_until("seven observed entries", Duration::from_secs(10), || {
        metric_sum(
            &metrics(&lab),
            "fleetroute_access_log_entries_total",
            &["result=\"observed\""],
        ) >= 7.0
    });
    let m = metrics(&lab);
    let tokens = |kind: &str| {
        metric_sum(
            &m,
            "fleetroute_tokens_total",
            &[&format!("kind=\"{kind}\"")],
        )
    };
    // 4 completion tokens per request, read by the Wasm filter off JSON bodies
    // and off the SSE event that carries usage.
    assert_eq!(tokens("completion"), 28.0, "{m}");
    assert!(tokens("prompt") > 0.0);
    assert_eq!(
        metric_sum(&m, "fleetroute_responses_total", &["class=\"ok\""]),
        7.0
    );
    // Time to first token from the first upstream body byte, streams only.
    assert_eq!(
        metric_sum(&m, "fleetroute_time_to_first_token_seconds_count", &[]),
        4.0
    );
    assert_eq!(
        metric_sum(
            &m,
            "fleetroute_leases_released_total",
            &["result=\"logged\""]
        ),
        7.0
    );
    assert_eq!(lab.router_inflight(), Some(0));
    // Envoy's own counters reach fleetroute's metrics (scraped every 5 s).
    wait_until(
        "Envoy's access log counters",
        Duration::from_secs(15),
        || {
            metric_sum(
                &metrics(&lab),
                "fleetroute_envoy_access_log",
                &["result=\"written\""],
            ) >= 7.0
        },
    );
}

#[test]
fn lost_entries_release_every_lease_by_its_bound() {
    // Engine scrapes off: only the lease bound can end the lost leases.
    let lab = Lab::start(
        ENGINE,
        LabSpec {
            router: &router(0, 3000, 4000),
            engine_args: &["--decode-ms-per-token", "5"],
            envoy_edit: Some(log_service_down),
            ..Default::default()
        },
    );
    send(&lab, 6, true);
    // Responses are complete, but fleetroute never heard: the load stays...
    assert_eq!(lab.router_inflight(), Some(6));
    let m = metrics(&lab);
    assert_eq!(
        metric_sum(&m, "fleetroute_access_log_entries_total", &[]),
        0.0
    );
    // ...until each lease's bound (floor 3 s, ceiling 4 s) passes.
    wait_until("every lease expired", Duration::from_secs(10), || {
        lab.router_inflight() == Some(0)
    });
    let m = metrics(&lab);
    assert_eq!(
        metric_sum(
            &m,
            "fleetroute_leases_released_total",
            &["result=\"expired\""]
        ),
        6.0
    );
    assert_eq!(metric_sum(&m, "fleetroute_leases_held", &[]), 0.0);
    // The loss shows in Envoy's counters too.
    wait_until(
        "Envoy counts the lost entries",
        Duration::from_secs(15),
        || {
            let m = metrics(&lab);
            metric_sum(&m, "fleetroute_envoy_access_log", &["result=\"dropped\""])
                + metric_sum(&m, "fleetroute_envoy_access_log", &["result=\"written\""])
                >= 6.0
        },
    );
}

#[test]
fn the_engines_count_ends_lost_leases_before_their_bound() {
    // A 10-minute ceiling: only reconciliation with the engine's reported
    // running and waiting counts can end these leases within the deadline.
    let lab = Lab::start(
        ENGINE,
        LabSpec {
            router: &router(200, 1500, 600_000),
            engine_args: &["--decode-ms-per-token", "5"],
            envoy_edit: Some(log_service_down),
            ..Default::default()
        },
    );
    // No max_tokens: the bound would be the default output at a slow rate.
    let body = r#"{"model":"m1","messages":[{"role":"user","content":"hi"}],"stream":true}"#;
    for _ in 0..4 {
        assert_eq!(post(&url(&lab), body, &[]).status, 200);
    }
    assert_eq!(lab.router_inflight(), Some(4));
    wait_until(
        "the engine count to end the leases",
        Duration::from_secs(10),
        || lab.router_inflight() == Some(0),
    );
    let m = metrics(&lab);
    assert_eq!(
        metric_sum(
            &m,
            "fleetroute_leases_released_total",
            &["result=\"reconciled\""]
        ),
        4.0
    );
    assert_eq!(
        metric_sum(
            &m,
            "fleetroute_leases_released_total",
            &["result=\"expired\""]
        ),
        0.0
    );
}
