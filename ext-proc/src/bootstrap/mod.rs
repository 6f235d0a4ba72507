//! `fleetroute bootstrap`: renders an Envoy bootstrap for a router config from
//! the commented template in `envoy-config/envoy.yaml`, so the fleet clusters
//! and the fail-open routes always match the router config (fail-open
//! routing: `fail_open`; the `envoy:` bounds: `envoy_bounds`).
//!
//! Members: by default every fleet and fail-open cluster is an EDS cluster
//! that asks fleetroute over ADS (`eds`), so Envoy's members follow
//! fleetroute's at runtime. `static_endpoints` writes the config's `endpoints`
//! into the file instead (STATIC clusters, no ADS), for a control plane that
//! owns EDS itself.

mod identity;
mod retry;
mod token;

use std::net::SocketAddr;

use yaml_serde::{Mapping, Value};

use crate::config::RouterConfig;
use crate::{envoy_bounds, fail_open};

/// The commented template, shipped inside the binary.
pub const TEMPLATE: &str = include_str!("../../../envoy-config/envoy.yaml");

#[derive(Clone, Debug)]
pub struct BootstrapOptions {
    pub listen: SocketAddr,
    pub envoy_admin: SocketAddr,
    /// fleetroute instances (the ext_proc and access log cluster), at least one.
    pub grpc: Vec<SocketAddr>,
    /// Absolute path of `fleetroute_filter.wasm`.
    pub wasm: String,
    /// Answer a JSON 503 when fleetroute is unreachable, instead of the
    /// fail-open fallback routes.
    pub fail_closed: bool,
    /// List the config's endpoints in the file (STATIC clusters) instead of
    /// serving them by EDS.
    pub static_endpoints: bool,
}

/// Why a bootstrap could not be rendered: the template or the config does
/// not allow it; the message names what.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct RenderError(String);

impl From<String> for RenderError {
    fn from(s: String) -> Self {
        RenderError(s)
    }
}

impl From<&str> for RenderError {
    fn from(s: &str) -> Self {
        RenderError(s.to_string())
    }
}

fn key(k: &str) -> Value {
    Value::String(k.to_string())
}

fn get_mut<'a>(v: &'a mut Value, path: &[&str]) -> Result<&'a mut Value, RenderError> {
    let mut cur = v;
    for p in path {
        cur = cur
            .get_mut(*p)
            .ok_or_else(|| format!("template: missing '{}'", path.join(".")))?;
    }
    Ok(cur)
}

fn socket_address(addr: SocketAddr) -> Value {
    let mut m = Mapping::new();
    m.insert(key("address"), key(&addr.ip().to_string()));
    m.insert(key("port_value"), Value::Number(addr.port().into()));
    Value::Mapping(m)
}

/// Turns a template EDS cluster into a STATIC one listing `endpoints`
/// (`load_assignment.endpoints`).
fn to_static(c: &mut Value, name: &str, endpoints: Value) -> Result<(), RenderError> {
    let m = c
        .as_mapping_mut()
        .ok_or("template: a cluster is not a mapping")?;
    m.insert(key("type"), key("STATIC"));
    m.remove("eds_cluster_config");
    // Only EDS removes hosts.
    m.remove("ignore_health_on_host_removal");
    let mut la = Mapping::new();
    la.insert(key("cluster_name"), key(name));
    la.insert(key("endpoints"), endpoints);
    m.insert(key("load_assignment"), Value::Mapping(la));
    Ok(())
}

fn endpoint(addr: &str) -> Result<Value, RenderError> {
    let addr: SocketAddr = addr
        .parse()
        .map_err(|_| format!("'{addr}' is not ip:port"))?;
    Ok(yaml_serde::from_str(&format!(
        "endpoint: {{ address: {{ socket_address: {{ address: '{}', port_value: {} }} }} }}",
        addr.ip(),
        addr.port()
    ))
    .expect("static yaml"))
}

