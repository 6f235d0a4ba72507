//! What a decision carries for a fleet with its own model name or its own
//! key: the served-name header only when the names differ, the fleet's key in
//! place of the client's credentials, no mirror that would carry either to
//! another fleet, and the model list as an immediate answer.

use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use envoy_types::pb::envoy::service::ext_proc::v3::{HeaderMutation, ProcessingResponse};
use fleetroute_filter::contract;

use super::key::RouteKey;
use super::{Decision, decide};
use crate::config::RouterConfig;
use crate::request::reply as mutation;
use crate::state::{Event, Shared, Writer};
use crate::topology::{FleetId, ReplicaId};

const SECRET: &str = "sk-fleet-only-7f3a";

struct Rig {
    shared: Arc<Shared>,
    _w: Writer,
    _key: tempfile::NamedTempFile,
}

/// `base` serves the clients' name, `burst` its own, `paid` has its own key;
/// `mirror` is a fleet other stages can shadow to.
fn rig(stage: &str) -> Rig {
    let key = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(key.path(), format!("{SECRET}\n")).unwrap();
    let text = format!(
        r#"
grpc: {{ trusted_network: true }}
fleets:
  - {{ name: base, region: us, endpoints: ["10.0.0.1:1"] }}
  - {{ name: burst, region: us, endpoints: ["10.0.1.1:1"] }}
  - name: paid
    region: us
    endpoints: ["10.0.2.1:1"]
    credentials: {{ api_key_file: "{}" }}
  - {{ name: mirror, region: us, endpoints: ["10.0.3.1:1"] }}
stages:
{stage}
"#,
        key.path().display()
    );
    let cfg = RouterConfig::parse_valid(&text).unwrap();
    let (shared, mut w) = Writer::new(&cfg);
    let now = Instant::now();
    for f in 0..cfg.fleets.len() {
        for _ in 0..2 {
            w.apply(
                Event::Health {
                    generation: 1,
                    fleet: FleetId(f),
                    replica: ReplicaId(0),
                    ok: true,
                },
                now,
            );
        }
    }
    w.drain(now);
    Rig {
        shared,
        _w: w,
        _key: key,
    }
}

fn only(fleet: &str, extra: &str) -> String {
    format!(
        "  - {{ name: s, models: [llama], fleets: [{fleet}], routing: {{ policy: priority }}{extra} }}"
    )
}

fn key(model: &str, k: u64) -> RouteKey<'_> {
    RouteKey {
        model: Some(model),
        key: k,
        key_source: Some(contract::KeySource::User),
        ..Default::default()
    }
}

fn mutation_of(r: &ProcessingResponse) -> &HeaderMutation {
    match &r.response {
        Some(Response::RequestHeaders(h)) => h
            .response
            .as_ref()
            .unwrap()
            .header_mutation
            .as_ref()
            .unwrap(),
        other => panic!("not a headers reply: {other:?}"),
    }
}

fn set<'a>(m: &'a HeaderMutation, name: &str) -> Option<&'a [u8]> {
    m.set_headers
        .iter()
        .filter_map(|h| h.header.as_ref())
        .find(|h| h.key == name)
        .map(|h| h.raw_value.as_slice())
}

fn route(rig: &Rig, model: &str, k: u64) -> (Decision, ProcessingResponse) {
    let snap = rig.shared.snapshot();
    let d = decide(&snap, &key(model, k), 0).unwrap();
    let reply = mutation::route(&snap.topo, &d, 1, "test", Some(model));
    (d, reply)
}

