//! Admission on the routing stream, in process: the gRPC service served on a
//! loopback port as `serve` does, the test playing Envoy's filter. A held
//! request gets Envoy's timer extended first, then its answer; a stream that
//! ends while held leaves the queue at once; refusals are 429 JSON with a
//! `retry-after`; the tenant's limits apply to what class admission lets
//! through, also after a hold.
#![allow(clippy::unwrap_used)] // test code says what it expects

mod grpc;

use grpc::{Rig, headers, wait_until};

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    ImmediateResponse, ProcessingRequest, ProcessingResponse,
};
use fleetroute::state::load::RequestGuard;
use fleetroute::topology::ReplicaId;
use fleetroute_filter::contract;

/// One replica with room for two requests; critical must see its first
/// token within 800 ms, standard within 3 s.
const CONFIG: &str = r#"
admission: { priority_header: x-priority }
tenants:
  # These tests play the filter: its tenant header is trusted.
  identity: { source: header, header: x-tenant }
  named:
    gold: { priority: critical }
    batch: { priority: sheddable }
    capped: { priority: critical, max_requests_in_flight: 1 }
fleets:
  - name: pool
    region: us
    endpoints: ["127.0.0.1:1"]
    capacity: { max_inflight: 2 }
stages:
  - name: chat
    models: [m1]
    fleets: [pool]
    admission:
      ttft_ms: { critical: 800, standard: 3000 }
      retry_after_s: 2
"#;

async fn rig() -> Rig {
    rig_with(CONFIG).await
}

async fn rig_with(config: &str) -> Rig {
    Rig::start(config).await
}

/// What these tests do and read on the rig.
trait Admissions {
    fn fill(&self) -> Vec<RequestGuard>;
    fn verdicts(&self, class: &str, verdict: &str) -> f64;
    fn depth(&self, class: &str) -> f64;
}

impl Admissions for Rig {
    /// Fills the replica's slots: every new request must wait for one.
    fn fill(&self) -> Vec<RequestGuard> {
        let snap = self.shared.snapshot();
        let load = &snap.topo.fleets[0].replicas[ReplicaId(0)].load;
        vec![load.start(10), load.start(10)]
    }

    fn verdicts(&self, class: &str, verdict: &str) -> f64 {
        self.metric(
            "fleetroute_admission_verdicts_total",
            &format!("stage=\"chat\",class=\"{class}\",verdict=\"{verdict}\""),
        )
    }

    fn depth(&self, class: &str) -> f64 {
        self.metric(
            "fleetroute_admission_queue_depth",
            &format!("stage=\"chat\",class=\"{class}\""),
        )
    }
}

fn request(tenant: &str, priority: Option<&str>) -> ProcessingRequest {
    let mut pairs = vec![
        (contract::MODEL, "m1"),
        (contract::TENANT, tenant),
        (contract::PROMPT_TOKENS, "500"),
        ("x-request-id", "r"),
    ];
    if let Some(p) = priority {
        pairs.push(("x-priority", p));
    }
    headers(&pairs)
}

async fn next(replies: &mut tonic::Streaming<ProcessingResponse>) -> ProcessingResponse {
    tokio::time::timeout(Duration::from_secs(10), replies.message())
        .await
        .expect("a reply in time")
        .expect("a healthy stream")
        .expect("a reply, not the end")
}

fn immediate(r: &ProcessingResponse) -> &ImmediateResponse {
    match &r.response {
        Some(Response::ImmediateResponse(i)) => i,
        other => panic!("an immediate response, got {other:?}"),
    }
}

fn header<'a>(i: &'a ImmediateResponse, name: &str) -> Option<&'a str> {
    i.headers
        .as_ref()?
        .set_headers
        .iter()
        .filter_map(|h| h.header.as_ref())
        .find(|h| h.key == name)
        .map(|h| std::str::from_utf8(&h.raw_value).expect("UTF-8"))
}

fn error(i: &ImmediateResponse) -> serde_json::Value {
    serde_json::from_slice::<serde_json::Value>(&i.body).expect("JSON")["error"].clone()
}

