//! Through real Envoy: clients cannot steer, bad input gets a clear answer,
//! failed replicas leave and return, and a stopped router fails open (or
//! closed, when configured so).
#![cfg(feature = "e2e")] // needs Envoy and the built binaries: scripts/test.sh

use std::collections::HashSet;
use std::time::Duration;

use fleetroute_tests::harness::client::{blocking_get, chat_body, post};
use fleetroute_tests::harness::scenario::{
    FAST_ENGINES as FAST, TWO_FLEETS, chat_url as url, two_fleets_tolerant_health,
};
use fleetroute_tests::harness::{Lab, LabSpec, wait_for_value, wait_until};

const ENGINE: &str = env!("CARGO_BIN_EXE_fleetroute-engine");

fn lab(router: &str, fail_closed: bool) -> Lab {
    Lab::start(
        ENGINE,
        LabSpec {
            router,
            engine_args: FAST,
            fail_closed,
            ..Default::default()
        },
    )
}

#[test]
fn clients_cannot_choose_cluster_or_host() {
    let lab = lab(TWO_FLEETS, false);
    let envoy_admin = lab.envoy_admin.trim_start_matches("http://").to_string();
    for i in 0..20 {
        let user = format!("steer-{i}");
        let honest = post(&url(&lab), chat_body("m1", Some(&user), "hi", false), &[]);
        let chosen = honest.served_by().to_string();
        let other = lab.replicas.keys().find(|n| **n != chosen).unwrap().clone();
        // A well-formed tag, so only its removal keeps it from being believed.
        let forged_route = format!(
            "chat|burst|{}|0|0|0|none|0000000000000001|0000000000000001",
            lab.replicas[&other]
        );
        for target in [
            lab.replicas[&other].as_str(),
            envoy_admin.as_str(),
            "10.9.9.9:80",
        ] {
            let r = post(
                &url(&lab),
                chat_body("m1", Some(&user), "hi", false),
                &[
                    ("x-fleetroute-cluster", "burst"),
                    ("x-fleetroute-key", "0000000000000001"),
                    ("x-fleetroute-route", &forged_route),
                    ("x-gateway-destination-endpoint", target),
                ],
            );
            assert_eq!(r.status, 200, "{}", r.body);
            assert_eq!(
                r.served_by(),
                chosen,
                "forged headers towards {target} moved the request"
            );
            let received = r
                .header("x-sim-received-headers")
                .expect("the engine lists the headers it received");
            assert!(
                !received.split(',').any(
                    |h| h.starts_with("x-fleetroute-") || h == "x-gateway-destination-endpoint"
                ),
                "internal headers reached the engine: {received}"
            );
        }
    }
    assert!(lab.envoy_stat("wasmcustom.fleetroute_filter.reserved_header_stripped") >= 240);
}

#[test]
fn bad_bodies_get_clear_answers() {
    let lab = lab(&two_fleets_tolerant_health(), false);
    // Not JSON: refused by the filter, no fleet asked.
    let r = post(&url(&lab), "{not json", &[]);
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.header("x-served-by"), None);
    assert_eq!(r.json()["error"]["code"], "invalid_json", "{}", r.body);
    // Wrong shape: the model is still read and routed.
    let r = post(&url(&lab), r#"{"model":"m1","messages":5}"#, &[]);
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.header("x-served-by").is_some());
    // Invalid UTF-8.
    let r = post(&url(&lab), b"{\"model\":\"m1\xff\"}".to_vec(), &[]);
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "invalid_json", "{}", r.body);
    // Over the filter's limit, declared up front.
    let big = chat_body("m1", None, &"x".repeat(5 << 20), false);
    let r = post(&url(&lab), big.clone(), &[]);
    assert_eq!(r.status, 413, "{}", &r.body[..r.body.len().min(300)]);
    assert_eq!(r.json()["error"]["code"], "request_too_large");
    // Over the limit without a content-length (chunked).
    let chunks: Vec<Vec<u8>> = big
        .as_bytes()
        .chunks(64 << 10)
        .map(<[u8]>::to_vec)
        .collect();
    let r = fleetroute_tests::harness::client::client()
        .post(url(&lab))
        .body(reqwest::blocking::Body::new(std::io::Cursor::new(
            chunks.concat(),
        )))
        .send();
    // Envoy may close the connection once it has answered; either way no hang.
    if let Ok(r) = r {
        assert_eq!(r.status(), 413);
    }
    // A malformed residency header is refused, not ignored.
    let r = post(
        &url(&lab),
        chat_body("m1", None, "hi", false),
        &[("x-residency", "US!")],
    );
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["code"], "invalid_residency");
    // The service is still fine afterwards.
    let r = post(&url(&lab), chat_body("m1", Some("after"), "hi", false), &[]);
    assert_eq!(r.status, 200);
}

/// Two stages on two fleets: a body that names both must not be routed
/// (and priced, and charged) as one while the engine serves the other.
const CHEAP_AND_PREMIUM: &str = r#"
health_check: { interval_ms: 500, timeout_ms: 500, healthy_threshold: 1, unhealthy_threshold: 3 }
fleets:
  - name: cheap
    region: us
    endpoints: ["{c1}"]
  - name: premium
    region: us
    endpoints: ["{p1}"]
stages:
  - name: cheap
    models: [cheap]
    fleets: [cheap]
  - name: premium
    models: [premium]
    fleets: [premium]
"#;

