//! LoRA adapters through real Envoy, on simulated replicas that hold them
//! as vLLM does (one GPU slot each here): every request goes to a replica
//! that holds its adapter, so each adapter is loaded once; an adapter no
//! replica knows is registered on one replica (`/v1/load_lora_adapter`)
//! while its first requests wait, which the client reads in
//! `x-fleetroute-cold-start`; one whose weights are missing is a clear 503
//! with `retry-after`, never a hang; two instances sharing nothing register
//! a new adapter on the same replica.
#![cfg(feature = "e2e")] // needs Envoy and the built binaries: scripts/test.sh

use std::collections::{BTreeMap, BTreeSet};

use fleetroute_tests::harness::client::{self, chat_body, post};
use fleetroute_tests::harness::scenario::{FAST_ENGINES, chat_url as url};
use fleetroute_tests::harness::{Lab, LabSpec};
use serde_json::Value;

const ENGINE: &str = env!("CARGO_BIN_EXE_fleetroute-engine");

fn engine_args(extra: &[&'static str]) -> &'static [&'static str] {
    let mut v: Vec<&'static str> = FAST_ENGINES.to_vec();
    v.extend_from_slice(extra);
    Vec::leak(v)
}

/// Adapter loads each replica's engine reports, by where from.
fn loads(lab: &Lab) -> u64 {
    lab.replicas
        .values()
        .map(|addr| {
            let (_, text) = client::blocking_get(&format!("http://{addr}/metrics")).unwrap();
            text.lines()
                .filter(|l| l.starts_with("fleetroute_sim_lora_loads_total"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>() as u64
        })
        .sum()
}

/// The adapters each replica knows, from its `/v1/models`.
fn known(lab: &Lab) -> BTreeMap<String, BTreeSet<String>> {
    lab.replicas
        .iter()
        .map(|(name, addr)| {
            let (_, body) = client::blocking_get(&format!("http://{addr}/v1/models")).unwrap();
            let v: Value = serde_json::from_str(&body).unwrap();
            let ids = v["data"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m.get("parent").is_some())
                .map(|m| m["id"].as_str().unwrap().to_string())
                .collect();
            (name.clone(), ids)
        })
        .collect()
}

const PRELOADED: &str = r#"
health_check: { interval_ms: 300, timeout_ms: 300, healthy_threshold: 1, unhealthy_threshold: 3 }
engine_metrics: { interval_ms: 200, timeout_ms: 200 }
fleets:
  - name: pool
    region: us
    endpoints: ["{r1}", "{r2}", "{r3}"]
    lora: { max_loras: 1, max_cpu_loras: 1 }
stages:
  - { name: base, models: [base], adapters: [sql, chat, legal], fleets: [pool] }
"#;

#[test]
fn every_request_goes_where_its_adapter_is() {
    let lab = Lab::start(
        ENGINE,
        LabSpec {
            router: PRELOADED,
            engine_args: engine_args(&[
                "--max-loras",
                "1",
                "--max-cpu-loras",
                "1",
                "--lora",
                "sql,chat,legal",
            ]),
            ..Default::default()
        },
    );
    let mut served: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for i in 0..30 {
        let adapter = ["sql", "chat", "legal"][i % 3];
        // Each request a user of its own: nothing but the adapter ties
        // them to a replica.
        let user = format!("user-{i}");
        let r = post(
            &url(&lab),
            chat_body(adapter, Some(&user), &format!("task {i}"), false),
            &[],
        );
        assert_eq!(r.status, 200, "{}", r.body);
        served
            .entry(adapter)
            .or_default()
            .insert(r.served_by().to_string());
    }
    // One replica per adapter, three different ones, and so three loads in
    // all: a request sent where its adapter is not would evict another (one
    // slot each) and load again.
    for (adapter, replicas) in &served {
        assert_eq!(replicas.len(), 1, "{adapter} on {replicas:?}");
    }
    let homes: BTreeSet<&String> = served.values().flatten().collect();
    assert_eq!(homes.len(), 3, "{served:?}");
    assert_eq!(loads(&lab), 3, "{served:?}");
    // The snapshot shows each replica's adapter, the decisions theirs.
    let (_, snap) = client::blocking_get(&format!("{}/debug/snapshot", lab.admin)).unwrap();
    let snap: Value = serde_json::from_str(&snap).unwrap();
    let held: BTreeSet<String> = snap["fleets"][0]["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["adapters"].as_array().unwrap().clone())
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        held,
        BTreeSet::from(["chat".into(), "legal".into(), "sql".into()])
    );
    let (_, log) = client::blocking_get(&format!("{}/debug/decisions", lab.admin)).unwrap();
    assert!(log.contains("\"adapter\":\"legal\""), "{log}");
    // The base model is served too, and lists the adapters.
    let r = post(&url(&lab), chat_body("base", None, "plain", false), &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    let (_, list) = client::blocking_get(&format!("{}/v1/models", lab.envoy)).unwrap();
    assert!(
        list.contains("\"id\":\"legal\"") && list.contains("\"parent\":\"base\""),
        "{list}"
    );
}

#[test]
fn an_adapter_no_replica_knows_is_registered_once_and_told_to_the_client() {
    let weights = tempfile::tempdir().unwrap();
    for a in ["sql", "chat"] {
        std::fs::create_dir(weights.path().join(a)).unwrap();
    }
    let router = format!(
        r#"
health_check: {{ interval_ms: 300, timeout_ms: 300, healthy_threshold: 1, unhealthy_threshold: 3 }}
fleets:
  - name: pool
    region: us
    endpoints: ["{{r1}}", "{{r2}}", "{{r3}}"]
    lora: {{ max_loras: 2, load_path: "{}/{{adapter}}", load_timeout_ms: 5000 }}
stages:
  - {{ name: base, models: [base], adapters: [sql, chat, gone], fleets: [pool] }}
"#,
        weights.path().display()
    );
    let router: &'static str = Box::leak(router.into_boxed_str());
    let lab = Lab::start(
        ENGINE,
        LabSpec {
            router,
            engine_args: engine_args(&["--max-loras", "2", "--runtime-lora"]),
            ..Default::default()
        },
    );
    // The first request for sql waits for its registration and says so.
    let r = post(
        &url(&lab),
        chat_body("sql", Some("u1"), "first", false),
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let waited: u64 = r
        .header("x-fleetroute-cold-start")
        .unwrap_or_else(|| panic!("no cold-start header: {:?}", r.headers))
        .parse()
        .unwrap();
    assert!(waited < 5000, "{waited}");
    let home = r.served_by().to_string();
    // The next ones find it there, and wait for nothing.
    for i in 0..5 {
        let r = post(
            &url(&lab),
            chat_body("sql", Some(&format!("u{i}")), "again", false),
            &[],
        );
        assert_eq!(
            (r.status, r.served_by()),
            (200, home.as_str()),
            "{}",
            r.body
        );
        assert_eq!(r.header("x-fleetroute-cold-start"), None);
    }
    // Four at once for chat: one registration, on one replica. (A burst
    // past the replica's load bounds spills to a second one, as a popular
    // adapter's requests do.)
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let u = url(&lab);
            std::thread::spawn(move || {
                post(
                    &u,
                    chat_body("chat", Some(&format!("c{i}")), "together", true),
                    &[],
                )
            })
        })
        .collect();
    for h in handles {
        let r = h.join().unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let known = known(&lab);
    let with = |a: &str| known.values().filter(|s| s.contains(a)).count();
    assert_eq!((with("sql"), with("chat")), (1, 1), "{known:?}");
    // No weights for `gone`: a clear 503 naming it, with retry-after.
    let r = post(&url(&lab), chat_body("gone", Some("u9"), "x", false), &[]);
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(
        r.body.contains("adapter_unavailable") && r.body.contains("'gone'"),
        "{}",
        r.body
    );
    assert_eq!(r.header("retry-after"), Some("1"));
}

/// Two instances behind one Envoy, sharing nothing: the first requests for
/// a new adapter reach both, and both send it to the adapter's own
/// rendezvous home, so it is registered on one replica, not two.
#[test]
fn two_instances_register_a_new_adapter_on_the_same_replica() {
    let weights = tempfile::tempdir().unwrap();
    let names = ["sql", "chat", "legal", "support"];
    for a in names {
        std::fs::create_dir(weights.path().join(a)).unwrap();
    }
    let router = format!(
        r#"
health_check: {{ interval_ms: 300, timeout_ms: 300, healthy_threshold: 1, unhealthy_threshold: 3 }}
fleets:
  - name: pool
    region: us
    endpoints: ["{{r1}}", "{{r2}}", "{{r3}}", "{{r4}}"]
    lora: {{ max_loras: 4, load_path: "{}/{{adapter}}" }}
stages:
  - {{ name: base, models: [base], adapters: [{}], fleets: [pool] }}
"#,
        weights.path().display(),
        names.join(", ")
    );
    let router: &'static str = Box::leak(router.into_boxed_str());
    let lab = Lab::start(
        ENGINE,
        LabSpec {
            router,
            // Room for every adapter on every replica: neither instance
            // sees a full one, so both follow each adapter's rendezvous
            // order. (A replica one instance knows full and the other not
            // may send the same new adapter two ways.)
            engine_args: engine_args(&["--max-loras", "4", "--runtime-lora"]),
            instances: Some(2),
            ..Default::default()
        },
    );
    // Three at once per adapter: within the load bounds even when one
    // instance decides all three (a fourth could spill, see above).
    for a in names {
        let handles: Vec<_> = (0..3)
            .map(|i| {
                let (u, body) = (
                    url(&lab),
                    chat_body(a, Some(&format!("{a}{i}")), "go", false),
                );
                std::thread::spawn(move || post(&u, body, &[]))
            })
            .collect();
        for h in handles {
            let r = h.join().unwrap();
            assert_eq!(r.status, 200, "{}", r.body);
        }
    }
    let known = known(&lab);
    for a in names {
        let on = known.values().filter(|s| s.contains(a)).count();
        assert_eq!(on, 1, "{a}: {known:?}");
    }
    // Both instances took part.
    for i in 0..2 {
        let ok = lab
            .instance_metric(i, "fleetroute_adapter_loads_total", &["result=\"ok\""])
            .unwrap_or(0.0);
        assert!(ok >= 1.0, "instance {i} waited for no registration");
    }
}
