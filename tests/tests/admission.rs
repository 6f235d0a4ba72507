//! Admission through real Envoy: two tenants, `gold` (critical, a 1500 ms
//! time to first token objective) and `batch` (sheddable), on one stage of
//! two slow replicas. `batch` floods it from 12 connections while `gold`
//! sends a paced trickle of streamed requests.
//!
//! Without admission the flood queues in the engines and gold's first
//! tokens come late (checked, so the overload is real). With admission gold
//! meets its objective, batch gets 429 `overloaded` at once, and every held
//! request is answered or refused within its bound.
#![cfg(feature = "e2e")] // needs Envoy and the built binaries: scripts/test.sh

use std::io::Read;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::thread;
use std::time::{Duration, Instant};

use fleetroute_tests::harness::client::{chat_body_tokens, client, metric_sum};
use fleetroute_tests::harness::scenario::chat_url;
use fleetroute_tests::harness::{Lab, LabSpec, pace, wait_until};

const ENGINE: &str = env!("CARGO_BIN_EXE_fleetroute-engine");

/// 4000 prompt tokens/s per replica, one prefill at a time, 4 in a batch.
const SLOW: &[&str] = &[
    "--prefill-tokens-per-sec",
    "4000",
    "--decode-ms-per-token",
    "10",
    "--max-batch",
    "4",
];

const OBJECTIVE: Duration = Duration::from_millis(1500);

fn router(admission: bool) -> String {
    let stage = if admission {
        "    admission: { ttft_ms: { critical: 1500 } }\n"
    } else {
        ""
    };
    format!(
        r#"
health_check: {{ interval_ms: 500, timeout_ms: 500, healthy_threshold: 1, unhealthy_threshold: 3 }}
admission: {{ max_wait_ms: 3000 }}
tenants:
  # A gateway in front is trusted to write x-tenant (the clients here).
  identity: {{ source: header, header: x-tenant }}
  named:
    gold: {{ priority: critical }}
    batch: {{ priority: sheddable }}
fleets:
  - name: base
    region: us
    endpoints: ["{{b1}}", "{{b2}}"]
    capacity: {{ max_inflight: 4 }}
stages:
  - name: chat
    models: [m1]
    fleets: [base]
{stage}"#
    )
}

/// One request's timing, from the client's side.
#[derive(Clone, Debug)]
struct Timed {
    status: u16,
    /// To the first body byte (the first token of a stream).
    first_byte: Duration,
    retry_after: Option<String>,
    body: String,
}

fn send(lab: &Lab, tenant: &str, text: &str, stream: bool, max_tokens: u32) -> Timed {
    let body = chat_body_tokens("m1", None, text, stream, max_tokens);
    let start = Instant::now();
    let mut r = client()
        .post(chat_url(lab))
        .header("content-type", "application/json")
        .header("x-tenant", tenant)
        .body(body)
        .send()
        .expect("a response");
    let status = r.status().as_u16();
    let retry_after = r
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let mut first = [0u8; 1];
    let n = r.read(&mut first).unwrap_or(0);
    let first_byte = start.elapsed();
    let mut rest = String::new();
    let _ = r.read_to_string(&mut rest);
    Timed {
        status,
        first_byte,
        retry_after,
        body: format!("{}{rest}", String::from_utf8_lossy(&first[..n])),
    }
}

/// A prompt of about `bytes` bytes that no earlier request shares (the
/// engines cache prefixes: a repeated prompt would cost no prefill).
fn prompt(tag: &str, bytes: usize) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let mut s = format!("{} {tag} ", N.fetch_add(1, Relaxed));
    while s.len() < bytes {
        s.push_str("lorem ipsum dolor sit amet ");
    }
    s
}

struct Run {
    gold: Vec<Timed>,
    batch: Vec<Timed>,
}

/// 12 batch connections, 12 requests each, back to back (~2000-token
/// prompts: 0.5 s of prefill each); gold sends 24 streamed ~200-token
/// requests, one every 250 ms, once the flood is under way.
fn overload(lab: &Lab) -> Run {
    let batch = Mutex::new(Vec::new());
    let gold = thread::scope(|s| {
        for c in 0..12 {
            let batch = &batch;
            s.spawn(move || {
                for i in 0..12 {
                    let text = prompt(&format!("batch {c} {i}"), 8000);
                    let t = send(lab, "batch", &text, false, 20);
                    batch.lock().unwrap().push(t);
                }
            });
        }
        s.spawn(|| {
            // Let the flood fill the replicas first.
            pace(Duration::from_millis(1500));
            (0..24)
                .map(|i| {
                    let t = send(lab, "gold", &prompt(&format!("gold {i}"), 800), true, 4);
                    pace(Duration::from_millis(250));
                    t
                })
                .collect::<Vec<_>>()
        })
        .join()
        .expect("gold thread")
    });
    Run {
        gold,
        batch: batch.into_inner().unwrap(),
    }
}

