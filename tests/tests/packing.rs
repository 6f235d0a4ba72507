//! Several models on one pool, through real Envoy: two real llama.cpp
//! servers in router mode (`--models-dir`, one model loaded at a time,
//! no autoload), three models and one whose file is no model. A model no
//! replica holds is loaded on one replica (`POST /models/load`) while its
//! first requests wait, which the client reads in
//! `x-fleetroute-cold-start`; every request goes to a replica that has its
//! model loaded (the engine refuses any other with a 400); a model evicted
//! for another is loaded again; one that fails to load is a clear 503
//! with `retry-after`, never a hang. Two instances sharing nothing load a
//! new model on one replica (simulated router-mode replicas).
#![cfg(feature = "e2e")] // needs Envoy, llama-server and the built binaries: scripts/test.sh

use std::collections::BTreeSet;
use std::time::Duration;

use fleetroute_tests::harness::client::{self, Reply, chat_body_tokens, post};
use fleetroute_tests::harness::llama::Llama;
use fleetroute_tests::harness::llama_router::LlamaRouter;
use fleetroute_tests::harness::scenario::chat_url as url;
use fleetroute_tests::harness::{Lab, LabSpec, wait_until};

const ENGINE: &str = env!("CARGO_BIN_EXE_fleetroute-engine");

const ROUTER: &str = r#"
health_check: { interval_ms: 500, timeout_ms: 500, healthy_threshold: 1, unhealthy_threshold: 3 }
# llama.cpp's router answers /metrics per model only (those scrapes fail:
# load figures are fleetroute's own); its model list is read each round.
engine_metrics: { interval_ms: 250, timeout_ms: 250 }
fleets:
  - name: pool
    region: here
    engine: llamacpp
    endpoints: ["A", "B"]
    packing: { max_models: 1, load_ms: 1000, load_timeout_ms: 20000 }
stages:
  - { name: alpha, models: [alpha, alpha-latest], fleets: [pool] }
  - { name: beta, fleets: [pool] }
  - { name: gamma, fleets: [pool] }
  - { name: broken, fleets: [pool] }
"#;

struct Rig {
    routers: Vec<LlamaRouter>,
    lab: Lab,
    _dir: tempfile::TempDir,
}

impl Rig {
    fn start() -> Rig {
        let llama = Llama::require();
        let dir = tempfile::tempdir().expect("temp dir");
        let models = ["alpha", "beta", "gamma", "broken"];
        let routers: Vec<LlamaRouter> = ["a", "b"]
            .iter()
            .map(|n| LlamaRouter::start(&llama, n, dir.path(), &models, 1))
            .collect();
        let router = ROUTER
            .replace("\"A\"", &format!("\"{}\"", routers[0].addr))
            .replace("\"B\"", &format!("\"{}\"", routers[1].addr));
        let lab = Lab::start(
            ENGINE,
            LabSpec {
                router: &router,
                ..Default::default()
            },
        );
        Rig {
            routers,
            lab,
            _dir: dir,
        }
    }

    fn ask(&self, model: &str, i: usize) -> Reply {
        let body = chat_body_tokens(
            model,
            Some(&format!("user-{i}")),
            &format!("Say {i}."),
            false,
            2,
        );
        post(&url(&self.lab), body, &[])
    }

    /// The replica a request went to, from its decision record.
    fn served_by(&self, r: &Reply) -> String {
        let id = r.header("x-request-id").expect("request id");
        self.lab.decision(id).expect("decision recorded").1
    }

