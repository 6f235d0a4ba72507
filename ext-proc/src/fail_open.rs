//! Fail-open routing for the rendered Envoy bootstrap: what serves a request
//! when fleetroute could not be asked. Each stage's fleets keep their
//! configured proportions, and a fleet whose hosts Envoy finds unhealthy or
//! ejects hands its share to the stage's other fleets, never to a fleet
//! outside the stage (so never outside its residency).
//!
//! Mechanism: per stage with several fleets, one aggregate cluster per fleet
//! F (`F@stage`) listing F first and then the stage's other fleets; the
//! route splits by `weighted_clusters` over those aggregates. An aggregate
//! sends to its first cluster while enough of its hosts are healthy and spills
//! to the next as they fail.

use serde_json::json;
use serde_yaml::Value;

use crate::config::{PolicyKind, RouterConfig, StageConfig, TimeoutsConfig};

/// The stream header's value for a streaming request (the Wasm filter's).
pub const STREAMING: &str = "1";

/// Where a stage's fail-open traffic goes.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Cluster → share (integers, reduced). One entry: no split.
    pub shares: Vec<(String, u32)>,
    /// Aggregate clusters to define: name → member clusters in order.
    pub aggregates: Vec<(String, Vec<String>)>,
}

pub fn aggregate_name(fleet: &str, stage: &str) -> String {
    format!("{fleet}@{stage}")
}

/// What "configured proportions" means per policy: `weighted` is weight ×
/// replica count (as fleetroute's weighted policy shares keys); `priority` is
/// everything to the first fleet in `order`; `latency` and `cost` have no
/// fixed proportions, so traffic is spread by replica count.
pub fn plan(cfg: &RouterConfig, stage: &StageConfig) -> Plan {
    let replicas = |name: &str| {
        cfg.fleets
            .iter()
            .find(|f| f.name == name)
            .map_or(0, |f| f.endpoints.len()) as f64
    };
    let r = &stage.routing;
    // The stage's fleets in failover order, each with its raw share.
    let mut ranked: Vec<(String, f64)> = match r.policy {
        PolicyKind::Priority => {
            let mut order: Vec<String> = r.order.clone().unwrap_or_default();
            for f in &stage.fleets {
                if !order.contains(f) {
                    order.push(f.clone());
                }
            }
            order
                .into_iter()
                .enumerate()
                .map(|(i, f)| (f, if i == 0 { 1.0 } else { 0.0 }))
                .collect()
        }
        PolicyKind::Weighted => {
            let mut v: Vec<(String, f64)> = stage
                .fleets
                .iter()
                .map(|f| {
                    let w = r
                        .weights
                        .as_ref()
                        .and_then(|w| w.get(f).copied())
                        .unwrap_or(1.0);
                    (f.clone(), w * replicas(f))
                })
                .collect();
            v.sort_by(|a, b| b.1.total_cmp(&a.1));
            v
        }
        PolicyKind::Latency | PolicyKind::Cost => stage
            .fleets
            .iter()
            .map(|f| (f.clone(), replicas(f)))
            .collect(),
    };
    let total: f64 = ranked.iter().map(|(_, s)| s).sum();
    if !(total.is_finite() && total > 0.0) {
        // Nothing has a share (no replicas, or weights of 0): the first fleet
        // still takes it, failing over to the others.
        for (i, (_, s)) in ranked.iter_mut().enumerate() {
            *s = if i == 0 { 1.0 } else { 0.0 };
        }
    }
    let mut ints: Vec<(String, u32)> = ranked
        .iter()
        .zip(integer_shares(
            &ranked.iter().map(|(_, s)| *s).collect::<Vec<_>>(),
        ))
        .map(|((f, _), w)| (f.clone(), w))
        .filter(|(_, w)| *w > 0)
        .collect();
    let g = ints.iter().fold(0, |g, (_, w)| gcd(g, *w)).max(1);
    for (_, w) in &mut ints {
        *w /= g;
    }
    if stage.fleets.len() < 2 {
        return Plan {
            shares: ints,
            aggregates: Vec::new(),
        };
    }
    let order: Vec<&String> = ranked.iter().map(|(f, _)| f).collect();
    let aggregates = ints
        .iter()
        .map(|(f, _)| {
            let mut members = vec![f.clone()];
            members.extend(order.iter().filter(|o| **o != f).map(|o| (*o).clone()));
            (aggregate_name(f, &stage.name), members)
        })
        .collect();
    let shares = ints
        .into_iter()
        .map(|(f, w)| (aggregate_name(&f, &stage.name), w))
        .collect();
    Plan { shares, aggregates }
}

