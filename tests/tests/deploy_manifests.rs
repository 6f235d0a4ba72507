//! The manifests in `deploy/` cannot run here (no cluster). What can be
//! checked is: every document parses and carries the fields its kind needs;
//! the Kubernetes objects fit together; the Deployment's arguments start the
//! real `fleetroute` and its probe paths answer; the names the Istio and Envoy
//! Gateway objects use exist in the router config they ship (loaded by
//! fleetroute's own config loader); and the raw Envoy fragments they inject,
//! applied the way the mesh applies them, pass real `envoy --mode validate`.
//!
//! YAML is read only with `from_str` into `serde_json::Value`.
#![cfg(feature = "e2e")] // needs Envoy and the built binaries: scripts/test.sh

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use fleetroute::config::RouterConfig;
use fleetroute_filter::config::FilterConfig;
use fleetroute_tests::harness::client::{blocking_get, chat_body, client};
use fleetroute_tests::harness::procs::{Proc, free_port};
use fleetroute_tests::harness::scenario::{FAST_ENGINES, TWO_FLEETS, chat_url};
use fleetroute_tests::harness::{Binaries, Lab, LabSpec, wait_until};
use serde_json::{Value, json};

const ENGINE: &str = env!("CARGO_BIN_EXE_fleetroute-engine");

/// Where the filter's module is read from in the manifests' Envoy fragments.
const WASM_IN_POD: &str = "/etc/fleetroute/fleetroute_filter.wasm";

/// Files in a directory that its kustomization deliberately leaves out.
const NOT_APPLIED: &[&str] = &["istio/wasmplugin.yaml"];

struct Doc {
    file: String,
    v: Value,
}

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .join("deploy")
}

/// The documents of a multi-document YAML file (blank or comment-only
/// documents skipped).
fn yaml_docs(text: &str, file: &str) -> Vec<Value> {
    let mut docs = vec![String::new()];
    for line in text.lines() {
        if line.trim_end() == "---" {
            docs.push(String::new());
        } else {
            let d = docs.last_mut().unwrap();
            d.push_str(line);
            d.push('\n');
        }
    }
    docs.into_iter()
        .filter(|d| {
            d.lines()
                .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        })
        .map(|d| {
            yaml_serde::from_str::<Value>(&d).unwrap_or_else(|e| panic!("{file}: not YAML: {e}"))
        })
        .collect()
}

/// Every document under `deploy/<sub>` (all of `deploy/` for "").
fn manifests(sub: &str) -> Vec<Doc> {
    let mut files = Vec::new();
    let mut dirs = vec![deploy_dir().join(sub)];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "yaml" || x == "yml") {
                files.push(p);
            }
        }
    }
    files.sort();
    assert!(!files.is_empty(), "no manifests under deploy/{sub}");
    let mut out = Vec::new();
    for f in files {
        let file = f.strip_prefix(deploy_dir()).unwrap().display().to_string();
        for v in yaml_docs(&std::fs::read_to_string(&f).unwrap(), &file) {
            out.push(Doc {
                file: file.clone(),
                v,
            });
        }
    }
    out
}

fn kind(v: &Value) -> &str {
    v["kind"].as_str().unwrap_or("")
}

fn name(v: &Value) -> &str {
    v["metadata"]["name"].as_str().unwrap_or("")
}

fn ns(v: &Value) -> &str {
    v["metadata"]["namespace"].as_str().unwrap_or("")
}

/// The one document of this kind and name.
fn find<'a>(docs: &'a [Doc], k: &str, n: &str) -> &'a Value {
    let found: Vec<_> = docs
        .iter()
        .filter(|d| kind(&d.v) == k && name(&d.v) == n)
        .collect();
    assert_eq!(found.len(), 1, "expected one {k} named {n}");
    &found[0].v
}

fn of_kind<'a>(docs: &'a [Doc], k: &str) -> Vec<&'a Value> {
    docs.iter()
        .filter(|d| kind(&d.v) == k)
        .map(|d| &d.v)
        .collect()
}

/// The value at a JSON pointer, or a failure naming it.
fn at<'a>(v: &'a Value, ptr: &str) -> &'a Value {
    v.pointer(ptr)
        .unwrap_or_else(|| panic!("{} {}: no {ptr}", kind(v), name(v)))
}

fn text<'a>(v: &'a Value, ptr: &str) -> &'a str {
    at(v, ptr)
        .as_str()
        .unwrap_or_else(|| panic!("{} {}: {ptr} is not a string", kind(v), name(v)))
}

fn list<'a>(v: &'a Value, ptr: &str) -> &'a Vec<Value> {
    at(v, ptr)
        .as_array()
        .unwrap_or_else(|| panic!("{} {}: {ptr} is not a list", kind(v), name(v)))
}

fn one_of(v: &Value, ptr: &str, allowed: &[&str]) {
    let got = text(v, ptr);
    assert!(
        allowed.contains(&got),
        "{} {}: {ptr} = {got}, not one of {allowed:?}",
        kind(v),
        name(v)
    );
}

fn api_group(v: &Value) -> &str {
    let api = v["apiVersion"].as_str().unwrap_or("");
    api.rsplit_once('/').map_or("", |(g, _)| g)
}

/// `a ⊆ b` for label maps.
fn labels_within(a: &Value, b: &Value) -> bool {
    a.as_object()
        .is_some_and(|a| !a.is_empty() && a.iter().all(|(k, x)| b.get(k) == Some(x)))
}