fn p(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1]
}

fn sorted(v: impl Iterator<Item = Duration>) -> Vec<Duration> {
    let mut v: Vec<Duration> = v.collect();
    v.sort();
    v
}

fn start(admission: bool) -> Lab {
    let router = router(admission);
    Lab::start(
        ENGINE,
        LabSpec {
            router: &router,
            engine_args: SLOW,
            ..Default::default()
        },
    )
}

#[test]
fn the_critical_tenant_keeps_its_objective_while_sheddable_traffic_is_refused_at_once() {
    // Without admission: the overload is real.
    let off = {
        let lab = start(false);
        let run = overload(&lab);
        lab.wait_settled();
        run
    };
    let off_gold = sorted(
        off.gold
            .iter()
            .filter(|t| t.status == 200)
            .map(|t| t.first_byte),
    );
    assert_eq!(off_gold.len(), 24, "without admission everything is served");
    assert!(
        off.batch.iter().all(|t| t.status == 200),
        "without admission no batch request is refused"
    );
    let off_p90 = p(&off_gold, 0.9);
    assert!(
        off_p90 > OBJECTIVE,
        "the flood must overload the stage: gold p90 {off_p90:?} without admission"
    );

    // With admission.
    let lab = start(true);
    let on = overload(&lab);
    let gold_ok = sorted(
        on.gold
            .iter()
            .filter(|t| t.status == 200)
            .map(|t| t.first_byte),
    );
    let gold_refused = on.gold.iter().filter(|t| t.status == 429).count();
    assert_eq!(
        gold_ok.len() + gold_refused,
        24,
        "gold: only 200 or 429: {:?}",
        on.gold.iter().map(|t| t.status).collect::<Vec<_>>()
    );
    assert!(
        gold_ok.len() >= 20,
        "{} of 24 gold requests served",
        gold_ok.len()
    );
    let on_p90 = p(&gold_ok, 0.9);
    assert!(
        on_p90 <= OBJECTIVE,
        "gold p90 {on_p90:?} with admission (objective {OBJECTIVE:?}; {off_p90:?} without)"
    );
    // Every gold request is answered or refused within its bound: the
    // objective less its own prefill, plus Envoy's and the client's share
    // of a loaded machine.
    let slowest = on.gold.iter().map(|t| t.first_byte).max().unwrap();
    assert!(slowest < OBJECTIVE + Duration::from_secs(1), "{slowest:?}");

    let refused: Vec<&Timed> = on.batch.iter().filter(|t| t.status == 429).collect();
    let served = on.batch.iter().filter(|t| t.status == 200).count();
    assert_eq!(refused.len() + served, on.batch.len());
    assert!(
        refused.len() * 2 > on.batch.len(),
        "most of the flood is shed: {} of {}",
        refused.len(),
        on.batch.len()
    );
    for t in &refused {
        let e: serde_json::Value = serde_json::from_str(&t.body).expect("a JSON 429");
        assert_eq!(e["error"]["code"], "overloaded", "{}", t.body);
        assert_eq!(e["error"]["class"], "sheddable");
        assert!(
            ["saturated", "reserved"].contains(&e["error"]["reason"].as_str().unwrap()),
            "{}",
            t.body
        );
        assert_eq!(t.retry_after.as_deref(), Some("1"));
    }
    let quick = sorted(refused.iter().map(|t| t.first_byte));
    let (q50, q99) = (p(&quick, 0.5), p(&quick, 0.99));
    assert!(q99 < Duration::from_millis(500), "429 p99 {q99:?}");

    // fleetroute's own account: nothing left held, every gold request has
    // one verdict.
    lab.wait_settled();
    let metrics = || {
        client()
            .get(format!("{}/metrics", lab.admin))
            .send()
            .and_then(|r| r.text())
            .unwrap_or_default()
    };
    wait_until("no request held", Duration::from_secs(5), || {
        metric_sum(&metrics(), "fleetroute_admission_queue_depth", &[]) == 0.0
    });
    let m = metrics();
    let gold = |v: &str| {
        metric_sum(
            &m,
            "fleetroute_admission_verdicts_total",
            &["class=\"critical\"", &format!("verdict=\"{v}\"")],
        )
    };
    use fleetroute::metrics::{Values, Verdict};
    let all: f64 = Verdict::ALL.iter().map(|v| gold(v.as_str())).sum();
    assert_eq!(all, 24.0, "{m}");
    let held = gold("admitted_after_wait");
    println!(
        "gold p50/p90 {:?}/{:?} without admission, {:?}/{:?} with ({} served, {} refused, {held} after a hold); \
         batch {} served, {} refused, 429 p50 {q50:?} p99 {q99:?}",
        p(&off_gold, 0.5),
        off_p90,
        p(&gold_ok, 0.5),
        on_p90,
        gold_ok.len(),
        gold_refused,
        served,
        refused.len(),
    );
}

