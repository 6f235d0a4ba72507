//! The control endpoint: sets and clears faults, reports every replica.
//!
//! - `GET /replicas`: a JSON array of replica snapshots.
//! - `POST /replicas/{name}/fault`: replaces the replica's fault with the body's.
//! - `DELETE /replicas/{name}/fault`: clears it.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

use super::faults::Fault;
use super::replica::Replica;

type Replicas = Arc<Vec<Arc<Replica>>>;

pub fn router(replicas: Replicas) -> Router {
    Router::new()
        .route("/replicas", get(list))
        .route("/replicas/{name}/fault", post(set).delete(clear))
        .with_state(replicas)
}

async fn list(State(replicas): State<Replicas>) -> Response {
    Json(replicas.iter().map(|r| r.snapshot()).collect::<Vec<_>>()).into_response()
}

async fn set(State(replicas): State<Replicas>, Path(name): Path<String>, body: Bytes) -> Response {
    let Some(rep) = find(&replicas, &name) else {
        return not_found(&name);
    };
    match Fault::parse(&body) {
        Ok(fault) => apply(rep, fault),
        Err(message) => error(StatusCode::BAD_REQUEST, message),
    }
}

async fn clear(State(replicas): State<Replicas>, Path(name): Path<String>) -> Response {
    match find(&replicas, &name) {
        Some(rep) => apply(rep, Fault::default()),
        None => not_found(&name),
    }
}

fn apply(rep: &Replica, fault: Fault) -> Response {
    tracing::info!(replica = %rep.name, ?fault, "fault set");
    rep.fault.send_replace(fault.clone());
    Json(json!({"name": rep.name, "fault": fault})).into_response()
}

fn find<'a>(replicas: &'a [Arc<Replica>], name: &str) -> Option<&'a Replica> {
    replicas.iter().find(|r| r.name == name).map(|r| &**r)
}

fn not_found(name: &str) -> Response {
    error(StatusCode::NOT_FOUND, format!("no replica named '{name}'"))
}

fn error(status: StatusCode, message: String) -> Response {
    (status, Json(json!({"error": {"message": message}}))).into_response()
}
