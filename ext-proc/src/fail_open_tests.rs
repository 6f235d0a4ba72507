//! Tests of `fail_open.rs`.

use super::*;

fn cfg(routing: &str, fleets: &str) -> RouterConfig {
    RouterConfig::parse(&format!(
        r#"
fleets:
  - {{ name: a, region: us, endpoints: ["10.0.0.1:80", "10.0.0.2:80"] }}
  - {{ name: b, region: us, endpoints: ["10.0.1.1:80"] }}
  - {{ name: c, region: us, endpoints: ["10.0.2.1:80", "10.0.2.2:80", "10.0.2.3:80"] }}
  - {{ name: far, region: eu, endpoints: ["10.9.0.1:80"] }}
  - {{ name: empty, region: us, dns: {{ name: empty.test, port: 80 }} }}
stages:
  - name: s/1
    fleets: {fleets}
    residency: us
    routing: {routing}
  - name: eu
    fleets: [far]
"#
    ))
    .unwrap()
}

fn localities(c: &RouterConfig, stage: usize) -> Vec<(String, u32, u32)> {
    plan(c, &c.stages[stage])
        .into_iter()
        .map(|l| (l.fleet, l.priority, l.weight))
        .collect()
}

fn l(f: &str, p: u32, w: u32) -> (String, u32, u32) {
    (f.to_string(), p, w)
}

#[test]
fn weighted_shares_are_weight_times_replicas() {
    let c = cfg(
        "{ policy: weighted, weights: { a: 1, b: 4, c: 0 } }",
        "[a, b, c]",
    );
    // a: 1 × 2 = 2, b: 4 × 1 = 4; c has weight 0: failover only.
    assert_eq!(
        localities(&c, 0),
        vec![l("a", 0, 1), l("b", 0, 2), l("c", 1, 1)]
    );
    let c = cfg(
        "{ policy: weighted, weights: { a: 0.25, b: 0.5 } }",
        "[a, b]",
    );
    assert_eq!(localities(&c, 0), vec![l("a", 0, 1), l("b", 0, 1)]);
}

#[test]
fn priority_follows_the_order() {
    let c = cfg("{ policy: priority, order: [c, a] }", "[a, b, c]");
    assert_eq!(
        localities(&c, 0),
        vec![l("c", 0, 1), l("a", 1, 1), l("b", 2, 1)]
    );
}

#[test]
fn priorities_stay_dense_when_a_fleet_has_no_replicas() {
    let c = cfg(
        "{ policy: priority, order: [empty, c, a] }",
        "[a, c, empty]",
    );
    assert_eq!(localities(&c, 0), vec![l("c", 0, 1), l("a", 1, 1)]);
}

#[test]
fn latency_and_cost_spread_by_replica_count() {
    let c = cfg("{ policy: latency }", "[a, c, empty]");
    assert_eq!(localities(&c, 0), vec![l("a", 0, 2), l("c", 0, 3)]);
}

#[test]
fn no_fallback_cluster_leaves_its_stage() {
    let c = cfg("{ policy: weighted }", "[a, b, c]");
    let text = yaml_serde::to_string(&endpoints(&c, &c.stages[0]).unwrap()).unwrap();
    assert!(!text.contains("10.9.0.1"), "{text}");
    let eu = yaml_serde::to_string(&endpoints(&c, &c.stages[1]).unwrap()).unwrap();
    assert!(eu.contains("10.9.0.1") && !eu.contains("10.0."), "{eu}");
}

#[test]
fn streaming_routes_come_first_and_carry_the_idle_bound() {
    let c = cfg("{ policy: weighted }", "[a, b]");
    // The model list first, then two matches per name (s/1, eu) and the 404 default.
    let r = routes(&c);
    assert!(
        r[0]["direct_response"]["body"]["inline_string"]
            .as_str()
            .unwrap()
            .contains("\"s/1\"")
    );
    let r = &r[1..];
    assert_eq!(r.len(), 5);
    assert_eq!(
        r[0]["route"]["retry_policy"]["per_try_idle_timeout"],
        Value::String("60s".into())
    );
    assert_eq!(
        r[0]["route"]["cluster"],
        Value::String("fallback/s/1".into())
    );
    assert!(r[1]["route"]["retry_policy"]["per_try_idle_timeout"].is_null());
    assert_eq!(r[0]["match"]["headers"].as_sequence().unwrap().len(), 2);
    assert_eq!(r[1]["match"]["headers"].as_sequence().unwrap().len(), 1);
    assert_eq!(
        r[4]["route"]["cluster_not_found_response_code"],
        Value::String("NOT_FOUND".into())
    );
}

#[test]
fn fleets_that_rename_or_carry_a_key_take_no_fail_open_traffic() {
    let key = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(key.path(), "sk-b").unwrap();
    let c = RouterConfig::parse(&format!(
        r#"
fleets:
  - {{ name: a, region: us, endpoints: ["10.0.0.1:80"] }}
  - {{ name: b, region: us, endpoints: ["10.0.1.1:80"], credentials: {{ api_key_file: '{}' }} }}
  - {{ name: c, region: us, endpoints: ["10.0.2.1:80"] }}
stages:
  - name: mixed
    fleets: [b, {{ name: c, model: other }}, a]
    routing: {{ policy: priority }}
  - name: external
    models: [ext]
    fleets: [b]
default_stage: external
"#,
        key.path().display()
    ))
    .unwrap();
    // Only a is left, and it takes priority 0.
    assert_eq!(localities(&c, 0), vec![l("a", 0, 1)]);
    assert!(plan(&c, &c.stages[1]).is_empty());
    let r = routes(&c);
    let to_external: Vec<&Value> = r
        .iter()
        .filter(|r| r["route"]["cluster"] == Value::String("fallback/external".into()))
        .collect();
    assert!(to_external.is_empty(), "{to_external:?}");
    // ext, external, and the default stage's pair answer 503 themselves.
    let refused = r
        .iter()
        .filter(|r| {
            r["route"]["cluster_not_found_response_code"]
                == Value::String("SERVICE_UNAVAILABLE".into())
        })
        .count();
    assert_eq!(refused, 6);
    // No refusal is a direct response: the catch-all's buffer limit counts.
    assert!(r[1..].iter().all(|r| r.get("direct_response").is_none()));
}
