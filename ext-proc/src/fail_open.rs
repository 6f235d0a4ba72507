//! Fail-open routing for the rendered Envoy bootstrap: what serves a request
//! when fleetroute could not be asked. Each stage's fleets keep their
//! configured proportions, and a fleet whose hosts Envoy finds unhealthy or
//! ejects hands its share to the stage's other fleets, never to a fleet
//! outside the stage (so never outside its residency).
//!
//! A fail-open request reaches its fleet exactly as the client sent it: its
//! model name and its `Authorization`. So a fleet that serves the stage's
//! model under its own name, or that has its own key (an external provider,
//! which must never see a client's key), is left out of the stage's
//! fail-open cluster; a stage left with no fleet answers fail-open requests
//! with a 503 (`router_unavailable`) instead.
//!
//! Mechanism: one cluster per stage (`fallback/<stage>`) holding the stage's
//! replicas, one locality per fleet, with Envoy's health checks and outlier
//! detection. Locality-weighted balancing scales each fleet's weight by the
//! share of its hosts that are healthy, so a dead fleet's share moves to the
//! others at once; priorities give the failover order. (Aggregate clusters
//! over the fleet clusters were tried first: with Envoy 1.40 their view of
//! health lagged the health checker, and requests still reached a dead fleet
//! after its hosts were marked unhealthy.)

use serde_json::json;
use yaml_serde::Value;

use crate::config::{PolicyKind, RouterConfig, StageConfig, TimeoutsConfig};

/// The stream header's value for a streaming request (the Wasm filter's).
pub const STREAMING: &str = "1";

/// Fleet names cannot hold '/', so no fallback cluster shares a fleet's name.
pub const CLUSTER_PREFIX: &str = "fallback/";

pub fn cluster_name(stage: &str) -> String {
    format!("{CLUSTER_PREFIX}{stage}")
}

/// One fleet inside a stage's fallback cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct Locality {
    pub fleet: String,
    /// 0 takes traffic first; higher levels only as lower ones fail.
    pub priority: u32,
    /// Share within its priority (Envoy's locality weight, at least 1).
    pub weight: u32,
}

/// Whether a fleet may take a stage's fail-open traffic (see the module doc).
pub fn takes_fail_open(cfg: &RouterConfig, stage: &StageConfig, fleet: &str) -> bool {
    let renamed = stage
        .fleets
        .iter()
        .any(|f| f.name == fleet && f.model.is_some());
    let keyed = cfg
        .fleets
        .iter()
        .any(|f| f.name == fleet && f.credentials.is_some());
    !renamed && !keyed
}

/// Whether any fleet of the stage may take its fail-open traffic: the stage
/// then has a fail-open cluster (whatever its members now; EDS may fill it
/// later), else its fail-open routes refuse.
pub fn has_fail_open(cfg: &RouterConfig, stage: &StageConfig) -> bool {
    stage.fleet_names().any(|f| takes_fail_open(cfg, stage, f))
}

/// What "configured proportions" means per policy: `weighted` is weight ×
/// replica count (as fleetroute's weighted policy shares keys), and fleets
/// of weight 0 only take over when the others fail; `priority` is the `order`,
/// one priority level per fleet; `latency` and `cost` have no fixed
/// proportions, so traffic is spread by replica count.
pub fn plan(cfg: &RouterConfig, stage: &StageConfig) -> Vec<Locality> {
    plan_with(cfg, stage, |name| {
        cfg.fleets
            .iter()
            .find(|f| f.name == name)
            .map_or(0, |f| f.endpoints.len())
    })
}