/// Envoy's weights are integers: exact when the shares are whole numbers at
/// one of a few decimal scales (weights like 3 or 0.25), else parts of 10000.
fn integer_shares(shares: &[f64]) -> Vec<u32> {
    for scale in [1.0, 10.0, 100.0, 1000.0] {
        let scaled: Vec<f64> = shares.iter().map(|s| s * scale).collect();
        if scaled.iter().all(|s| (s - s.round()).abs() < 1e-9)
            && scaled.iter().sum::<f64>() <= 1_000_000.0
        {
            return scaled.iter().map(|s| s.round() as u32).collect();
        }
    }
    let total: f64 = shares.iter().sum();
    shares
        .iter()
        .map(|s| (s / total * 10_000.0).round() as u32)
        .collect()
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Whole seconds or a fraction, as Envoy reads durations ("600s", "0.25s").
pub fn duration(ms: u64) -> Value {
    Value::String(format!("{}s", ms as f64 / 1000.0))
}

fn retry_policy(t: &TimeoutsConfig, streaming: bool) -> serde_json::Value {
    let mut p = json!({
        "retry_on": "connect-failure,refused-stream,reset-before-request",
        "num_retries": 2,
        "retry_host_predicate": [{
            "name": "envoy.retry_host_predicates.previous_hosts",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"
            }
        }],
        "host_selection_retry_max_attempts": 3,
    });
    if streaming {
        p["per_try_idle_timeout"] = json!(format!("{}s", t.upstream_idle_ms as f64 / 1000.0));
    }
    p
}

/// The streaming and the non-streaming route for one match (streaming first:
/// the other matches both).
fn route_pair(header: Option<&str>, plan: &Plan, t: &TimeoutsConfig) -> [Value; 2] {
    let target = match plan.shares.as_slice() {
        [(cluster, _)] => json!({ "cluster": cluster }),
        shares => json!({ "weighted_clusters": { "clusters": shares
            .iter()
            .map(|(name, weight)| json!({ "name": name, "weight": weight }))
            .collect::<Vec<_>>() } }),
    };
    [true, false].map(|streaming| {
        let mut headers = Vec::new();
        if let Some(model) = header {
            headers.push(json!({ "name": fleetroute_filter::contract::MODEL, "string_match": { "exact": model } }));
        }
        if streaming {
            headers.push(json!({ "name": fleetroute_filter::contract::STREAM, "string_match": { "exact": STREAMING } }));
        }
        let mut m = json!({ "prefix": "/" });
        if !headers.is_empty() {
            m["headers"] = json!(headers);
        }
        let mut route = target.clone();
        route["timeout"] = json!(format!("{}s", t.response_ms as f64 / 1000.0));
        route["retry_policy"] = retry_policy(t, streaming);
        serde_yaml::to_value(json!({ "match": m, "route": route })).expect("json is yaml")
    })
}

/// Fail-open routes, used only when fleetroute could not be asked.
pub fn routes(cfg: &RouterConfig) -> Vec<Value> {
    let t = &cfg.envoy.timeouts;
    let mut routes = Vec::new();
    for stage in &cfg.stages {
        if stage.fleets.is_empty() {
            continue;
        }
        let plan = plan(cfg, stage);
        for model in stage.models.iter().chain([&stage.name]) {
            routes.extend(route_pair(Some(model), &plan, t));
        }
    }
    let default_stage = cfg
        .default_stage
        .as_ref()
        .and_then(|d| cfg.stages.iter().find(|s| &s.name == d))
        .filter(|s| !s.fleets.is_empty());
    match default_stage {
        Some(s) => routes.extend(route_pair(None, &plan(cfg, s), t)),
        None => routes.push(
            serde_yaml::from_str(
                "match: { prefix: '/' }\n\
                 direct_response: { status: 404, body: { inline_string: '{\"error\":{\"message\":\"no stage serves this model\",\"type\":\"routing_error\",\"code\":\"model_not_found\"}}' } }",
            )
            .expect("static yaml"),
        ),
    }
    routes
}

