//! The admin API and the CLI against a running fleetroute (real Envoy
//! beside it): the CLI's `--json` is the API's JSON, its exit status tells a
//! value refused before sending (2) from a refusal by the API (1), and every
//! refusal over HTTP has one shape with the status its code names.
#![cfg(feature = "e2e")] // needs Envoy and the built binaries: scripts/test.sh

use std::process::Command;

use fleetroute_tests::harness::client::{blocking_get, blocking_send};
use fleetroute_tests::harness::scenario::FAST_ENGINES as FAST;
use fleetroute_tests::harness::{Lab, LabSpec};
use serde_json::Value;

const ENGINE: &str = env!("CARGO_BIN_EXE_fleetroute-engine");
const TOKEN: &str = "admin-api-token";

const ROUTER: &str = r#"
health_check: { interval_ms: 200, timeout_ms: 150 }
fleets:
  - name: base
    region: us
    endpoints: ["{b1}"]
  - name: burst
    region: us
    endpoints: ["{u1}"]
  - name: far
    region: eu
    endpoints: ["{f1}"]
stages:
  - name: chat
    models: [m1]
    fleets: [base, burst]
    residency: us
    routing: { policy: weighted }
  - name: batch
    models: [m2]
    fleets: [base, far]
    routing: { policy: priority, order: [base, far] }
"#;

/// Runs the CLI; returns (exit status, stdout, stderr).
fn cli(lab: &Lab, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(&lab.bins.fleetroute)
        .args(args)
        .env("FLEETROUTE_ADMIN", lab.admin.trim_start_matches("http://"))
        .env("FLEETROUTE_ADMIN_TOKEN", TOKEN)
        .output()
        .expect("run the fleetroute CLI");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The keys of every object, recursively: the shape of a JSON document.
fn shape(v: &Value, at: &str, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                let p = format!("{at}.{k}");
                out.push(p.clone());
                shape(v, &p, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|v| shape(v, &format!("{at}[]"), out)),
        _ => {}
    }
}

fn shape_of(v: &Value) -> Vec<String> {
    let mut out = Vec::new();
    shape(v, "", &mut out);
    out.sort();
    out.dedup();
    out
}

#[test]
fn the_cli_and_the_api_speak_the_same_types_and_errors() {
    let lab = Lab::start(
        ENGINE,
        LabSpec {
            router: ROUTER,
            engine_args: FAST,
            admin_token: Some(TOKEN),
            ..Default::default()
        },
    );

    // --json prints the API's view: same document shape, same values that
    // do not move with traffic.
    let (code, out, err) = cli(&lab, &["endpoint", "get", "chat", "--json"]);
    assert_eq!(code, 0, "{err}");
    let from_cli: Value = serde_json::from_str(&out).expect("--json is JSON");
    let (status, body) = blocking_get(&format!("{}/v1/stage?name=chat", lab.admin)).unwrap();
    assert_eq!(status, 200, "{body}");
    let from_api: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(shape_of(&from_cli), shape_of(&from_api));
    for field in ["name", "residency", "routing", "experiment"] {
        assert_eq!(from_cli[field], from_api[field], "{field}");
    }
    assert_eq!(from_cli["fleets"][1]["replicas"][0]["state"], "ready");

    // A value the request's own checks refuse never leaves the CLI: exit 2.
    let (code, _, err) = cli(
        &lab,
        &["fleet", "scale", "base", "--min", "3", "--max", "1"],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("min 3 is above max 1"), "{err}");
    // Refusals by the API: exit 1 with the API's status and message.
    for (args, want) in [
        (
            &["split", "set", "nope", "base", "--weight", "1"][..],
            "404 Not Found: no stage 'nope'",
        ),
        (
            &["split", "set", "batch", "base", "--weight", "2"][..],
            "409 Conflict: stage 'batch' uses the priority policy",
        ),
        (
            &["experiment", "set", "chat", "--shadow", "far=5"][..],
            "409 Conflict: stages[0].experiment.shadow.fleet",
        ),
        (&["metrics", "nope"][..], "404 Not Found: no stage 'nope'"),
    ] {
        let (code, _, err) = cli(&lab, args);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }

    // Over HTTP: each refusal's status and its code, in one shape.
    let post = |path: &str, body: &str| {
        blocking_send("POST", &format!("{}{path}", lab.admin), body).expect("admin API")
    };
    for (path, body, status, code) in [
        (
            "/v1/split",
            r#"{"stage":"chat","fleet":"base","weight":-1}"#,
            401,
            "unauthorized",
        ),
        ("/v1/nothing", "{}", 404, "not_found"),
    ] {
        let (s, text) = post(path, body);
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (status, Some(code)),
            "{text}"
        );
        assert!(v["error"]["message"].is_string(), "{text}");
    }
}