#[test]
fn the_served_name_goes_with_the_decision_only_when_it_differs() {
    let r = rig(
        "  - { name: s, models: [llama, meta-llama/Llama-3.1-70B-Instruct], fleets: [{ name: burst, model: meta-llama/Llama-3.1-70B-Instruct }] }",
    );
    let (_, reply) = route(&r, "llama", 1);
    let m = mutation_of(&reply);
    assert_eq!(
        set(m, contract::SERVED_MODEL),
        Some(&b"meta-llama/Llama-3.1-70B-Instruct"[..])
    );
    assert_eq!(set(m, "authorization"), None);
    assert!(m.remove_headers.is_empty(), "{:?}", m.remove_headers);
    // The client already used the served name: nothing to rename.
    let (_, reply) = route(&r, "meta-llama/Llama-3.1-70B-Instruct", 1);
    assert_eq!(set(mutation_of(&reply), contract::SERVED_MODEL), None);

    let r = rig(&only("base", ""));
    let (_, reply) = route(&r, "llama", 1);
    assert_eq!(set(mutation_of(&reply), contract::SERVED_MODEL), None);
}

#[test]
fn the_audit_record_names_the_model_the_fleet_served() {
    let r = rig(
        "  - { name: s, models: [llama, meta-llama/Llama-3.1-70B-Instruct], fleets: [{ name: burst, model: meta-llama/Llama-3.1-70B-Instruct }] }",
    );
    let snap = r.shared.snapshot();
    for (asked, served) in [
        ("llama", Some("meta-llama/Llama-3.1-70B-Instruct")),
        ("meta-llama/Llama-3.1-70B-Instruct", None),
    ] {
        let k = key(asked, 1);
        let d = decide(&snap, &k, 0).unwrap();
        let ctx = crate::request::tenant::context(&snap, &d, &k);
        assert_eq!(&*ctx.model, asked);
        assert_eq!(ctx.model_served.as_deref(), served, "asked {asked}");
    }
}

#[test]
fn a_fleet_with_a_key_replaces_the_clients_credentials() {
    let r = rig(&only("paid", ""));
    let (_, reply) = route(&r, "llama", 1);
    let m = mutation_of(&reply);
    assert_eq!(
        set(m, "authorization"),
        Some(format!("Bearer {SECRET}").as_bytes())
    );
    for h in mutation::CLIENT_CREDENTIAL_HEADERS {
        assert!(m.remove_headers.iter().any(|x| x == h), "{h} kept");
    }
    // Nowhere else: not in the decision's tag, nor in any debug view.
    let snap = r.shared.snapshot();
    let md = format!("{:?}", reply.dynamic_metadata);
    assert!(!md.contains(SECRET), "{md}");
    assert!(!format!("{:?}", snap.topo).contains(SECRET));
    assert!(!format!("{:?}", snap.config).contains(SECRET));

    let r = rig(&only("base", ""));
    let (_, reply) = route(&r, "llama", 1);
    let m = mutation_of(&reply);
    assert_eq!(set(m, "authorization"), None, "the client's stays as it is");
    assert!(m.remove_headers.is_empty());
}

#[test]
fn no_mirror_carries_a_fleets_key_or_a_name_the_shadow_does_not_serve() {
    let shadow = ", experiment: { shadow: { fleet: mirror, percent: 100 } }";
    let mirrored = |fleets: &str| {
        let r = rig(&only(fleets, shadow));
        (0..20u64).any(|k| route(&r, "llama", k).0.shadow.is_some())
    };
    assert!(mirrored("base"), "the control case mirrors");
    assert!(!mirrored("paid"), "the paid fleet's key went to the mirror");
    assert!(!mirrored("{ name: burst, model: other-name }"));
}

#[test]
fn the_model_list_is_the_configs_names_once_each() {
    let r = rig(
        "  - { name: s, models: [llama, l3], fleets: [base] }\n  - { name: t, models: [t], fleets: [burst] }",
    );
    let snap = r.shared.snapshot();
    let reply = mutation::model_list(&snap.topo);
    let Some(Response::ImmediateResponse(ir)) = &reply.response else {
        panic!("not an immediate answer: {reply:?}");
    };
    assert_eq!(ir.status.as_ref().map(|s| s.code), Some(200));
    let v: serde_json::Value = serde_json::from_slice(&ir.body).unwrap();
    assert_eq!(v["object"], "list");
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["llama", "l3", "s", "t"]);
    assert!(
        v["data"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["object"] == "model")
    );
}
