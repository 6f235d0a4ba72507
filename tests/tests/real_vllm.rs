//! A real vLLM server on CPU (SmolLM2-135M) behind real Envoy and
//! fleetroute: the vLLM dialect's scrape, cache reuse as vLLM reports it, and
//! a LoRA adapter loaded at run time and routed to. One test, one server: a
//! vLLM server takes about 30 s to start and 4 GB.
#![cfg(feature = "e2e")] // needs Envoy, vLLM (scripts/setup-vllm.sh) and the built binaries

use std::time::Duration;

use fleetroute_tests::harness::client::{self, metric_sum, post};
use fleetroute_tests::harness::scenario::chat_url;
use fleetroute_tests::harness::vllm::{MODEL, VllmServer};
use fleetroute_tests::harness::{Lab, LabSpec, wait_for_value, wait_until};
use serde_json::{Value, json};

const ENGINE: &str = env!("CARGO_BIN_EXE_fleetroute-engine");

const ROUTER: &str = r#"
health_check: { interval_ms: 500, timeout_ms: 500, healthy_threshold: 1, unhealthy_threshold: 3 }
engine_metrics: { interval_ms: 250, timeout_ms: 250 }
default_stage: chat
fleets:
  - name: cpu
    region: here
    engine: vllm
    endpoints: ["V"]
    lora: { max_loras: 2, load_path: "LORA/{adapter}", load_timeout_ms: 20000 }
stages:
  - name: chat
    models: [smollm2]
    adapters: [adapter-a]
    fleets: [cpu]
"#;

fn replica(lab: &Lab) -> Option<Value> {
    let (_, body) = client::blocking_get(&format!("{}/debug/snapshot", lab.admin))?;
    let v: Value = serde_json::from_str(&body).ok()?;
    v["fleets"][0]["replicas"].as_array()?.first().cloned()
}

#[test]
fn vllm_dialect_cache_reuse_and_a_runtime_adapter() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = VllmServer::start("a", dir.path());
    let router = ROUTER
        .replace("\"V\"", &format!("\"{}\"", server.addr))
        .replace(
            "LORA",
            &server.venv.join("models/lora").display().to_string(),
        );
    let lab = Lab::start(
        ENGINE,
        LabSpec {
            router: &router,
            ..Default::default()
        },
    );
    wait_for_value(Duration::from_secs(30), || {
        replica(&lab).filter(|r| r["ready"] == true)
    })
    .expect("the vLLM replica never became ready");

    // Sleep mode is refused on CPU (`--enable-sleep-mode` stops the server
    // at start): only its API state can be checked here.
    let (status, body) =
        client::blocking_get(&format!("http://{}/is_sleeping", server.addr)).unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["is_sleeping"],
        false
    );

    // Cache reuse as vLLM reports it: whole 128-token blocks of a prompt
    // sent again.
    let system = "You are a careful assistant for a hardware store. ".repeat(30);
    let ask = |q: &str| {
        let body = json!({ "model": MODEL, "max_tokens": 4, "temperature": 0,
            "messages": [{ "role": "system", "content": system }, { "role": "user", "content": q }] });
        let r = post(&chat_url(&lab), body.to_string(), &[]);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .expect("cached_tokens (--enable-prompt-tokens-details)")
    };
    assert_eq!(ask("Do you sell nails?"), 0, "a cold cache");
    let again = ask("Do you sell screws?");
    assert!(
        again >= 128 && again % 128 == 0,
        "vLLM reuses whole blocks of the shared system prompt: {again}"
    );
    // Envoy's access log reaches fleetroute in batches.
    wait_until(
        "fleetroute to count vLLM's cached tokens",
        Duration::from_secs(10),
        || {
            let (_, m) = client::blocking_get(&format!("{}/metrics", lab.admin)).unwrap();
            metric_sum(&m, "fleetroute_tokens_total", &["kind=\"cached\""]) >= 128.0
        },
    );

    // The vLLM dialect: KV usage is a number, the prefix-cache counters are
    // vLLM's own, nothing is missing.
    let r = wait_for_value(Duration::from_secs(10), || {
        replica(&lab).filter(|r| r["engine_prefix_cache_hits"].as_u64().unwrap_or(0) >= 128)
    })
    .expect("the scrape never read vLLM's prefix-cache counters");
    assert!(r["engine_kv_usage"].is_number(), "{r}");
    let (_, m) = client::blocking_get(&format!("{}/metrics", lab.admin)).unwrap();
    assert_eq!(
        metric_sum(&m, "fleetroute_engine_signal_missing", &["fleet=\"cpu\""]),
        0.0
    );

    // An adapter vLLM does not know yet, asked for by name through Envoy:
    // fleetroute registers it (`/v1/load_lora_adapter`) and the client
    // reads the wait.
    let body = json!({ "model": "adapter-a", "max_tokens": 4,
        "messages": [{ "role": "user", "content": "Name a color." }] });
    let r = post(&chat_url(&lab), body.to_string(), &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["model"], "adapter-a", "the adapter answered");
    assert!(
        r.header("x-fleetroute-cold-start").is_some(),
        "{:?}",
        r.headers
    );
    let r = post(&chat_url(&lab), body.to_string(), &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("x-fleetroute-cold-start"), None, "registered once");
    // Registered again by hand: vLLM says it has it.
    let (status, body) = server.load_adapter("adapter-a");
    assert_eq!(status, 400, "{body}");
    // The scrape reads vLLM's LoRA state (the newest `lora_requests_info`).
    let lora = wait_for_value(Duration::from_secs(10), || {
        replica(&lab).and_then(|r| r.get("engine_lora").cloned().filter(Value::is_object))
    })
    .expect("the scrape never read vLLM's LoRA state");
    assert_eq!(lora["max"], 2, "{lora}");
}