/// The timer extension a held request's first reply asks Envoy for.
fn extension(r: &ProcessingResponse) -> Duration {
    assert!(r.response.is_none(), "a timer extension carries no answer");
    let d = r
        .override_message_timeout
        .as_ref()
        .expect("override_message_timeout");
    Duration::new(d.seconds as u64, d.nanos as u32)
}

fn routed(r: &ProcessingResponse) -> bool {
    matches!(r.response, Some(Response::RequestHeaders(_))) && r.dynamic_metadata.is_some()
}

#[tokio::test]
async fn a_held_request_gets_a_longer_timer_then_its_route() {
    let rig = rig().await;
    let (tx, mut replies) = rig.routing().await;
    // Room: routed at once, no extension.
    tx.send(request("gold", None)).await.expect("send");
    assert!(routed(&next(&mut replies).await));

    let full = rig.fill();
    let (tx, mut replies) = rig.routing().await;
    tx.send(request("gold", None)).await.expect("send");
    // 800 ms less its own prefill ((500 + 256) / 5 ms), plus 500 ms margin.
    let ext = extension(&next(&mut replies).await);
    assert!(
        ext > Duration::from_millis(900) && ext <= Duration::from_millis(1300),
        "{ext:?}"
    );
    wait_until("the request to be held", || rig.depth("critical") == 1.0).await;
    let freed = Instant::now();
    drop(full);
    let answer = next(&mut replies).await;
    assert!(routed(&answer), "{answer:?}");
    // Released at the head's next poll (20 ms), not at its deadline.
    assert!(
        freed.elapsed() < Duration::from_millis(500),
        "{:?}",
        freed.elapsed()
    );
    assert_eq!(rig.depth("critical"), 0.0);
    assert_eq!(rig.verdicts("critical", "admitted_after_wait"), 1.0);
    assert_eq!(rig.verdicts("critical", "admitted"), 1.0);
    assert_eq!(
        rig.metric(
            "fleetroute_admission_wait_seconds_count",
            "stage=\"chat\",class=\"critical\""
        ),
        1.0
    );
}

#[tokio::test]
async fn a_stream_that_ends_while_held_leaves_the_queue_at_once() {
    let rig = rig().await;
    let full = rig.fill();
    let (tx, mut replies) = rig.routing().await;
    tx.send(request("gold", None)).await.expect("send");
    extension(&next(&mut replies).await);
    let (tx2, mut replies2) = rig.routing().await;
    tx2.send(request("gold", None)).await.expect("send");
    extension(&next(&mut replies2).await);
    wait_until("both held", || rig.depth("critical") == 2.0).await;
    // The first client goes away: Envoy resets its stream.
    drop(tx);
    drop(replies);
    wait_until("the first to leave", || rig.depth("critical") == 1.0).await;
    assert_eq!(rig.verdicts("critical", "cancelled"), 1.0);
    // The second is now the head: a free slot goes to it.
    drop(full);
    assert!(routed(&next(&mut replies2).await));
    assert_eq!(rig.depth("critical"), 0.0);
}

#[tokio::test]
async fn a_held_request_is_refused_when_its_objective_runs_out() {
    let rig = rig().await;
    let _full = rig.fill();
    let (tx, mut replies) = rig.routing().await;
    let sent = Instant::now();
    tx.send(request("gold", None)).await.expect("send");
    extension(&next(&mut replies).await);
    let answer = next(&mut replies).await;
    let waited = sent.elapsed();
    let i = immediate(&answer);
    assert_eq!(i.status.as_ref().map(|s| s.code), Some(429));
    let e = error(i);
    assert_eq!(e["code"], "overloaded");
    // Near its end, what is left of the objective falls below the queue's
    // own prediction: a poll then refuses it as `objective` just before the
    // deadline would as `timed_out` (which one wins is timing).
    let reason = e["reason"].as_str().expect("a reason");
    assert!(["timed_out", "objective"].contains(&reason), "{e:?}");
    assert_eq!(e["class"], "critical");
    assert_eq!(header(i, "retry-after"), Some("2"));
    // Within its bound: 800 ms less its own prefill, never past the timer.
    assert!(
        waited >= Duration::from_millis(600) && waited < Duration::from_millis(1100),
        "{waited:?}"
    );
    assert_eq!(rig.verdicts("critical", reason), 1.0);
    assert_eq!(
        rig.verdicts("critical", "timed_out") + rig.verdicts("critical", "objective"),
        1.0
    );
}