/// Checks the fields a document of its kind needs (enumerations as the
/// Istio and Envoy Gateway APIs define them).
fn check_fields(d: &Doc) {
    let v = &d.v;
    let k = kind(v);
    assert!(!k.is_empty(), "{}: a document without kind", d.file);
    assert!(at(v, "/apiVersion").is_string());
    if k != "Kustomization" {
        assert!(!name(v).is_empty(), "{}: {k} without metadata.name", d.file);
    }
    match (api_group(v), k) {
        ("kustomize.config.k8s.io", "Kustomization") => {
            assert!(!list(v, "/resources").is_empty());
        }
        ("", "ServiceAccount") | ("", "ConfigMap") => {}
        ("rbac.authorization.k8s.io", "Role") => {
            assert!(!list(v, "/rules").is_empty());
        }
        ("rbac.authorization.k8s.io", "RoleBinding") => {
            text(v, "/roleRef/kind");
            text(v, "/roleRef/name");
            assert!(!list(v, "/subjects").is_empty());
        }
        ("apps", "Deployment") => {
            assert!(at(v, "/spec/replicas").is_u64());
            at(v, "/spec/selector/matchLabels");
            let c = at(v, "/spec/template/spec/containers/0");
            for p in [
                "/image",
                "/readinessProbe/httpGet/path",
                "/livenessProbe/httpGet/path",
                "/resources/requests/cpu",
                "/resources/requests/memory",
                "/resources/limits/memory",
            ] {
                text(c, p);
            }
            assert!(!list(c, "/args").is_empty() && !list(c, "/ports").is_empty());
        }
        ("", "Service") => {
            at(v, "/spec/selector");
            for p in list(v, "/spec/ports") {
                text(p, "/name");
                assert!(at(p, "/port").is_u64());
            }
        }
        ("policy", "PodDisruptionBudget") => {
            at(v, "/spec/selector/matchLabels");
            assert!(
                v.pointer("/spec/minAvailable").is_some()
                    || v.pointer("/spec/maxUnavailable").is_some()
            );
        }
        ("networking.istio.io", "Gateway") => {
            at(v, "/spec/selector");
            for s in list(v, "/spec/servers") {
                assert!(at(s, "/port/number").is_u64());
                assert!(!list(s, "/hosts").is_empty());
            }
        }
        ("networking.istio.io", "VirtualService") => {
            assert!(!list(v, "/spec/hosts").is_empty());
            for h in list(v, "/spec/http") {
                for r in list(h, "/route") {
                    text(r, "/destination/host");
                }
            }
        }
        ("networking.istio.io", "EnvoyFilter") => {
            for p in list(v, "/spec/configPatches") {
                one_of(
                    p,
                    "/applyTo",
                    &[
                        "LISTENER",
                        "FILTER_CHAIN",
                        "NETWORK_FILTER",
                        "HTTP_FILTER",
                        "ROUTE_CONFIGURATION",
                        "VIRTUAL_HOST",
                        "HTTP_ROUTE",
                        "CLUSTER",
                        "EXTENSION_CONFIG",
                        "LISTENER_FILTER",
                    ],
                );
                one_of(
                    p,
                    "/match/context",
                    &["ANY", "SIDECAR_INBOUND", "SIDECAR_OUTBOUND", "GATEWAY"],
                );
                one_of(
                    p,
                    "/patch/operation",
                    &[
                        "MERGE",
                        "ADD",
                        "REMOVE",
                        "INSERT_BEFORE",
                        "INSERT_AFTER",
                        "INSERT_FIRST",
                        "REPLACE",
                        "MERGE_AND_REPLACE_LIST",
                    ],
                );
                assert!(at(p, "/patch/value").is_object());
            }
        }
        ("extensions.istio.io", "WasmPlugin") => {
            text(v, "/spec/url");
            one_of(v, "/spec/phase", &["AUTHN", "AUTHZ", "STATS"]);
            assert!(at(v, "/spec/priority").is_i64());
            one_of(
                v,
                "/spec/failStrategy",
                &["FAIL_CLOSE", "FAIL_OPEN", "FAIL_RELOAD"],
            );
            assert!(at(v, "/spec/pluginConfig").is_object());
        }
        ("gateway.networking.k8s.io", "Gateway") => {
            text(v, "/spec/gatewayClassName");
            for l in list(v, "/spec/listeners") {
                text(l, "/name");
                one_of(l, "/protocol", &["HTTP", "HTTPS"]);
            }
        }
        ("gateway.networking.k8s.io", "HTTPRoute") => {
            assert!(!list(v, "/spec/parentRefs").is_empty());
            for r in list(v, "/spec/rules") {
                assert!(!list(r, "/backendRefs").is_empty());
            }
        }
        ("gateway.envoyproxy.io", "EnvoyProxy") => {
            for f in list(v, "/spec/filterOrder") {
                text(f, "/name");
            }
        }
        ("gateway.envoyproxy.io", "EnvoyExtensionPolicy") => {
            assert!(!list(v, "/spec/targetRefs").is_empty());
            for w in list(v, "/spec/wasm") {
                one_of(w, "/code/type", &["HTTP", "Image"]);
            }
            for e in list(v, "/spec/extProc") {
                assert!(!list(e, "/backendRefs").is_empty());
            }
        }
        ("gateway.envoyproxy.io", "EnvoyPatchPolicy") => {
            text(v, "/spec/targetRef/name");
            one_of(v, "/spec/type", &["JSONPatch"]);
            for p in list(v, "/spec/jsonPatches") {
                one_of(
                    p,
                    "/type",
                    &[
                        "type.googleapis.com/envoy.config.listener.v3.Listener",
                        "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
                        "type.googleapis.com/envoy.config.cluster.v3.Cluster",
                        "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
                    ],
                );
                text(p, "/name");
                one_of(
                    p,
                    "/operation/op",
                    &["add", "remove", "replace", "move", "copy", "test"],
                );
            }
        }
        ("networking.k8s.io", "NetworkPolicy") => {
            at(v, "/spec/podSelector/matchLabels");
            for rule in list(v, "/spec/ingress") {
                assert!(
                    !list(rule, "/ports").is_empty(),
                    "{}: a rule for every port",
                    d.file
                );
                assert!(
                    !list(rule, "/from").is_empty(),
                    "{}: a rule open to all",
                    d.file
                );
            }
        }
        ("security.istio.io", "PeerAuthentication") => {
            at(v, "/spec/selector/matchLabels");
            one_of(v, "/spec/mtls/mode", &["STRICT", "PERMISSIVE", "DISABLE"]);
        }
        ("security.istio.io", "AuthorizationPolicy") => {
            at(v, "/spec/selector/matchLabels");
            one_of(v, "/spec/action", &["ALLOW", "DENY", "AUDIT", "CUSTOM"]);
            assert!(!list(v, "/spec/rules").is_empty());
        }
        (g, k) => panic!("{}: no checks for {g}/{k}: add them", d.file),
    }
}

