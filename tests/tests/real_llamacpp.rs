//! Two real llama.cpp servers (`llama-server`, SmolLM2-135M) in one fleet,
//! behind real Envoy and fleetroute: a conversation stays on one server and
//! that server's own report shows its cache reused; streaming usage reaches
//! fleetroute through the filter; the llama.cpp dialect's scrape moves the
//! load figures; a killed server is left and the conversation moves without
//! failing; a restarted one comes back after its warmup.
#![cfg(feature = "e2e")] // needs Envoy, llama-server and the built binaries: scripts/test.sh

use std::io::Read;
use std::time::Duration;

use fleetroute_tests::harness::client::{self, metric_sum, post};
use fleetroute_tests::harness::llama::{Llama, LlamaServer, MODEL};
use fleetroute_tests::harness::scenario::chat_url;
use fleetroute_tests::harness::{Lab, LabSpec, wait_for_value, wait_until};
use serde_json::{Value, json};

const ENGINE: &str = env!("CARGO_BIN_EXE_fleetroute-engine");

/// Real engines answer in tens of milliseconds to seconds: probes and
/// scrapes with room for a busy 2-core machine.
const ROUTER: &str = r#"
health_check: { interval_ms: 500, timeout_ms: 500, healthy_threshold: 1, unhealthy_threshold: 3 }
engine_metrics: { interval_ms: 250, timeout_ms: 250 }
default_stage: chat
fleets:
  - name: local
    region: here
    engine: llamacpp
    endpoints: ["A", "B"]
stages:
  - name: chat
    models: [smollm2]
    fleets: [local]
    warmup:
      timeout_ms: 20000
      prompts: [{ body: { model: smollm2, messages: [{ role: user, content: "Say OK." }], max_tokens: 2 } }]
"#;

struct Rig {
    servers: Vec<LlamaServer>,
    lab: Lab,
    _dir: tempfile::TempDir,
}

impl Rig {
    fn start() -> Rig {
        let llama = Llama::require();
        let dir = tempfile::tempdir().expect("temp dir");
        let servers: Vec<LlamaServer> = ["a", "b"]
            .iter()
            .map(|n| LlamaServer::start(&llama, n, dir.path()))
            .collect();
        let router = ROUTER
            .replace("\"A\"", &format!("\"{}\"", servers[0].addr))
            .replace("\"B\"", &format!("\"{}\"", servers[1].addr));
        let lab = Lab::start(
            ENGINE,
            LabSpec {
                router: &router,
                ..Default::default()
            },
        );
        let rig = Rig {
            servers,
            lab,
            _dir: dir,
        };
        for s in 0..2 {
            rig.wait_replica(s, "ready and warm", |r| r["ready"] == true);
        }
        rig
    }

    fn server_at(&self, addr: &str) -> usize {
        self.servers
            .iter()
            .position(|s| s.addr == addr)
            .unwrap_or_else(|| panic!("{addr} is none of the servers"))
    }

    /// fleetroute's view of server `s` (admin snapshot).
    fn replica_view(&self, s: usize) -> Option<Value> {
        let (_, body) = client::blocking_get(&format!("{}/debug/snapshot", self.lab.admin))?;
        let v: Value = serde_json::from_str(&body).ok()?;
        v["fleets"][0]["replicas"]
            .as_array()?
            .iter()
            .find(|r| r["addr"] == self.servers[s].addr.as_str())
            .cloned()
    }

    fn wait_replica(&self, s: usize, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        wait_for_value(Duration::from_secs(60), || {
            self.replica_view(s).filter(|r| pred(r))
        })
        .unwrap_or_else(|| panic!("server {s} never {what}: {:?}", self.replica_view(s)))
    }

    /// One turn: the reply's text, the server that served it, and the
    /// cached prompt tokens that server reported.
    fn turn(&self, messages: &[Value]) -> (String, usize, u64) {
        let body =
            json!({ "model": MODEL, "messages": messages, "max_tokens": 12, "temperature": 0 });
        let r = post(&chat_url(&self.lab), body.to_string(), &[]);
        assert_eq!(r.status, 200, "{}", r.body);
        let id = r.header("x-request-id").expect("request id").to_string();
        let (_, replica) = self.lab.decision(&id).expect("decision recorded");
        let v = r.json();
        let text = v["choices"][0]["message"]["content"]
            .as_str()
            .expect("an answer")
            .to_string();
        let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .expect("cached_tokens in usage");
        (text, self.server_at(&replica), cached)
    }
}

fn conversation(topic: &str) -> Vec<Value> {
    vec![
        json!({ "role": "system", "content": "You are a helpful assistant who answers in one short sentence." }),
        json!({ "role": "user", "content": format!("Tell me one fact about {topic}.") }),
    ]
}

