//! Through real Envoy: fleetroute serves the members of every fleet and
//! fail-open cluster by EDS. After every membership change Envoy's
//! `/clusters` lists exactly fleetroute's members; requests to new replicas
//! succeed and a steady load through grow and shrink fails no request;
//! Envoy keeps its members while fleetroute is down (fail-open serves them)
//! and gets the full current set when fleetroute is back; an Envoy started
//! before fleetroute waits out its initial fetch timeout, then catches up;
//! the `--static-endpoints` rendering serves the config's members with no
//! EDS stream at all.
#![cfg(feature = "e2e")] // needs Envoy and the built binaries: scripts/test.sh

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::time::{Duration, Instant};

use fleetroute_tests::harness::client::{blocking_get, chat_body, chat_body_tokens, client, post};
use fleetroute_tests::harness::scenario::{FAST_ENGINES, chat_url};
use fleetroute_tests::harness::steady_load::{LoadSpec, SteadyLoad};
use fleetroute_tests::harness::{Lab, LabSpec, wait_for_value, wait_until};

const ENGINE: &str = env!("CARGO_BIN_EXE_fleetroute-engine");
const TOKEN: &str = "eds-token";

/// Two fleets under one stage; health checks that ride out a loaded machine.
const ROUTER: &str = r#"
health_check: { interval_ms: 500, timeout_ms: 500, healthy_threshold: 1, unhealthy_threshold: 3 }
default_stage: chat
fleets:
  - name: base
    region: us
    endpoints: ["{b1}", "{b2}"]
  - name: burst
    region: us
    endpoints: ["{u1}", "{u2}"]
stages:
  - name: chat
    models: [m1]
    fleets: [base, burst]
    routing: { policy: weighted, weights: { base: 1, burst: 1 } }
"#;

/// The fail-open cluster of `chat` holds both fleets.
const STAGES: &[(&str, &[&str])] = &[("chat", &["base", "burst"])];

fn lab(engine_args: &'static [&'static str], edit: Option<fn(&str) -> String>) -> Lab {
    Lab::start(
        ENGINE,
        LabSpec {
            router: ROUTER,
            engine_args,
            admin_token: Some(TOKEN),
            envoy_edit: edit,
            ..Default::default()
        },
    )
}

type Members = BTreeMap<String, BTreeSet<String>>;

/// fleetroute's members per fleet, from its snapshot.
fn router_members(lab: &Lab) -> Option<Members> {
    let (_, body) = blocking_get(&format!("{}/debug/snapshot", lab.admin))?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    let mut out = Members::new();
    for f in v["fleets"].as_array()? {
        let addrs = f["replicas"]
            .as_array()?
            .iter()
            .filter_map(|r| r["addr"].as_str().map(str::to_string))
            .collect();
        out.insert(f["name"].as_str()?.to_string(), addrs);
    }
    Some(out)
}

/// What Envoy should list: every fleet as fleetroute has it, and each
/// stage's fail-open cluster with its fleets' members.
fn expected(router: &Members) -> Members {
    let mut want = router.clone();
    for (stage, fleets) in STAGES {
        let all = fleets
            .iter()
            .flat_map(|f| router.get(*f).cloned().unwrap_or_default())
            .collect();
        want.insert(format!("fallback/{stage}"), all);
    }
    want
}

/// Envoy's members of the clusters in `want`.
fn envoy_members(lab: &Lab, want: &Members) -> Option<Members> {
    let all = lab.envoy_members()?;
    Some(
        want.keys()
            .map(|c| {
                let hosts = all.get(c).map(|h| h.keys().cloned().collect());
                (c.clone(), hosts.unwrap_or_default())
            })
            .collect(),
    )
}

/// Waits until Envoy lists exactly fleetroute's members everywhere; returns them.
fn wait_agreement(lab: &Lab, what: &str) -> Members {
    wait_agreement_on(lab, what, |_| true)
}