#[test]
fn every_manifest_has_the_fields_its_kind_needs() {
    let docs = manifests("");
    for d in &docs {
        check_fields(d);
    }
    // Each kustomization lists exactly the files of its directory.
    for d in docs.iter().filter(|d| kind(&d.v) == "Kustomization") {
        let dir = Path::new(&d.file).parent().unwrap();
        let listed: BTreeSet<String> = list(&d.v, "/resources")
            .iter()
            .map(|r| dir.join(r.as_str().unwrap()).display().to_string())
            .collect();
        let present: BTreeSet<String> = docs
            .iter()
            .map(|x| x.file.clone())
            .filter(|f| {
                Path::new(f).parent() == Some(dir)
                    && !f.ends_with("kustomization.yaml")
                    && !NOT_APPLIED.contains(&f.as_str())
            })
            .collect();
        assert_eq!(listed, present, "{}", d.file);
    }
}

/// Every list of headers a route removes before upstream (any list that
/// removes `x-fleetroute-cluster`) removes every internal request header of
/// the wire contract, but the shadow header a mirror policy still reads.
#[test]
fn every_route_removes_every_internal_header() {
    fn lists<'a>(v: &'a Value, out: &mut Vec<&'a Vec<Value>>) {
        match v {
            Value::Array(items) => {
                if items.iter().any(|x| x == "x-fleetroute-cluster") {
                    out.push(items);
                }
                items.iter().for_each(|x| lists(x, out));
            }
            Value::Object(m) => m.values().for_each(|x| lists(x, out)),
            _ => {}
        }
    }
    let docs = manifests("");
    let mut found = Vec::new();
    for d in &docs {
        lists(&d.v, &mut found);
    }
    assert!(found.len() >= 6, "only {} header lists found", found.len());
    for l in found {
        for h in fleetroute_filter::contract::REQUEST_HEADERS {
            if *h != fleetroute_filter::contract::SHADOW {
                assert!(l.iter().any(|x| x == h), "{h} reaches a replica: {l:?}");
            }
        }
    }
}

/// The router config the ConfigMap ships, through fleetroute's loader.
fn shipped_router(docs: &[Doc]) -> (RouterConfig, String) {
    let cm = find(docs, "ConfigMap", "fleetroute-config");
    let yaml = text(cm, "/data/router.yaml").to_string();
    let cfg = RouterConfig::parse(&yaml).unwrap_or_else(|e| panic!("ConfigMap router.yaml: {e}"));
    (cfg, yaml)
}

/// Fleet name → its endpoints' port (every endpoint of a fleet shares it).
fn fleet_ports(cfg: &RouterConfig) -> BTreeMap<String, u16> {
    cfg.fleets
        .iter()
        .map(|f| {
            let ports: BTreeSet<u16> = f
                .endpoints
                .iter()
                .map(|e| e.rsplit_once(':').unwrap().1.parse().unwrap())
                .collect();
            assert_eq!(ports.len(), 1, "fleet {}: one target port", f.name);
            (f.name.clone(), *ports.first().unwrap())
        })
        .collect()
}

fn container(deploy: &Value) -> &Value {
    at(deploy, "/spec/template/spec/containers/0")
}

/// A container port's number by name.
fn container_port(deploy: &Value, port_name: &str) -> u64 {
    list(container(deploy), "/ports")
        .iter()
        .find(|p| p["name"] == port_name)
        .and_then(|p| p["containerPort"].as_u64())
        .unwrap_or_else(|| panic!("no container port named {port_name}"))
}

/// The value following a flag in the container's args.
fn arg_after<'a>(deploy: &'a Value, flag: &str) -> &'a str {
    let args = list(container(deploy), "/args");
    let i = args
        .iter()
        .position(|a| a == flag)
        .unwrap_or_else(|| panic!("no {flag} in the args"));
    args[i + 1].as_str().unwrap()
}

