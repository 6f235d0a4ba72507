//! How precise fleetroute's prefix index is against real engines: two
//! llama.cpp servers behind real Envoy and fleetroute, a multi-turn chat
//! workload and an agent workload (one long system and tool prefix shared by
//! every task). Per request: the prompt share fleetroute predicted cached on
//! the replica it chose (`/debug/decisions`), against the tokens the engine
//! reports it reused (`usage.prompt_tokens_details.cached_tokens`).
//!
//! The prediction is in the filter's unit (prompt bytes / 4); it is scaled
//! to the engine's tokens by the request's own ratio. Precision: predicted
//! tokens the engine did reuse, over all predicted; recall: reused tokens
//! that were predicted, over all reused.
//!
//! `cargo run --release -p fleetroute-tests --bin fleetroute-prefix-precision [ENGINE] [BLOCK_BYTES]`
//! (after `scripts/build.sh`): `ENGINE` is `llamacpp` (two servers, the
//! default; `scripts/setup-llamacpp.sh`) or `vllm` (one server; `scripts/setup-vllm.sh`),
//! `BLOCK_BYTES` the filter's `block_bytes` (default: the filter's own).

use std::sync::OnceLock;
use std::time::Duration;

use fleetroute_tests::harness::client::{self, post};
use fleetroute_tests::harness::llama::{Llama, LlamaServer, MODEL};
use fleetroute_tests::harness::scenario::chat_url;
use fleetroute_tests::harness::vllm::VllmServer;
use fleetroute_tests::harness::{Lab, LabSpec, wait_for_value};
use serde_json::{Value, json};

const ROUTER: &str = r#"
health_check: { interval_ms: 500, timeout_ms: 500, healthy_threshold: 1, unhealthy_threshold: 3 }
engine_metrics: { interval_ms: 250, timeout_ms: 250 }
default_stage: chat
fleets:
  - name: local
    region: here
    engine: ENGINE
    endpoints: [ENDPOINTS]
    capacity: { kv_cache_tokens: CACHE }
stages:
  - name: chat
    models: [smollm2]
    fleets: [local]
"#;

/// One request's figures.
#[derive(Debug, Default, Clone, Copy)]
struct Sample {
    /// Predicted cached, in engine tokens.
    predicted: f64,
    /// Reused, as the engine reports it.
    actual: f64,
    prompt: f64,
}

struct Figures {
    precision: f64,
    recall: f64,
    /// Requests predicted to hit that reused nothing, and the reverse.
    false_hits: usize,
    missed_hits: usize,
    n: usize,
    predicted: f64,
    actual: f64,
    prompt: f64,
}

fn figures(samples: &[Sample]) -> Figures {
    let both: f64 = samples.iter().map(|s| s.predicted.min(s.actual)).sum();
    let predicted: f64 = samples.iter().map(|s| s.predicted).sum();
    let actual: f64 = samples.iter().map(|s| s.actual).sum();
    Figures {
        precision: if predicted > 0.0 {
            both / predicted
        } else {
            f64::NAN
        },
        recall: if actual > 0.0 {
            both / actual
        } else {
            f64::NAN
        },
        false_hits: samples
            .iter()
            .filter(|s| s.predicted > 0.0 && s.actual == 0.0)
            .count(),
        missed_hits: samples
            .iter()
            .filter(|s| s.predicted == 0.0 && s.actual > 0.0)
            .count(),
        n: samples.len(),
        predicted,
        actual,
        prompt: samples.iter().map(|s| s.prompt).sum(),
    }
}

/// The filter's `block_bytes` for this run, if not its default.
static BLOCK_BYTES: OnceLock<usize> = OnceLock::new();

fn with_block_bytes(envoy: &str) -> String {
    match BLOCK_BYTES.get() {
        Some(b) => envoy.replacen("\"block_bytes\": 1024", &format!("\"block_bytes\": {b}"), 1),
        None => envoy.to_string(),
    }
}

struct Rig {
    lab: Lab,
    _llama: Vec<LlamaServer>,
    _vllm: Option<VllmServer>,
    _dir: tempfile::TempDir,
}

fn start(engine_name: &str) -> Rig {
    let dir = tempfile::tempdir().expect("temp dir");
    let (llama, vllm, addrs, cache) = match engine_name {
        "llamacpp" => {
            let l = Llama::require();
            let servers: Vec<LlamaServer> = ["a", "b"]
                .iter()
                .map(|n| LlamaServer::start(&l, n, dir.path()))
                .collect();
            let addrs: Vec<String> = servers.iter().map(|s| s.addr.clone()).collect();
            // One unified 4096-token context per server.
            (servers, None, addrs, 4096)
        }
        "vllm" => {
            let v = VllmServer::start("a", dir.path());
            let addrs = vec![v.addr.clone()];
            // VLLM_CPU_KVCACHE_SPACE=1 (GiB) holds about 45,000 tokens of this model.
            (Vec::new(), Some(v), addrs, 40_000)
        }
        other => panic!("ENGINE is llamacpp or vllm, not {other}"),
    };
    let endpoints: Vec<String> = addrs.iter().map(|a| format!("\"{a}\"")).collect();
    let router = ROUTER
        .replace("ENGINE", engine_name)
        .replace("ENDPOINTS", &endpoints.join(", "))
        .replace("CACHE", &cache.to_string());
    let engine = std::env::current_exe()
        .expect("own path")
        .with_file_name("fleetroute-engine");
    let lab = Lab::start(
        engine.to_str().expect("UTF-8 path"),
        LabSpec {
            router: &router,
            envoy_edit: Some(with_block_bytes),
            ..Default::default()
        },
    );
    Rig {
        lab,
        _llama: llama,
        _vllm: vllm,
        _dir: dir,
    }
}