/// Like `wait_agreement`, on a member set that also passes `settled` (a
/// removed replica stays listed, leaving, until its requests end).
fn wait_agreement_on(lab: &Lab, what: &str, settled: impl Fn(&Members) -> bool) -> Members {
    let mut last = (Members::new(), None);
    let agreed = wait_for_value(Duration::from_secs(30), || {
        let want = expected(&router_members(lab)?);
        let got = envoy_members(lab, &want)?;
        if got == want && settled(&want) {
            return Some(want);
        }
        last = (want, Some(got));
        None
    });
    agreed.unwrap_or_else(|| {
        panic!(
            "{what}: Envoy never listed fleetroute's members\nfleetroute: {:?}\nenvoy:      {:?}",
            last.0, last.1
        )
    })
}

/// The router config with `base`'s members replaced.
fn with_base(lab: &Lab, base: &[&str]) -> String {
    let text = std::fs::read_to_string(&lab.router_path).unwrap();
    let start = text.find("endpoints: [").unwrap();
    let end = start + text[start..].find(']').unwrap() + 1;
    let list: Vec<String> = base.iter().map(|a| format!("\"{a}\"")).collect();
    format!(
        "{}endpoints: [{}]{}",
        &text[..start],
        list.join(", "),
        &text[end..]
    )
}

/// Applies the router config through the admin API (the call returns once
/// the writer installed it); then the time until Envoy's `/clusters` shows
/// exactly fleetroute's new members, polled without pause.
fn reload_and_time(lab: &Lab, text: &str) -> Duration {
    std::fs::write(&lab.router_path, text).unwrap();
    let start = Instant::now();
    let r = client()
        .post(format!("{}/v1/reload", lab.admin))
        .header("authorization", format!("Bearer {TOKEN}"))
        .send()
        .expect("reload");
    assert_eq!(r.status(), 200, "{}", r.text().unwrap_or_default());
    let want = expected(&router_members(lab).expect("fleetroute's members"));
    let deadline = start + Duration::from_secs(30);
    loop {
        if envoy_members(lab, &want).as_ref() == Some(&want) {
            return start.elapsed();
        }
        assert!(
            Instant::now() < deadline,
            "Envoy did not follow the reload: want {want:?}, has {:?}",
            envoy_members(lab, &want)
        );
    }
}

fn ms(d: &[Duration]) -> String {
    let v: Vec<String> = d
        .iter()
        .map(|d| format!("{:.1}", d.as_secs_f64() * 1e3))
        .collect();
    v.join(", ")
}

#[test]
fn envoy_follows_fleetroutes_members_through_grow_and_shrink_under_load() {
    let lab = lab(FAST_ENGINES, None);
    let start = wait_agreement(&lab, "at start");
    assert_eq!(start["base"].len(), 2);
    assert_eq!(start["fallback/chat"].len(), 4);
    // One stream per Envoy: every cluster shares one config source.
    let metrics = blocking_get(&format!("{}/metrics", lab.admin)).unwrap().1;
    assert!(
        metrics.lines().any(|l| l == "fleetroute_eds_streams 1"),
        "expected one EDS stream:\n{}",
        metrics
            .lines()
            .filter(|l| l.contains("eds"))
            .collect::<Vec<_>>()
            .join("\n")
    );

    let extra = lab.start_replicas(&["b3", "b4"]);
    let (b1, b2) = (lab.replicas["b1"].clone(), lab.replicas["b2"].clone());
    let (b3, b4) = (extra.replicas["b3"].clone(), extra.replicas["b4"].clone());
    let two = with_base(&lab, &[&b1, &b2]);
    let four = with_base(&lab, &[&b1, &b2, &b3, &b4]);

    let load = SteadyLoad::start(&lab, LoadSpec::default());
    wait_until("load to start", Duration::from_secs(30), || {
        load.sent() >= 20
    });
    let (mut grow, mut shrink) = (Vec::new(), Vec::new());
    for round in 0..3 {
        grow.push(reload_and_time(&lab, &four));
        let members = wait_agreement(&lab, "after growing to 4");
        assert_eq!(members["base"].len(), 4);
        assert_eq!(members["fallback/chat"].len(), 6);
        if round == 0 {
            // The new replicas take requests once fleetroute found them healthy.
            wait_until("the new replicas to serve", Duration::from_secs(60), || {
                load.served("b3") > 0 && load.served("b4") > 0
            });
        }
        let before = load.sent();
        wait_until("load on 4 replicas", Duration::from_secs(30), || {
            load.sent() >= before + 40
        });
        shrink.push(reload_and_time(&lab, &two));
        let members = wait_agreement_on(&lab, "after shrinking to 2", |m| m["base"].len() == 2);
        assert_eq!(members["base"], BTreeSet::from([b1.clone(), b2.clone()]));
        assert_eq!(members["fallback/chat"].len(), 4);
        let before = load.sent();
        wait_until("load on 2 replicas", Duration::from_secs(30), || {
            load.sent() >= before + 40
        });
    }
    let (sent, failed) = load.finish();
    eprintln!(
        "EDS propagation (reload request -> Envoy /clusters exact), ms: grow 2->4 [{}], shrink 4->2 [{}]; {sent} requests under load",
        ms(&grow),
        ms(&shrink)
    );
    assert!(sent >= 200, "only {sent} requests under load");
    assert_eq!(
        failed, 0,
        "{failed} of {sent} requests failed while members changed"
    );
    // The removed replicas are not in Envoy's clusters anymore, and nothing
    // is in flight to them: they can go.
    lab.wait_settled();
    drop(extra);
}

