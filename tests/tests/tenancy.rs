//! Tenant limits and budgets through real Envoy: a request over a limit gets
//! a 429 naming it, every admitted request is charged exactly once with what
//! it used (whatever happens to its stream), limits change at runtime without
//! losing counters, and the audit log has one line per request.
#![cfg(feature = "e2e")] // needs Envoy and the built binaries: scripts/test.sh

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::thread;
use std::time::Duration;

use fleetroute_tests::harness::client::{blocking_get, chat_body_tokens, client, metric_sum, post};
use fleetroute_tests::harness::scenario::chat_url;
use fleetroute_tests::harness::{Lab, LabSpec, wait_until};
use serde_json::Value;

const ENGINE: &str = env!("CARGO_BIN_EXE_fleetroute-engine");
const TOKEN: &str = "tenant-admin-token";

/// `AUDIT` is replaced by the audit file's path.
const ROUTER: &str = r#"
health_check: { interval_ms: 500, timeout_ms: 500, healthy_threshold: 1, unhealthy_threshold: 3 }
fleets:
  - name: pool
    region: us
    endpoints: ["{r1}", "{r2}"]
    cost: { usd_per_million_tokens: 1.0 }
stages:
  - name: chat
    models: [m1]
    fleets: [pool]
    residency: us
tenants:
  # A gateway in front is trusted to write x-tenant (the clients here).
  identity: { source: header, header: x-tenant }
  named:
    acme: { tokens_per_minute: 10000000, max_requests_in_flight: 100, budget: { usd: 1000, per: day } }
    tight: { tokens_per_minute: 300 }
    frugal: { budget: { usd: 0.0001, per: day } }
    solo: { max_requests_in_flight: 1 }
audit: { path: AUDIT }
"#;

fn start(dir: &tempfile::TempDir, engine_args: &[&str]) -> (Lab, std::path::PathBuf) {
    let audit = dir.path().join("audit.log");
    let router = ROUTER.replace("AUDIT", audit.to_str().expect("UTF-8 path"));
    let lab = Lab::start(
        ENGINE,
        LabSpec {
            router: &router,
            engine_args,
            admin_token: Some(TOKEN),
            ..Default::default()
        },
    );
    (lab, audit)
}

fn tenant(lab: &Lab, name: &str) -> Value {
    let (status, body) =
        blocking_get(&format!("{}/v1/tenant?name={name}", lab.admin)).expect("admin API");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("a tenant view")
}

fn usage(v: &Value, field: &str) -> u64 {
    v["usage"][field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {v}"))
}

fn ask(
    lab: &Lab,
    tenant: &str,
    max_tokens: u32,
    stream: bool,
) -> fleetroute_tests::harness::client::Reply {
    let body = chat_body_tokens("m1", None, "What is a tenant?", stream, max_tokens);
    post(&chat_url(lab), body, &[("x-tenant", tenant)])
}

/// Audit records, by request id.
fn audit_lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("audit line {l:?}: {e}")))
        .collect()
}

fn metrics(lab: &Lab) -> String {
    blocking_get(&format!("{}/metrics", lab.admin))
        .expect("/metrics")
        .1
}

