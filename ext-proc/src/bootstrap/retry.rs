//! What Envoy needs for `upstream` fallbacks: a `retry/<from>/<to>` cluster
//! per pair of fleets a request may be retried across (members by EDS, the
//! override-host policy like a fleet's, and the filter's upstream root,
//! which renames a retry's model), and routes that retry a request to such
//! a cluster once, on a failure before its first response byte.
//!
//! Why this mechanism: Envoy's retries stay inside the cluster the route
//! chose, and `cluster_header` is read once. A cluster holding both fleets
//! lets the override-host policy, which takes the next host of fleetroute's
//! list on each retry, send the retry to the fallback's replica fleetroute
//! chose with the request. An aggregate cluster would fail over by priority
//! to a cluster Envoy balances itself (not to fleetroute's replica), and
//! neither carries the fallback's model name: only an upstream filter, which
//! runs once per attempt, can write it into the retry's body.

use yaml_serde::Value;

use super::{RenderError, endpoint, get_mut, key, to_static};
use crate::config::{RouterConfig, retry_cluster, retry_pairs};
use fleetroute_filter::contract;

/// Failures a retry to the fallback covers: any 5xx (an engine's error, and
/// Envoy's own on a per-try idle timeout), a reset or refused connection.
/// Envoy never retries once response headers went to the client.
const RETRY_ON: &str = "5xx,reset,connect-failure,refused-stream";

/// The upstream root and Envoy's codec, as a cluster's upstream filters.
fn upstream_filters(wasm: &str) -> Value {
    yaml_serde::from_str(&format!(
        r#"
envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
  "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
  explicit_http_config: {{ http_protocol_options: {{}} }}
  http_filters:
    - name: fleetroute.upstream
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
        config:
          name: {root}
          root_id: {root}
          vm_config:
            vm_id: fleetroute
            runtime: envoy.wasm.runtime.v8
            code: {{ local: {{ filename: '{wasm}' }} }}
          # A retry pauses on its headers until its body is renamed.
          allow_on_headers_stop_iteration: true
          failure_policy: FAIL_RELOAD
    - name: envoy.filters.http.upstream_codec
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.filters.http.upstream_codec.v3.UpstreamCodec
"#,
        root = contract::UPSTREAM_ROOT_ID,
    ))
    .expect("static yaml")
}

/// One cluster per pair, copied from the fleet cluster `prototype`.
pub(super) fn clusters(
    prototype: &Value,
    cfg: &RouterConfig,
    wasm: &str,
    static_endpoints: bool,
) -> Result<Vec<Value>, RenderError> {
    let mut out = Vec::new();
    for (from, to) in retry_pairs(cfg) {
        let name = retry_cluster(&from, &to);
        let mut c = prototype.clone();
        *get_mut(&mut c, &["name"])? = key(&name);
        c.as_mapping_mut()
            .ok_or("template: a cluster is not a mapping")?
            .insert(
                key("typed_extension_protocol_options"),
                upstream_filters(wasm),
            );
        if static_endpoints {
            to_static(&mut c, &name, static_groups(cfg, &from, &to)?)?;
        }
        crate::envoy_bounds::fleet_cluster(&mut c, cfg)?;
        out.push(c);
    }
    Ok(out)
}

/// The pair's endpoints from the config: `from` at priority 0, `to` at 1.
fn static_groups(cfg: &RouterConfig, from: &str, to: &str) -> Result<Value, RenderError> {
    let mut groups = Vec::new();
    let names: &[&str] = if from == to { &[from] } else { &[from, to] };
    for (priority, name) in names.iter().enumerate() {
        let Some(f) = cfg.fleets.iter().find(|f| f.name == *name) else {
            continue;
        };
        let lb: Vec<Value> = f
            .endpoints
            .iter()
            .map(|e| endpoint(e))
            .collect::<Result<_, _>>()?;
        let mut g = yaml_serde::Mapping::new();
        g.insert(key("priority"), Value::Number((priority as u64).into()));
        g.insert(key("lb_endpoints"), Value::Sequence(lb));
        groups.push(Value::Mapping(g));
    }
    Ok(Value::Sequence(groups))
}