    /// What fleetroute's snapshot says a replica holds.
    fn held(&self, addr: &str) -> Vec<String> {
        let (_, snap) =
            client::blocking_get(&format!("{}/debug/snapshot", self.lab.admin)).unwrap();
        let snap: serde_json::Value = serde_json::from_str(&snap).unwrap();
        snap["fleets"][0]["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["addr"] == addr)
            .flat_map(|r| r["adapters"].as_array().cloned().unwrap_or_default())
            .filter_map(|a| a.as_str().map(String::from))
            .collect()
    }

    /// Which routers have `model` loaded.
    fn holders(&self, model: &str) -> BTreeSet<String> {
        self.routers
            .iter()
            .filter(|r| r.loaded().iter().any(|m| m == model))
            .map(|r| r.addr.clone())
            .collect()
    }
}

#[test]
fn a_cold_model_loads_on_one_replica_and_requests_only_go_where_theirs_is() {
    let rig = Rig::start();
    // Nothing loaded: the first request waits for its model, and says so.
    let first = rig.ask("alpha", 0);
    assert_eq!(first.status, 200, "{}", first.body);
    let cold: u64 = first
        .header("x-fleetroute-cold-start")
        .unwrap_or_else(|| panic!("no cold-start header: {:?}", first.headers))
        .parse()
        .unwrap();
    assert!(cold > 0, "cold start {cold} ms");
    assert!(first.body.contains("\"model\":\"alpha\""), "{}", first.body);
    assert_eq!(rig.holders("alpha").len(), 1);
    // Loaded now: no wait, same replica, and an alias is renamed to the
    // name the engine knows.
    let again = rig.ask("alpha-latest", 1);
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(again.header("x-fleetroute-cold-start"), None);
    assert_eq!(rig.served_by(&again), rig.served_by(&first));

    // Four at once for a second model: loaded once, on the other replica
    // (one model each: loading it beside alpha would evict alpha).
    let r = &rig;
    let burst: Vec<Reply> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|i| s.spawn(move || r.ask("beta", 10 + i)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in &burst {
        assert_eq!(r.status, 200, "{}", r.body);
        assert_ne!(rig.served_by(r), rig.served_by(&first));
    }
    assert_eq!(rig.holders("beta").len(), 1);
    assert_eq!(rig.holders("alpha").len(), 1, "alpha was evicted");

    // A third model evicts one of them; the evicted one loads again when
    // asked for: every request answered, none refused for a model the
    // replica had dropped.
    for (i, m) in ["gamma", "alpha", "beta", "gamma", "alpha"]
        .iter()
        .enumerate()
    {
        let r = rig.ask(m, 100 + i);
        assert_eq!(r.status, 200, "{m}: {}", r.body);
        assert_eq!(rig.holders(m).len(), 1, "{m} after request {i}");
    }

    // A load behind fleetroute's back (another instance's) is read from the
    // engine's list: the model it evicted is gone from that replica.
    let other = rig
        .routers
        .iter()
        .find(|r| !r.loaded().contains(&"gamma".to_string()))
        .expect("gamma is on one replica");
    let before = other.loaded();
    let r = post(
        &format!("http://{}/models/load", other.addr),
        r#"{"model":"gamma"}"#,
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.body);
    wait_until(
        "the snapshot to show the engine's load",
        Duration::from_secs(20),
        || rig.held(&other.addr) == ["gamma"],
    );
    assert_ne!(before, ["gamma"]);

    // No model in the file: a clear 503 naming it, soon, and again on the
    // next try (never remembered as loaded).
    for i in 0..2 {
        let r = rig.ask("broken", 200 + i);
        assert_eq!(r.status, 503, "{}", r.body);
        assert!(
            r.body.contains("model_unavailable") && r.body.contains("'broken'"),
            "{}",
            r.body
        );
        assert_eq!(r.header("retry-after"), Some("1"));
    }
    // The loads are counted by result.
    let metrics = client::blocking_get(&format!("{}/metrics", rig.lab.admin))
        .unwrap()
        .1;
    let count = |result: &str| {
        client::metric_sum(
            &metrics,
            "fleetroute_model_loads_total",
            &[&format!("result=\"{result}\"")],
        )
    };
    assert!(count("ok") >= 3.0 && count("failed") >= 2.0, "{metrics}");
}

/// Two instances behind one Envoy, sharing nothing, on simulated replicas
/// that serve models as llama.cpp's router does: the first requests for a
/// model reach both, and both send it to the model's own rendezvous home,
/// so each model is loaded once in all (a second load on another replica
/// would count; one on the same replica is refused as "already running").
#[test]
fn two_instances_load_a_new_model_on_the_same_replica() {
    const ROUTER: &str = r#"
health_check: { interval_ms: 300, timeout_ms: 300, healthy_threshold: 1, unhealthy_threshold: 3 }
engine_metrics: { interval_ms: 200, timeout_ms: 200 }
fleets:
  - name: pool
    region: us
    endpoints: ["{r1}", "{r2}", "{r3}", "{r4}"]
    packing: { max_models: 4, load_ms: 300 }
stages:
  - { name: m1, fleets: [pool] }
  - { name: m2, fleets: [pool] }
  - { name: m3, fleets: [pool] }
  - { name: m4, fleets: [pool] }
"#;
    let mut args: Vec<&'static str> = fleetroute_tests::harness::scenario::FAST_ENGINES.to_vec();
    // Room for every model on every replica: neither instance sees a full
    // one, so both follow each model's rendezvous order.
    args.extend([
        "--packed-models",
        "m1,m2,m3,m4",
        "--models-max",
        "4",
        "--model-load-ms",
        "300",
    ]);
    let lab = Lab::start(
        ENGINE,
        LabSpec {
            router: ROUTER,
            engine_args: Vec::leak(args),
            instances: Some(2),
            ..Default::default()
        },
    );
    for m in ["m1", "m2", "m3", "m4"] {
        let handles: Vec<_> = (0..3)
            .map(|i| {
                let (u, body) = (
                    url(&lab),
                    chat_body_tokens(m, Some(&format!("{m}{i}")), "go", false, 2),
                );
                std::thread::spawn(move || post(&u, body, &[]))
            })
            .collect();
        for h in handles {
            let r = h.join().unwrap();
            assert_eq!(r.status, 200, "{m}: {}", r.body);
        }
    }
    let loads: f64 = lab
        .replicas
        .values()
        .map(|addr| {
            let (_, text) = client::blocking_get(&format!("http://{addr}/metrics")).unwrap();
            client::metric_sum(&text, "fleetroute_sim_model_loads_total", &[])
        })
        .sum();
    assert_eq!(loads, 4.0, "four models, each loaded once");
    // Both instances took part.
    for i in 0..2 {
        let ok = lab
            .instance_metric(i, "fleetroute_model_loads_total", &["result=\"ok\""])
            .unwrap_or(0.0);
        assert!(ok >= 1.0, "instance {i} waited for no load");
    }
}

/// The models each simulated replica has loaded.
fn loaded_on(lab: &Lab) -> Vec<Vec<String>> {
    lab.replicas
        .values()
        .map(|addr| {
            let (_, body) = client::blocking_get(&format!("http://{addr}/models")).unwrap();
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            v["data"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["status"]["value"] == "loaded")
                .map(|m| m["id"].as_str().unwrap().to_string())
                .collect()
        })
        .collect()
}

/// Placement ahead of demand: a model with a warm minimum is loaded before
/// any request asks for it, so its first request has no cold start; the
/// only model with requests is loaded on every replica (its share fills
/// them all) before requests need it there.
#[test]
fn placement_loads_models_ahead_of_their_requests() {
    const ROUTER: &str = r#"
health_check: { interval_ms: 300, timeout_ms: 300, healthy_threshold: 1, unhealthy_threshold: 3 }
engine_metrics: { interval_ms: 200, timeout_ms: 200 }
fleets:
  - name: pool
    region: us
    endpoints: ["{r1}", "{r2}", "{r3}"]
    packing: { max_models: 2, load_ms: 300, placement: { interval_ms: 200, window_s: 2 } }
stages:
  - { name: hot, fleets: [pool] }
  - { name: rare, fleets: [pool], warm_replicas: 1 }
  - { name: other, fleets: [pool] }
"#;
    let mut args: Vec<&'static str> = fleetroute_tests::harness::scenario::FAST_ENGINES.to_vec();
    args.extend([
        "--packed-models",
        "hot,rare,other",
        "--models-max",
        "2",
        "--model-load-ms",
        "300",
    ]);
    let lab = Lab::start(
        ENGINE,
        LabSpec {
            router: ROUTER,
            engine_args: Vec::leak(args),
            ..Default::default()
        },
    );
    // No request yet: the warm minimum is loaded on one replica.
    wait_until(
        "rare to be loaded ahead of demand",
        Duration::from_secs(20),
        || {
            loaded_on(&lab)
                .iter()
                .filter(|m| m.contains(&"rare".to_string()))
                .count()
                == 1
        },
    );
    let r = post(
        &url(&lab),
        chat_body_tokens("rare", Some("u"), "hi", false, 2),
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.header("x-fleetroute-cold-start"),
        None,
        "rare was loaded ahead"
    );
    // Only hot is asked for: placement puts it on every replica.
    let on_all = || {
        loaded_on(&lab)
            .iter()
            .all(|m| m.contains(&"hot".to_string()))
    };
    for i in 0..200 {
        let r = post(
            &url(&lab),
            chat_body_tokens("hot", Some(&format!("u{i}")), "go", false, 2),
            &[],
        );
        assert_eq!(r.status, 200, "{}", r.body);
        if on_all() {
            break;
        }
    }
    wait_until("hot on every replica", Duration::from_secs(20), on_all);
    // The warm minimum stays (rare's one request, while it was the only
    // demand, may have spread it to more replicas).
    let rare = loaded_on(&lab);
    assert!(
        rare.iter().any(|m| m.contains(&"rare".to_string())),
        "{rare:?}"
    );
    let ok = lab
        .instance_metric(0, "fleetroute_placement_loads_total", &["result=\"ok\""])
        .unwrap_or(0.0);
    assert!(ok >= 3.0, "placement loads: {ok}");
    // Each placement load is a line of the decision log.
    let (_, log) =
        client::blocking_get(&format!("{}/debug/decisions?limit=1000", lab.admin)).unwrap();
    assert!(
        log.contains(r#""pick":"placement""#) && log.contains(r#""adapter":"rare""#),
        "{log}"
    );
}