#[tokio::test]
async fn sheddable_requests_are_refused_at_once_on_a_saturated_stage() {
    let rig = rig().await;
    let _full = rig.fill();
    let (tx, mut replies) = rig.routing().await;
    let sent = Instant::now();
    tx.send(request("batch", None)).await.expect("send");
    let answer = next(&mut replies).await;
    let took = sent.elapsed();
    let i = immediate(&answer);
    assert_eq!(i.status.as_ref().map(|s| s.code), Some(429));
    assert_eq!(header(i, "content-type"), Some("application/json"));
    let e = error(i);
    assert_eq!(
        (e["reason"].as_str(), e["class"].as_str()),
        (Some("saturated"), Some("sheddable"))
    );
    assert!(e["message"].as_str().unwrap().contains("stage 'chat'"));
    assert!(took < Duration::from_millis(500), "{took:?}");
    // A gold client lowering itself is shed the same way; a bad value is a 400.
    tx.send(request("gold", Some("sheddable")))
        .await
        .expect("send");
    let e = error(immediate(&next(&mut replies).await));
    assert_eq!(e["class"], "sheddable");
    tx.send(request("gold", Some("urgent")))
        .await
        .expect("send");
    let i = immediate(&next(&mut replies).await).clone();
    assert_eq!(i.status.as_ref().map(|s| s.code), Some(400));
    assert_eq!(error(&i)["code"], "invalid_priority");
}

#[tokio::test]
async fn what_class_admission_lets_through_meets_its_tenants_limits_also_after_a_hold() {
    let rig = rig().await;
    let (tx, mut replies) = rig.routing().await;
    // Its one request in flight: the lease holds it (no access log here).
    tx.send(request("capped", None)).await.expect("send");
    assert!(routed(&next(&mut replies).await));

    // Admitted by its class, refused by its tenant's limit.
    let (tx, mut replies) = rig.routing().await;
    tx.send(request("capped", None)).await.expect("send");
    let answer = next(&mut replies).await;
    let i = immediate(&answer);
    assert_eq!(i.status.as_ref().map(|s| s.code), Some(429));
    assert_eq!(error(i)["code"], "max_requests_in_flight", "{:?}", error(i));
    assert_eq!(rig.verdicts("critical", "admitted"), 2.0);

    // Held first, then released into the same limit.
    let full = rig.fill();
    let (tx, mut replies) = rig.routing().await;
    tx.send(request("capped", None)).await.expect("send");
    extension(&next(&mut replies).await);
    wait_until("the request to be held", || rig.depth("critical") == 1.0).await;
    drop(full);
    let answer = next(&mut replies).await;
    let i = immediate(&answer);
    assert_eq!(i.status.as_ref().map(|s| s.code), Some(429));
    assert_eq!(error(i)["code"], "max_requests_in_flight", "{:?}", error(i));
    assert_eq!(rig.verdicts("critical", "admitted_after_wait"), 1.0);
    assert_eq!(rig.depth("critical"), 0.0);
}

#[tokio::test]
async fn a_class_refusal_writes_its_audit_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("audit.log");
    let rig = rig_with(&format!(
        "{CONFIG}audit: {{ path: '{}' }}\n",
        path.display()
    ))
    .await;
    let _full = rig.fill();
    let (tx, mut replies) = rig.routing().await;
    tx.send(request("batch", None)).await.expect("send");
    let e = error(immediate(&next(&mut replies).await));
    assert_eq!(e["reason"], "saturated");
    let mut line = serde_json::Value::Null;
    wait_until("the audit line", || {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        match text.lines().next() {
            Some(l) => {
                line = serde_json::from_str(l).expect("a JSON line");
                true
            }
            None => false,
        }
    })
    .await;
    assert_eq!(line["admission"], "overloaded", "{line}");
    assert_eq!(line["reason"], "saturated", "{line}");
    assert_eq!(line["status"], 429, "{line}");
    assert_eq!(line["stage"], "chat", "{line}");
    assert_eq!(line["tenant"], "batch", "{line}");
    assert_eq!(line["model_requested"], "m1", "{line}");
}
