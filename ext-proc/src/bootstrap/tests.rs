//! Tests of the rendered bootstrap (`bootstrap/mod.rs`).

use super::*;

const ROUTER: &str = include_str!("../../../envoy-config/router.yaml");

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
    let rendered: Value = yaml_serde::from_str(&render(TEMPLATE, &cfg, &opts()).unwrap()).unwrap();
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
        if *h != fleetroute_filter::contract::SHADOW
            && *h != fleetroute_filter::contract::UPSTREAM_FALLBACK
        {
            assert!(removed.contains(h), "{h} reaches the upstream");
        }
    }
    assert!(removed.contains(&fleetroute_filter::contract::OVERRIDE_HOST_HEADER));
}

/// The container demo's Envoy config is the rendering of its router config.
#[test]
fn docker_files_agree() {
    let cfg =
        RouterConfig::parse(include_str!("../../../envoy-config/docker/router.yaml")).unwrap();
    let opts = BootstrapOptions {
        listen: "0.0.0.0:10000".parse().unwrap(),
        envoy_admin: "0.0.0.0:9901".parse().unwrap(),
        grpc: vec!["172.30.0.20:50051".parse().unwrap()],
        ..opts()
    };
    let rendered: Value = yaml_serde::from_str(&render(TEMPLATE, &cfg, &opts).unwrap()).unwrap();
    let shipped: Value =
        yaml_serde::from_str(include_str!("../../../envoy-config/docker/envoy.yaml")).unwrap();
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
    let hcm =
        &doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"];
    let mapper = hcm["local_reply_config"]["mappers"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| m["filter"]["status_code_filter"]["comparison"]["value"]["default_value"] == 413)
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
    let hcm =
        &doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"];
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
        + crate::request::reply::TIMER_MARGIN.as_secs_f64();
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
    let hcm =
        &doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"];
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
    assert!(e.to_string().contains("grpc.token_file"), "{e}");
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