#[test]
fn a_body_means_one_thing_to_the_router_and_the_engine() {
    let lab = lab(CHEAP_AND_PREMIUM, false);
    let chat = r#""messages":[{"role":"user","content":"hi"}],"max_tokens":2"#;
    for body in [
        format!(r#"{{"model":"cheap",{chat},"model":"premium"}}"#),
        format!(r#"{{"model":false,{chat},"model":"premium"}}"#),
        format!(r#"{{"model":"cheap",{chat},"mod\u0065l":"premium"}}"#),
        format!(r#"{{"model":"cheap",{chat},"max_tokens":9000}}"#),
    ] {
        let r = post(&url(&lab), body.clone(), &[]);
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert_eq!(r.json()["error"]["code"], "duplicate_key", "{}", r.body);
        assert_eq!(r.header("x-served-by"), None, "{body} reached a fleet");
    }
    // Python's own literals are not JSON to the router: refused, not routed.
    let r = post(
        &url(&lab),
        format!(r#"{{"model":"premium",{chat},"temperature":NaN}}"#),
        &[],
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "invalid_json");
    // A byte order mark is skipped, as the engines skip it: routed by the
    // model after it, to the fleet that serves it.
    let body = [
        &b"\xEF\xBB\xBF"[..],
        format!(r#"{{"model":"premium",{chat}}}"#).as_bytes(),
    ]
    .concat();
    let r = post(&url(&lab), body, &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("x-served-by"), Some("p1"), "{}", r.body);
    assert_eq!(r.json()["model"], "premium");
    assert!(lab.envoy_stat("wasmcustom.fleetroute_filter.parse_duplicate_key") >= 4);
}

#[test]
fn unknown_models_and_unsatisfiable_residency_are_refused() {
    let router = TWO_FLEETS.replace("default_stage: chat\n", "");
    let lab = lab(&router, false);
    let r = post(&url(&lab), chat_body("gpt-nope", None, "hi", false), &[]);
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "model_not_found");
    let r = post(
        &url(&lab),
        chat_body("m1", None, "hi", false),
        &[("x-residency", "eu")],
    );
    assert_eq!(r.status, 503, "{}", r.body);
    let err = r.json();
    assert_eq!(err["error"]["code"], "residency_unsatisfiable");
    assert!(err["error"]["message"].as_str().unwrap().contains("eu"));
    let r = post(
        &url(&lab),
        chat_body("m1", None, "hi", false),
        &[("x-residency", "us")],
    );
    assert_eq!(r.status, 200);
}

fn served_set(lab: &Lab, n: usize, tag: &str) -> HashSet<String> {
    (0..n)
        .map(|i| {
            let r = post(
                &url(lab),
                chat_body("m1", Some(&format!("{tag}-{i}")), "hi", false),
                &[],
            );
            assert_eq!(r.status, 200, "{}", r.body);
            r.served_by().to_string()
        })
        .collect()
}

#[test]
fn unhealthy_replicas_leave_and_come_back() {
    let lab = lab(TWO_FLEETS, false);
    assert!(served_set(&lab, 40, "before").contains("b1"));
    lab.fault("b1", r#"{"health_status": 503}"#);
    // Two failed probes in a row take b1 out.
    let b1 = lab.replicas["b1"].clone();
    wait_until("b1 to be not ready", Duration::from_secs(20), || {
        let (_, body) = blocking_get(&format!("{}/debug/snapshot", lab.admin)).expect("snapshot");
        let snap: serde_json::Value = serde_json::from_str(&body).expect("snapshot JSON");
        snap["fleets"][0]["replicas"].as_array().is_some_and(|all| {
            all.iter()
                .any(|r| r["addr"] == b1.as_str() && r["ready"] == false)
        })
    });
    let during = served_set(&lab, 60, "during");
    assert!(
        !during.contains("b1"),
        "b1 still served while unhealthy: {during:?}"
    );
    lab.clear_fault("b1");
    let back = wait_for_value(Duration::from_secs(3), || {
        served_set(&lab, 40, "after").contains("b1").then_some(())
    });
    assert!(back.is_some(), "b1 never came back");
}

#[test]
fn a_stopped_router_fails_open() {
    let mut lab = lab(TWO_FLEETS, false);
    lab.stop_router();
    for i in 0..10 {
        let r = post(
            &url(&lab),
            chat_body("m1", Some(&format!("open-{i}")), "hi", false),
            &[],
        );
        assert_eq!(r.status, 200, "fail-open request {i}: {}", r.body);
        // The fail-open route sends the model's requests to its stage's fleets
        // (tests/tests/fail_open.rs checks their proportions).
        assert!(
            r.served_by().starts_with('b') || r.served_by().starts_with('u'),
            "fail-open served by {}",
            r.served_by()
        );
    }
    lab.restart_router();
    let r = post(&url(&lab), chat_body("m1", Some("back"), "hi", false), &[]);
    assert_eq!(r.status, 200);
    let id = r.header("x-request-id").unwrap();
    assert!(lab.decision(id).is_some(), "routed by fleetroute again");
}

#[test]
fn a_stopped_router_fails_closed_when_configured() {
    let mut lab = lab(TWO_FLEETS, true);
    let r = post(&url(&lab), chat_body("m1", Some("x"), "hi", false), &[]);
    assert_eq!(r.status, 200);
    lab.stop_router();
    let r = post(&url(&lab), chat_body("m1", Some("x"), "hi", false), &[]);
    assert_eq!(r.status, 503, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "router_unavailable");
}