/// One replica taking two requests at a time; critical's objective 4 s,
/// no request held longer than 2.5 s.
const HOLD: &str = r#"
health_check: { interval_ms: 500, timeout_ms: 500, healthy_threshold: 1, unhealthy_threshold: 3 }
admission: { max_wait_ms: 2500 }
tenants:
  # A gateway in front is trusted to write x-tenant (the clients here).
  identity: { source: header, header: x-tenant }
  named:
    gold: { priority: critical }
fleets:
  - name: base
    region: us
    endpoints: ["{b1}"]
    capacity: { max_inflight: 2 }
stages:
  - name: chat
    models: [m1]
    fleets: [base]
    admission: { ttft_ms: { critical: 4000 } }
"#;

/// Fills the replica's two slots with streams of `tokens` tokens (10 ms
/// each); returns once fleetroute counts both.
fn block<'s>(
    s: &'s thread::Scope<'s, '_>,
    lab: &'s Lab,
    tokens: u32,
) -> Vec<thread::ScopedJoinHandle<'s, Timed>> {
    let blockers: Vec<_> = (0..2)
        .map(|i| {
            s.spawn(move || {
                send(
                    lab,
                    "gold",
                    &prompt(&format!("blocker {i}"), 200),
                    true,
                    tokens,
                )
            })
        })
        .collect();
    wait_until("both slots taken", Duration::from_secs(10), || {
        lab.router_inflight() == Some(2)
    });
    blockers
}

#[test]
fn a_held_request_outlasts_envoys_message_timeout_and_ends_within_its_bound() {
    let lab = Lab::start(
        ENGINE,
        LabSpec {
            router: HOLD,
            engine_args: &[
                "--prefill-tokens-per-sec",
                "20000",
                "--decode-ms-per-token",
                "10",
            ],
            ..Default::default()
        },
    );
    let stat = |s: &str| lab.envoy_stat(&format!("http.inference.ext_proc.{s}"));
    let metric = |labels: &[&str]| {
        let m = client()
            .get(format!("{}/metrics", lab.admin))
            .send()
            .and_then(|r| r.text())
            .unwrap_or_default();
        metric_sum(&m, "fleetroute_admission_verdicts_total", labels)
    };

    // 1. Held while both slots are busy (~1 s streams), then routed by
    // fleetroute: not failed open when Envoy's 200 ms message timeout passes.
    let held = thread::scope(|s| {
        let blockers = block(s, &lab, 100);
        let t = send(&lab, "gold", &prompt("held", 200), true, 4);
        for b in blockers {
            assert_eq!(b.join().unwrap().status, 200);
        }
        t
    });
    assert_eq!(held.status, 200, "{}", held.body);
    assert!(
        held.first_byte > Duration::from_millis(300),
        "it waited for a slot: {:?}",
        held.first_byte
    );
    assert_eq!(metric(&["verdict=\"admitted_after_wait\""]), 1.0);
    assert!(stat("override_message_timeout_received") >= 1);
    assert_eq!(stat("override_message_timeout_ignored"), 0);
    assert_eq!(stat("message_timeouts"), 0);
    assert_eq!(stat("failure_mode_allowed"), 0, "nothing failed open");
    lab.wait_settled();

    // 2. Slots busy far longer than any hold (6 s streams): refused at
    // admission.max_wait_ms, 2.5 s.
    let refused = thread::scope(|s| {
        let _blockers = block(s, &lab, 600);
        send(&lab, "gold", &prompt("refused", 200), true, 4)
    });
    assert_eq!(refused.status, 429, "{}", refused.body);
    let e: serde_json::Value = serde_json::from_str(&refused.body).expect("JSON");
    assert_eq!(e["error"]["reason"], "timed_out");
    assert!(
        refused.first_byte >= Duration::from_millis(2400)
            && refused.first_byte < Duration::from_millis(3500),
        "refused at its bound: {:?}",
        refused.first_byte
    );
    assert_eq!(stat("failure_mode_allowed"), 0);
    lab.wait_settled();

    // 3. A client that gives up while held: its request leaves the queue.
    thread::scope(|s| {
        let _blockers = block(s, &lab, 300);
        let gone = client()
            .post(chat_url(&lab))
            .header("content-type", "application/json")
            .header("x-tenant", "gold")
            .timeout(Duration::from_millis(400))
            .body(chat_body_tokens("m1", None, &prompt("gone", 200), true, 4))
            .send();
        assert!(gone.is_err(), "the client timed out first");
        wait_until(
            "the request to leave its queue",
            Duration::from_secs(2),
            || metric(&["verdict=\"cancelled\""]) == 1.0,
        );
    });
    assert_eq!(metric(&["verdict=\"timed_out\""]), 1.0);
    assert_eq!(stat("failure_mode_allowed"), 0);
}
