//! The admin API in process, against a real writer: each refusal's status
//! and the one error shape, and views the CLI can read back.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, header};
use tower::ServiceExt;

use super::api::{self, Applied, ErrorBody, ErrorCode, StageView};
use super::{AdminState, router};
use crate::config::RouterConfig;
use crate::reload::Reloader;
use crate::state::{Shared, Writer};

const TOKEN: &str = "s3cret";

const CONFIG: &str = "\
fleets:
  - { name: a, region: us, endpoints: [\"10.0.0.1:8000\"] }
  - { name: b, region: us, endpoints: [\"10.0.0.2:8000\"] }
  - { name: far, region: eu, endpoints: [\"10.0.0.3:8000\"] }
stages:
  - name: chat
    models: [m]
    fleets: [a, b]
    residency: us
    routing: { policy: weighted }
  - name: batch
    models: [n]
    fleets: [a, far]
    routing: { policy: priority, order: [a, far] }
";

struct Api {
    app: Router,
    shared: Arc<Shared>,
    /// Holds the config file the reloader reads.
    file: tempfile::NamedTempFile,
}

/// How the writer behind the API runs.
enum WriterIs {
    Running,
    Stopped,
    /// Alive but never answering.
    Stuck,
}

fn api(writer_is: WriterIs, token: Option<&str>) -> Api {
    let cfg = RouterConfig::parse_valid(CONFIG).unwrap();
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), CONFIG).unwrap();
    let (shared, writer) = Writer::new(&cfg);
    let mut state = AdminState::new(
        shared.clone(),
        Reloader::new(shared.clone(), file.path().to_path_buf()),
        token.map(str::to_string),
    );
    match writer_is {
        WriterIs::Running => drop(tokio::spawn(writer.run())),
        WriterIs::Stopped => drop(writer),
        WriterIs::Stuck => {
            state.change_timeout = Duration::from_millis(50);
            // Kept alive and never run: the change waits in its queue.
            std::mem::forget(writer);
        }
    }
    Api {
        app: router(state),
        shared,
        file,
    }
}

async fn call(
    api: &Api,
    method: &str,
    path: &str,
    body: &str,
    token: Option<&str>,
) -> (u16, String) {
    let mut req = Request::builder().method(method).uri(path);
    if let Some(t) = token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let resp = api
        .app
        .clone()
        .oneshot(req.body(Body::from(body.to_string())).unwrap())
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

/// A refusal: its status, and the one error shape whose code agrees with it.
async fn refused(
    api: &Api,
    method: &str,
    path: &str,
    body: &str,
    token: Option<&str>,
) -> (u16, ErrorBody) {
    let (status, text) = call(api, method, path, body, token).await;
    let e: ErrorBody = serde_json::from_str(&text).unwrap_or_else(|err| {
        panic!("{method} {path}: {status} {text:?} is not the error shape: {err}")
    });
    assert_eq!(e.error.code.status(), status, "{text}");
    assert!(!e.error.message.is_empty());
    (status, e)
}

async fn post_ok(api: &Api, path: &str, body: &str) -> String {
    let (status, text) = call(api, "POST", path, body, Some(TOKEN)).await;
    assert_eq!(status, 200, "{path} {body}: {text}");
    serde_json::from_str::<Applied>(&text).unwrap().applied
}

#[tokio::test]
async fn malformed_and_out_of_range_changes_are_400() {
    let api = api(WriterIs::Running, Some(TOKEN));
    for (path, body) in [
        (api::SPLIT, r#"{"stage":"chat","fleet":"a","weight":-1}"#),
        (api::SPLIT, r#"{"stage":"chat","fleet":"a"}"#),
        (
            api::SPLIT,
            r#"{"stage":"chat","fleet":"a","weight":1,"extra":0}"#,
        ),
        (api::SPLIT, "not json"),
        (api::SCALE, r#"{"fleet":"a","min":5,"max":2}"#),
        (
            api::EXPERIMENT,
            r#"{"stage":"chat","experiment":{"ab":{"control":"a","variants":[{"fleet":"b","percent":101}]}}}"#,
        ),
        (
            api::EXPERIMENT,
            r#"{"stage":"chat","experiment":{"ab":{"control":"a","variants":[{"fleet":"a","percent":10}]}}}"#,
        ),
        (
            api::EXPERIMENT,
            r#"{"stage":"chat","experiment":{"shadow":{"fleet":"b","percent":-1}}}"#,
        ),
    ] {
        let (status, e) = refused(&api, "POST", path, body, Some(TOKEN)).await;
        assert_eq!((status, e.error.code), (400, ErrorCode::Invalid), "{body}");
    }
    let (_, e) = refused(&api, "GET", "/v1/stage", "", None).await;
    assert_eq!(
        e.error.code,
        ErrorCode::Invalid,
        "a stage view needs ?name="
    );
    // Nothing was applied.
    let snap = api.shared.snapshot();
    assert_eq!(snap.topo.generation, 1);
    assert!(snap.config.fleets[0].hosts.is_none());
}

#[tokio::test]
async fn unknown_stages_fleets_replicas_and_paths_are_404() {
    let api = api(WriterIs::Running, Some(TOKEN));
    for (method, path, body, needle) in [
        (
            "POST",
            api::SPLIT,
            r#"{"stage":"nope","fleet":"a","weight":1}"#,
            "no stage 'nope'",
        ),
        (
            "POST",
            api::SPLIT,
            r#"{"stage":"chat","fleet":"far","weight":1}"#,
            "not in stage",
        ),
        (
            "POST",
            api::SCALE,
            r#"{"fleet":"nope","min":0,"max":1}"#,
            "no fleet 'nope'",
        ),
        (
            "POST",
            api::DRAIN,
            r#"{"replica":"10.9.9.9:1"}"#,
            "no replica",
        ),
        (
            "POST",
            api::EXPERIMENT,
            r#"{"stage":"chat","experiment":{"shadow":{"fleet":"ghost","percent":5}}}"#,
            "unknown fleet 'ghost'",
        ),
        (
            "POST",
            api::EXPERIMENT,
            r#"{"stage":"nope","experiment":{}}"#,
            "no stage",
        ),
        ("GET", "/v1/stage?name=nope", "", "no stage 'nope'"),
        ("GET", "/v1/nothing-here", "", "no such path"),
    ] {
        let (status, e) = refused(&api, method, path, body, Some(TOKEN)).await;
        assert_eq!(
            (status, e.error.code),
            (404, ErrorCode::NotFound),
            "{path} {body}"
        );
        assert!(e.error.message.contains(needle), "{}", e.error.message);
    }
}

#[tokio::test]
async fn changes_the_running_config_cannot_take_are_409() {
    let api = api(WriterIs::Running, Some(TOKEN));
    post_ok(
        &api,
        api::SPLIT,
        r#"{"stage":"chat","fleet":"b","weight":0}"#,
    )
    .await;
    for (body, path, needle) in [
        // Weights belong to the weighted policy; batch is a priority stage.
        (
            r#"{"stage":"batch","fleet":"a","weight":2}"#,
            api::SPLIT,
            "priority policy",
        ),
        // b weighs 0 (set above): a at 0 too would leave chat no fleet.
        (
            r#"{"stage":"chat","fleet":"a","weight":0}"#,
            api::SPLIT,
            "no fleet with a weight",
        ),
        // A shadow to an eu fleet would take chat's traffic out of its residency.
        (
            r#"{"stage":"chat","experiment":{"shadow":{"fleet":"far","percent":5}}}"#,
            api::EXPERIMENT,
            "residency",
        ),
        // An A/B arm on a fleet the stage does not have.
        (
            r#"{"stage":"chat","experiment":{"ab":{"control":"a","variants":[{"fleet":"far","percent":5}]}}}"#,
            api::EXPERIMENT,
            "not in stages[0].fleets",
        ),
    ] {
        let (status, e) = refused(&api, "POST", path, body, Some(TOKEN)).await;
        assert_eq!((status, e.error.code), (409, ErrorCode::Conflict), "{body}");
        assert!(e.error.message.contains(needle), "{}", e.error.message);
    }
    // A refused change leaves everything as it was.
    let snap = api.shared.snapshot();
    let chat = &snap.config.stages[0];
    assert!(chat.experiment.ab.is_none() && chat.experiment.shadow.is_none());
    let crate::config::RoutingConfig::Weighted(w) = &chat.routing else {
        panic!("stage chat is weighted");
    };
    assert_eq!(w.weights.get("a"), None);
}

#[tokio::test]
async fn a_stopped_writer_is_503() {
    let api = api(WriterIs::Stopped, Some(TOKEN));
    for (path, body) in [
        (api::SPLIT, r#"{"stage":"chat","fleet":"a","weight":2}"#),
        (api::DRAIN, r#"{"replica":"10.0.0.1:8000"}"#),
        (api::RELOAD, ""),
    ] {
        let (status, e) = refused(&api, "POST", path, body, Some(TOKEN)).await;
        assert_eq!(
            (status, e.error.code),
            (503, ErrorCode::Unavailable),
            "{path}"
        );
        assert!(e.error.message.contains("stopped"), "{}", e.error.message);
    }
    // Reads still answer from the last snapshot.
    let (status, _) = call(&api, "GET", "/v1/stage?name=chat", "", None).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn a_writer_that_does_not_answer_is_503() {
    let api = api(WriterIs::Stuck, Some(TOKEN));
    let (status, e) = refused(
        &api,
        "POST",
        api::SCALE,
        r#"{"fleet":"a","min":0,"max":2}"#,
        Some(TOKEN),
    )
    .await;
    assert_eq!((status, e.error.code), (503, ErrorCode::Unavailable));
    assert!(
        e.error.message.contains("did not answer"),
        "{}",
        e.error.message
    );
}

#[tokio::test]
async fn changes_need_the_token_and_a_read_only_api_refuses_them() {
    let api_ro = api(WriterIs::Running, None);
    let body = r#"{"stage":"chat","fleet":"a","weight":2}"#;
    let (status, e) = refused(&api_ro, "POST", api::SPLIT, body, Some(TOKEN)).await;
    assert_eq!((status, e.error.code), (403, ErrorCode::Forbidden));
    let api = api(WriterIs::Running, Some(TOKEN));
    for token in [None, Some("wrong")] {
        let (status, e) = refused(&api, "POST", api::SPLIT, body, token).await;
        assert_eq!(
            (status, e.error.code),
            (401, ErrorCode::Unauthorized),
            "{token:?}"
        );
    }
    let (status, e) = refused(&api, "GET", api::SPLIT, "", None).await;
    assert_eq!((status, e.error.code), (405, ErrorCode::MethodNotAllowed));
}

#[tokio::test]
async fn accepted_changes_answer_what_changed_and_show_in_the_view() {
    let api = api(WriterIs::Running, Some(TOKEN));
    let what = post_ok(
        &api,
        api::SPLIT,
        r#"{"stage":"chat","fleet":"b","weight":3}"#,
    )
    .await;
    assert!(what.contains("1 -> 3"), "{what}");
    let what = post_ok(&api, api::SCALE, r#"{"fleet":"b","min":1,"max":4}"#).await;
    assert!(what.contains("min 1, max 4"), "{what}");
    let what = post_ok(&api, api::DRAIN, r#"{"replica":"10.0.0.1:8000"}"#).await;
    assert!(what.contains("draining"), "{what}");
    // The server's view, read back as the CLI reads it.
    let (status, text) = call(&api, "GET", "/v1/stage?name=chat", "", None).await;
    assert_eq!(status, 200);
    let view: StageView = serde_json::from_str(&text).unwrap();
    assert_eq!(view.fleets[1].weight, Some(3.0));
    assert_eq!(view.fleets[1].hosts.map(|b| (b.min, b.max)), Some((1, 4)));
    // Not probed yet: draining, and shown as unknown until its first probe.
    let replica = &view.fleets[0].replicas[0];
    assert!(replica.draining, "{replica:?}");
    assert_eq!(replica.state, api::ReplicaState::Unknown);
    let table = crate::cli::render_endpoint(&view);
    assert!(table.contains("1..4") && table.contains("0/1"), "{table}");
    let (status, text) = call(&api, "GET", api::STAGES, "", None).await;
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<Vec<StageView>>(&text).unwrap().len(),
        2
    );
    let (status, text) = call(&api, "GET", api::SNAPSHOT, "", None).await;
    assert_eq!(status, 200);
    let snap: api::SnapshotView = serde_json::from_str(&text).unwrap();
    assert_eq!(snap.fleets.len(), 3);
}

#[tokio::test]
async fn a_reload_of_an_invalid_file_is_400_and_a_valid_one_applies() {
    let api = api(WriterIs::Running, Some(TOKEN));
    std::fs::write(api.file.path(), "fleets: [").unwrap();
    let (status, e) = refused(&api, "POST", api::RELOAD, "", Some(TOKEN)).await;
    assert_eq!((status, e.error.code), (400, ErrorCode::Invalid));
    assert!(
        e.error.message.contains("the running config stays"),
        "{}",
        e.error.message
    );
    std::fs::write(api.file.path(), CONFIG).unwrap();
    let what = post_ok(&api, api::RELOAD, "").await;
    assert!(what.contains("generation 2"), "{what}");
}

#[tokio::test]
async fn tenants_are_read_and_changed_through_the_api() {
    use crate::tenancy::ledger::{Estimate, Usage};
    let api = api(WriterIs::Running, Some(TOKEN));
    // Usage as the request path and the observer make it.
    let ledger = api.shared.tenants.ledger();
    let est = Estimate {
        prompt_tokens: 100,
        max_tokens: 50,
        cost_usd: 0.0,
        ttl: None,
    };
    let r = ledger.admit("acme", &est).unwrap();
    let held = ledger.admit("acme", &est).unwrap();
    r.commit(
        Usage {
            prompt: 100,
            cached: 0,
            completion: 20,
        },
        0.5,
    );
    let (status, text) = call(&api, "GET", "/v1/tenant?name=acme", "", None).await;
    assert_eq!(status, 200, "{text}");
    let v: api::TenantView = serde_json::from_str(&text).unwrap();
    assert_eq!((v.name.as_str(), v.named, v.tracked), ("acme", false, true));
    assert_eq!(v.usage.requests_in_flight, 1);
    assert_eq!(v.usage.tokens_in_flight, 150);
    assert_eq!(v.usage.tokens_charged, 120);
    assert_eq!((v.usage.admitted, v.usage.committed), (2, 1));
    assert!((v.usage.usd_charged - 0.5).abs() < 1e-9);
    assert_eq!(v.limits.tokens_per_minute, None);

    // Unknown tenants are not tracked by being looked at.
    let (status, e) = refused(&api, "GET", "/v1/tenant?name=ghost", "", None).await;
    assert_eq!(status, 404);
    assert!(
        e.error.message.contains("default limits"),
        "{}",
        e.error.message
    );
    assert!(ledger.find("ghost").is_none());

    // A change needs the token, and checks its own values first.
    let body =
        r#"{"name":"acme","limits":{"tokens_per_minute":2000,"budget":{"usd":5,"per":"day"}}}"#;
    let (status, _) = refused(&api, "POST", api::TENANT, body, None).await;
    assert_eq!(status, 401);
    for bad in [
        r#"{"name":"acme","limits":{"tokens_per_minute":0}}"#,
        r#"{"name":"acme","limits":{}}"#,
        r#"{"name":"other","limits":{"tokens_per_minute":5}}"#,
        r#"{"name":"a b","limits":{"tokens_per_minute":5}}"#,
        r#"{"name":"acme","limits":{"tokens_per_min":5}}"#,
        r#"{"name":"acme","remove":true,"limits":{"tokens_per_minute":5}}"#,
    ] {
        let (status, e) = refused(&api, "POST", api::TENANT, bad, Some(TOKEN)).await;
        assert_eq!((status, e.error.code), (400, ErrorCode::Invalid), "{bad}");
    }
    let applied = post_ok(&api, api::TENANT, body).await;
    assert!(
        applied.contains("tenant 'acme'") && applied.contains("tokens_per_minute 2000"),
        "{applied}"
    );
    // The config and the ledger both have it; the counters stayed.
    let snap = api.shared.snapshot();
    assert_eq!(snap.tenant("acme").tokens_per_minute, Some(2000));
    let t = ledger.find("acme").unwrap();
    assert_eq!(t.limits().tokens_per_minute, Some(2000));
    assert_eq!(
        t.charged_tokens.load(std::sync::atomic::Ordering::Relaxed),
        120
    );
    // null makes a limit unlimited; other fields stay.
    post_ok(
        &api,
        api::TENANT,
        r#"{"name":"acme","limits":{"tokens_per_minute":null}}"#,
    )
    .await;
    let t = ledger.find("acme").unwrap();
    assert_eq!(t.limits().tokens_per_minute, None);
    assert_eq!(t.limits().budget.map(|b| b.usd), Some(5.0));
    let (_, text) = call(&api, "GET", api::TENANTS, "", None).await;
    let all: api::TenantsView = serde_json::from_str(&text).unwrap();
    assert_eq!(all.tracked, 1);
    assert!(all.tenants[0].named);
    assert_eq!(all.tenants[0].usage.budget_left_usd, Some(5.0 - 0.5));
    // Removing the entry puts it back on the default limits.
    post_ok(&api, api::TENANT, r#"{"name":"acme","remove":true}"#).await;
    assert_eq!(ledger.find("acme").unwrap().limits().budget, None);
    let (status, _) = refused(
        &api,
        "POST",
        api::TENANT,
        r#"{"name":"acme","remove":true}"#,
        Some(TOKEN),
    )
    .await;
    assert_eq!(status, 404, "no named entry to remove");
    drop(held);
}

/// A DNS fleet has no members before its first answer, so "every replica
/// probed" alone would say ready with nothing to route to.
#[tokio::test]
async fn ready_waits_for_the_first_membership_answer_then_the_probes() {
    use crate::membership::Member;
    use crate::state::Event;
    use crate::topology::{FleetId, ReplicaId};
    const DNS: &str = "\
health_check: { healthy_threshold: 1 }
fleets:
  - { name: pool, region: us, dns: { name: pool.test, port: 80 } }
stages: [{ name: s, models: [m], fleets: [pool] }]
";
    let cfg = RouterConfig::parse_valid(DNS).unwrap();
    let file = tempfile::NamedTempFile::new().unwrap();
    let (shared, mut writer) = Writer::new(&cfg);
    let app = router(AdminState::new(
        shared.clone(),
        Reloader::new(shared.clone(), file.path().to_path_buf()),
        None,
    ));
    let api = Api { app, shared, file };
    let now = std::time::Instant::now();

    let (status, text) = call(&api, "GET", api::READY, "", None).await;
    assert_eq!((status, text.contains("pool")), (503, true), "{text}");

    let members = vec![Member::by_addr("10.0.0.1:80".parse().unwrap())];
    let source = cfg.fleets[0].source();
    writer.apply(
        Event::Membership {
            fleet: "pool".into(),
            source,
            members,
        },
        now,
    );
    let (status, text) = call(&api, "GET", api::READY, "", None).await;
    assert_eq!(status, 503, "members known, none probed: {text}");
    assert!(text.contains("1 replicas not probed"), "{text}");

    let generation = api.shared.snapshot().topo.generation;
    api.shared.emit(Event::Health {
        generation,
        fleet: FleetId(0),
        replica: ReplicaId(0),
        ok: true,
    });
    writer.drain(now);
    let (status, text) = call(&api, "GET", api::READY, "", None).await;
    assert_eq!(status, 200, "{text}");
}

/// A source that keeps failing holds the router unready only for
/// `SOURCE_GRACE`; one that has not answered at all (slow, no failure yet)
/// holds it for as long as that lasts.
#[tokio::test]
async fn a_failing_source_holds_readiness_until_its_grace() {
    use crate::state::readiness::{SOURCE_GRACE, not_ready};
    let cfg = RouterConfig::parse_valid(
        "fleets:\n  - { name: pool, region: us, dns: { name: pool.test, port: 80 } }\n\
         stages: [{ name: s, models: [m], fleets: [pool] }]\n",
    )
    .unwrap();
    let (shared, _writer) = Writer::new(&cfg);
    let later = shared.started + SOURCE_GRACE + std::time::Duration::from_secs(1);
    let soon = shared.started + std::time::Duration::from_secs(1);
    assert!(not_ready(&shared, later).is_some(), "no answer, no failure");
    let c = shared.metrics.sources.counters("pool");
    crate::membership::SourceCounters::bump(&c.failures);
    let why = not_ready(&shared, soon).expect("failed once, within the grace");
    assert!(why.contains("pool"), "{why}");
    assert_eq!(not_ready(&shared, later), None, "failing past the grace");
}