#[test]
fn envoy_keeps_its_members_while_fleetroute_is_down_and_resyncs_on_restart() {
    let mut lab = lab(FAST_ENGINES, None);
    let members = wait_agreement(&lab, "at start");
    // Fleet clusters carry fleetroute's health, fail-open clusters do not.
    let envoy = lab.envoy_members().unwrap();
    for host in envoy["base"].values() {
        assert!(
            host.contains(&"eds_health_status=HEALTHY".to_string()),
            "{host:?}"
        );
    }
    for host in envoy["fallback/chat"].values() {
        assert!(
            !host
                .iter()
                .any(|f| f.contains("eds_health_status=UNHEALTHY")),
            "{host:?}"
        );
    }

    lab.stop_router();
    // Fail-open serves from the members Envoy keeps.
    for i in 0..20 {
        let r = post(
            &chat_url(&lab),
            chat_body("m1", Some(&format!("down-{i}")), "hi", false),
            &[],
        );
        assert_eq!(r.status, 200, "fail-open with fleetroute down: {}", r.body);
    }
    assert_eq!(
        envoy_members(&lab, &members).as_ref(),
        Some(&members),
        "Envoy dropped members while fleetroute was down"
    );
    // The config changes while fleetroute is down: burst loses u2.
    let text = std::fs::read_to_string(&lab.router_path)
        .unwrap()
        .replace(&format!(", \"{}\"", lab.replicas["u2"]), "");
    std::fs::write(&lab.router_path, text).unwrap();
    let back = Instant::now();
    lab.restart_router();
    let members = wait_agreement(&lab, "after fleetroute restarted");
    let resync = back.elapsed();
    assert_eq!(
        members["burst"],
        BTreeSet::from([lab.replicas["u1"].clone()])
    );
    assert_eq!(members["fallback/chat"].len(), 3);
    eprintln!(
        "EDS resync after a fleetroute restart (start -> Envoy /clusters exact): {:.0} ms",
        resync.as_secs_f64() * 1e3
    );
    let r = post(
        &chat_url(&lab),
        chat_body("m1", Some("after"), "hi", false),
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        lab.decision(r.header("x-request-id").unwrap()).is_some(),
        "routed by fleetroute again"
    );
}

/// Envoy waits this long for fleetroute's first answer in this scenario.
fn short_initial_fetch(text: &str) -> String {
    assert!(
        text.contains("initial_fetch_timeout: 10s"),
        "the template's timeout moved"
    );
    text.replace("initial_fetch_timeout: 10s", "initial_fetch_timeout: 3s")
}

