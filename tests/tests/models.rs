//! Through real Envoy: fleets that serve a stage's model under their own
//! names get their own name (each engine refuses any other, as vLLM does) and
//! the client always reads back the name it asked for, streamed or not; a
//! fleet with its own API key gets that key and never the client's, on routed,
//! mirrored and fail-open requests; `GET /v1/models` lists what clients may
//! ask for, from fleetroute, and from Envoy while fleetroute is down.
#![cfg(feature = "e2e")] // needs Envoy and the built binaries: scripts/test.sh

use std::time::Duration;

use fleetroute_tests::harness::client::{self, chat_body, post};
use fleetroute_tests::harness::scenario::{FAST_ENGINES, chat_url as url};
use fleetroute_tests::harness::{Lab, LabSpec, wait_until};
use serde_json::Value;

const ENGINE: &str = env!("CARGO_BIN_EXE_fleetroute-engine");

const BURST_NAME: &str = "meta-llama/Llama-3.1-70B-Instruct";

/// One stage over two fleets that each serve `llama` under their own name.
const RENAMED: &str = r#"
health_check: { interval_ms: 500, timeout_ms: 500, healthy_threshold: 1, unhealthy_threshold: 3 }
default_stage: chat
fleets:
  - { name: base, region: us, endpoints: ["{b1}", "{b2}"] }
  - { name: burst, region: us, endpoints: ["{u1}"] }
  - { name: spare, region: us, endpoints: ["{s1}"] }
stages:
  - name: chat
    models: [llama, l3]
    fleets: [{ name: base, model: base-build/llama-8b }, { name: burst, model: meta-llama/Llama-3.1-70B-Instruct }]
    routing: { policy: weighted }
    # Each replica answers only its own name: the golden prompt is renamed too.
    warmup: { prompts: [{ body: { model: llama, messages: [{ role: user, content: "2+2=" }], max_tokens: 2 } }] }
  - name: other
    models: [meta-llama/Llama-3.1-70B-Instruct]
    fleets: [{ name: burst, model: meta-llama/Llama-3.1-70B-Instruct }]
  - name: plain
    models: [small]
    fleets: [spare]
"#;

