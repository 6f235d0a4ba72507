//! The admin API's routes: reads answer views of the current snapshot;
//! changes are authorised, checked, handed to the writer and answered with
//! what changed or why not.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use serde::de::DeserializeOwned;

use super::api::{
    self, Applied, Check, DecisionQuery, DrainRequest, ExperimentRequest, ScaleRequest,
    SnapshotView, SplitRequest, StageQuery, StageView, TenantQuery, TenantRequest, TenantView,
    TenantsQuery, TenantsView,
};
use super::auth::authorize;
use super::errors::ApiError;
use super::tenant_metrics::TenantSeries;
use super::{tenant_views, views};
use crate::reload::Reloader;
use crate::state::{Change, ChangeError, Shared, decision_log};

/// How long a change waits for the writer's verdict before answering 503.
pub const CHANGE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone)]
pub struct AdminState {
    pub shared: Arc<Shared>,
    pub reloader: Reloader,
    pub token: Option<String>,
    pub change_timeout: Duration,
    /// Set once every replica had been probed: a member joining later does
    /// not take the router out of its own Service while it is probed.
    ready: Arc<AtomicBool>,
    /// What the per-tenant series showed at the last scrape.
    tenant_series: Arc<Mutex<TenantSeries>>,
}

impl AdminState {
    pub fn new(shared: Arc<Shared>, reloader: Reloader, token: Option<String>) -> AdminState {
        AdminState {
            shared,
            reloader,
            token,
            change_timeout: CHANGE_TIMEOUT,
            ready: Arc::default(),
            tenant_series: Arc::default(),
        }
    }
}

pub fn router(state: AdminState) -> Router {
    Router::new()
        .route(api::READY, get(ready))
        .route(api::METRICS, get(metrics))
        .route(api::DECISIONS, get(decisions))
        .route(api::SNAPSHOT, get(snapshot))
        .route(api::STAGES, get(stages))
        .route(api::STAGE, get(stage))
        .route(api::SPLIT, post(split))
        .route(api::SCALE, post(scale))
        .route(api::DRAIN, post(drain))
        .route(api::EXPERIMENT, post(experiment))
        .route(api::RELOAD, post(reload))
        .route(api::TENANTS, get(tenants))
        .route(api::TENANT, get(tenant).post(set_tenant))
        .fallback(|| async { ApiError::NotFound("no such path".into()) })
        .method_not_allowed_fallback(|| async {
            ApiError::MethodNotAllowed("this path does not take this method".into())
        })
        .with_state(state)
}

/// Ready once every DNS or Kubernetes fleet's source has answered and every
/// replica has been probed at least once; then it stays ready (replicas that
/// join later are probed while the router serves) until told to stop.
async fn ready(State(s): State<AdminState>) -> impl IntoResponse {
    if !s.ready.load(Ordering::Relaxed) || s.shared.shutdown.draining() {
        if let Some(why) = super::not_ready(&s.shared, crate::clock::now()) {
            return (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n"));
        }
        s.ready.store(true, Ordering::Relaxed);
        // Ready means deciding: a call that follows this answer is routed.
        s.shared.deciding.store(true, Ordering::Relaxed);
    }
    (StatusCode::OK, "ready\n".to_string())
}

async fn metrics(State(s): State<AdminState>) -> impl IntoResponse {
    // Per-tenant series are brought up to date when they are read.
    super::tenant_metrics::export(&s.shared, &s.tenant_series);
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.shared.metrics.render(),
    )
}

fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    q.map(|Query(v)| v)
        .map_err(|e| ApiError::Invalid(format!("query: {}", e.body_text())))
}

/// Newest first; at most `limit` records and `RESPONSE_BYTES` of JSON.
async fn decisions(
    State(s): State<AdminState>,
    q: Result<Query<DecisionQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let q = query(q)?;
    let records = s.shared.recent_decisions(decision_log::Query {
        request_id: q.id.as_deref(),
        decision_id: q.decision.as_deref(),
        limit: q.limit.unwrap_or(100).min(decision_log::LOG_ENTRIES),
    });
    Ok((
        [(header::CONTENT_TYPE, "application/json")],
        decision_log::json_within(&records, decision_log::RESPONSE_BYTES),
    )
        .into_response())
}

async fn snapshot(State(s): State<AdminState>) -> Json<SnapshotView> {
    let mut v = views::snapshot_view(&s.shared.snapshot());
    views::engine_reports(&mut v.fleets, &s.shared.metrics.engines);
    Json(v)
}

