//! The admin HTTP API: readiness, a debug view of recent decisions and of the
//! current state.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json};
use axum::routing::get;
use serde::{Deserialize, Serialize};

use crate::state::Shared;
use crate::state::health::Health;

pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/ready", get(ready))
        .route("/debug/decisions", get(decisions))
        .route("/debug/snapshot", get(snapshot))
        .with_state(shared)
}

/// Ready once every replica has been probed at least once.
async fn ready(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    let snap = shared.snapshot();
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

#[derive(Deserialize)]
struct DecisionQuery {
    id: Option<String>,
    limit: Option<usize>,
}

async fn decisions(
    State(shared): State<Arc<Shared>>,
    Query(q): Query<DecisionQuery>,
) -> impl IntoResponse {
    Json(shared.recent_decisions(q.id.as_deref(), q.limit.unwrap_or(100).min(4096)))
}

#[derive(Serialize)]
struct ReplicaView {
    addr: String,
    health: Health,
    ready: bool,
    warm: bool,
    ejected: bool,
    inflight: u32,
    pending_prefill_tokens: u64,
    engine_running: u32,
    engine_waiting: u32,
    engine_kv_usage: f64,
}

#[derive(Serialize)]
struct FleetView {
    name: String,
    region: String,
    figures: crate::state::figures::FleetFigures,
    spilling: bool,
    prefix_blocks: usize,
    replicas: Vec<ReplicaView>,
}

async fn snapshot(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    let snap = shared.snapshot();
    let fleets: Vec<FleetView> = snap
        .topo
        .fleets
        .iter()
        .enumerate()
        .map(|(f, fleet)| FleetView {
            name: fleet.name.clone(),
            region: fleet.region.clone(),
            figures: snap.fleets[f].figures,
            spilling: snap.fleets[f].spilling,
            prefix_blocks: snap.fleets[f].prefix.len(),
            replicas: fleet
                .replicas
                .iter()
                .enumerate()
                .map(|(r, rep)| ReplicaView {
                    addr: rep.addr.clone(),
                    health: snap.replicas[f][r].health,
                    ready: snap.replicas[f][r].ready(),
                    warm: snap.replicas[f][r].warm,
                    ejected: snap.replicas[f][r].ejected,
                    inflight: rep.load.inflight(),
                    pending_prefill_tokens: rep.load.pending_prefill(),
                    engine_running: rep.load.engine_running(),
                    engine_waiting: rep.load.engine_waiting(),
                    engine_kv_usage: rep.load.kv_usage(),
                })
                .collect(),
        })
        .collect();
    Json(serde_json::json!({ "generation": snap.topo.generation, "fleets": fleets }))
}