pub fn render(
    template: &str,
    cfg: &RouterConfig,
    opts: &BootstrapOptions,
) -> Result<String, RenderError> {
    let mut doc: Value = yaml_serde::from_str(template).map_err(|e| format!("template: {e}"))?;
    *get_mut(&mut doc, &["admin", "address", "socket_address"])? = socket_address(opts.envoy_admin);
    if opts.static_endpoints {
        // Nothing is asked of fleetroute but routing.
        doc.as_mapping_mut()
            .ok_or("template: not a mapping")?
            .remove("dynamic_resources");
    } else {
        get_mut(&mut doc, &["dynamic_resources", "ads_config"])?;
    }
    envoy_bounds::overload(&mut doc, &cfg.envoy)?;

    let listener = get_mut(&mut doc, &["static_resources", "listeners"])?
        .get_mut(0)
        .ok_or("template: no listener")?;
    *get_mut(listener, &["address", "socket_address"])? = socket_address(opts.listen);
    let hcm = get_mut(listener, &["filter_chains"])?
        .get_mut(0)
        .and_then(|c| c.get_mut("filters"))
        .and_then(|f| f.get_mut(0))
        .and_then(|f| f.get_mut("typed_config"))
        .ok_or("template: no http_connection_manager")?;
    envoy_bounds::connection_manager(hcm, &cfg.envoy)?;

    http_filters(hcm, cfg, opts)?;
    routes(hcm, cfg)?;
    clusters(&mut doc, cfg, opts)?;
    for addr in &opts.grpc {
        crate::peer_auth::check_listen(*addr, &cfg.grpc).map_err(|e| format!("--grpc: {e}"))?;
    }
    if let Some(token) = cfg.grpc.token().map_err(|e| e.to_string())? {
        token::write(&mut doc, &token)?;
    }
    Ok(yaml_serde::to_string(&doc).map_err(|e| e.to_string())?)
}

/// The Wasm filter's file and configuration, the routing ext_proc's failure
/// mode and forwarded headers, and `jwt_authn` first when tenants come from
/// JWTs.
fn http_filters(
    hcm: &mut Value,
    cfg: &RouterConfig,
    opts: &BootstrapOptions,
) -> Result<(), RenderError> {
    for filter in get_mut(hcm, &["http_filters"])?
        .as_sequence_mut()
        .ok_or("template: http_filters is not a list")?
    {
        let name = filter
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let tc = get_mut(filter, &["typed_config"])?;
        let is_wasm = tc
            .get("@type")
            .and_then(Value::as_str)
            .is_some_and(|t| t.ends_with("envoy.extensions.filters.http.wasm.v3.Wasm"));
        if is_wasm {
            *get_mut(tc, &["config", "vm_config", "code", "local", "filename"])? = key(&opts.wasm);
            // The reading root only: the rename root has no configuration.
            if let Some(value) = tc
                .get_mut("config")
                .and_then(|c| c.get_mut("configuration"))
                .and_then(|c| c.get_mut("value"))
            {
                let json = value
                    .as_str()
                    .ok_or("template: the Wasm configuration is not text")?;
                *value = key(&identity::filter_configuration(json, cfg)?);
            }
        } else if name == "envoy.filters.http.ext_proc" && tc.get("observability_mode").is_none() {
            *get_mut(tc, &["failure_mode_allow"])? = Value::Bool(!opts.fail_closed);
            if opts.fail_closed {
                // Failing closed, a report that cannot reach fleetroute
                // would fail a response already under way: the prefill
                // share then ends at its estimate instead.
                if let Some(m) = tc.as_mapping_mut() {
                    m.remove("allow_mode_override");
                    m.remove("allowed_override_modes");
                }
            }
            if let Some(h) = &cfg.admission.priority_header {
                // Admission reads the client's priority header.
                get_mut(tc, &["forward_rules", "allowed_headers", "patterns"])?
                    .as_sequence_mut()
                    .ok_or("template: forward_rules patterns is not a list")?
                    .push(
                        yaml_serde::from_str(&format!("{{ exact: '{h}' }}"))
                            .expect("a header name"),
                    );
            }
        }
    }

    identity::jwt(
        get_mut(hcm, &["http_filters"])?
            .as_sequence_mut()
            .ok_or("template: http_filters is not a list")?,
        cfg,
    )?;
    Ok(())
}

/// The decision's routes (bounded), then the fail-open routes.
fn routes(hcm: &mut Value, cfg: &RouterConfig) -> Result<(), RenderError> {
    let routes = get_mut(hcm, &["route_config", "virtual_hosts"])?
        .get_mut(0)
        .and_then(|vh| vh.get_mut("routes"))
        .and_then(Value::as_sequence_mut)
        .ok_or("template: no routes")?;
    let chosen = routes
        .first()
        .ok_or_else(|| "template: no cluster_header route".to_string())
        .and_then(|r| envoy_bounds::chosen_routes(r, &cfg.envoy))?;
    routes.clear();
    // A request to a `retry/` cluster matches its own routes first.
    let retries = retry::routes(&chosen, cfg)?;
    let retrying = !retries.is_empty();
    routes.extend(retries);
    routes.extend(chosen);
    routes.extend(fail_open::routes(cfg));
    if retrying {
        // The upstream root tells a retry by Envoy's attempt count.
        get_mut(hcm, &["route_config", "virtual_hosts"])?
            .get_mut(0)
            .and_then(Value::as_mapping_mut)
            .ok_or("template: no virtual host")?
            .insert(key("include_request_attempt_count"), Value::Bool(true));
    }
    // Envoy refuses a direct response body over this (default 4 KiB); the
    // model list grows with the config.
    let list = crate::config::model_list::body(cfg).len() as u64;
    get_mut(hcm, &["route_config"])?
        .as_mapping_mut()
        .ok_or("template: route_config is not a mapping")?
        .insert(
            key("max_direct_response_body_size_bytes"),
            Value::Number(list.max(4096).next_power_of_two().into()),
        );
    Ok(())
}