#[test]
fn the_kubernetes_objects_fit_together() {
    let docs = manifests("kubernetes");
    let deploy = find(&docs, "Deployment", "fleetroute");
    let pod = at(deploy, "/spec/template");
    let pod_labels = at(pod, "/metadata/labels");
    assert_eq!(at(deploy, "/spec/replicas"), 2);
    assert!(labels_within(
        at(deploy, "/spec/selector/matchLabels"),
        pod_labels
    ));

    // The Service reaches the pods on named container ports.
    let svc = find(&docs, "Service", "fleetroute");
    assert!(labels_within(at(svc, "/spec/selector"), pod_labels));
    let port_names: BTreeSet<&str> = list(svc, "/spec/ports")
        .iter()
        .map(|p| text(p, "/targetPort"))
        .collect();
    assert_eq!(port_names, BTreeSet::from(["grpc", "admin"]));
    for p in port_names {
        container_port(deploy, p);
    }

    // The listen addresses are the container ports, on the pod's address.
    assert_eq!(
        arg_after(deploy, "--grpc"),
        format!("0.0.0.0:{}", container_port(deploy, "grpc"))
    );
    assert_eq!(
        arg_after(deploy, "--admin"),
        format!("0.0.0.0:{}", container_port(deploy, "admin"))
    );

    // Probes and the Prometheus scrape go to the admin port.
    let c = container(deploy);
    for probe in ["readinessProbe", "livenessProbe"] {
        assert_eq!(c[probe]["httpGet"]["port"], "admin", "{probe}");
    }
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/ready");
    let ann = at(pod, "/metadata/annotations");
    assert_eq!(ann["prometheus.io/scrape"], "true");
    assert_eq!(
        ann["prometheus.io/port"],
        container_port(deploy, "admin").to_string()
    );

    // The config file is the ConfigMap's key where it is mounted.
    let mount = list(c, "/volumeMounts")
        .iter()
        .find(|m| m["name"] == "config")
        .expect("a config mount");
    let volume = list(pod, "/spec/volumes")
        .iter()
        .find(|v| v["name"] == "config")
        .expect("a config volume");
    let cm_name = text(volume, "/configMap/name");
    let cm = find(&docs, "ConfigMap", cm_name);
    let key = at(cm, "/data").as_object().unwrap().keys().next().unwrap();
    assert_eq!(
        arg_after(deploy, "--config"),
        format!("{}/{key}", text(mount, "/mountPath"))
    );

    // RBAC: the pod's account may get, list and watch EndpointSlices, nothing more.
    let sa = text(pod, "/spec/serviceAccountName");
    find(&docs, "ServiceAccount", sa);
    let binding = of_kind(&docs, "RoleBinding")
        .into_iter()
        .find(|b| {
            list(b, "/subjects")
                .iter()
                .any(|s| s["kind"] == "ServiceAccount" && s["name"] == sa)
        })
        .expect("a RoleBinding for the service account");
    let role = find(&docs, "Role", text(binding, "/roleRef/name"));
    let rules = list(role, "/rules");
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0]["apiGroups"], json!(["discovery.k8s.io"]));
    assert_eq!(rules[0]["resources"], json!(["endpointslices"]));
    assert_eq!(rules[0]["verbs"], json!(["get", "list", "watch"]));

    // Every object in one namespace: a Role binds only there.
    for d in &docs {
        if kind(&d.v) != "Kustomization" {
            assert_eq!(ns(&d.v), ns(deploy), "{} {}", kind(&d.v), name(&d.v));
        }
    }

    // The budget keeps one instance through voluntary disruptions.
    let pdb = of_kind(&docs, "PodDisruptionBudget");
    assert_eq!(pdb.len(), 1);
    assert!(labels_within(
        at(pdb[0], "/spec/selector/matchLabels"),
        pod_labels
    ));
    let min = at(pdb[0], "/spec/minAvailable").as_u64().unwrap();
    assert!(min >= 1 && min < at(deploy, "/spec/replicas").as_u64().unwrap());

    // Only the gateways' pods reach the gRPC port, which is why the router
    // config may say trusted_network; the admin port stays in the namespace.
    let (cfg, _) = shipped_router(&docs);
    assert!(cfg.grpc.trusted_network && cfg.grpc.token_file.is_none());
    let np = find(&docs, "NetworkPolicy", "fleetroute");
    assert!(labels_within(
        at(np, "/spec/podSelector/matchLabels"),
        pod_labels
    ));
    let rules = list(np, "/spec/ingress");
    let grpc_rule = rules
        .iter()
        .find(|r| list(r, "/ports").iter().any(|p| p["port"] == "grpc"))
        .expect("a rule for the gRPC port");
    assert_eq!(
        list(grpc_rule, "/ports").len(),
        1,
        "the gRPC rule opens only gRPC"
    );
    for from in list(grpc_rule, "/from") {
        assert!(
            !at(from, "/podSelector/matchLabels")
                .as_object()
                .unwrap()
                .is_empty()
                && !at(from, "/namespaceSelector/matchLabels")
                    .as_object()
                    .unwrap()
                    .is_empty(),
            "every gRPC source names its namespace and its pods: {from}"
        );
    }
    // The clients' keys come from their Secret, where the config reads them.
    let keys_mount = list(c, "/volumeMounts")
        .iter()
        .find(|m| m["name"] == "api-keys")
        .expect("an api-keys mount");
    let keys_file = cfg
        .tenants
        .identity
        .api_keys_file
        .as_deref()
        .expect("api_keys_file");
    assert!(keys_file.starts_with(text(keys_mount, "/mountPath")));
    assert_eq!(
        cfg.tenants.identity.source,
        fleetroute::config::IdentitySource::ApiKey
    );

    // One Service per fleet, named as the fleet, on its endpoints' port.
    for (fleet, port) in fleet_ports(&cfg) {
        let s = find(&docs, "Service", &fleet);
        let ports = list(s, "/spec/ports");
        assert!(
            ports
                .iter()
                .any(|p| p["port"] == port && p["targetPort"] == port),
            "Service {fleet} does not serve port {port}"
        );
    }
}

/// Starts the real binary with the Deployment's arguments (addresses moved to
/// loopback, the config where the test put it) and asks the probe and scrape
/// paths.
#[test]
fn the_deployment_args_start_fleetroute_and_its_probes_answer() {
    let bins = Binaries::locate(ENGINE);
    let docs = manifests("kubernetes");
    let deploy = find(&docs, "Deployment", "fleetroute");
    let c = container(deploy);
    let (cfg, yaml) = shipped_router(&docs);
    let dir = tempfile::tempdir().unwrap();
    // The clients' keys where the test put them (the Secret in the pod).
    let keys = dir.path().join("api-keys");
    std::fs::write(&keys, "").unwrap();
    let pod_keys = cfg.tenants.identity.api_keys_file.expect("api_keys_file");
    let yaml = yaml.replace(&pod_keys, keys.to_str().unwrap());
    let config = dir.path().join("router.yaml");
    std::fs::write(&config, yaml).unwrap();

    let grpc = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());
    let pod_config = arg_after(deploy, "--config").to_string();
    let pod_grpc = arg_after(deploy, "--grpc").to_string();
    let pod_admin = arg_after(deploy, "--admin").to_string();
    let args: Vec<String> = list(c, "/args")
        .iter()
        .map(|a| {
            let a = a.as_str().unwrap();
            if a == pod_config {
                config.display().to_string()
            } else if a == pod_grpc {
                grpc.clone()
            } else if a == pod_admin {
                admin.clone()
            } else {
                a.to_string()
            }
        })
        .collect();
    let mut cmd = Command::new(&bins.fleetroute);
    cmd.args(&args).env_remove("FLEETROUTE_ADMIN_TOKEN");
    for e in list(c, "/env") {
        if let Some(v) = e["value"].as_str() {
            cmd.env(text(e, "/name"), v);
        }
    }
    let mut proc = Proc::spawn("fleetroute", &mut cmd, dir.path());

    let path = |probe: &str| text(c, &format!("/{probe}/httpGet/path")).to_string();
    let ann = at(deploy, "/spec/template/metadata/annotations");
    let scrape = ann["prometheus.io/path"].as_str().unwrap().to_string();
    // The fleets' addresses are not reachable here: every replica turns
    // unhealthy after its first probe, and then the instance is ready.
    for (what, p) in [
        ("liveness", path("livenessProbe")),
        ("readiness", path("readinessProbe")),
    ] {
        let url = format!("http://{admin}{p}");
        wait_until(what, Duration::from_secs(30), || {
            assert!(!proc.exited(), "fleetroute exited:\n{}", proc.log_tail(20));
            blocking_get(&url).is_some_and(|(s, _)| s == 200)
        });
    }
    let (status, body) = blocking_get(&format!("http://{admin}{scrape}")).expect("scrape");
    assert_eq!(status, 200);
    assert!(body.contains("fleetroute_replicas"), "{body}");
    proc.stop();
}

