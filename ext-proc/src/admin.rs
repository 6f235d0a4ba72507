//! The admin HTTP API (loopback by default): readiness, Prometheus metrics,
//! a view of each stage, and changes (split, host bounds, drain, experiments,
//! reload). Reads are open; every change needs the bearer token fleetroute
//! was started with, and is logged with what changed.

use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;

use crate::config::{Bounds, ExperimentConfig, RoutingConfig};
use crate::state::decision_log;
use crate::state::health::Health;
use crate::state::{Change, Shared, Snapshot};
use crate::topology::Policy;

#[derive(Clone)]
pub struct AdminState {
    pub shared: Arc<Shared>,
    pub config_path: PathBuf,
    pub token: Option<String>,
}

pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .route("/debug/decisions", get(decisions))
        .route("/debug/snapshot", get(snapshot))
        .route("/v1/stages", get(stages))
        .route("/v1/stage", get(stage))
        .route("/v1/split", post(split))
        .route("/v1/scale", post(scale))
        .route("/v1/drain", post(drain))
        .route("/v1/experiment", post(experiment))
        .route("/v1/reload", post(reload))
        .with_state(state)
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(serde_json::json!({ "error": message.into() }))).into_response()
}

/// The token changes must carry, as given at start. An empty (or blank)
/// token is refused: it would match an empty `Bearer` credential.
pub fn admin_token(given: Option<String>) -> Result<Option<String>, String> {
    match given {
        Some(t) if t.trim().is_empty() => Err(
            "the admin token is empty (--admin-token or FLEETROUTE_ADMIN_TOKEN): give a \
             non-empty token, or set neither for a read-only admin API"
                .into(),
        ),
        other => Ok(other),
    }
}

/// The credential of an `Authorization: Bearer <token>` header: the scheme
/// is case-insensitive (RFC 9110), and an empty credential is no credential.
pub fn bearer(value: &str) -> Option<&str> {
    let (scheme, rest) = value.trim_start().split_once([' ', '\t'])?;
    let token = rest.trim_matches([' ', '\t']);
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Changes need `Authorization: Bearer <token>`; without a configured token
/// the API is read-only.
fn authorize(state: &AdminState, headers: &HeaderMap) -> Result<(), Box<Response>> {
    let Some(token) = state.token.as_deref().filter(|t| !t.is_empty()) else {
        return Err(Box::new(error(
            StatusCode::FORBIDDEN,
            "changes are disabled: start fleetroute with --admin-token (or FLEETROUTE_ADMIN_TOKEN)",
        )));
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer);
    // Constant time: the comparison does not reveal how much of a guess matched.
    let matches = given.is_some_and(|g| bool::from(g.as_bytes().ct_eq(token.as_bytes())));
    if !matches {
        return Err(Box::new(error(
            StatusCode::UNAUTHORIZED,
            "a valid admin token is required for changes",
        )));
    }
    Ok(())
}

async fn apply(state: &AdminState, change: Change) -> Response {
    match state.shared.change(change).await {
        Ok(what) => Json(serde_json::json!({ "applied": what })).into_response(),
        Err(why) => error(StatusCode::BAD_REQUEST, why),
    }
}

/// Ready once every replica has been probed at least once.
async fn ready(State(s): State<AdminState>) -> impl IntoResponse {
    let snap = s.shared.snapshot();
    let unknown = snap
        .replicas
        .iter()
        .flatten()
        .filter(|r| r.health == Health::Unknown)
        .count();
    if unknown == 0 {
        (StatusCode::OK, "ready\n".to_string())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{unknown} replicas not probed yet\n"),
        )
    }
}

async fn metrics(State(s): State<AdminState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.shared.metrics.render(),
    )
}

#[derive(Deserialize)]
struct DecisionQuery {
    id: Option<String>,
    decision: Option<String>,
    limit: Option<usize>,
}

