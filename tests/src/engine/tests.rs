//! The engine over real sockets, in-process.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};

use super::latency::LatencyModel;
use super::replica::ReplicaSettings;
use super::{Engine, EngineConfig};

const BLOCK_BYTES: usize = 16;

fn settings(max_batch: usize, decode_ms: f64) -> ReplicaSettings {
    ReplicaSettings {
        block_bytes: BLOCK_BYTES,
        cache_tokens: 4096,
        latency: LatencyModel {
            prefill_tokens_per_sec: 1e6,
            decode_ms_per_token: decode_ms,
            decode_ms_per_running: 0.0,
            max_batch,
        },
        default_max_tokens: 4,
        models: vec!["m".into()],
        api_key: None,
        adapters: None,
        packed: None,
    }
}

struct Rig {
    engine: Engine,
    http: reqwest::Client,
}

impl Rig {
    async fn start(names: &[&str], settings: ReplicaSettings) -> Rig {
        Self::start_with(names, settings, Vec::new(), Vec::new()).await
    }

    async fn start_with(
        names: &[&str],
        settings: ReplicaSettings,
        served_models: Vec<(String, String)>,
        api_keys: Vec<(String, String)>,
    ) -> Rig {
        let any = "127.0.0.1:0".parse().unwrap();
        let cfg = EngineConfig {
            replicas: names.iter().map(|n| (n.to_string(), any)).collect(),
            control: Some(any),
            settings,
            any_address: false,
            served_models,
            api_keys,
        };
        let engine = Engine::start(cfg).await.unwrap();
        // No pooling: a fault that drops connections must not leak into the next request.
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap();
        Rig { engine, http }
    }

    fn url(&self, replica: &str, path: &str) -> String {
        format!(
            "http://{}{path}",
            self.engine.replica_addr(replica).unwrap()
        )
    }

    fn control(&self, path: &str) -> String {
        format!("http://{}{path}", self.engine.control_addr().unwrap())
    }

    /// The request is built before the future, which therefore borrows nothing.
    fn chat(
        &self,
        replica: &str,
        body: &Value,
    ) -> impl Future<Output = reqwest::Result<reqwest::Response>> + use<> {
        self.http
            .post(self.url(replica, "/v1/chat/completions"))
            .json(body)
            .send()
    }

    async fn fault(&self, replica: &str, fault: Value) {
        let r = self
            .http
            .post(self.control(&format!("/replicas/{replica}/fault")))
            .json(&fault)
            .send()
            .await;
        assert_eq!(r.unwrap().status(), 200);
    }

    async fn clear(&self, replica: &str) {
        let r = self
            .http
            .delete(self.control(&format!("/replicas/{replica}/fault")))
            .send()
            .await;
        assert_eq!(r.unwrap().status(), 200);
    }