/// Deep merge with protobuf merge semantics, as Istio's MERGE: objects merge
/// field by field, lists append, anything else is replaced.
fn proto_merge(into: &mut Value, from: &Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                match a.get_mut(k) {
                    Some(x) => proto_merge(x, v),
                    None => {
                        a.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => a.extend(b.iter().cloned()),
        (a, b) => *a = b.clone(),
    }
}

fn validate(bootstrap: &Value, wasm: &Path) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("envoy.json");
    let text = bootstrap
        .to_string()
        .replace(WASM_IN_POD, wasm.to_str().unwrap());
    std::fs::write(&path, text).unwrap();
    let out = Command::new("envoy")
        .args(["--mode", "validate", "-c"])
        .arg(&path)
        .output()
        .expect("envoy on PATH");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), log)
}

fn static_cluster(name: &str, endpoints: &[String], http2: bool) -> Value {
    let lb_endpoints: Vec<Value> = endpoints
        .iter()
        .map(|e| {
            let (ip, port) = e.rsplit_once(':').unwrap();
            json!({ "endpoint": { "address": { "socket_address": {
                "address": ip, "port_value": port.parse::<u16>().unwrap() } } } })
        })
        .collect();
    let mut c = json!({
        "name": name,
        "type": "STATIC",
        "connect_timeout": "10s",
        "load_assignment": { "cluster_name": name, "endpoints": [{ "lb_endpoints": lb_endpoints }] },
    });
    if http2 {
        c["typed_extension_protocol_options"] = json!({
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": { "http2_protocol_options": {} } } });
    }
    c
}

fn bootstrap(hcm: Value, listener: &str, clusters: Vec<Value>) -> Value {
    json!({
        "static_resources": {
            "listeners": [{
                "name": listener,
                "address": { "socket_address": { "address": "127.0.0.1", "port_value": 10080 } },
                "filter_chains": [{ "filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": hcm }] }]
            }],
            "clusters": clusters,
        }
    })
}