/// Every aggregate cluster the fail-open routes name: (name, members).
pub fn aggregates(cfg: &RouterConfig) -> Vec<(String, Vec<String>)> {
    cfg.stages
        .iter()
        .filter(|s| !s.fleets.is_empty())
        .flat_map(|s| plan(cfg, s).aggregates)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(routing: &str, fleets: &str) -> RouterConfig {
        RouterConfig::parse(&format!(
            r#"
fleets:
  - {{ name: a, region: us, endpoints: ["10.0.0.1:80", "10.0.0.2:80"] }}
  - {{ name: b, region: us, endpoints: ["10.0.1.1:80"] }}
  - {{ name: c, region: us, endpoints: ["10.0.2.1:80", "10.0.2.2:80", "10.0.2.3:80"] }}
  - {{ name: far, region: eu, endpoints: ["10.9.0.1:80"] }}
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

    fn shares(p: &Plan) -> Vec<(&str, u32)> {
        p.shares.iter().map(|(n, w)| (n.as_str(), *w)).collect()
    }

    #[test]
    fn weighted_shares_are_weight_times_replicas() {
        let c = cfg(
            "{ policy: weighted, weights: { a: 1, b: 4, c: 0 } }",
            "[a, b, c]",
        );
        let p = plan(&c, &c.stages[0]);
        // a: 1 × 2 = 2, b: 4 × 1 = 4, c: 0: c takes no share but stays a failover.
        assert_eq!(shares(&p), vec![("b@s/1", 2), ("a@s/1", 1)]);
        assert_eq!(
            p.aggregates,
            vec![
                ("b@s/1".into(), vec!["b".into(), "a".into(), "c".into()]),
                ("a@s/1".into(), vec!["a".into(), "b".into(), "c".into()]),
            ]
        );
    }

    #[test]
    fn priority_sends_all_to_the_first_and_fails_over_in_order() {
        let c = cfg("{ policy: priority, order: [c, a] }", "[a, b, c]");
        let p = plan(&c, &c.stages[0]);
        assert_eq!(shares(&p), vec![("c@s/1", 1)]);
        assert_eq!(
            p.aggregates,
            vec![("c@s/1".into(), vec!["c".into(), "a".into(), "b".into()])]
        );
    }

    #[test]
    fn latency_and_cost_spread_by_replica_count() {
        let c = cfg("{ policy: latency }", "[a, c]");
        assert_eq!(
            shares(&plan(&c, &c.stages[0])),
            vec![("a@s/1", 2), ("c@s/1", 3)]
        );
    }

    #[test]
    fn a_single_fleet_stage_routes_to_its_cluster() {
        let c = cfg("{ policy: latency }", "[a]");
        let eu = plan(&c, &c.stages[1]);
        assert_eq!(shares(&eu), vec![("far", 1)]);
        assert!(eu.aggregates.is_empty());
    }

    #[test]
    fn no_route_or_aggregate_leaves_the_stage() {
        let c = cfg("{ policy: weighted }", "[a, b, c]");
        for (name, members) in aggregates(&c) {
            let stage = name.split_once('@').unwrap().1;
            let allowed: &[&str] = if stage == "s/1" {
                &["a", "b", "c"]
            } else {
                &["far"]
            };
            assert!(
                members.iter().all(|m| allowed.contains(&m.as_str())),
                "{name}: {members:?}"
            );
        }
        let text = serde_yaml::to_string(&routes(&c)).unwrap();
        assert!(!text.contains("far@"), "{text}");
    }

    #[test]
    fn streaming_routes_come_first_and_carry_the_idle_bound() {
        let c = cfg("{ policy: weighted }", "[a, b]");
        let r = routes(&c);
        // Two matches per name (s/1, eu) plus the 404 default.
        assert_eq!(r.len(), 5);
        assert_eq!(
            r[0]["route"]["retry_policy"]["per_try_idle_timeout"],
            Value::String("60s".into())
        );
        assert!(r[1]["route"]["retry_policy"]["per_try_idle_timeout"].is_null());
        assert_eq!(r[0]["match"]["headers"].as_sequence().unwrap().len(), 2);
        assert_eq!(r[1]["match"]["headers"].as_sequence().unwrap().len(), 1);
        assert!(r[4]["direct_response"].is_mapping());
    }
}