#[test]
fn over_a_limit_is_a_429_naming_it_and_refusals_are_not_charged() {
    let dir = tempfile::tempdir().unwrap();
    let (lab, audit) = start(
        &dir,
        &[
            "--prefill-tokens-per-sec",
            "10000000",
            "--decode-ms-per-token",
            "20",
        ],
    );

    // tokens_per_minute 300: each request reserves its prompt + 100.
    let first = ask(&lab, "tight", 100, false);
    assert_eq!(first.status, 200, "{}", first.body);
    let mut refused = None;
    for _ in 0..5 {
        let r = ask(&lab, "tight", 100, false);
        if r.status == 429 {
            refused = Some(r);
            break;
        }
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let r = refused.expect("tight is refused within its per-minute limit");
    assert_eq!(r.header("content-type"), Some("application/json"));
    let retry: u64 = r
        .header("retry-after")
        .expect("retry-after")
        .parse()
        .unwrap();
    assert!((1..=70).contains(&retry), "retry-after {retry}");
    let e = r.json();
    assert_eq!(e["error"]["code"], "tokens_per_minute", "{e}");
    assert_eq!(e["error"]["type"], "rate_limit_exceeded");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("300 tokens per minute")
    );

    // The budget: 0.0001 USD at 1 USD per million tokens is 100 tokens.
    let r = ask(&lab, "frugal", 200, false);
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "budget");
    assert_eq!(r.json()["error"]["type"], "insufficient_quota");

    // One request in flight: a second one while a stream runs is refused.
    let url = chat_url(&lab);
    let long = thread::spawn(move || {
        let body = chat_body_tokens("m1", None, "Tell me a long story.", true, 150);
        post(&url, body, &[("x-tenant", "solo")])
    });
    wait_until(
        "solo's stream to be admitted",
        Duration::from_secs(10),
        || usage(&tenant(&lab, "solo"), "requests_in_flight") == 1,
    );
    let r = ask(&lab, "solo", 4, false);
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "max_requests_in_flight");
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(long.join().unwrap().status, 200);

    // Refused before a fleet is chosen (unknown model, residency outside the
    // stage's): never admitted, so never charged.
    let before = tenant(&lab, "acme");
    let r = post(
        &chat_url(&lab),
        chat_body_tokens("nope", None, "hi", false, 4),
        &[("x-tenant", "acme")],
    );
    assert_eq!(r.status, 404, "{}", r.body);
    let r = post(
        &chat_url(&lab),
        chat_body_tokens("m1", None, "hi", false, 4),
        &[("x-tenant", "acme"), ("x-residency", "eu")],
    );
    assert_eq!(r.status, 503, "{}", r.body);
    lab.wait_settled();
    let after = tenant(&lab, "acme");
    assert_eq!(usage(&after, "admitted"), usage(&before, "admitted"));
    assert_eq!(
        usage(&after, "tokens_charged"),
        usage(&before, "tokens_charged")
    );

    // Refusals are counted per tenant and limit, and nothing they reserved stays.
    let t = tenant(&lab, "tight");
    assert_eq!(t["usage"]["refused"]["tokens_per_minute"], 1);
    assert_eq!(usage(&t, "requests_in_flight"), 0);
    let m = metrics(&lab);
    assert_eq!(
        metric_sum(
            &m,
            "fleetroute_tenant_refused_total",
            &["tenant=\"frugal\"", "limit=\"budget\""]
        ),
        1.0,
        "{m}"
    );

    // The audit log: one line per request, refusals with their verdict, no prompt text.
    wait_until("every audit line", Duration::from_secs(10), || {
        audit_lines(&audit).len() >= 8
    });
    let lines = audit_lines(&audit);
    let text = std::fs::read_to_string(&audit).unwrap();
    assert!(!text.contains("What is a tenant") && !text.contains("long story"));
    let verdicts: Vec<(&str, &str, u64)> = lines
        .iter()
        .map(|l| {
            (
                l["tenant"].as_str().unwrap(),
                l["admission"].as_str().unwrap(),
                l["status"].as_u64().unwrap(),
            )
        })
        .collect();
    for want in [
        ("tight", "admitted", 200),
        ("tight", "tokens_per_minute", 429),
        ("frugal", "budget", 429),
        ("solo", "max_requests_in_flight", 429),
        ("solo", "admitted", 200),
        ("acme", "not_routed", 404),
        ("acme", "not_routed", 503),
    ] {
        assert!(verdicts.contains(&want), "{want:?} not in {verdicts:?}");
    }
    let served = lines
        .iter()
        .find(|l| l["tenant"] == "solo" && l["admission"] == "admitted")
        .unwrap();
    assert_eq!(served["completion_tokens"], 150);
    assert_eq!(served["stage"], "chat");
    assert_eq!(served["fleet"], "pool");
    assert_eq!(served["policy"], "latency");
    assert!(served["ttft_ms"].as_u64().is_some() && served["duration_ms"].as_u64().unwrap() > 0);
    assert!(served["cost_usd"].as_f64().unwrap() > 0.0);
    let ids: HashSet<&str> = lines
        .iter()
        .map(|l| l["request_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), lines.len(), "one line per request");
}

#[test]
fn limits_change_at_runtime_and_keep_the_counters() {
    let dir = tempfile::tempdir().unwrap();
    let (lab, _) = start(&dir, fleetroute_tests::harness::scenario::FAST_ENGINES);
    let first = ask(&lab, "tight", 100, false);
    assert_eq!(first.status, 200);
    lab.wait_settled();
    let charged = usage(&tenant(&lab, "tight"), "tokens_charged");
    assert!(charged > 100);

    // Through the CLI: a change needs the token, and says what changed.
    let (ok, _, err) = lab.cli(&["tenant", "set", "tight", "--tpm", "5000"], None);
    assert!(!ok && err.contains("401"), "{err}");
    let (ok, out, err) = lab.cli(
        &[
            "tenant", "set", "tight", "--tpm", "5000", "--budget", "2/day",
        ],
        Some(TOKEN),
    );
    assert!(ok, "{err}");
    assert!(
        out.contains("tokens_per_minute 300") && out.contains("tokens_per_minute 5000"),
        "{out}"
    );
    let t = tenant(&lab, "tight");
    assert_eq!(t["limits"]["tokens_per_minute"], 5000);
    assert_eq!(usage(&t, "tokens_charged"), charged, "the counters stay");
    for _ in 0..5 {
        assert_eq!(ask(&lab, "tight", 100, false).status, 200);
    }
    let (ok, out, _) = lab.cli(&["tenant", "get", "tight"], None);
    assert!(
        ok && out.starts_with("tenant tight  (named entry)"),
        "{out}"
    );
    assert!(out.contains("2 USD/day"), "{out}");
    let (ok, out, _) = lab.cli(&["tenant", "get"], None);
    assert!(
        ok && out.lines().any(|l| l.trim_start().starts_with("tight ")),
        "{out}"
    );

    // Through the file: a reload replaces the admin change (the file is the
    // truth again) and keeps the counters.
    lab.wait_settled();
    let charged = usage(&tenant(&lab, "tight"), "tokens_charged");
    let text = std::fs::read_to_string(&lab.router_path).unwrap();
    std::fs::write(
        &lab.router_path,
        text.replace(
            "tight: { tokens_per_minute: 300 }",
            "tight: { tokens_per_minute: 400, priority: sheddable }",
        ),
    )
    .unwrap();
    wait_until("the reloaded limit", Duration::from_secs(15), || {
        tenant(&lab, "tight")["limits"]["tokens_per_minute"] == 400
    });
    let t = tenant(&lab, "tight");
    assert_eq!(t["limits"]["priority"], "sheddable");
    assert_eq!(t["limits"]["budget"], Value::Null);
    assert_eq!(usage(&t, "tokens_charged"), charged);
    // The usage of the last minute counts against the new limit at once.
    let r = ask(&lab, "tight", 100, false);
    assert_eq!(r.status, 429, "{}", r.body);
}

/// Reads an SSE response until `cut_after` data events (all when `None`);
/// the events read and whether `[DONE]` came. Dropping the response
/// afterwards closes the connection: the client is gone mid-stream.
fn read_events(mut r: reqwest::blocking::Response, cut_after: Option<usize>) -> (usize, bool) {
    let mut seen = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        let events = count_events(&seen);
        if cut_after.is_some_and(|k| events >= k) {
            return (events, false);
        }
        match r.read(&mut buf) {
            Ok(0) | Err(_) => {
                let done = String::from_utf8_lossy(&seen).contains("data: [DONE]");
                return (events, done);
            }
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
    }
}

/// Data events other than `[DONE]` and the usage event (choices: []).
fn count_events(bytes: &[u8]) -> usize {
    let text = String::from_utf8_lossy(bytes);
    text.split("\n\n")
        .filter(|e| e.starts_with("data: {") && e.ends_with('}') && !e.contains("\"choices\":[]"))
        .count()
}

fn stream_request(lab: &Lab, text: &str, max_tokens: u32) -> reqwest::blocking::Response {
    client()
        .post(chat_url(lab))
        .header("content-type", "application/json")
        .header("x-tenant", "acme")
        .body(chat_body_tokens("m1", None, text, true, max_tokens))
        .send()
        .expect("a response")
}

fn request_id(r: &reqwest::blocking::Response) -> String {
    r.headers()["x-request-id"].to_str().unwrap().to_string()
}

/// A stream over HTTP/2 that the client resets (RST_STREAM) after `k`
/// events, on a connection that stays open: the request id and events read.
async fn reset_after(envoy: &str, body: String, k: usize) -> (String, usize) {
    use http_body_util::{BodyExt, Full};
    use hyper::body::Bytes;
    let addr = envoy.trim_start_matches("http://");
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .expect("h2 handshake");
    let driver = tokio::spawn(conn);
    let req = hyper::Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("x-tenant", "acme")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let resp = send.send_request(req).await.expect("h2 response");
    let id = resp.headers()["x-request-id"].to_str().unwrap().to_string();
    let mut body = resp.into_body();
    let mut seen = Vec::new();
    while count_events(&seen) < k {
        match body.frame().await {
            Some(Ok(f)) => {
                if let Some(d) = f.data_ref() {
                    seen.extend_from_slice(d);
                }
            }
            _ => break,
        }
    }
    let events = count_events(&seen);
    // Dropping the body resets this stream only.
    drop(body);
    // The connection outlives the reset: the same connection takes another request.
    let again = hyper::Request::get(format!("http://{addr}/v1/models"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let _ = send.send_request(again).await;
    drop(send);
    let _ = driver.await;
    (id, events)
}

fn engine_totals(lab: &Lab) -> (u64, u64) {
    let (_, body) = blocking_get(&format!("{}/replicas", lab.control)).expect("control");
    let v: Value = serde_json::from_str(&body).unwrap();
    v.as_array().unwrap().iter().fold((0, 0), |(p, g), r| {
        (
            p + r["prompt_tokens"].as_u64().unwrap(),
            g + r["generation_tokens"].as_u64().unwrap(),
        )
    })
}

#[test]
fn every_request_is_charged_once_whatever_happens_to_its_stream() {
    let dir = tempfile::tempdir().unwrap();
    let (lab, audit) = start(
        &dir,
        &[
            "--prefill-tokens-per-sec",
            "10000000",
            "--decode-ms-per-token",
            "15",
        ],
    );
    const MAX: u32 = 40;
    // (request id, events the client read, what happened)
    let mut sent: Vec<(String, usize, &str)> = Vec::new();

    // Complete streams.
    let complete: Vec<_> = (0..6)
        .map(|i| {
            let r = stream_request(&lab, &format!("complete {i}"), MAX);
            thread::spawn(move || {
                let id = request_id(&r);
                let (n, done) = read_events(r, None);
                assert!(done, "a complete stream ends with [DONE]");
                (id, n)
            })
        })
        .collect();
    for h in complete {
        let (id, n) = h.join().unwrap();
        sent.push((id, n, "complete"));
    }
    // Clients that go away mid-stream (the connection closes).
    let killed: Vec<_> = (0..6)
        .map(|i| {
            let r = stream_request(&lab, &format!("killed client {i}"), MAX);
            thread::spawn(move || {
                let id = request_id(&r);
                let (n, _) = read_events(r, Some(3 + i));
                (id, n)
            })
        })
        .collect();
    for h in killed {
        let (id, n) = h.join().unwrap();
        sent.push((id, n, "killed"));
    }
    // HTTP/2 streams reset by the client.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for i in 0..6 {
        let body = chat_body_tokens("m1", None, &format!("reset stream {i}"), true, MAX);
        let (id, n) = rt.block_on(reset_after(&lab.envoy, body, 2 + i));
        sent.push((id, n, "reset"));
    }
    // The engine dies after 5 tokens.
    for r in lab.replicas.keys() {
        lab.fault(r, r#"{"die_after_tokens": 5}"#);
    }
    for i in 0..3 {
        let r = stream_request(&lab, &format!("engine dies {i}"), MAX);
        let id = request_id(&r);
        let (n, done) = read_events(r, None);
        assert!(!done, "a stream whose engine died has no [DONE]");
        sent.push((id, n, "died"));
    }
    for r in lab.replicas.keys() {
        lab.clear_fault(r);
    }

    // Every reservation ends: nothing in flight, each one committed.
    let total = sent.len() as u64;
    wait_until(
        "every charge to be committed",
        Duration::from_secs(30),
        || {
            let t = tenant(&lab, "acme");
            usage(&t, "committed") == total && usage(&t, "requests_in_flight") == 0
        },
    );
    let t = tenant(&lab, "acme");
    assert_eq!(usage(&t, "admitted"), total, "{t}");
    assert_eq!(
        (
            usage(&t, "expired"),
            usage(&t, "dropped"),
            usage(&t, "late_commits")
        ),
        (0, 0, 0),
        "every request ended through its access log entry: {t}"
    );
    assert_eq!(usage(&t, "tokens_in_flight"), 0);

    // The charges, one audit line each.
    wait_until("every audit line", Duration::from_secs(10), || {
        audit_lines(&audit).len() as u64 >= total
    });
    let lines = audit_lines(&audit);
    let by_id: HashMap<&str, &Value> = lines
        .iter()
        .map(|l| (l["request_id"].as_str().unwrap(), l))
        .collect();
    assert_eq!(by_id.len(), lines.len(), "never two lines for one request");
    let (mut prompt, mut completion, mut cost) = (0, 0, 0.0);
    for (id, read, how) in &sent {
        let l = by_id
            .get(id.as_str())
            .unwrap_or_else(|| panic!("no audit line for {how} request {id}"));
        assert_eq!(l["admission"], "admitted");
        let p = l["prompt_tokens"].as_u64().unwrap();
        let c = l["completion_tokens"].as_u64().unwrap();
        assert!(p > 0, "{how}: never free: {l}");
        match *how {
            "complete" => assert_eq!(c, u64::from(MAX), "{l}"),
            // At least what the client read, at most what the engine wrote.
            "killed" | "reset" => {
                assert!(
                    c >= *read as u64 && c <= u64::from(MAX),
                    "{how} read {read}: {l}"
                )
            }
            _ => assert!(c >= *read as u64 && c <= 5, "{how} read {read}: {l}"),
        }
        prompt += p;
        completion += c;
        cost += l["cost_usd"].as_f64().unwrap();
    }
    // The counters are exactly the sum of the committed charges...
    assert_eq!(usage(&t, "tokens_charged"), prompt + completion);
    assert_eq!(
        usage(&t, "tokens_last_minute"),
        prompt + completion,
        "no estimate left in the window"
    );
    let usd = t["usage"]["usd_charged"].as_f64().unwrap();
    assert!((usd - cost).abs() < 1e-5, "{usd} vs {cost}");
    assert!(
        (usd - (prompt + completion) as f64 / 1e6).abs() < 1e-5,
        "priced at 1 USD per million"
    );
    // ...and agree with the engines: every prompt they prefilled, no more
    // output than they generated.
    let (engine_prompt, engine_generated) = engine_totals(&lab);
    assert_eq!(prompt, engine_prompt);
    assert!(
        completion <= engine_generated,
        "{completion} > {engine_generated}"
    );
    let m = metrics(&lab);
    assert_eq!(
        metric_sum(&m, "fleetroute_tenant_tokens_total", &["tenant=\"acme\""]),
        (prompt + completion) as f64
    );
    assert_eq!(
        metric_sum(&m, "fleetroute_tenant_requests_total", &["tenant=\"acme\""]),
        total as f64
    );
}