/// One cluster per fleet and per stage's fail-open, copied from the
/// template's, and the fleetroute cluster's addresses.
fn clusters(
    doc: &mut Value,
    cfg: &RouterConfig,
    opts: &BootstrapOptions,
) -> Result<(), RenderError> {
    let clusters = get_mut(doc, &["static_resources", "clusters"])?
        .as_sequence_mut()
        .ok_or("template: clusters is not a list")?;
    let is_fallback = |c: &Value| {
        c.get("name")
            .and_then(Value::as_str)
            .is_some_and(|n| n.starts_with(fail_open::CLUSTER_PREFIX))
    };
    let prototype = clusters
        .iter()
        .find(|c| c.get("load_balancing_policy").is_some() && !is_fallback(c))
        .cloned()
        .ok_or("template: no fleet cluster to copy")?;
    let fallback = clusters
        .iter()
        .find(|c| is_fallback(c))
        .cloned()
        .ok_or("template: no fail-open cluster to copy")?;
    for (what, c) in [("fleet", &prototype), ("fail-open", &fallback)] {
        if c.get("eds_cluster_config").is_none() {
            return Err(
                format!("template: the {what} cluster to copy has no eds_cluster_config").into(),
            );
        }
    }
    let mut out: Vec<Value> = clusters
        .iter()
        .filter(|c| c.get("load_balancing_policy").is_none())
        .cloned()
        .collect();
    for c in &mut out {
        if c.get("name").and_then(Value::as_str) == Some("fleetroute") {
            if opts.grpc.is_empty() {
                return Err("no fleetroute address (--grpc)".into());
            }
            let lb: Vec<Value> = opts
                .grpc
                .iter()
                .map(|a| endpoint(&a.to_string()))
                .collect::<Result<_, _>>()?;
            let mut group = Mapping::new();
            group.insert(key("lb_endpoints"), Value::Sequence(lb));
            *get_mut(c, &["load_assignment", "endpoints"])? =
                Value::Sequence(vec![Value::Mapping(group)]);
        }
    }
    for fleet in &cfg.fleets {
        let mut c = prototype.clone();
        *get_mut(&mut c, &["name"])? = key(&fleet.name);
        if opts.static_endpoints {
            let lb: Result<Vec<Value>, RenderError> =
                fleet.endpoints.iter().map(|e| endpoint(e)).collect();
            let mut group = Mapping::new();
            group.insert(key("lb_endpoints"), Value::Sequence(lb?));
            to_static(
                &mut c,
                &fleet.name,
                Value::Sequence(vec![Value::Mapping(group)]),
            )?;
        }
        envoy_bounds::fleet_cluster(&mut c, cfg)?;
        out.push(c);
    }
    out.extend(retry::clusters(
        &prototype,
        cfg,
        &opts.wasm,
        opts.static_endpoints,
    )?);
    // A stage whose fleets may not take fail-open traffic has no cluster (its
    // fail-open routes answer 503).
    for stage in cfg
        .stages
        .iter()
        .filter(|s| fail_open::has_fail_open(cfg, s))
    {
        let mut c = fallback.clone();
        envoy_bounds::fallback_cluster(&mut c, cfg, stage)?;
        if opts.static_endpoints {
            let name = fail_open::cluster_name(&stage.name);
            to_static(&mut c, &name, fail_open::endpoints(cfg, stage)?)?;
        }
        out.push(c);
    }
    *clusters = out;
    Ok(())
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod tests_support {
    use super::*;

    pub fn opts() -> BootstrapOptions {
        BootstrapOptions {
            listen: crate::listen::ENVOY_LISTEN.parse().unwrap(),
            envoy_admin: crate::listen::ENVOY_ADMIN.parse().unwrap(),
            grpc: vec![crate::listen::GRPC.parse().unwrap()],
            wasm: "/etc/fleetroute/fleetroute_filter.wasm".into(),
            fail_closed: false,
            static_endpoints: false,
        }
    }

    /// The template rendered for `router`, parsed.
    pub fn rendered(router: &str, opts: &BootstrapOptions) -> Value {
        let cfg = RouterConfig::parse(router).unwrap();
        yaml_serde::from_str(&render(TEMPLATE, &cfg, opts).unwrap()).unwrap()
    }
}
