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

use std::net::SocketAddr;

use yaml_serde::{Mapping, Value};

use crate::config::RouterConfig;
use crate::{envoy_bounds, fail_open};

/// The commented template, shipped inside the binary.
pub const TEMPLATE: &str = include_str!("../../envoy-config/envoy.yaml");

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

fn key(k: &str) -> Value {
    Value::String(k.to_string())
}

fn get_mut<'a>(v: &'a mut Value, path: &[&str]) -> Result<&'a mut Value, String> {
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
fn to_static(c: &mut Value, name: &str, endpoints: Value) -> Result<(), String> {
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

fn endpoint(addr: &str) -> Result<Value, String> {
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
) -> Result<String, String> {
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
                *value = key(&crate::bootstrap_identity::filter_configuration(json, cfg)?);
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

    crate::bootstrap_identity::jwt(
        get_mut(hcm, &["http_filters"])?
            .as_sequence_mut()
            .ok_or("template: http_filters is not a list")?,
        cfg,
    )?;

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
    routes.extend(chosen);
    routes.extend(fail_open::routes(cfg));
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

    let clusters = get_mut(&mut doc, &["static_resources", "clusters"])?
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
            return Err(format!(
                "template: the {what} cluster to copy has no eds_cluster_config"
            ));
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
            let lb: Result<Vec<Value>, String> =
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
    for addr in &opts.grpc {
        crate::peer_auth::check_listen(*addr, &cfg.grpc).map_err(|e| format!("--grpc: {e}"))?;
    }
    if let Some(token) = cfg.grpc.token().map_err(|e| e.to_string())? {
        crate::bootstrap_token::write(&mut doc, &token)?;
    }
    yaml_serde::to_string(&doc).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROUTER: &str = include_str!("../../envoy-config/router.yaml");

    fn opts() -> BootstrapOptions {
        BootstrapOptions {
            // The template is rendered with the defaults: it shows them.
            listen: crate::listen::ENVOY_LISTEN.parse().unwrap(),
            envoy_admin: crate::listen::ENVOY_ADMIN.parse().unwrap(),
            grpc: vec![crate::listen::GRPC.parse().unwrap()],
            wasm: "/etc/fleetroute/fleetroute_filter.wasm".into(),
            fail_closed: false,
            static_endpoints: false,
        }
    }

    /// The shipped envoy.yaml is exactly what `bootstrap` renders for the
    /// shipped router.yaml: the two files cannot drift apart.
    #[test]
    fn shipped_files_agree() {
        let cfg = RouterConfig::parse(ROUTER).unwrap();
        let rendered: Value =
            yaml_serde::from_str(&render(TEMPLATE, &cfg, &opts()).unwrap()).unwrap();
        let shipped: Value = yaml_serde::from_str(TEMPLATE).unwrap();
        assert!(
            rendered == shipped,
            "envoy-config/envoy.yaml and router.yaml disagree"
        );
    }

    /// The template strips every internal request header before upstream,
    /// except the shadow header its mirror policy still needs.
    #[test]
    fn the_template_strips_every_internal_header() {
        let doc: Value = yaml_serde::from_str(TEMPLATE).unwrap();
        let removed = &doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
            ["route_config"]["request_headers_to_remove"];
        let removed: Vec<&str> = removed
            .as_sequence()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        for h in fleetroute_filter::contract::REQUEST_HEADERS {
            if *h != fleetroute_filter::contract::SHADOW {
                assert!(removed.contains(h), "{h} reaches the upstream");
            }
        }
        assert!(removed.contains(&fleetroute_filter::contract::OVERRIDE_HOST_HEADER));
    }

    /// The container demo's Envoy config is the rendering of its router config.
    #[test]
    fn docker_files_agree() {
        let cfg =
            RouterConfig::parse(include_str!("../../envoy-config/docker/router.yaml")).unwrap();
        let opts = BootstrapOptions {
            listen: "0.0.0.0:10000".parse().unwrap(),
            envoy_admin: "0.0.0.0:9901".parse().unwrap(),
            grpc: vec!["172.30.0.20:50051".parse().unwrap()],
            ..opts()
        };
        let rendered: Value =
            yaml_serde::from_str(&render(TEMPLATE, &cfg, &opts).unwrap()).unwrap();
        let shipped: Value =
            yaml_serde::from_str(include_str!("../../envoy-config/docker/envoy.yaml")).unwrap();
        assert!(
            rendered == shipped,
            "envoy-config/docker/envoy.yaml is stale: regenerate it with the command in its first line"
        );
    }

    /// Envoy's own 413 gets exactly the filter's JSON body, and a Wasm VM
    /// that dies is reloaded.
    #[test]
    fn body_limits_answer_like_the_filter() {
        let doc: Value = yaml_serde::from_str(TEMPLATE).unwrap();
        let hcm = &doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"];
        let mapper = hcm["local_reply_config"]["mappers"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|m| {
                m["filter"]["status_code_filter"]["comparison"]["value"]["default_value"] == 413
            })
            .expect("a 413 mapper");
        let mapped: serde_json::Value =
            serde_json::to_value(&mapper["body_format_override"]["json_format"]).unwrap();
        let filter: serde_json::Value =
            serde_json::from_str(&fleetroute_filter::http::LocalReply::too_large().body).unwrap();
        assert_eq!(mapped, filter);
        let wasm = hcm["http_filters"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|f| f["name"] == "envoy.filters.http.wasm")
            .unwrap();
        assert_eq!(
            wasm["typed_config"]["config"]["failure_policy"],
            "FAIL_RELOAD"
        );
    }

    /// Several instances: one endpoint each in the one gRPC cluster, which
    /// Envoy health-checks over grpc.health.v1; the single default is unchanged.
    #[test]
    fn several_instances_share_one_health_checked_cluster() {
        let cfg =
            RouterConfig::parse(&format!("{ROUTER}\ngrpc: {{ trusted_network: true }}\n")).unwrap();
        let grpc = vec![
            "10.0.0.7:50051".parse().unwrap(),
            "10.0.0.8:50052".parse().unwrap(),
        ];
        let out = render(TEMPLATE, &cfg, &BootstrapOptions { grpc, ..opts() }).unwrap();
        let doc: Value = yaml_serde::from_str(&out).unwrap();
        let c = doc["static_resources"]["clusters"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "fleetroute")
            .unwrap();
        let eps = c["load_assignment"]["endpoints"][0]["lb_endpoints"]
            .as_sequence()
            .unwrap();
        let addrs: Vec<(String, u64)> = eps
            .iter()
            .map(|e| {
                let a = &e["endpoint"]["address"]["socket_address"];
                (
                    a["address"].as_str().unwrap().to_string(),
                    a["port_value"].as_u64().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            addrs,
            [
                ("10.0.0.7".to_string(), 50051),
                ("10.0.0.8".to_string(), 50052)
            ]
        );
        assert!(c["health_checks"][0]["grpc_health_check"].is_mapping());
        assert!(c["outlier_detection"].is_mapping());
        let none = BootstrapOptions {
            grpc: Vec::new(),
            ..opts()
        };
        assert!(render(TEMPLATE, &cfg, &none).is_err());
    }

    /// Held requests need Envoy to grant a longer timer than
    /// `message_timeout` (up to any `admission.max_wait_ms`), and the
    /// priority header must reach fleetroute.
    #[test]
    fn admission_gets_its_timer_and_its_header() {
        let cfg = RouterConfig::parse(&format!(
            "{ROUTER}\nadmission: {{ priority_header: x-priority }}\n"
        ))
        .unwrap();
        let doc: Value = yaml_serde::from_str(&render(TEMPLATE, &cfg, &opts()).unwrap()).unwrap();
        let hcm = &doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"];
        let routing = hcm["http_filters"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|f| {
                f["name"] == "envoy.filters.http.ext_proc"
                    && f["typed_config"].get("observability_mode").is_none()
            })
            .unwrap();
        let tc = &routing["typed_config"];
        let max: f64 = tc["max_message_timeout"]
            .as_str()
            .unwrap()
            .trim_end_matches('s')
            .parse()
            .unwrap();
        let needed = crate::config::MAX_WAIT_CAP_MS as f64 / 1000.0
            + crate::admission::reply::TIMER_MARGIN.as_secs_f64();
        assert!(max >= needed, "max_message_timeout {max}s < {needed}s");
        let patterns = tc["forward_rules"]["allowed_headers"]["patterns"]
            .as_sequence()
            .unwrap();
        assert!(patterns.iter().any(|p| p["exact"] == "x-priority"));
        // Without the header configured, only what routing reads.
        let plain: Value = yaml_serde::from_str(TEMPLATE).unwrap();
        assert!(
            !serde_json::to_string(&plain)
                .unwrap()
                .contains("x-priority")
        );
    }

    #[test]
    fn fail_closed_flips_only_the_routing_filter() {
        let cfg = RouterConfig::parse(ROUTER).unwrap();
        let out = render(
            TEMPLATE,
            &cfg,
            &BootstrapOptions {
                fail_closed: true,
                ..opts()
            },
        )
        .unwrap();
        assert_eq!(out.matches("failure_mode_allow: false").count(), 1);
        assert_eq!(out.matches("failure_mode_allow: true").count(), 0);
        // No response-time report that could fail a response.
        assert!(!out.contains("allow_mode_override"), "{out}");
        let open = render(TEMPLATE, &cfg, &opts()).unwrap();
        assert_eq!(open.matches("allow_mode_override: true").count(), 1);
    }

    fn clusters(out: &str) -> Vec<Value> {
        let doc: Value = yaml_serde::from_str(out).unwrap();
        doc["static_resources"]["clusters"]
            .as_sequence()
            .unwrap()
            .clone()
    }

    /// By default every fleet and fail-open cluster asks fleetroute for its
    /// members, all through one config source (one stream per Envoy).
    #[test]
    fn fleet_and_fail_open_clusters_are_served_by_fleetroute() {
        let cfg = RouterConfig::parse(ROUTER).unwrap();
        let out = render(TEMPLATE, &cfg, &opts()).unwrap();
        let all = clusters(&out);
        let served: Vec<&Value> = all.iter().filter(|c| c["name"] != "fleetroute").collect();
        assert_eq!(served.len(), cfg.fleets.len() + cfg.stages.len());
        let doc: Value = yaml_serde::from_str(&out).unwrap();
        let ads = &doc["dynamic_resources"]["ads_config"];
        assert_eq!(
            ads["grpc_services"][0]["envoy_grpc"]["cluster_name"],
            "fleetroute"
        );
        assert_eq!(ads["api_type"], "GRPC");
        let source = &served[0]["eds_cluster_config"]["eds_config"];
        assert!(source["ads"].is_mapping(), "{source:?}");
        assert!(source["initial_fetch_timeout"].as_str().is_some());
        for c in &served {
            assert_eq!(c["type"], "EDS", "{}", c["name"].as_str().unwrap());
            assert!(c.get("load_assignment").is_none());
            assert_eq!(&c["eds_cluster_config"]["eds_config"], source);
            let fallback = c["name"]
                .as_str()
                .unwrap()
                .starts_with(fail_open::CLUSTER_PREFIX);
            assert_eq!(
                c["ignore_health_on_host_removal"].as_bool() == Some(true),
                fallback
            );
            assert_eq!(c.get("health_checks").is_some(), fallback);
            assert_eq!(c.get("outlier_detection").is_some(), fallback);
            assert!(c["circuit_breakers"]["thresholds"][0]["retry_budget"].is_mapping());
        }
        assert!(out.contains("override_host"));
        assert!(out.contains("node:"), "EDS needs a node identity");
    }

    /// `grpc.token_file`: every call Envoy makes to fleetroute carries the
    /// token (routing, access log, ADS, health checks), and nothing else
    /// changes; beyond loopback no address is rendered without a peer check.
    #[test]
    fn the_grpc_token_reaches_every_call_to_fleetroute() {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), "tok-0123456789abcdef\n").unwrap();
        let cfg = RouterConfig::parse(&format!(
            "{ROUTER}\ngrpc: {{ token_file: '{}' }}\n",
            f.path().display()
        ))
        .unwrap();
        let out = render(TEMPLATE, &cfg, &opts()).unwrap();
        let doc: Value = yaml_serde::from_str(&out).unwrap();
        let meta = |v: &Value| v["initial_metadata"][0].clone();
        let want: Value =
            yaml_serde::from_str("{ key: authorization, value: 'Bearer tok-0123456789abcdef' }")
                .unwrap();
        assert_eq!(
            meta(&doc["dynamic_resources"]["ads_config"]["grpc_services"][0]),
            want
        );
        let hcm = &doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"];
        let ext_proc = hcm["http_filters"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|f| f["name"] == "envoy.filters.http.ext_proc")
            .unwrap();
        assert_eq!(meta(&ext_proc["typed_config"]["grpc_service"]), want);
        assert_eq!(
            meta(&hcm["access_log"][0]["typed_config"]["common_config"]["grpc_service"]),
            want
        );
        let c = clusters(&out)
            .into_iter()
            .find(|c| c["name"] == "fleetroute")
            .unwrap();
        assert_eq!(
            c["health_checks"][0]["grpc_health_check"]["initial_metadata"][0]["header"],
            want
        );
        assert_eq!(out.matches("tok-0123456789abcdef").count(), 4);
        // Without a token nothing is added.
        let plain = render(TEMPLATE, &RouterConfig::parse(ROUTER).unwrap(), &opts()).unwrap();
        assert!(!plain.contains("initial_metadata"));
        // A fleetroute beyond loopback needs a peer check.
        let far = BootstrapOptions {
            grpc: vec!["10.0.0.7:50051".parse().unwrap()],
            ..opts()
        };
        let e = render(TEMPLATE, &RouterConfig::parse(ROUTER).unwrap(), &far).unwrap_err();
        assert!(e.contains("grpc.token_file"), "{e}");
        assert!(render(TEMPLATE, &cfg, &far).is_ok());
    }

    /// `--static-endpoints`: the config's members in the file, nothing asked.
    #[test]
    fn static_endpoints_list_the_config_members() {
        let cfg = RouterConfig::parse(ROUTER).unwrap();
        let out = render(
            TEMPLATE,
            &cfg,
            &BootstrapOptions {
                static_endpoints: true,
                ..opts()
            },
        )
        .unwrap();
        assert!(!out.contains("eds_cluster_config"), "{out}");
        assert!(!out.contains("dynamic_resources"), "{out}");
        let all = clusters(&out);
        for fleet in &cfg.fleets {
            let c = all
                .iter()
                .find(|c| c["name"] == fleet.name.as_str())
                .unwrap();
            assert_eq!(c["type"], "STATIC");
            assert_eq!(c["load_assignment"]["cluster_name"], fleet.name.as_str());
            let eps = c["load_assignment"]["endpoints"][0]["lb_endpoints"]
                .as_sequence()
                .unwrap();
            assert_eq!(eps.len(), fleet.endpoints.len());
        }
        for stage in &cfg.stages {
            let name = fail_open::cluster_name(&stage.name);
            let c = all.iter().find(|c| c["name"] == name.as_str()).unwrap();
            assert_eq!(c["type"], "STATIC");
            assert_eq!(
                c["load_assignment"]["endpoints"],
                fail_open::endpoints(&cfg, stage).unwrap()
            );
            assert!(c.get("health_checks").is_some());
            assert!(c.get("ignore_health_on_host_removal").is_none());
        }
    }
}