#[test]
fn a_conversation_stays_and_its_server_reports_cache_reuse() {
    let rig = Rig::start();
    let cached_before: Vec<f64> = (0..2)
        .map(|s| {
            rig.servers[s]
                .metric("llamacpp:prompt_tokens_cached_total")
                .unwrap()
        })
        .collect();
    let mut messages = conversation("the moon");
    let mut served = Vec::new();
    let mut cached = Vec::new();
    for turn in 0..4 {
        let (text, s, c) = rig.turn(&messages);
        served.push(s);
        cached.push(c);
        messages.push(json!({ "role": "assistant", "content": text }));
        messages
            .push(json!({ "role": "user", "content": format!("And another one, number {turn}?") }));
    }
    assert!(
        served.iter().all(|&s| s == served[0]),
        "the conversation moved: {served:?}"
    );
    assert!(
        cached[1..].iter().all(|&c| c > 20),
        "later turns reuse the cache, as the server reports it: {cached:?}"
    );
    let home = served[0];
    let grew = |s: usize| {
        rig.servers[s]
            .metric("llamacpp:prompt_tokens_cached_total")
            .unwrap()
            - cached_before[s]
    };
    assert!(
        grew(home) >= cached[1..].iter().sum::<u64>() as f64,
        "the serving server's own counter shows the reuse"
    );
    assert_eq!(grew(1 - home), 0.0, "the other server reused nothing");
    // The scrape read the same counters through the llama.cpp dialect.
    let v = rig.wait_replica(home, "reported its cache counters", |r| {
        r["engine_prefix_cache_hits"].as_u64().unwrap_or(0) > 0
    });
    assert!(
        v["engine_kv_usage"].is_null(),
        "llama.cpp has no KV gauge: {v}"
    );
}

#[test]
fn streaming_usage_reaches_fleetroute_and_the_scrape_moves_load() {
    let rig = Rig::start();
    let mut messages = conversation("rivers");
    // Streamed turns with usage: through the filter, cached tokens counted.
    for turn in 0..2 {
        let body = json!({ "model": MODEL, "messages": messages, "max_tokens": 8, "stream": true,
                           "stream_options": { "include_usage": true } });
        let r = post(&chat_url(&rig.lab), body.to_string(), &[]);
        assert_eq!(r.status, 200, "{}", r.body);
        assert!(r.body.contains("data: [DONE]"), "{}", r.body);
        assert!(r.body.contains("\"cached_tokens\""), "{}", r.body);
        messages.push(json!({ "role": "assistant", "content": "Rivers flow." }));
        messages.push(json!({ "role": "user", "content": format!("More, {turn}?") }));
    }
    wait_until(
        "fleetroute to count cached tokens",
        Duration::from_secs(10),
        || {
            let (_, m) = client::blocking_get(&format!("{}/metrics", rig.lab.admin)).unwrap();
            metric_sum(&m, "fleetroute_tokens_total", &["kind=\"cached\""]) > 0.0
        },
    );

    // A long answer in flight: the engine's own count, scraped, moves.
    let url = chat_url(&rig.lab);
    let long = json!({ "model": MODEL, "max_tokens": 400, "temperature": 0,
        "messages": [{ "role": "user", "content": "Write a long story about a lighthouse keeper." }] });
    let worker = std::thread::spawn(move || post(&url, long.to_string(), &[]));
    let busy = wait_for_value(Duration::from_secs(20), || {
        (0..2).find(|&s| {
            rig.replica_view(s)
                .is_some_and(|r| r["engine_running"].as_u64().unwrap_or(0) >= 1)
        })
    });
    let done = worker.join().expect("the long request");
    assert_eq!(done.status, 200, "{}", done.body);
    let busy = busy.expect("the scrape never saw the engine running a request");
    rig.wait_replica(busy, "went back to idle", |r| r["engine_running"] == 0);

    let (_, m) = client::blocking_get(&format!("{}/metrics", rig.lab.admin)).unwrap();
    assert!(
        metric_sum(
            &m,
            "fleetroute_engine_scrapes_total",
            &["engine=\"llamacpp\"", "result=\"ok\""]
        ) > 0.0
    );
    assert_eq!(
        metric_sum(&m, "fleetroute_engine_signal_missing", &["fleet=\"local\""]),
        0.0,
        "every signal the llama.cpp dialect names is there"
    );
}

#[test]
fn a_killed_server_is_left_and_a_restarted_one_comes_back_after_warmup() {
    let mut rig = Rig::start();
    let mut messages = conversation("volcanoes");
    let (text, home, _) = rig.turn(&messages);
    messages.push(json!({ "role": "assistant", "content": text }));
    messages.push(json!({ "role": "user", "content": "Tell me a much longer story about one." }));

    // The next turn streams from its server, which dies mid-stream.
    let body = json!({ "model": MODEL, "messages": messages, "max_tokens": 400, "stream": true });
    let mut resp = client::client()
        .post(chat_url(&rig.lab))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .expect("streaming request");
    assert_eq!(resp.status(), 200);
    let mut first = [0u8; 64];
    let n = resp.read(&mut first).expect("first bytes");
    assert!(n > 0);
    rig.servers[home].kill();
    let mut rest = String::new();
    let _ = resp.read_to_string(&mut rest);
    assert!(
        !rest.contains("[DONE]"),
        "a killed server's stream ends without [DONE]"
    );

    // The conversation goes on, elsewhere, without a failed turn.
    messages.push(json!({ "role": "assistant", "content": "Once upon a time" }));
    messages.push(json!({ "role": "user", "content": "Go on." }));
    let (_, moved_to, _) = rig.turn(&messages);
    assert_eq!(moved_to, 1 - home, "the next turn went to the dead server");
    rig.wait_replica(home, "left the rotation", |r| r["ready"] == false);

    // Back on the same address with an empty cache: warmed up, then routed to.
    rig.servers[home].restart();
    rig.wait_replica(home, "came back warm", |r| {
        r["ready"] == true && r["warm"] == true
    });
    let warmed = rig.servers[home]
        .metric("llamacpp:prompt_tokens_total")
        .unwrap_or(0.0);
    assert!(warmed > 0.0, "the golden prompt ran on the new process");
    let back = (0..40).any(|i| rig.turn(&conversation(&format!("topic {i}"))).1 == home);
    assert!(back, "no new conversation reached the restarted server");
}