/// Newest first; at most `limit` records and `RESPONSE_BYTES` of JSON.
async fn decisions(
    State(s): State<AdminState>,
    Query(q): Query<DecisionQuery>,
) -> impl IntoResponse {
    let records = s.shared.recent_decisions(decision_log::Query {
        request_id: q.id.as_deref(),
        decision_id: q.decision.as_deref(),
        limit: q.limit.unwrap_or(100).min(decision_log::LOG_ENTRIES),
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        decision_log::json_within(&records, decision_log::RESPONSE_BYTES),
    )
}

#[derive(Serialize)]
pub struct ReplicaView {
    pub addr: String,
    pub state: &'static str,
    pub health: Health,
    pub ready: bool,
    pub warm: bool,
    pub ejected: bool,
    pub draining: bool,
    pub inflight: u32,
    pub queued_tokens: u64,
    pub engine_running: u32,
    pub engine_waiting: u32,
    pub engine_kv_usage: f64,
}

#[derive(Serialize)]
pub struct FleetView {
    pub name: String,
    pub region: String,
    /// Weight in a weighted stage.
    pub weight: Option<f64>,
    pub traffic_share: Option<f64>,
    pub hit_rate_predicted: Option<f64>,
    pub hit_rate_engine: Option<f64>,
    pub ttft_p95_ms: Option<f64>,
    pub latency_ms_per_1k_tokens: Option<f64>,
    pub error_rate: f64,
    pub tokens_per_sec: f64,
    pub cost_usd_per_gpu_hour: Option<f64>,
    pub cost_usd_per_million_tokens: Option<f64>,
    pub utilisation: Option<f64>,
    pub saturated: bool,
    pub desired_replicas: u32,
    pub hosts: Option<Bounds>,
    pub prefix_blocks: usize,
    pub replicas: Vec<ReplicaView>,
}

#[derive(Serialize)]
pub struct StageView {
    pub name: String,
    pub models: Vec<String>,
    pub residency: Vec<String>,
    pub replicas: Option<Bounds>,
    pub routing: RoutingConfig,
    pub experiment: ExperimentConfig,
    pub fleets: Vec<FleetView>,
}

fn fleet_view(snap: &Snapshot, f: usize, stage: Option<(usize, usize)>) -> FleetView {
    let fleet = &snap.topo.fleets[f];
    let fs = &snap.fleets[f];
    let sf = stage.map(|(s, i)| snap.stages[s][i]);
    let weight = stage.and_then(|(s, _)| match &snap.topo.stages[s].policy {
        Policy::Weighted { weights } => weights.get(f).copied(),
        _ => None,
    });
    FleetView {
        name: fleet.name.clone(),
        region: fleet.region.clone(),
        weight,
        traffic_share: sf.map(|x| x.traffic_share),
        hit_rate_predicted: sf.and_then(|x| x.hit_rate_predicted),
        hit_rate_engine: sf.and_then(|x| x.hit_rate_engine),
        ttft_p95_ms: fs.figures.ttft_p95_ms,
        latency_ms_per_1k_tokens: fs.figures.latency,
        error_rate: fs.figures.error_rate,
        tokens_per_sec: fs.figures.tokens_per_sec,
        cost_usd_per_gpu_hour: fleet.cost.as_ref().and_then(|c| c.gpu_hour_usd),
        cost_usd_per_million_tokens: fs.figures.usd_per_mtok,
        utilisation: fs.utilisation.is_finite().then_some(fs.utilisation),
        saturated: fs.spilling,
        desired_replicas: fs.desired_replicas,
        hosts: fleet.hosts,
        prefix_blocks: fs.prefix.len(),
        replicas: fleet
            .replicas
            .iter()
            .enumerate()
            .map(|(r, rep)| {
                let st = snap.replicas[f][r];
                ReplicaView {
                    addr: rep.addr.clone(),
                    state: st.label(),
                    health: st.health,
                    ready: st.ready(),
                    warm: st.warm,
                    ejected: st.ejected,
                    draining: st.draining,
                    inflight: rep.load.inflight(),
                    queued_tokens: rep.load.pending_prefill(),
                    engine_running: rep.load.engine_running(),
                    engine_waiting: rep.load.engine_waiting(),
                    engine_kv_usage: rep.load.kv_usage(),
                }
            })
            .collect(),
    }
}

pub fn stage_view(snap: &Snapshot, s: usize) -> StageView {
    let st = &snap.topo.stages[s];
    let cfg = snap.config.stages.iter().find(|c| c.name == st.name);
    StageView {
        name: st.name.clone(),
        models: cfg.map(|c| c.models.clone()).unwrap_or_default(),
        residency: st.residency.clone(),
        replicas: st.replicas,
        routing: st.routing.clone(),
        experiment: cfg.map(|c| c.experiment.clone()).unwrap_or_default(),
        fleets: st
            .fleets
            .iter()
            .enumerate()
            .map(|(i, &f)| fleet_view(snap, f.index(), Some((s, i))))
            .collect(),
    }
}

async fn snapshot(State(s): State<AdminState>) -> impl IntoResponse {
    let snap = s.shared.snapshot();
    let fleets: Vec<FleetView> = (0..snap.topo.fleets.len())
        .map(|f| fleet_view(&snap, f, None))
        .collect();
    Json(serde_json::json!({ "generation": snap.topo.generation, "fleets": fleets }))
}

async fn stages(State(s): State<AdminState>) -> impl IntoResponse {
    let snap = s.shared.snapshot();
    let all: Vec<StageView> = (0..snap.topo.stages.len())
        .map(|i| stage_view(&snap, i))
        .collect();
    Json(all)
}

#[derive(Deserialize)]
struct StageQuery {
    name: String,
}

async fn stage(State(s): State<AdminState>, Query(q): Query<StageQuery>) -> Response {
    let snap = s.shared.snapshot();
    match snap.topo.by_stage_name.get(&q.name) {
        Some(&i) => Json(stage_view(&snap, i.index())).into_response(),
        None => error(StatusCode::NOT_FOUND, format!("no stage '{}'", q.name)),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SplitBody {
    stage: String,
    fleet: String,
    weight: f64,
}

/// An authorised change: the JSON body, then the change it asks for.
async fn change_from<B: serde::de::DeserializeOwned>(
    s: &AdminState,
    headers: &HeaderMap,
    body: &[u8],
    into: impl FnOnce(B) -> Change,
) -> Response {
    if let Err(r) = authorize(s, headers) {
        return *r;
    }
    match serde_json::from_slice::<B>(body) {
        Ok(b) => apply(s, into(b)).await,
        // JSON has no NaN or infinity: such a weight fails here.
        Err(e) => error(StatusCode::BAD_REQUEST, format!("body: {e}")),
    }
}

async fn split(State(s): State<AdminState>, headers: HeaderMap, body: Bytes) -> Response {
    change_from(&s, &headers, &body, |b: SplitBody| Change::SetWeight {
        stage: b.stage,
        fleet: b.fleet,
        weight: b.weight,
    })
    .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScaleBody {
    fleet: String,
    min: u32,
    max: u32,
}

async fn scale(State(s): State<AdminState>, headers: HeaderMap, body: Bytes) -> Response {
    change_from(&s, &headers, &body, |b: ScaleBody| Change::Scale {
        fleet: b.fleet,
        min: b.min,
        max: b.max,
    })
    .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DrainBody {
    replica: String,
    #[serde(default = "yes")]
    drain: bool,
}

fn yes() -> bool {
    true
}

async fn drain(State(s): State<AdminState>, headers: HeaderMap, body: Bytes) -> Response {
    change_from(&s, &headers, &body, |b: DrainBody| Change::Drain {
        replica: b.replica,
        drain: b.drain,
    })
    .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExperimentBody {
    stage: String,
    experiment: ExperimentConfig,
}

async fn experiment(State(s): State<AdminState>, headers: HeaderMap, body: Bytes) -> Response {
    change_from(&s, &headers, &body, |b: ExperimentBody| {
        Change::Experiment {
            stage: b.stage,
            experiment: b.experiment,
        }
    })
    .await
}

async fn reload(State(s): State<AdminState>, headers: HeaderMap) -> Response {
    if let Err(r) = authorize(&s, &headers) {
        return *r;
    }
    match crate::serve::reload(&s.shared, &s.config_path, "admin API").await {
        Ok(what) => Json(serde_json::json!({ "applied": what })).into_response(),
        Err(why) => error(StatusCode::BAD_REQUEST, why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_or_blank_token_is_refused_at_start() {
        for t in ["", " ", "\t"] {
            let e = admin_token(Some(t.into())).unwrap_err();
            assert!(e.contains("admin token is empty"), "{e}");
        }
        assert_eq!(admin_token(None), Ok(None));
        assert_eq!(admin_token(Some("x".into())), Ok(Some("x".into())));
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive_and_needs_a_credential() {
        for (header, want) in [
            ("Bearer abc", Some("abc")),
            ("bearer abc", Some("abc")),
            ("BEARER  abc ", Some("abc")),
            ("Bearer\tabc", Some("abc")),
            ("Bearer ", None),
            ("Bearer", None),
            ("bearer   ", None),
            ("Basic abc", None),
            ("Bearerabc", None),
            ("", None),
        ] {
            assert_eq!(bearer(header), want, "{header:?}");
        }
    }
}