async fn stages(State(s): State<AdminState>) -> Json<Vec<StageView>> {
    let mut v = views::stage_views(&s.shared.snapshot());
    for st in &mut v {
        views::engine_reports(&mut st.fleets, &s.shared.metrics.engines);
    }
    Json(v)
}

async fn stage(
    State(s): State<AdminState>,
    q: Result<Query<StageQuery>, QueryRejection>,
) -> Result<Json<StageView>, ApiError> {
    let q = query(q)?;
    views::stage_by_name(&s.shared.snapshot(), &q.name)
        .map(|mut st| {
            views::engine_reports(&mut st.fleets, &s.shared.metrics.engines);
            Json(st)
        })
        .ok_or_else(|| ApiError::NotFound(format!("no stage '{}'", q.name)))
}

async fn tenants(
    State(s): State<AdminState>,
    q: Result<Query<TenantsQuery>, QueryRejection>,
) -> Result<Json<TenantsView>, ApiError> {
    let q = query(q)?;
    let limit = q.limit.unwrap_or(100).min(api::MAX_TENANTS_LISTED);
    Ok(Json(tenant_views::tenants(&s.shared, limit)))
}

async fn tenant(
    State(s): State<AdminState>,
    q: Result<Query<TenantQuery>, QueryRejection>,
) -> Result<Json<TenantView>, ApiError> {
    let q = query(q)?;
    let name = crate::route::key::truncate_id(&q.name);
    tenant_views::tenant(&s.shared, name)
        .map(Json)
        .ok_or_else(|| {
            let snap = s.shared.snapshot();
            ApiError::NotFound(format!(
                "tenant '{name}' has not been seen here; it gets {} ({})",
                if snap.config.tenants.named.contains_key(name) {
                    "its named limits"
                } else {
                    "the default limits"
                },
                snap.tenant(name)
            ))
        })
}

async fn set_tenant(
    State(s): State<AdminState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Applied>, ApiError> {
    change(&s, &headers, &body, |b: TenantRequest| Change::Tenant {
        name: b.name,
        patch: b.limits,
        remove: b.remove,
    })
    .await
}

/// Waits for the writer's verdict, at most `change_timeout`.
async fn verdict(
    s: &AdminState,
    change: impl Future<Output = Result<String, ChangeError>>,
) -> Result<Json<Applied>, ApiError> {
    match tokio::time::timeout(s.change_timeout, change).await {
        Ok(r) => Ok(Json(Applied { applied: r? })),
        Err(_) => Err(ApiError::Unavailable(format!(
            "the state writer did not answer within {} ms; the change may still apply",
            s.change_timeout.as_millis()
        ))),
    }
}

/// An authorised change: the JSON body, its own checks, then the change it
/// asks for.
async fn change<B: DeserializeOwned + Check>(
    s: &AdminState,
    headers: &HeaderMap,
    body: &[u8],
    into: impl FnOnce(B) -> Change,
) -> Result<Json<Applied>, ApiError> {
    authorize(s.token.as_deref(), headers)?;
    // JSON has no NaN or infinity: such a weight fails here.
    let b: B = serde_json::from_slice(body).map_err(|e| ApiError::Invalid(format!("body: {e}")))?;
    b.check().map_err(ApiError::Invalid)?;
    verdict(s, s.shared.change(into(b))).await
}

async fn split(
    State(s): State<AdminState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Applied>, ApiError> {
    change(&s, &headers, &body, |b: SplitRequest| Change::SetWeight {
        stage: b.stage,
        fleet: b.fleet,
        weight: b.weight,
    })
    .await
}

async fn scale(
    State(s): State<AdminState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Applied>, ApiError> {
    change(&s, &headers, &body, |b: ScaleRequest| Change::Scale {
        fleet: b.fleet,
        min: b.min,
        max: b.max,
    })
    .await
}

async fn drain(
    State(s): State<AdminState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Applied>, ApiError> {
    change(&s, &headers, &body, |b: DrainRequest| Change::Drain {
        replica: b.replica,
        drain: b.drain,
    })
    .await
}

async fn experiment(
    State(s): State<AdminState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Applied>, ApiError> {
    change(&s, &headers, &body, |b: ExperimentRequest| {
        Change::Experiment {
            stage: b.stage,
            experiment: b.experiment,
        }
    })
    .await
}

async fn reload(
    State(s): State<AdminState>,
    headers: HeaderMap,
) -> Result<Json<Applied>, ApiError> {
    authorize(s.token.as_deref(), &headers)?;
    verdict(&s, s.reloader.reload("admin API")).await
}