fn router_filter() -> Value {
    json!({ "name": "envoy.filters.http.router", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router" } })
}

/// Istio's name for a Service port's outbound cluster.
fn istio_cluster(host: &str, port: u64) -> String {
    format!("outbound|{port}||{host}")
}

/// The filter configuration a Wasm filter fragment carries, checked by the
/// filter's own parser.
fn wasm_plugin_config(filter: &Value) -> FilterConfig {
    let json = text(filter, "/typed_config/config/configuration/value");
    FilterConfig::parse(json.as_bytes()).unwrap_or_else(|e| panic!("filter configuration: {e}"))
}

/// The Istio manifests applied as Istio applies them to the gateway's
/// listener, routes and clusters (built from the Gateway, the VirtualService
/// and the fleets' Services, as Istio names them), then validated by Envoy.
#[test]
fn the_istio_fragments_validate_in_envoy_and_name_the_shipped_fleets() {
    let bins = Binaries::locate(ENGINE);
    let k8s = manifests("kubernetes");
    let istio = manifests("istio");
    let (cfg, _) = shipped_router(&k8s);
    let ports = fleet_ports(&cfg);
    let fleet_ns = ns(find(&k8s, "Service", "fleetroute")).to_string();
    let host = |svc: &str| format!("{svc}.{fleet_ns}.svc.cluster.local");

    // What Istio generates: the gateway's virtual host (named host:port) with
    // the VirtualService's route, and one outbound cluster per destination.
    let gw = of_kind(&istio, "Gateway")[0];
    let server = &list(gw, "/spec/servers")[0];
    let vhost_name = format!(
        "{}:{}",
        text(server, "/hosts/0"),
        at(server, "/port/number")
    );
    let vs = of_kind(&istio, "VirtualService")[0];
    let mut weighted = Vec::new();
    let mut clusters = BTreeMap::new();
    for r in list(vs, "/spec/http/0/route") {
        let h = text(r, "/destination/host");
        let port = at(r, "/destination/port/number").as_u64().unwrap();
        let fleet = h
            .strip_suffix(&format!(".{fleet_ns}.svc.cluster.local"))
            .unwrap_or_else(|| panic!("fail-open destination {h} is not a fleet's Service"));
        assert_eq!(Some(&(port as u16)), ports.get(fleet), "fail-open to {h}");
        let name = istio_cluster(h, port);
        weighted.push(json!({ "name": name, "weight": at(r, "/weight") }));
        let eps = &cfg
            .fleets
            .iter()
            .find(|f| f.name == fleet)
            .unwrap()
            .endpoints;
        let mut c = static_cluster(&name, eps, false);
        c["lb_policy"] = json!("LEAST_REQUEST"); // Istio's default
        clusters.insert(name, c);
    }
    assert_eq!(
        clusters.len(),
        cfg.fleets.len(),
        "fail-open covers every fleet"
    );
    let svc = find(&k8s, "Service", "fleetroute");
    let grpc_port = list(svc, "/spec/ports")
        .iter()
        .find(|p| p["name"] == "grpc")
        .and_then(|p| p["port"].as_u64())
        .unwrap();
    let ext_proc_cluster = istio_cluster(&host("fleetroute"), grpc_port);
    clusters.insert(
        ext_proc_cluster.clone(),
        static_cluster(&ext_proc_cluster, &["127.0.0.1:50051".into()], true),
    );
    let mut hcm = json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "outbound_0.0.0.0_8080",
        "route_config": { "name": "http.8080", "virtual_hosts": [{
            "name": vhost_name,
            "domains": [text(server, "/hosts/0")],
            "routes": [{ "match": { "prefix": "/" },
                         "route": { "weighted_clusters": { "clusters": weighted } } }]
        }]},
        "http_filters": [router_filter()],
    });

    // Apply every patch, checking that each finds what it patches.
    let mut routed_fleets = BTreeSet::new();
    let mut patched_clusters = BTreeSet::new();
    let mut wasm_filters = Vec::new();
    for f in of_kind(&istio, "EnvoyFilter") {
        for p in list(f, "/spec/configPatches") {
            let value = at(p, "/patch/value").clone();
            let op = text(p, "/patch/operation");
            match (text(p, "/applyTo"), op) {
                ("HTTP_FILTER", "INSERT_BEFORE") => {
                    let before = text(p, "/match/listener/filterChain/filter/subFilter/name");
                    let filters = hcm["http_filters"].as_array_mut().unwrap();
                    let i = filters
                        .iter()
                        .position(|x| x["name"] == before)
                        .unwrap_or_else(|| panic!("no filter {before} to insert before"));
                    if value["typed_config"]["@type"]
                        .as_str()
                        .unwrap()
                        .ends_with("wasm.v3.Wasm")
                    {
                        wasm_filters.push(value.clone());
                    }
                    if value["typed_config"]["@type"]
                        .as_str()
                        .unwrap()
                        .ends_with("ExternalProcessor")
                    {
                        assert_eq!(
                            text(&value, "/typed_config/grpc_service/envoy_grpc/cluster_name"),
                            ext_proc_cluster,
                            "the ext_proc filter calls the fleetroute Service"
                        );
                    }
                    filters.insert(i, value);
                }
                ("NETWORK_FILTER", "MERGE") => {
                    assert_eq!(
                        text(p, "/match/listener/filterChain/filter/name"),
                        "envoy.filters.network.http_connection_manager"
                    );
                    let mut filter = json!({ "typed_config": hcm.clone() });
                    proto_merge(&mut filter, &value);
                    hcm = filter["typed_config"].take();
                    for log in hcm["access_log"].as_array().unwrap() {
                        assert_eq!(
                            text(
                                log,
                                "/typed_config/common_config/grpc_service/envoy_grpc/cluster_name"
                            ),
                            ext_proc_cluster
                        );
                    }
                }
                ("VIRTUAL_HOST", "MERGE") => {
                    assert_eq!(text(p, "/match/routeConfiguration/vhost/name"), vhost_name);
                    proto_merge(&mut hcm["route_config"]["virtual_hosts"][0], &value);
                }
                ("HTTP_ROUTE", "INSERT_BEFORE") => {
                    assert_eq!(text(p, "/match/routeConfiguration/vhost/name"), vhost_name);
                    assert!(p.pointer("/match/routeConfiguration/vhost/route").is_none());
                    // The route names the fleet fleetroute writes and sends it
                    // to that fleet's Service's cluster.
                    let fleet = list(&value, "/match/headers")
                        .iter()
                        .find(|h| h["name"] == "x-fleetroute-cluster")
                        .map(|h| text(h, "/string_match/exact"))
                        .expect("a route on x-fleetroute-cluster");
                    let port = *ports
                        .get(fleet)
                        .unwrap_or_else(|| panic!("route for unknown fleet {fleet}"));
                    assert_eq!(
                        text(&value, "/route/cluster"),
                        istio_cluster(&host(fleet), port.into())
                    );
                    routed_fleets.insert(fleet.to_string());
                    hcm["route_config"]["virtual_hosts"][0]["routes"]
                        .as_array_mut()
                        .unwrap()
                        .insert(0, value);
                }
                ("CLUSTER", "MERGE") => {
                    let name = istio_cluster(
                        text(p, "/match/cluster/service"),
                        at(p, "/match/cluster/portNumber").as_u64().unwrap(),
                    );
                    let c = clusters
                        .get_mut(&name)
                        .unwrap_or_else(|| panic!("no cluster {name} to patch"));
                    proto_merge(c, &value);
                    patched_clusters.insert(name);
                }
                (a, o) => panic!("{a} {o}: not applied by this test; add it"),
            }
        }
    }
    let fleets: BTreeSet<String> = ports.keys().cloned().collect();
    assert_eq!(routed_fleets, fleets, "a route for every fleet");
    let fleet_clusters: BTreeSet<String> = ports
        .iter()
        .map(|(f, p)| istio_cluster(&host(f), (*p).into()))
        .collect();
    assert_eq!(
        patched_clusters, fleet_clusters,
        "the override-host policy on every fleet's cluster"
    );

    // Streaming routes come before the other route of their fleet.
    let routes = hcm["route_config"]["virtual_hosts"][0]["routes"].clone();
    for fleet in &fleets {
        let pos = |stream: bool| {
            routes
                .as_array()
                .unwrap()
                .iter()
                .position(|r| {
                    let hs = r["match"]["headers"].as_array();
                    hs.is_some_and(|hs| {
                        hs.iter()
                            .any(|h| h["string_match"]["exact"] == fleet.as_str())
                            && hs.iter().any(|h| h["name"] == "x-fleetroute-stream") == stream
                    })
                })
                .unwrap_or_else(|| panic!("fleet {fleet}: no route (stream {stream})"))
        };
        assert!(pos(true) < pos(false), "fleet {fleet}");
    }

    // The Wasm filter comes before the ext_proc, the rename root after it
    // (it reads what the ext_proc sets), and all before the router.
    let order: Vec<&str> = hcm["http_filters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        order,
        [
            "fleetroute.wasm",
            "fleetroute.ext_proc",
            "fleetroute.rename",
            "envoy.filters.http.router"
        ]
    );
    assert_eq!(wasm_filters.len(), 2);
    let (reader, rename) = (&wasm_filters[0], &wasm_filters[1]);
    assert_eq!(
        text(rename, "/typed_config/config/root_id"),
        fleetroute_filter::contract::RENAME_ROOT_ID
    );
    assert_eq!(
        at(rename, "/typed_config/config/vm_config"),
        at(reader, "/typed_config/config/vm_config"),
        "both roots share the module and its VM"
    );
    assert_eq!(
        at(
            rename,
            "/typed_config/config/allow_on_headers_stop_iteration"
        ),
        &json!(true)
    );
    // The WasmPlugin (kept for later) carries the same filter configuration.
    let plugin = of_kind(&istio, "WasmPlugin")[0];
    let plugin_cfg = FilterConfig::parse(at(plugin, "/spec/pluginConfig").to_string().as_bytes())
        .unwrap_or_else(|e| panic!("WasmPlugin pluginConfig: {e}"));
    assert_eq!(plugin_cfg, wasm_plugin_config(reader));

    let boot = bootstrap(
        hcm,
        "0.0.0.0_8080",
        clusters.into_values().collect::<Vec<_>>(),
    );
    let (ok, log) = validate(&boot, &bins.wasm);
    assert!(ok, "the Istio fragments do not validate:\n{log}");

    // The check has teeth: a route to a cluster that does not exist fails.
    let mut broken = boot.clone();
    let first_route = broken
        .pointer_mut("/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/route_config/virtual_hosts/0/routes/0/route/cluster")
        .unwrap();
    *first_route = json!(istio_cluster(&host("bsae"), 8000));
    let (ok, _) = validate(&broken, &bins.wasm);
    assert!(!ok, "Envoy accepted a route to an unknown cluster");
}