/// Sends one turn; its sample and the answer's text.
fn turn(lab: &Lab, messages: &[Value]) -> (Sample, String) {
    let body = json!({ "model": MODEL, "messages": messages, "max_tokens": 16, "temperature": 0 });
    let r = post(&chat_url(lab), body.to_string(), &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    let id = r.header("x-request-id").expect("request id").to_string();
    let url = format!("{}/debug/decisions?id={id}", lab.admin);
    let d = wait_for_value(Duration::from_secs(2), || {
        let (_, body) = client::blocking_get(&url)?;
        let v: Value = serde_json::from_str(&body).ok()?;
        v.as_array()?.first().cloned()
    })
    .expect("decision recorded");
    let v = r.json();
    let prompt = v["usage"]["prompt_tokens"].as_f64().expect("prompt_tokens");
    let actual = v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_f64()
        .unwrap_or(0.0);
    let est_prompt = d["prompt_tokens"].as_f64().unwrap_or(0.0).max(1.0);
    let est_cached = d["predicted_cached_tokens"].as_f64().unwrap_or(0.0);
    let sample = Sample {
        predicted: (est_cached / est_prompt).min(1.0) * prompt,
        actual,
        prompt,
    };
    let text = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or("")
        .to_string();
    (sample, text)
}

const TOPICS: [&str; 4] = ["tides", "glaciers", "bees", "lighthouses"];

/// Four conversations of six turns, interleaved: each turn resends the whole
/// conversation so far.
fn chat(lab: &Lab) -> Vec<Sample> {
    let system = "You are a patient tutor. Answer in two or three short sentences, \
                  plainly, and end with a question that checks understanding. "
        .repeat(4);
    let mut convs: Vec<Vec<Value>> = TOPICS
        .iter()
        .map(|t| {
            vec![
                json!({ "role": "system", "content": system }),
                json!({ "role": "user", "content": format!("Teach me about {t}. {}", "I know nothing yet. ".repeat(10)) }),
            ]
        })
        .collect();
    let mut out = Vec::new();
    for step in 0..6 {
        for c in convs.iter_mut() {
            let (s, text) = turn(lab, c);
            out.push(s);
            c.push(json!({ "role": "assistant", "content": text }));
            c.push(json!({ "role": "user", "content": format!("Thanks. Now question {step}: why does that happen, in more detail?") }));
        }
    }
    out
}

/// One long system prompt with tool definitions shared by every task; each
/// task takes three steps (a tool call and its result appended each time).
fn agent(lab: &Lab) -> Vec<Sample> {
    let tools: Vec<Value> = (0..12)
        .map(|i| json!({ "name": format!("tool_{i}"), "description": format!("Tool number {i}: looks up records of kind {i} in the inventory and returns them as a table with columns id, name, quantity and location."), "parameters": { "type": "object", "properties": { "query": { "type": "string" }, "limit": { "type": "integer" } } } }))
        .collect();
    let system = format!(
        "You are an inventory agent. Call one tool per step by writing TOOL name(query). Tools:\n{}",
        serde_json::to_string_pretty(&tools).expect("json")
    );
    let mut tasks: Vec<Vec<Value>> = (0..8)
        .map(|i| {
            vec![
                json!({ "role": "system", "content": system }),
                json!({ "role": "user", "content": format!("Task {i}: find every item of kind {} stored in warehouse {}.", i % 5, i) }),
            ]
        })
        .collect();
    let mut out = Vec::new();
    for step in 0..3 {
        for (i, t) in tasks.iter_mut().enumerate() {
            let (s, text) = turn(lab, t);
            out.push(s);
            t.push(json!({ "role": "assistant", "content": text }));
            t.push(json!({ "role": "user", "content": format!("TOOL RESULT step {step}: {}", format!("| {i} | item | 3 | shelf {step} |\n").repeat(6)) }));
        }
    }
    out
}

fn main() {
    let engine = std::env::args().nth(1).unwrap_or_else(|| "llamacpp".into());
    if let Some(b) = std::env::args().nth(2) {
        let b: usize = b.parse().expect("BLOCK_BYTES: a number");
        BLOCK_BYTES.set(b).expect("set once");
    }
    let rig = start(&engine);
    println!(
        "engine {engine}, block_bytes {}",
        BLOCK_BYTES.get().copied().unwrap_or(1024)
    );
    println!(
        "workload  requests  prompt_tokens  reused(engine)  predicted  precision  recall  false_hits  missed_hits"
    );
    for (name, run) in [("chat", chat as fn(&Lab) -> Vec<Sample>), ("agent", agent)] {
        let f = figures(&run(&rig.lab));
        println!(
            "{name:<8}  {:>8}  {:>13.0}  {:>14.0}  {:>9.0}  {:>9.3}  {:>6.3}  {:>10}  {:>11}",
            f.n,
            f.prompt,
            f.actual,
            f.predicted,
            f.precision,
            f.recall,
            f.false_hits,
            f.missed_hits
        );
    }
}