/// The same for any membership: `replicas` counts a fleet's members (the
/// config's `endpoints` for a static bootstrap, the running topology's for
/// the endpoints fleetroute serves by EDS).
pub fn plan_with(
    cfg: &RouterConfig,
    stage: &StageConfig,
    replicas: impl Fn(&str) -> usize,
) -> Vec<Locality> {
    let r = &stage.routing;
    let mut out = Vec::new();
    match r.policy() {
        PolicyKind::Priority => {
            let mut order: Vec<String> = r.order().unwrap_or_default().to_vec();
            for f in stage.fleet_names() {
                if !order.contains(f) {
                    order.push(f.clone());
                }
            }
            out.extend(order.into_iter().enumerate().map(|(i, fleet)| Locality {
                fleet,
                priority: i as u32,
                weight: 1,
            }));
        }
        PolicyKind::Weighted | PolicyKind::Latency | PolicyKind::Cost => {
            let shares: Vec<f64> = stage
                .fleet_names()
                .map(|f| r.weight(f) * replicas(f) as f64)
                .collect();
            let ints = if shares.iter().any(|s| *s > 0.0) {
                integer_shares(&shares)
            } else {
                vec![1; shares.len()]
            };
            let g = ints.iter().fold(0, |g, w| gcd(g, *w)).max(1);
            out.extend(stage.fleet_names().zip(ints).map(|(f, w)| Locality {
                fleet: f.clone(),
                priority: u32::from(w == 0),
                weight: (w / g).max(1),
            }));
        }
    }
    // A fleet without replicas has nothing to offer.
    // A fleet without replicas has nothing to offer; one that renames the
    // model or carries a key may not take fail-open traffic.
    out.retain(|l| replicas(&l.fleet) > 0 && takes_fail_open(cfg, stage, &l.fleet));
    // Envoy's priorities count from 0 without gaps: renumber what is left
    // (a fleet scaled to zero at runtime must not leave level 0 empty).
    let mut levels: Vec<u32> = out.iter().map(|l| l.priority).collect();
    levels.sort_unstable();
    levels.dedup();
    for l in &mut out {
        l.priority = levels.partition_point(|&p| p < l.priority) as u32;
    }
    out
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
        "retry_back_off": { "base_interval": "0.005s", "max_interval": "0.05s" },
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

/// Named by no one (the filter strips a client's copy): a route whose
/// `cluster_header` it is finds no cluster, and Envoy answers with the
/// route's `cluster_not_found_response_code`, which the listener's local
/// reply mappers give a JSON body (`envoy-config/envoy.yaml`). A refusal is
/// such a route rather than a `direct_response` because the route a request
/// first matches, before the filter has written any header (the catch-all),
/// sets how much of its body Envoy buffers: a cluster route carries the
/// virtual host's `request_body_buffer_limit`, a direct response only the
/// connection's 1 MiB.
pub const NO_CLUSTER_HEADER: &str = "x-fleetroute-no-cluster";

/// A route that refuses: `NOT_FOUND` (no stage serves the model) or
/// `SERVICE_UNAVAILABLE` (no fleet of the stage may serve it without
/// fleetroute).
fn refusal(code: &str) -> serde_json::Value {
    json!({ "cluster_header": NO_CLUSTER_HEADER, "cluster_not_found_response_code": code })
}

/// Where a stage's fail-open requests go: its cluster, or, when no fleet of
/// the stage may take them, a 503.
fn target(
    cfg: &RouterConfig,
    stage: &StageConfig,
    t: &TimeoutsConfig,
    streaming: bool,
) -> serde_json::Value {
    if !has_fail_open(cfg, stage) {
        return refusal("SERVICE_UNAVAILABLE");
    }
    json!({
        "cluster": cluster_name(&stage.name),
        "timeout": format!("{}s", t.response_ms as f64 / 1000.0),
        "retry_policy": retry_policy(t, streaming),
    })
}

/// The streaming and the non-streaming route for one match (streaming first:
/// the other matches both).
fn route_pair(cfg: &RouterConfig, header: Option<&str>, stage: &StageConfig) -> [Value; 2] {
    let t = &cfg.envoy.timeouts;
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
        let route = json!({ "match": m, "route": target(cfg, stage, t, streaming) });
        yaml_serde::to_value(route).expect("json is yaml")
    })
}

/// `GET /v1/models` while fleetroute cannot be asked: Envoy answers with the
/// list as of this rendering (the same body fleetroute answers with).
pub fn model_list_route(cfg: &RouterConfig) -> Value {
    use fleetroute_filter::contract::{ENDPOINT, ENDPOINT_MODELS};
    let route = json!({
        "match": { "prefix": "/", "headers": [{ "name": ENDPOINT, "string_match": { "exact": ENDPOINT_MODELS } }] },
        "direct_response": { "status": 200, "body": { "inline_string": crate::config::model_list::body(cfg) } },
        "response_headers_to_add": json_content_type(),
    });
    yaml_serde::to_value(route).expect("json is yaml")
}

/// Envoy's own answers say text/plain; these bodies are JSON.
fn json_content_type() -> serde_json::Value {
    json!([{
        "header": { "key": "content-type", "value": "application/json" },
        "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
    }])
}

/// Fail-open routes, used only when fleetroute could not be asked.
pub fn routes(cfg: &RouterConfig) -> Vec<Value> {
    let mut routes = vec![model_list_route(cfg)];
    for stage in &cfg.stages {
        for model in stage.models.iter().chain([&stage.name]) {
            routes.extend(route_pair(cfg, Some(model), stage));
        }
    }
    let default_stage = cfg
        .default_stage
        .as_ref()
        .and_then(|d| cfg.stages.iter().find(|s| &s.name == d));
    match default_stage {
        Some(s) => routes.extend(route_pair(cfg, None, s)),
        None => routes.push(
            yaml_serde::to_value(
                json!({ "match": { "prefix": "/" }, "route": refusal("NOT_FOUND") }),
            )
            .expect("json is yaml"),
        ),
    }
    routes
}

/// The `load_assignment.endpoints` of a stage's fallback cluster.
pub fn endpoints(cfg: &RouterConfig, stage: &StageConfig) -> Result<Value, String> {
    let mut groups = Vec::new();
    for l in plan(cfg, stage) {
        let fleet = cfg
            .fleets
            .iter()
            .find(|f| f.name == l.fleet)
            .ok_or_else(|| format!("unknown fleet '{}'", l.fleet))?;
        let mut eps = Vec::new();
        for e in &fleet.endpoints {
            let a: std::net::SocketAddr = e.parse().map_err(|_| format!("'{e}' is not ip:port"))?;
            eps.push(json!({ "endpoint": { "address": { "socket_address": {
                "address": a.ip().to_string(), "port_value": a.port() } } } }));
        }
        let mut g = json!({
            "locality": { "sub_zone": l.fleet },
            "load_balancing_weight": l.weight,
            "lb_endpoints": eps,
        });
        if l.priority > 0 {
            g["priority"] = json!(l.priority);
        }
        groups.push(g);
    }
    Ok(yaml_serde::to_value(groups).expect("json is yaml"))
}

#[cfg(test)]
#[path = "fail_open_tests.rs"]
mod tests;