/// JSON patch `add` at `path` below every object an Envoy Gateway `jsonPath`
/// selects. Supports the forms the manifests use:
/// `..FIELD[?(@.name=='NAME')].a.b` and `..FIELD[?match(@.name, '.*SUFFIX')]`.
fn json_path_add(doc: &mut Value, json_path: &str, path: &str, value: &Value) -> usize {
    let rest = json_path.strip_prefix("..").expect("a `..` jsonPath");
    let (field, rest) = rest.split_once('[').unwrap();
    let (filter, tail) = rest.split_once(']').unwrap();
    let pred: Box<dyn Fn(&str) -> bool> = if let Some(n) = filter.strip_prefix("?(@.name=='") {
        let n = n.strip_suffix("')").unwrap().to_string();
        Box::new(move |x| x == n)
    } else if let Some(s) = filter.strip_prefix("?match(@.name, '.*") {
        let s = s.strip_suffix("')").unwrap().to_string();
        Box::new(move |x| x.ends_with(&s))
    } else {
        panic!("jsonPath form not supported here: {json_path}")
    };
    let keys: Vec<&str> = tail.split('.').filter(|k| !k.is_empty()).collect();
    fn walk(
        v: &mut Value,
        field: &str,
        pred: &dyn Fn(&str) -> bool,
        keys: &[&str],
        path: &str,
        value: &Value,
    ) -> usize {
        let mut n = 0;
        match v {
            Value::Object(m) => {
                for (k, x) in m.iter_mut() {
                    if k == field
                        && let Value::Array(items) = x
                    {
                        for item in items.iter_mut() {
                            if item["name"].as_str().is_some_and(pred) {
                                let mut target = &mut *item;
                                for key in keys {
                                    target = target
                                        .get_mut(*key)
                                        .unwrap_or_else(|| panic!("no {key} under the match"));
                                }
                                target[path] = value.clone();
                                n += 1;
                            }
                        }
                    } else {
                        n += walk(x, field, pred, keys, path, value);
                    }
                }
            }
            Value::Array(a) => {
                for x in a {
                    n += walk(x, field, pred, keys, path, value);
                }
            }
            _ => {}
        }
        n
    }
    walk(doc, field, &*pred, &keys, path, value)
}

