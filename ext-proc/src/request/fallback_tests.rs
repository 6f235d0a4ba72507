//! Fallbacks on the request path: an unhealthy stage's request served by
//! its fallback inside the residency it named, a long prompt by the
//! longer-context stage, and the client told which and why.

use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use envoy_types::pb::envoy::service::ext_proc::v3::{HttpHeaders, ProcessingResponse};
use fleetroute_filter::contract;

use super::{Answer, route_request};
use crate::admission::Admission;
use crate::config::RouterConfig;
use crate::state::{Event, Shared, Writer};
use crate::topology::{FleetId, ReplicaId};

const CONFIG: &str = r#"
grpc: { trusted_network: true }
fleets:
  - { name: big-eu, region: eu, endpoints: ["10.0.0.1:1"] }
  - { name: small-us, region: us, endpoints: ["10.0.2.1:1"] }
  - { name: small-eu, region: eu, endpoints: ["10.0.1.1:1"] }
  - { name: long-eu, region: eu, endpoints: ["10.0.3.1:1"] }
stages:
  - name: big
    models: [big-model]
    fleets: [big-eu]
    residency: eu
    context_tokens: 1000
    fallbacks:
      - { stage: small, on: [unhealthy, saturated] }
      - { stage: long, on: [context] }
  - name: small
    models: [small-model]
    fleets: [small-us, small-eu]
    routing: { policy: priority }
  - { name: long, models: [long-model], fleets: [long-eu], context_tokens: 100000 }
"#;

/// The config's fleets, healthy or not by name.
fn rig(healthy: &[&str]) -> (Arc<Shared>, Writer) {
    rig_of(CONFIG, healthy)
}

fn rig_of(config: &str, healthy: &[&str]) -> (Arc<Shared>, Writer) {
    let cfg = RouterConfig::parse_valid(config).unwrap();
    let (shared, mut w) = Writer::new(&cfg);
    let now = Instant::now();
    for (f, fleet) in cfg.fleets.iter().enumerate() {
        for _ in 0..2 {
            w.apply(
                Event::Health {
                    generation: 1,
                    fleet: FleetId(f),
                    replica: ReplicaId(0),
                    ok: healthy.contains(&fleet.name.as_str()),
                },
                now,
            );
        }
    }
    w.drain(now);
    (shared, w)
}

fn headers(model: &str, prompt_tokens: u32, key: u64) -> HttpHeaders {
    let h = |k: &str, v: String| HeaderValue {
        key: k.into(),
        raw_value: v.into_bytes(),
        ..Default::default()
    };
    HttpHeaders {
        headers: Some(HeaderMap {
            headers: vec![
                h(contract::MODEL, model.into()),
                h(contract::KEY, key.to_string()),
                h(contract::KEY_SOURCE, "user".into()),
                h(contract::PROMPT_TOKENS, prompt_tokens.to_string()),
            ],
        }),
        ..Default::default()
    }
}

fn ask(shared: &Shared, model: &str, prompt_tokens: u32, key: u64) -> ProcessingResponse {
    let admission = Admission::new(Instant::now());
    let h = headers(model, prompt_tokens, key);
    let answer = futures::executor::block_on(route_request(shared, &admission, &h, None));
    match answer {
        Answer::Now(r) => r.response,
        Answer::Held(_) => panic!("held without admission"),
    }
}

/// The request headers a routing reply sets.
fn set(r: &ProcessingResponse, name: &str) -> Option<String> {
    let Some(Response::RequestHeaders(h)) = &r.response else {
        return None;
    };
    let m = h.response.as_ref()?.header_mutation.as_ref()?;
    m.set_headers
        .iter()
        .filter_map(|h| h.header.as_ref())
        .find(|h| h.key == name)
        .map(|h| String::from_utf8_lossy(&h.raw_value).into_owned())
}

fn status(r: &ProcessingResponse) -> Option<i32> {
    match &r.response {
        Some(Response::ImmediateResponse(i)) => Some(i.status.as_ref()?.code),
        _ => None,
    }
}

#[test]
fn an_unhealthy_stage_falls_back_inside_its_own_residency() {
    let (shared, _w) = rig(&["small-us", "small-eu", "long-eu"]);
    for k in 0..50 {
        let r = ask(&shared, "big-model", 100, k);
        // small's priority order puts small-us first: the named stage's
        // residency (eu) keeps the request out of it.
        assert_eq!(set(&r, contract::CLUSTER).as_deref(), Some("small-eu"));
        assert_eq!(
            set(&r, contract::FALLBACK).as_deref(),
            Some("small; reason=unhealthy")
        );
        assert_eq!(
            set(&r, contract::SERVED_MODEL).as_deref(),
            Some("small-model")
        );
    }
}

#[test]
fn no_fallback_inside_the_residency_leaves_the_stages_own_error() {
    let (shared, _w) = rig(&["small-us", "long-eu"]);
    let r = ask(&shared, "big-model", 100, 1);
    assert_eq!(status(&r), Some(503), "{r:?}");
    assert!(format!("{r:?}").contains("no_ready_replica"));
}

#[test]
fn a_long_prompt_goes_to_the_longer_context_stage_and_a_short_one_stays() {
    let (shared, _w) = rig(&["big-eu", "small-eu", "long-eu"]);
    let r = ask(&shared, "big-model", 5000, 1);
    assert_eq!(set(&r, contract::CLUSTER).as_deref(), Some("long-eu"));
    assert_eq!(
        set(&r, contract::FALLBACK).as_deref(),
        Some("long; reason=context")
    );
    let r = ask(&shared, "big-model", 1000, 1);
    assert_eq!(set(&r, contract::CLUSTER).as_deref(), Some("big-eu"));
    assert_eq!(set(&r, contract::FALLBACK), None);
    assert_eq!(set(&r, contract::SERVED_MODEL), None);
}

#[test]
fn a_stage_without_a_fallback_for_the_condition_answers_itself() {
    // `long` has no fallbacks: its unhealthy fleet is a 503.
    let (shared, _w) = rig(&["big-eu", "small-eu"]);
    let r = ask(&shared, "long-model", 100, 1);
    assert_eq!(status(&r), Some(503), "{r:?}");
}

#[test]
fn an_upstream_fallback_pairs_the_chosen_replica_with_the_fallbacks() {
    let config = CONFIG.replace("on: [unhealthy, saturated]", "on: [upstream]");
    let (shared, _w) = rig_of(&config, &["big-eu", "small-us", "small-eu", "long-eu"]);
    let r = ask(&shared, "big-model", 100, 1);
    assert_eq!(
        set(&r, contract::CLUSTER).as_deref(),
        Some("retry/big-eu/small-eu")
    );
    assert_eq!(
        set(&r, contract::UPSTREAM_FALLBACK).as_deref(),
        Some("small|small-model")
    );
    // Decided now, sent as named: no fallback header, no rename.
    assert_eq!(set(&r, contract::FALLBACK), None);
    assert_eq!(set(&r, contract::SERVED_MODEL), None);
    let hosts = format!("{:?}", r.dynamic_metadata);
    assert!(hosts.contains("10.0.0.1:1,10.0.1.1:1"), "{hosts}");
    // No replica of small inside eu: routed as usual, to the fleet.
    let (shared, _w) = rig_of(&config, &["big-eu", "small-us", "long-eu"]);
    let r = ask(&shared, "big-model", 100, 1);
    assert_eq!(set(&r, contract::CLUSTER).as_deref(), Some("big-eu"));
    assert_eq!(set(&r, contract::UPSTREAM_FALLBACK), None);
}