    async fn state(&self, replica: &str) -> Value {
        let all: Value = self
            .http
            .get(self.control("/replicas"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        all.as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == replica)
            .unwrap()
            .clone()
    }
}

fn chat(prompt: &str, extra: Value) -> Value {
    let mut body = json!({"model": "m", "messages": [{"role": "user", "content": prompt}]});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

/// The SSE events of a streamed answer, and whether the body ended cleanly.
async fn sse_events(resp: reqwest::Response) -> (Vec<String>, bool) {
    let mut raw = Vec::new();
    let mut body = resp.bytes_stream();
    let mut clean = true;
    while let Some(chunk) = body.next().await {
        match chunk {
            Ok(c) => raw.extend_from_slice(&c),
            Err(_) => {
                clean = false;
                break;
            }
        }
    }
    let text = String::from_utf8(raw).unwrap();
    let events = text
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").unwrap().to_string());
    (events.collect(), clean)
}

#[tokio::test]
async fn repeated_prompt_hits_the_cache_and_output_is_deterministic() {
    let rig = Rig::start(&["r1", "r2"], settings(8, 0.0)).await;
    let body = chat(
        &"a shared system prompt. ".repeat(8),
        json!({"max_tokens": 6}),
    );
    let mut outputs = Vec::new();
    for (i, replica) in ["r1", "r1", "r2"].into_iter().enumerate() {
        let resp = rig
            .http
            .post(rig.url(replica, "/v1/chat/completions"))
            .header("x-request-id", format!("req-{i}"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.headers()["x-served-by"], replica);
        assert_eq!(resp.headers()["x-request-id"], format!("req-{i}").as_str());
        let v: Value = resp.json().await.unwrap();
        let usage = &v["usage"];
        let cached = usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        match i {
            1 => assert!(
                cached > 0 && cached <= usage["prompt_tokens"].as_u64().unwrap(),
                "{usage}"
            ),
            _ => assert_eq!(cached, 0, "a cold replica has nothing cached"),
        }
        assert_eq!(
            (v["object"].as_str(), usage["completion_tokens"].as_u64()),
            (Some("chat.completion"), Some(6))
        );
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        outputs.push(
            v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    assert!(
        outputs
            .iter()
            .all(|o| o == &outputs[0] && o.split(' ').count() == 6)
    );

    let metrics = rig
        .http
        .get(rig.url("r1", "/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("vllm:request_success_total{model_name=\"m\"} 2\n"),
        "{metrics}"
    );
    assert!(metrics.contains("vllm:prefix_cache_hits_total{model_name=\"m\"}"));
    let state = rig.state("r1").await;
    assert_eq!(state["requests_served"], 2);
    assert!(state["cached_tokens"].as_u64().unwrap() > 0);
    assert!(state["cache_used_tokens"].as_u64().unwrap() > 0);

    let completion = rig
        .http
        .post(rig.url("r1", "/v1/completions"))
        .json(&json!({"model": "m", "prompt": "hello"}))
        .send()
        .await
        .unwrap();
    let v: Value = completion.json().await.unwrap();
    assert_eq!(
        (
            v["object"].as_str(),
            v["choices"][0]["finish_reason"].as_str()
        ),
        (Some("text_completion"), Some("stop"))
    );
    assert_eq!(v["usage"]["completion_tokens"], 4, "the default length");
    rig.engine.shutdown().await;
}

#[tokio::test]
async fn bad_requests_get_openai_errors() {
    let rig = Rig::start(&["r1"], settings(8, 0.0)).await;
    let url = rig.url("r1", "/v1/chat/completions");
    for (body, status) in [
        ("{not json", 400),
        (r#"{"model":"m","messages":"hi"}"#, 400),
        (r#"{"model":"m","prompt":"hi"}"#, 400),
        (r#"{"model":"other","messages":[]}"#, 404),
    ] {
        let resp = rig.http.post(&url).body(body).send().await.unwrap();
        assert_eq!(resp.status(), status, "{body}");
        assert_eq!(resp.headers()["x-served-by"], "r1");
        let v: Value = resp.json().await.unwrap();
        assert!(
            v["error"]["message"].is_string()
                && v["error"]["type"].is_string()
                && v["error"]["code"].is_string()
        );
    }
    assert_eq!(
        rig.http
            .get(rig.url("r1", "/health"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
        "ok"
    );
    rig.engine.shutdown().await;
}

#[tokio::test]
async fn streams_one_chunk_per_token_then_usage_and_done() {
    let rig = Rig::start(&["r1"], settings(8, 25.0)).await;
    let body = chat(
        "stream me",
        json!({"stream": true, "max_tokens": 5, "stream_options": {"include_usage": true}}),
    );
    let started = Instant::now();
    let resp = rig.chat("r1", &body).await.unwrap();
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut body = resp.bytes_stream();
    let first = body.next().await.unwrap().unwrap();
    let first_at = started.elapsed();
    assert!(first.starts_with(b"data: {"), "events arrive one at a time");
    let mut rest = first.to_vec();
    while let Some(c) = body.next().await {
        rest.extend_from_slice(&c.unwrap());
    }
    let total = started.elapsed();
    assert!(
        total - first_at >= Duration::from_millis(80),
        "tokens are spread over the decode: {first_at:?} / {total:?}"
    );

    let text = String::from_utf8(rest).unwrap();
    let events: Vec<&str> = text
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| &e[6..])
        .collect();
    assert_eq!(events.len(), 5 + 2);
    let chunks: Vec<Value> = events[..6]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    for (i, c) in chunks[..5].iter().enumerate() {
        assert_eq!(c["object"], "chat.completion.chunk");
        assert!(c["choices"][0]["delta"]["content"].is_string());
        assert_eq!(c["choices"][0]["finish_reason"].is_null(), i < 4);
    }
    assert_eq!(chunks[5]["choices"], json!([]));
    assert_eq!(chunks[5]["usage"]["completion_tokens"], 5);
    assert_eq!(events[6], "[DONE]");
    rig.engine.shutdown().await;
}

#[tokio::test]
async fn requests_beyond_max_batch_queue() {
    // 4 tokens × 100 ms: one request takes about 400 ms.
    let rig = Rig::start(&["r1"], settings(1, 100.0)).await;
    let started = Instant::now();
    let a = rig.chat("r1", &chat("first", json!({})));
    let b = rig.chat("r1", &chat("second", json!({})));
    let probe = async {
        for _ in 0..30 {
            let s = rig.state("r1").await;
            if (s["running"].as_u64(), s["waiting"].as_u64()) == (Some(1), Some(1)) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    };
    let (a, b, queued) = tokio::join!(a, b, probe);
    assert!(queued, "one runs while the other waits");
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!((a.status().as_u16(), b.status().as_u16()), (200, 200));
    assert!(
        started.elapsed() >= Duration::from_millis(800),
        "the second waited: {:?}",
        started.elapsed()
    );
    let state = rig.state("r1").await;
    assert_eq!(
        (state["running"].as_u64(), state["waiting"].as_u64()),
        (Some(0), Some(0))
    );
    rig.engine.shutdown().await;
}

#[tokio::test]
async fn status_and_health_faults() {
    let rig = Rig::start(&["r1", "r2"], settings(8, 0.0)).await;
    let health = |r: &'static str| {
        let req = rig.http.get(rig.url(r, "/health"));
        async move { req.send().await.unwrap().status().as_u16() }
    };
    rig.fault("r1", json!({"status": 503})).await;
    let resp = rig.chat("r1", &chat("x", json!({}))).await.unwrap();
    assert_eq!(resp.status(), 503);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "injected_fault");
    assert_eq!(
        (health("r1").await, health("r2").await),
        (503, 200),
        "replicas are independent"
    );
    assert_eq!(rig.state("r1").await["fault"], json!({"status": 503}));

    rig.fault("r1", json!({"health_status": 503})).await;
    assert_eq!(health("r1").await, 503);
    assert_eq!(
        rig.chat("r1", &chat("x", json!({})))
            .await
            .unwrap()
            .status(),
        200
    );
    rig.clear("r1").await;
    assert_eq!(health("r1").await, 200);

    let ctl = |m: reqwest::Method, path: &str| rig.http.request(m, rig.control(path));
    assert_eq!(
        ctl(reqwest::Method::POST, "/replicas/nope/fault")
            .body("{}")
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
    assert_eq!(
        ctl(reqwest::Method::DELETE, "/replicas/nope/fault")
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
    let bad = ctl(reqwest::Method::POST, "/replicas/r1/fault")
        .body("{\"hang\": 1")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    assert!(bad.text().await.unwrap().contains("fault:"));
    rig.engine.shutdown().await;
}

#[tokio::test]
async fn slow_and_hang_faults() {
    let rig = Rig::start(&["r1"], settings(8, 10.0)).await;
    let timed = async |rig: &Rig| {
        let t = Instant::now();
        assert_eq!(
            rig.chat("r1", &chat("x", json!({})))
                .await
                .unwrap()
                .status(),
            200
        );
        t.elapsed()
    };
    let base = timed(&rig).await;
    rig.fault("r1", json!({"slow_factor": 5.0})).await;
    let slow = timed(&rig).await;
    assert!(slow >= Duration::from_millis(200), "{base:?} -> {slow:?}");

    rig.fault("r1", json!({"hang": true})).await;
    let hung = rig
        .http
        .post(rig.url("r1", "/v1/chat/completions"))
        .timeout(Duration::from_millis(300))
        .json(&chat("x", json!({})))
        .send()
        .await;
    assert!(hung.unwrap_err().is_timeout());
    // A request waiting when the fault clears is then answered.
    let pending = rig.chat("r1", &chat("y", json!({})));
    let clear = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        rig.clear("r1").await;
    };
    let (resp, ()) = tokio::join!(pending, clear);
    assert_eq!(resp.unwrap().status(), 200);
    rig.engine.shutdown().await;
}

#[tokio::test]
async fn die_after_tokens_breaks_streams_and_drops_connections() {
    let rig = Rig::start(&["r1"], settings(8, 5.0)).await;
    rig.fault("r1", json!({"die_after_tokens": 2})).await;
    let body = chat(
        "x",
        json!({"stream": true, "max_tokens": 6, "stream_options": {"include_usage": true}}),
    );
    let (events, clean) = sse_events(rig.chat("r1", &body).await.unwrap()).await;
    assert!(!clean, "the stream ends with an error");
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(events.iter().all(|e| e != "[DONE]"));

    let err = rig.chat("r1", &chat("x", json!({}))).await.unwrap_err();
    assert!(!err.is_timeout() && !err.is_status(), "{err:?}");
    // Shorter than the limit: answered in full.
    let short = rig
        .chat("r1", &chat("x", json!({"max_tokens": 2, "stream": true})))
        .await
        .unwrap();
    let (events, clean) = sse_events(short).await;
    assert!(clean && events.last().unwrap() == "[DONE]");

    rig.clear("r1").await;
    assert_eq!(
        rig.state("r1").await["running"],
        0,
        "broken requests free their slot"
    );
    rig.engine.shutdown().await;
}

#[tokio::test]
async fn refuse_closes_the_port_and_reopens_it() {
    let rig = Rig::start(&["r1"], settings(8, 0.0)).await;
    assert_eq!(
        rig.chat("r1", &chat("x", json!({})))
            .await
            .unwrap()
            .status(),
        200
    );
    rig.fault("r1", json!({"refuse": true})).await;
    // The accept loop closes the port as soon as it sees the fault.
    let mut refused = false;
    for _ in 0..50 {
        match rig.chat("r1", &chat("x", json!({}))).await {
            Err(e) if e.is_connect() => {
                refused = true;
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    assert!(refused, "connections are refused");
    rig.clear("r1").await;
    let mut back = false;
    for _ in 0..50 {
        if let Ok(r) = rig.chat("r1", &chat("x", json!({}))).await {
            back = r.status() == 200;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(back, "the same port serves again");
    rig.engine.shutdown().await;
}

#[tokio::test]
async fn configuration_is_checked() {
    let any = "127.0.0.1:0".parse().unwrap();
    let ok = EngineConfig {
        replicas: vec![("r1".into(), any)],
        control: None,
        settings: settings(1, 0.0),
        any_address: false,
        served_models: Vec::new(),
        api_keys: Vec::new(),
    };
    assert!(ok.validate().is_ok());
    let mut public = ok.clone();
    public.replicas[0].1 = "0.0.0.0:0".parse().unwrap();
    assert!(public.validate().unwrap_err().contains("loopback"));
    public.any_address = true;
    assert!(public.validate().is_ok(), "containers may bind any address");
    let mut twice = ok.clone();
    twice.replicas.push(("r1".into(), any));
    assert!(twice.validate().unwrap_err().contains("twice"));
    let mut blocks = ok.clone();
    blocks.settings.block_bytes = 10;
    assert!(blocks.validate().unwrap_err().contains("block-bytes"));
    let mut batch = ok;
    batch.settings.latency.max_batch = 0;
    assert!(Engine::start(batch).await.is_err());
}

#[tokio::test]
async fn a_replica_may_demand_its_own_name_and_key_and_records_what_it_saw() {
    let pair = |a: &str, b: &str| vec![(a.to_string(), b.to_string())];
    let rig = Rig::start_with(
        &["own", "open"],
        settings(8, 0.0),
        pair("own", "provider/m-70b"),
        pair("own", "sk-own"),
    )
    .await;
    let post = |replica: &str, model: &str, auth: Option<&str>| {
        let mut r = rig
            .http
            .post(rig.url(replica, "/v1/chat/completions"))
            .json(&json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}));
        if let Some(a) = auth {
            r = r.header("authorization", a);
        }
        r.send()
    };
    assert_eq!(
        post("own", "provider/m-70b", None).await.unwrap().status(),
        401
    );
    let wrong = post("own", "provider/m-70b", Some("Bearer sk-client"))
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let v: Value = wrong.json().await.unwrap();
    assert_eq!(v["error"]["code"], "invalid_api_key");
    let ok = post("own", "provider/m-70b", Some("Bearer sk-own"))
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    let v: Value = ok.json().await.unwrap();
    assert_eq!(v["model"], "provider/m-70b", "answers under its own name");
    assert_eq!(
        post("own", "m", Some("Bearer sk-own"))
            .await
            .unwrap()
            .status(),
        404
    );
    // The other replica keeps the process's settings.
    assert_eq!(
        post("open", "m", Some("Bearer sk-client"))
            .await
            .unwrap()
            .status(),
        200
    );
    let seen = &rig.state("own").await["authorization"];
    assert_eq!(seen["values"], json!(["Bearer sk-client", "Bearer sk-own"]));
    assert_eq!(seen["without"], 1);
    assert_eq!(
        rig.state("open").await["authorization"]["values"],
        json!(["Bearer sk-client"])
    );
    rig.engine.shutdown().await;
}
