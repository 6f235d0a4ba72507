//! What many scenarios share: fast engines and two fleets under one stage.

use super::Lab;

/// Engine flags for replicas that answer at once.
pub const FAST_ENGINES: &[&str] = &[
    "--prefill-tokens-per-sec",
    "10000000",
    "--decode-ms-per-token",
    "1",
];

/// Two fleets of two replicas (`b1`, `b2` in `base`; `u1`, `u2` in `burst`),
/// one stage `chat` serving model `m1`, weighted 1:1, health checks every
/// 200 ms, and `chat` as the default stage.
pub const TWO_FLEETS: &str = r#"
health_check: { interval_ms: 200, timeout_ms: 150, healthy_threshold: 2, unhealthy_threshold: 2 }
default_stage: chat
fleets:
  - name: base
    region: us
    endpoints: ["{b1}", "{b2}"]
  - name: burst
    region: us
    endpoints: ["{u1}", "{u2}"]
stages:
  - name: chat
    models: [m1]
    fleets: [base, burst]
    routing: { policy: weighted, weights: { base: 1, burst: 1 } }
"#;

/// `TWO_FLEETS` with health checks that ride out a stalled machine (a probe
/// may take a whole interval, three failures in a row to leave), for
/// scenarios about something else than health: on a loaded 2-core machine
/// the default 150 ms probes can all time out at once.
pub fn two_fleets_tolerant_health() -> String {
    let strict = "health_check: { interval_ms: 200, timeout_ms: 150, healthy_threshold: 2, unhealthy_threshold: 2 }";
    assert!(TWO_FLEETS.contains(strict));
    TWO_FLEETS.replace(
        strict,
        "health_check: { interval_ms: 500, timeout_ms: 500, healthy_threshold: 1, unhealthy_threshold: 3 }",
    )
}

/// The chat completions URL through the lab's Envoy.
pub fn chat_url(lab: &Lab) -> String {
    format!("{}/v1/chat/completions", lab.envoy)
}