/// The Envoy Gateway objects turned into the Envoy config Envoy Gateway
/// generates for them (names by its scheme, the Wasm filter as it builds it),
/// the EnvoyPatchPolicy applied, and the result validated by Envoy.
#[test]
fn the_envoy_gateway_fragments_validate_in_envoy_and_name_the_shipped_fleets() {
    let bins = Binaries::locate(ENGINE);
    let k8s = manifests("kubernetes");
    let eg = manifests("envoy-gateway");
    let (cfg, _) = shipped_router(&k8s);
    let ports = fleet_ports(&cfg);

    let gw = of_kind(&eg, "Gateway")[0];
    let listener = &list(gw, "/spec/listeners")[0];
    let listener_name = format!("{}/{}/{}", ns(gw), name(gw), text(listener, "/name"));
    let hostname = text(listener, "/hostname");
    let proxy = find(
        &eg,
        "EnvoyProxy",
        text(gw, "/spec/infrastructure/parametersRef/name"),
    );
    assert_eq!(
        at(proxy, "/spec/filterOrder"),
        &json!([{ "name": "envoy.filters.http.wasm", "before": "envoy.filters.http.ext_proc" }]),
        "the Wasm filter must run before the ext_proc that reads its headers"
    );

    // The HTTPRoute: a rule per fleet on x-fleetroute-cluster to the fleet's
    // Service, and a fail-open rule over every fleet.
    let route = find(&eg, "HTTPRoute", "fleetroute");
    assert_eq!(text(route, "/spec/parentRefs/0/name"), name(gw));
    let mut clusters = Vec::new();
    let mut fleet_rules = BTreeMap::new();
    let mut fail_open = BTreeSet::new();
    for (i, rule) in list(route, "/spec/rules").iter().enumerate() {
        let header = rule
            .pointer("/matches/0/headers")
            .and_then(Value::as_array)
            .and_then(|hs| hs.iter().find(|h| h["name"] == "x-fleetroute-cluster"));
        let backends = list(rule, "/backendRefs");
        let mut eps = Vec::new();
        for b in backends {
            let fleet = text(b, "/name");
            let port = *ports
                .get(fleet)
                .unwrap_or_else(|| panic!("backend {fleet} is not a fleet"));
            assert_eq!(at(b, "/port"), port);
            find(&k8s, "Service", fleet);
            eps.extend(
                cfg.fleets
                    .iter()
                    .find(|f| f.name == fleet)
                    .unwrap()
                    .endpoints
                    .clone(),
            );
        }
        let removed = list(rule, "/filters/0/requestHeaderModifier/remove");
        assert!(removed.iter().any(|h| h == "x-fleetroute-cluster"));
        assert!(
            removed
                .iter()
                .any(|h| h == "x-gateway-destination-endpoint")
        );
        match header {
            Some(h) => {
                assert_eq!(backends.len(), 1);
                assert_eq!(text(h, "/value"), text(&backends[0], "/name"));
                fleet_rules.insert(
                    format!("httproute/{}/{}/rule/{i}", ns(route), name(route)),
                    text(h, "/value").to_string(),
                );
            }
            None => fail_open.extend(backends.iter().map(|b| text(b, "/name").to_string())),
        }
        let cname = format!("httproute/{}/{}/rule/{i}", ns(route), name(route));
        clusters.push(static_cluster(&cname, &eps, false));
    }
    let fleets: BTreeSet<String> = ports.keys().cloned().collect();
    assert_eq!(
        fleet_rules.values().cloned().collect::<BTreeSet<_>>(),
        fleets
    );
    assert_eq!(fail_open, fleets, "fail-open covers every fleet");

    // The extension policy: the Wasm filter as Envoy Gateway builds it, and
    // the ext_proc on the fleetroute Service with the metadata it writes.
    let policy = find(&eg, "EnvoyExtensionPolicy", "fleetroute");
    assert_eq!(text(policy, "/spec/targetRefs/0/name"), name(route));
    let ext = &list(policy, "/spec/extProc")[0];
    assert_eq!(text(ext, "/backendRefs/0/name"), "fleetroute");
    let svc = find(&k8s, "Service", "fleetroute");
    assert!(
        list(svc, "/spec/ports")
            .iter()
            .any(|p| p["name"] == "grpc" && &p["port"] == at(ext, "/backendRefs/0/port"))
    );
    assert_eq!(
        at(ext, "/metadata/writableNamespaces"),
        &json!(["envoy.lb", "fleetroute"])
    );
    let mut http_filters = Vec::new();
    for (i, w) in list(policy, "/spec/wasm").iter().enumerate() {
        let config = at(w, "/config").to_string();
        FilterConfig::parse(config.as_bytes())
            .unwrap_or_else(|e| panic!("EnvoyExtensionPolicy wasm config: {e}"));
        let filter_name = format!(
            "envoy.filters.http.wasm/envoyextensionpolicy/{}/{}/wasm/{i}",
            ns(policy),
            name(policy)
        );
        http_filters.push(json!({
            "name": filter_name,
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
                "config": {
                    "name": w["name"],
                    "root_id": w["rootID"],
                    "vm_config": {
                        "vm_id": filter_name,
                        "runtime": "envoy.wasm.runtime.v8",
                        "code": { "local": { "filename": WASM_IN_POD } }
                    },
                    "configuration": {
                        "@type": "type.googleapis.com/google.protobuf.StringValue",
                        "value": config
                    },
                    "fail_open": w["failOpen"]
                }
            }
        }));
    }
    http_filters.push(router_filter());
    let als = text(
        proxy,
        "/spec/telemetry/accessLog/settings/0/sinks/0/als/backendRefs/0/name",
    );
    assert_eq!(als, "fleetroute");
    clusters.push(static_cluster(
        "fleetroute-als",
        &["127.0.0.1:50051".into()],
        true,
    ));
    let hcm = json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "http-80",
        "route_config": { "name": listener_name, "virtual_hosts": [{
            "name": format!("{listener_name}/{}", hostname.replace('.', "_")),
            "domains": [hostname],
            "routes": [{ "match": { "prefix": "/" }, "route": { "cluster": clusters[0]["name"] } }]
        }]},
        "http_filters": http_filters,
        "access_log": [{
            "name": "envoy.access_loggers.http_grpc",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig",
                "common_config": {
                    "log_name": "fleetroute",
                    "transport_api_version": "V3",
                    "grpc_service": { "envoy_grpc": { "cluster_name": "fleetroute-als" } }
                }
            }
        }],
    });
    let mut boot = bootstrap(hcm, &listener_name, clusters);

    // The patches, each required to find what it patches.
    let patch = find(&eg, "EnvoyPatchPolicy", "fleetroute");
    assert_eq!(text(patch, "/spec/targetRef/name"), name(gw));
    let mut override_host = BTreeSet::new();
    for p in list(patch, "/spec/jsonPatches") {
        let op = at(p, "/operation");
        assert_eq!(text(op, "/op"), "add");
        let target = text(p, "/name");
        let value = at(op, "/value");
        match text(p, "/type").rsplit('.').next().unwrap() {
            "Listener" | "RouteConfiguration" => {
                assert_eq!(target, listener_name);
                let n = json_path_add(&mut boot, text(op, "/jsonPath"), text(op, "/path"), value);
                assert_eq!(n, 1, "{} selects one object", text(op, "/jsonPath"));
            }
            "Cluster" => {
                let fleet = fleet_rules
                    .get(target)
                    .unwrap_or_else(|| panic!("{target} is no fleet's rule"));
                let field = text(op, "/path")
                    .strip_prefix('/')
                    .filter(|f| !f.contains('/'))
                    .expect("a top-level cluster field");
                let clusters = boot["static_resources"]["clusters"].as_array_mut().unwrap();
                let c = clusters
                    .iter_mut()
                    .find(|c| c["name"] == target)
                    .unwrap_or_else(|| panic!("no cluster {target}"));
                c[field] = value.clone();
                override_host.insert(fleet.clone());
            }
            t => panic!("{t}: not applied by this test; add it"),
        }
    }
    assert_eq!(
        override_host, fleets,
        "the override-host policy on every fleet's cluster"
    );
    let wasm = &boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        ["http_filters"][0]["typed_config"]["config"];
    assert_eq!(wasm["allow_on_headers_stop_iteration"], true);

    let (ok, log) = validate(&boot, &bins.wasm);
    assert!(ok, "the Envoy Gateway fragments do not validate:\n{log}");
}

/// Why the Istio manifests insert the filter as a raw fragment rather than a
/// WasmPlugin: without `allow_on_headers_stop_iteration` (which WasmPlugin and
/// Envoy Gateway's Wasm API cannot set) Envoy never hands the filter the body
/// it paused for, and the request hangs. Real Envoy, fleetroute and engines.
#[test]
fn without_stop_iteration_the_filter_never_forwards_a_chat_request() {
    fn no_stop_iteration(t: &str) -> String {
        let on = "allow_on_headers_stop_iteration: true";
        assert!(t.contains(on), "the bootstrap no longer sets {on}");
        t.replace(on, "allow_on_headers_stop_iteration: false")
    }
    let lab = Lab::start(
        ENGINE,
        LabSpec {
            router: TWO_FLEETS,
            engine_args: FAST_ENGINES,
            envoy_edit: Some(no_stop_iteration),
            ..Default::default()
        },
    );
    // A request the filter does not pause for still passes: Envoy and the
    // fleets are up.
    let (status, _) = blocking_get(&format!("{}/v1/models", lab.envoy)).expect("GET /v1/models");
    assert_eq!(status, 200);
    // A chat request, which the filter pauses to read, gets no answer.
    let sent = client()
        .post(chat_url(&lab))
        .header("content-type", "application/json")
        .body(chat_body("m1", Some("u"), "hello", false))
        .timeout(Duration::from_secs(5))
        .send();
    match sent {
        Err(e) => assert!(e.is_timeout(), "expected a timeout, got {e}"),
        Ok(r) => panic!("answered {} without stop iteration", r.status()),
    }
}