#[test]
fn an_envoy_started_before_fleetroute_waits_then_catches_up() {
    let mut lab = lab(FAST_ENGINES, Some(short_initial_fetch));
    wait_agreement(&lab, "at start");
    lab.stop_router();
    lab.restart_envoy();
    // Without fleetroute, Envoy starts once the initial fetch timed out, with
    // no members: nothing can be served.
    lab.wait_envoy_ready();
    assert!(lab.envoy_stat("cluster.base.init_fetch_timeout") >= 1);
    let envoy = lab.envoy_members().unwrap();
    assert!(
        envoy["base"].is_empty() && envoy["fallback/chat"].is_empty(),
        "{envoy:?}"
    );
    let r = post(
        &chat_url(&lab),
        chat_body("m1", Some("early"), "hi", false),
        &[],
    );
    assert_eq!(r.status, 503, "{}", r.body);
    // fleetroute comes up: Envoy's stream reconnects and fills the clusters.
    let up = Instant::now();
    lab.restart_router();
    wait_agreement(&lab, "after fleetroute came up");
    eprintln!(
        "EDS after a late fleetroute (start -> Envoy /clusters exact): {:.0} ms",
        up.elapsed().as_secs_f64() * 1e3
    );
    let r = post(
        &chat_url(&lab),
        chat_body("m1", Some("late"), "hi", false),
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
fn a_draining_replica_stays_listed_as_draining_and_finishes_its_stream() {
    let lab = lab(
        &[
            "--prefill-tokens-per-sec",
            "10000000",
            "--decode-ms-per-token",
            "20",
        ],
        None,
    );
    wait_agreement(&lab, "at start");
    let mut stream = client()
        .post(chat_url(&lab))
        .header("content-type", "application/json")
        .body(chat_body_tokens("m1", Some("long"), "long", true, 80))
        .send()
        .expect("a stream");
    assert_eq!(stream.status(), 200);
    let name = stream.headers()["x-served-by"]
        .to_str()
        .unwrap()
        .to_string();
    let addr = lab.replicas[&name].clone();
    let fleet = if name.starts_with('b') {
        "base"
    } else {
        "burst"
    };
    let (ok, out, err) = lab.cli(&["replica", "drain", &addr], Some(TOKEN));
    assert!(ok, "{out}{err}");
    // Still a member, marked draining, in the fleet and fail-open clusters.
    wait_until("Envoy to see the drain", Duration::from_secs(20), || {
        let Some(all) = lab.envoy_members() else {
            return false;
        };
        ["fallback/chat", fleet].iter().all(|c| {
            all[*c]
                .get(&addr)
                .is_some_and(|f| f.contains(&"eds_health_status=DRAINING".to_string()))
        })
    });
    let mut body = String::new();
    stream.read_to_string(&mut body).expect("the stream's body");
    assert!(
        body.trim_end().ends_with("[DONE]"),
        "the in-flight stream was cut: {body}"
    );
    let r = post(
        &chat_url(&lab),
        chat_body("m1", Some("long"), "next", false),
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_ne!(r.served_by(), name, "a draining replica took a new request");
}

#[test]
fn the_static_rendering_serves_the_config_members_without_eds() {
    let lab = Lab::start(
        ENGINE,
        LabSpec {
            router: ROUTER,
            engine_args: FAST_ENGINES,
            static_endpoints: true,
            ..Default::default()
        },
    );
    wait_agreement(&lab, "static clusters");
    let r = post(
        &chat_url(&lab),
        chat_body("m1", Some("static"), "hi", false),
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(lab.decision(r.header("x-request-id").unwrap()).is_some());
    let metrics = blocking_get(&format!("{}/metrics", lab.admin)).unwrap().1;
    assert!(
        metrics.lines().any(|l| l == "fleetroute_eds_streams 0"),
        "a static bootstrap opened an EDS stream"
    );
}