/// The decision's routes again, for requests fleetroute sent to a `retry/`
/// cluster: matched by the upstream root's header, retried once on any
/// failure before the first byte. Empty when no stage has `upstream`.
pub(super) fn routes(chosen: &[Value], cfg: &RouterConfig) -> Result<Vec<Value>, RenderError> {
    if retry_pairs(cfg).is_empty() {
        return Ok(Vec::new());
    }
    let present: Value = yaml_serde::from_str(&format!(
        "{{ name: {}, present_match: true }}",
        contract::UPSTREAM_FALLBACK
    ))
    .expect("static yaml");
    let mut out = Vec::new();
    for r in chosen {
        let mut r = r.clone();
        get_mut(&mut r, &["match", "headers"])?
            .as_sequence_mut()
            .ok_or("template: a route's headers are not a list")?
            .push(present.clone());
        let policy = get_mut(&mut r, &["route", "retry_policy"])?;
        *get_mut(policy, &["retry_on"])? = key(RETRY_ON);
        *get_mut(policy, &["num_retries"])? = Value::Number(1u64.into());
        out.push(r);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use yaml_serde::Value;

    use crate::bootstrap::tests_support::{opts, rendered};

    const ROUTER: &str = r#"
fleets:
  - { name: big, region: eu, endpoints: ["10.0.0.1:1"] }
  - { name: small, region: eu, endpoints: ["10.0.1.1:1"] }
  - { name: small-us, region: us, endpoints: ["10.0.2.1:1"] }
stages:
  - { name: big, models: [big-model], fleets: [big], residency: eu, fallbacks: [{ stage: small, on: [upstream] }] }
  - { name: small, models: [small-model], fleets: [small-us, small] }
"#;

    fn cluster<'a>(doc: &'a Value, name: &str) -> Option<&'a Value> {
        doc["static_resources"]["clusters"]
            .as_sequence()?
            .iter()
            .find(|c| c["name"].as_str() == Some(name))
    }

    fn vhost(doc: &Value) -> &Value {
        &doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]
            ["virtual_hosts"][0]
    }

    #[test]
    fn a_pair_inside_the_residency_gets_a_cluster_with_the_upstream_root_and_retry_routes() {
        let doc = rendered(ROUTER, &opts());
        let c = cluster(&doc, "retry/big/small").expect("retry/big/small");
        let filters = &c["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
            ["http_filters"];
        assert_eq!(
            filters[0]["typed_config"]["config"]["root_id"].as_str(),
            Some("fleetroute_upstream")
        );
        assert_eq!(
            filters[1]["name"].as_str(),
            Some("envoy.filters.http.upstream_codec")
        );
        // small-us is outside big's residency: no cluster pairs it.
        assert!(cluster(&doc, "retry/big/small-us").is_none());
        let vh = vhost(&doc);
        assert_eq!(vh["include_request_attempt_count"].as_bool(), Some(true));
        let first = &vh["routes"][0]["route"]["retry_policy"];
        assert_eq!(
            first["retry_on"].as_str(),
            Some("5xx,reset,connect-failure,refused-stream")
        );
        assert_eq!(first["num_retries"].as_u64(), Some(1));
    }

    #[test]
    fn without_upstream_nothing_changes() {
        let router = ROUTER.replace("on: [upstream]", "on: [unhealthy]");
        let doc = rendered(&router, &opts());
        assert!(cluster(&doc, "retry/big/small").is_none());
        assert!(vhost(&doc).get("include_request_attempt_count").is_none());
    }

    #[test]
    fn static_endpoints_list_both_fleets_by_priority() {
        let mut o = opts();
        o.static_endpoints = true;
        let doc = rendered(ROUTER, &o);
        let groups = &cluster(&doc, "retry/big/small").unwrap()["load_assignment"]["endpoints"];
        let addr = |g: usize| {
            groups[g]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]["address"]
                .as_str()
                .map(str::to_string)
        };
        assert_eq!(addr(0).as_deref(), Some("10.0.0.1"));
        assert_eq!(addr(1).as_deref(), Some("10.0.1.1"));
        assert_eq!(groups[1]["priority"].as_u64(), Some(1));
    }
}