fn engine_args(extra: &[&'static str]) -> &'static [&'static str] {
    let mut v: Vec<&'static str> = FAST_ENGINES.to_vec();
    v.extend_from_slice(extra);
    Vec::leak(v)
}

fn renamed_lab() -> Lab {
    Lab::start(
        ENGINE,
        LabSpec {
            router: RENAMED,
            engine_args: engine_args(&[
                "--served-model",
                "b1=base-build/llama-8b",
                "--served-model",
                "b2=base-build/llama-8b",
                "--served-model",
                "u1=meta-llama/Llama-3.1-70B-Instruct",
            ]),
            ..Default::default()
        },
    )
}

/// Waits until every replica has passed its stage's golden prompts (each
/// engine answers them only under its own name, or with its own key).
fn wait_warm(lab: &Lab) {
    wait_until("every replica warm", Duration::from_secs(20), || {
        client::blocking_get(&format!("{}/debug/snapshot", lab.admin))
            .and_then(|(_, body)| serde_json::from_str::<Value>(&body).ok())
            .is_some_and(|v| {
                let replicas: Vec<&Value> = v["fleets"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .flat_map(|f| f["replicas"].as_array().into_iter().flatten())
                    .collect();
                !replicas.is_empty() && replicas.iter().all(|r| r["ready"] == true)
            })
    });
}

/// The data events of an SSE body, parsed.
fn events(body: &str) -> Vec<Value> {
    body.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
        .collect()
}

/// A replica's record of the `Authorization` values it saw.
fn seen(lab: &Lab, replica: &str) -> Value {
    let (_, body) = client::blocking_get(&format!("{}/replicas", lab.control)).expect("control");
    let all: Value = serde_json::from_str(&body).expect("JSON");
    all.as_array()
        .expect("replicas")
        .iter()
        .find(|r| r["name"] == replica)
        .expect("replica")["authorization"]
        .clone()
}

#[test]
fn each_fleet_gets_its_own_name_and_the_client_reads_back_its_own() {
    let lab = renamed_lab();
    wait_warm(&lab);
    let mut fleets = std::collections::BTreeSet::new();
    for i in 0..24 {
        let user = format!("user-{i}");
        let asked = if i % 3 == 0 { "l3" } else { "llama" };
        let stream = i % 2 == 0;
        let r = post(
            &url(&lab),
            chat_body(asked, Some(&user), "hello there", stream),
            &[],
        );
        // Each engine answers 404 to any name but its own.
        assert_eq!(r.status, 200, "{asked} stream={stream}: {}", r.body);
        let served_by = r.served_by().to_string();
        let fleet = if served_by.starts_with('b') {
            "base"
        } else {
            "burst"
        };
        fleets.insert(fleet);
        let id = r.header("x-request-id").expect("request id").to_string();
        assert_eq!(lab.decision(&id).map(|d| d.0).as_deref(), Some(fleet));
        let received = r.header("x-sim-received-headers").unwrap_or_default();
        assert!(
            !received.contains("x-fleetroute-"),
            "internal headers reached the engine: {received}"
        );
        if stream {
            let evs = events(&r.body);
            assert!(evs.len() >= 5, "{}", r.body);
            for e in &evs {
                assert_eq!(e["model"], asked, "an event kept the served name: {e}");
            }
            assert!(r.body.ends_with("data: [DONE]\n\n"), "{}", r.body);
            assert!(evs.last().unwrap()["usage"]["prompt_tokens"].as_u64() > Some(0));
        } else {
            let v = r.json();
            assert_eq!(v["model"], asked, "{v}");
            assert_eq!(v["usage"]["completion_tokens"], 4);
        }
    }
    assert_eq!(fleets.len(), 2, "both fleets took requests: {fleets:?}");

    // A client that already uses a fleet's own name is not renamed.
    let r = post(&url(&lab), chat_body(BURST_NAME, None, "hi", false), &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["model"], BURST_NAME);

    // A 1 MiB prompt is renamed too (its body length changes).
    let big = "lorem ipsum ".repeat(90_000);
    let r = post(
        &url(&lab),
        chat_body("llama", Some("big"), &big, false),
        &[],
    );
    assert_eq!(r.status, 200, "{}", &r.body[..r.body.len().min(300)]);
    assert_eq!(r.json()["model"], "llama");

    let renamed = lab.envoy_stat("wasmcustom.fleetroute_filter.model_renamed");
    assert!(renamed >= 25, "{renamed} requests renamed");
    assert_eq!(
        lab.envoy_stat("wasmcustom.fleetroute_filter.model_rename_untouched"),
        0
    );
}

#[test]
fn the_model_list_comes_from_fleetroute_and_from_envoy_without_it() {
    let mut lab = renamed_lab();
    let list = |lab: &Lab| {
        let r = client::client()
            .get(format!("{}/v1/models", lab.envoy))
            .send()
            .expect("GET /v1/models");
        let ct = r.headers()["content-type"].to_str().unwrap().to_string();
        (r.status().as_u16(), ct, r.text().unwrap())
    };
    let (status, ct, body) = list(&lab);
    assert_eq!((status, ct.as_str()), (200, "application/json"), "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        ["llama", "l3", "chat", BURST_NAME, "other", "small", "plain"]
    );
    // No fleet was asked.
    assert_eq!(lab.envoy_stat("cluster.base.upstream_rq_total"), 0);

    lab.stop_router();
    let (status, ct, during) = list(&lab);
    assert_eq!((status, ct.as_str()), (200, "application/json"));
    assert_eq!(during, body, "Envoy's answer is fleetroute's");
    // Without fleetroute nobody renames: every fleet of `chat` renames, so
    // none takes its fail-open requests, and the client hears why.
    let r = post(&url(&lab), chat_body("llama", None, "hi", false), &[]);
    assert_eq!(r.status, 503, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "router_unavailable");
    assert_eq!(lab.envoy_stat("cluster.base.upstream_rq_total"), 0);
    // `plain`'s fleet serves the client's name: fail-open still serves it.
    let r = post(&url(&lab), chat_body("small", None, "hi", false), &[]);
    assert_eq!(r.status, 200, "{}", r.body);
}

const CLIENT_KEY: &str = "sk-client-0b1c";
const FLEET_KEY: &str = "sk-fleet-9e2d";

/// `chat` on our own fleet, `ext` on a provider with its own key, which
/// would mirror to `base` if fleetroute let it. A fleet's key goes only to
/// an authenticated peer: Envoy calls fleetroute with the token in
/// `{key_file}.grpc`.
fn keyed_router(key_file: &str) -> String {
    format!(
        r#"
health_check: {{ interval_ms: 500, timeout_ms: 500, healthy_threshold: 1, unhealthy_threshold: 3 }}
grpc: {{ token_file: '{key_file}.grpc' }}
fleets:
  - {{ name: base, region: us, endpoints: ["{{b1}}"] }}
  - name: paid
    region: us
    endpoints: ["{{p1}}"]
    credentials: {{ api_key_file: '{key_file}' }}
stages:
  - name: chat
    models: [m1]
    fleets: [base]
  - name: ext
    models: [ext]
    fleets: [paid]
    experiment: {{ shadow: {{ fleet: base, percent: 100 }} }}
    # The provider answers only with its key: the golden prompt carries it.
    warmup: {{ prompts: [{{ body: {{ model: ext, messages: [{{ role: user, content: "hi" }}], max_tokens: 1 }} }}] }}
"#
    )
}

#[test]
fn a_fleets_key_replaces_the_clients_and_never_leaves_it() {
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("paid.key");
    std::fs::write(&key_file, format!("{FLEET_KEY}\n")).unwrap();
    std::fs::write(
        dir.path().join("paid.key.grpc"),
        "models-grpc-token-0123456789",
    )
    .unwrap();
    let router = keyed_router(&key_file.display().to_string());
    let mut lab = Lab::start(
        ENGINE,
        LabSpec {
            router: &router,
            engine_args: engine_args(&["--require-api-key", "p1=sk-fleet-9e2d"]),
            admin_token: Some("admin-token"),
            ..Default::default()
        },
    );
    wait_warm(&lab);
    let client_auth = format!("Bearer {CLIENT_KEY}");
    let headers = [
        ("authorization", client_auth.as_str()),
        ("x-api-key", CLIENT_KEY),
        ("cookie", "session=client"),
    ];
    for i in 0..6 {
        let stream = i % 2 == 0;
        let r = post(
            &url(&lab),
            chat_body("ext", Some(&format!("u{i}")), "hi", stream),
            &headers,
        );
        assert_eq!(r.status, 200, "the provider refused: {}", r.body);
        let received = r
            .header("x-sim-received-headers")
            .unwrap_or_default()
            .to_string();
        for h in ["x-api-key", "cookie"] {
            assert!(
                !received.split(',').any(|x| x == h),
                "{h} reached the provider: {received}"
            );
        }
        let r = post(
            &url(&lab),
            chat_body("m1", Some(&format!("u{i}")), "hi", stream),
            &headers,
        );
        assert_eq!(r.status, 200, "{}", r.body);
    }
    // Without a default stage the catch-all route refuses; a body over the
    // connection's 1 MiB still reaches its fleet.
    let big = "lorem ipsum ".repeat(90_000);
    let r = post(
        &url(&lab),
        chat_body("ext", Some("big"), &big, false),
        &headers,
    );
    assert_eq!(r.status, 200, "{}", &r.body[..r.body.len().min(300)]);
    // The provider saw its own key only; our fleet saw the client's only
    // (no mirror of a provider request carried the provider's key to it).
    assert_eq!(
        seen(&lab, "p1")["values"],
        serde_json::json!([format!("Bearer {FLEET_KEY}")])
    );
    assert_eq!(seen(&lab, "b1")["values"], serde_json::json!([client_auth]));
    assert_eq!(
        lab.envoy_stat("cluster.base.upstream_rq_total"),
        6,
        "no mirrors"
    );

    // A rotated key is read on reload.
    std::fs::write(&key_file, "sk-rotated\n").unwrap();
    let (ok, out, err) = lab.cli(&["reload"], Some("admin-token"));
    assert!(ok, "{out}{err}");
    wait_until("the rotated key in use", Duration::from_secs(10), || {
        post(&url(&lab), chat_body("ext", None, "hi", false), &headers).status == 401
    });
    assert!(
        seen(&lab, "p1")["values"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v == "Bearer sk-rotated")
    );

    // Fail-open: the provider is in no fail-open cluster, so the client's
    // key cannot reach it; our own fleet still serves.
    lab.stop_router();
    let r = post(&url(&lab), chat_body("ext", None, "hi", false), &headers);
    assert_eq!(r.status, 503, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "router_unavailable");
    let r = post(&url(&lab), chat_body("m1", None, "hi", false), &headers);
    assert_eq!(r.status, 200, "{}", r.body);
    let provider = seen(&lab, "p1");
    assert!(
        !provider["values"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v.as_str().is_some_and(|v| v.contains(CLIENT_KEY))),
        "the client's key reached the provider: {provider}"
    );
}

#[test]
fn a_key_that_cannot_be_read_stops_the_config_with_its_field_path() {
    let bins = fleetroute_tests::harness::Binaries::locate(ENGINE);
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("router.yaml");
    let text = keyed_router("/nonexistent/fleetroute/paid.key")
        .replace("{b1}", "127.0.0.1:1")
        .replace("{p1}", "127.0.0.1:2");
    std::fs::write(&cfg, text).unwrap();
    let out = std::process::Command::new(&bins.fleetroute)
        .arg("check-config")
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains(
            "fleets[1].credentials.api_key_file: cannot read '/nonexistent/fleetroute/paid.key'"
        ),
        "{text}"
    );
}
