//! A replica's HTTP server. It runs its own accept loop rather than
//! `axum::serve` so that a `refuse` fault can close the listener and every open
//! connection (a proxy's pooled connections would otherwise keep reaching a
//! "dead" replica), and so a handler can drop its own connection mid-request.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use tower::Service;

use super::completions;
use super::faults::Fault;
use super::metrics;
use super::openai::ApiError;
use super::replica::Replica;

/// Drops the connection a request came on, without an answer.
#[derive(Clone)]
pub struct Kill(Arc<Notify>);

impl Kill {
    pub fn now(&self) {
        // A stored permit: the connection sees it even if not yet waiting.
        self.0.notify_one();
    }
}

const MAX_BODY_BYTES: usize = 64 << 20;

static REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
static SERVED_BY: HeaderName = HeaderName::from_static("x-served-by");
/// The request header names the replica received, so tests can prove what a
/// proxy in front of it forwarded or stripped.
static RECEIVED: HeaderName = HeaderName::from_static("x-sim-received-headers");

pub fn router(replica: Arc<Replica>) -> Router {
    let runtime_lora = replica
        .adapters
        .as_ref()
        .is_some_and(|a| a.settings.runtime);
    let router = if runtime_lora {
        Router::new()
            .route("/v1/load_lora_adapter", post(load_adapter))
            .route("/v1/unload_lora_adapter", post(unload_adapter))
    } else {
        Router::new()
    };
    let router = if replica.packed.is_some() {
        router
            .route("/models", get(packed_models))
            .route("/models/load", post(load_model))
            .route("/models/unload", post(unload_model))
    } else {
        router
    };
    router
        .route("/v1/chat/completions", post(completions::chat))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(prometheus))
        // Prompts up to the filter's largest readable body.
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(replica.clone(), tag))
        .with_state(replica)
}

/// Names the replica on every answer and echoes the client's request id.
async fn tag(State(rep): State<Arc<Replica>>, req: Request, next: Next) -> Response {
    let request_id = req.headers().get(&REQUEST_ID).cloned();
    let names: Vec<&str> = req.headers().keys().map(HeaderName::as_str).collect();
    let received = HeaderValue::from_str(&names.join(",")).ok();
    let mut res = next.run(req).await;
    if let Some(v) = received {
        res.headers_mut().insert(RECEIVED.clone(), v);
    }
    res.headers_mut()
        .insert(SERVED_BY.clone(), rep.name_header.clone());
    if let Some(id) = request_id {
        res.headers_mut().insert(REQUEST_ID.clone(), id);
    }
    res
}

async fn health(State(rep): State<Arc<Replica>>) -> Response {
    match rep.fault().health() {
        200 => "ok".into_response(),
        status => ApiError::injected(status).into_response(),
    }
}

/// The models this replica serves (empty: it answers for any model).
async fn models(State(rep): State<Arc<Replica>>) -> Response {
    let mut data: Vec<serde_json::Value> = rep
        .settings
        .models
        .iter()
        .map(|m| serde_json::json!({ "id": m, "object": "model", "owned_by": "fleetroute-engine" }))
        .collect();
    if let Some(m) = &rep.packed {
        data.extend(
            m.settings.models.iter().map(
                |id| serde_json::json!({ "id": id, "object": "model", "owned_by": "llamacpp" }),
            ),
        );
    }
    // The adapters it knows, as vLLM lists them.
    if let Some(ads) = &rep.adapters {
        data.extend(ads.names().into_iter().map(|a| {
            serde_json::json!({ "id": a, "object": "model", "owned_by": "fleetroute-engine", "parent": rep.settings.models.first() })
        }));
    }
    axum::Json(serde_json::json!({ "object": "list", "data": data })).into_response()
}

/// llama.cpp's router: its models with their status.
async fn packed_models(State(rep): State<Arc<Replica>>) -> Response {
    match &rep.packed {
        Some(m) => axum::Json(m.list()).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

#[derive(serde::Deserialize)]
struct ModelBody {
    model: String,
}

async fn load_model(State(rep): State<Arc<Replica>>, body: axum::body::Bytes) -> Response {
    model_call(&rep, &body, |m, name| m.load(name))
}

async fn unload_model(State(rep): State<Arc<Replica>>, body: axum::body::Bytes) -> Response {
    model_call(&rep, &body, |m, name| m.unload(name))
}

/// `{ "model" }` to one of the router's calls; its answer as llama.cpp words it.
fn model_call(
    rep: &Replica,
    body: &[u8],
    call: impl Fn(&Arc<super::models::Models>, &str) -> Result<(), super::models::Refusal>,
) -> Response {
    let Some(m) = &rep.packed else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let Ok(b) = serde_json::from_slice::<ModelBody>(body) else {
        return super::models::refusal((400, "model name is missing from the request"));
    };
    match call(m, &b.model) {
        Ok(()) => axum::Json(serde_json::json!({ "success": true })).into_response(),
        Err(r) => super::models::refusal(r),
    }
}

/// `{ lora_name, lora_path }`, as vLLM takes it; the path is not read.
#[derive(serde::Deserialize)]
struct AdapterBody {
    lora_name: String,
    #[serde(default)]
    lora_path: Option<String>,
}

async fn load_adapter(State(rep): State<Arc<Replica>>, body: axum::body::Bytes) -> Response {
    let Some(ads) = &rep.adapters else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let Ok(b) = serde_json::from_slice::<AdapterBody>(&body) else {
        return (StatusCode::BAD_REQUEST, "expected { lora_name, lora_path }").into_response();
    };
    // vLLM reads the weights from the path: one that is not there fails.
    let path = b.lora_path.as_deref().unwrap_or("");
    if !std::path::Path::new(path).exists() {
        let msg = format!(
            "Loading lora {} failed: No adapter found for {path}",
            b.lora_name
        );
        return (StatusCode::BAD_REQUEST, msg).into_response();
    }
    match ads.register(&b.lora_name) {
        Ok(()) => format!(
            "Success: LoRA adapter '{}' added successfully.",
            b.lora_name
        )
        .into_response(),
        Err(e) => (StatusCode::BAD_REQUEST, e).into_response(),
    }
}

async fn unload_adapter(State(rep): State<Arc<Replica>>, body: axum::body::Bytes) -> Response {
    let Some(ads) = &rep.adapters else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let Ok(b) = serde_json::from_slice::<AdapterBody>(&body) else {
        return (StatusCode::BAD_REQUEST, "expected { lora_name }").into_response();
    };
    if ads.unregister(&b.lora_name) {
        format!(
            "Success: LoRA adapter '{}' removed successfully.",
            b.lora_name
        )
        .into_response()
    } else {
        let msg = format!("The lora adapter '{}' cannot be found.", b.lora_name);
        (StatusCode::NOT_FOUND, msg).into_response()
    }
}

async fn prometheus(State(rep): State<Arc<Replica>>) -> Response {
    let mut text = metrics::render(&rep.snapshot());
    if let Some(m) = &rep.packed {
        text.push_str(&format!(
            "# TYPE fleetroute_sim_model_loads_total counter\nfleetroute_sim_model_loads_total {}\n",
            m.loads()
        ));
    }
    if let Some(ads) = &rep.adapters {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        text.push_str(&super::adapters::render(&ads.figures(), now));
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        text,
    )
        .into_response()
}

/// Serves `replica` until `shutdown` turns true, closing and re-opening its
/// port as the `refuse` fault comes and goes.
pub async fn serve(
    replica: Arc<Replica>,
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
) {
    let app = router(replica.clone());
    let mut faults = replica.fault.subscribe();
    let mut listener = Some(listener);
    loop {
        tokio::select! {
            () = stopped(&mut shutdown) => return,
            () = refusing(&mut faults, false) => {}
        }
        let l = match listener.take() {
            Some(l) => l,
            None => match rebind(&replica, &mut shutdown).await {
                Some(l) => l,
                None => return,
            },
        };
        let mut conns = JoinSet::new();
        loop {
            tokio::select! {
                () = stopped(&mut shutdown) => return,
                () = refusing(&mut faults, true) => break,
                accepted = l.accept() => match accepted {
                    Ok((stream, _)) => {
                        conns.spawn(connection(stream, app.clone()));
                    }
                    Err(e) => {
                        tracing::warn!(replica = %replica.name, "accept: {e}");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                },
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        }
        // Dropping the listener refuses new connections; dropping the set
        // aborts the open ones.
        drop(l);
        drop(conns);
    }
}

async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    // A dropped sender also means stop.
    let _ = shutdown.wait_for(|s| *s).await;
}

async fn refusing(faults: &mut watch::Receiver<Fault>, refuse: bool) {
    // The sender lives in the replica, which outlives this loop.
    let _ = faults.wait_for(|f| f.refuse == refuse).await;
}

/// Re-opens the replica's port once a refuse fault is cleared; `None` on shutdown.
async fn rebind(replica: &Replica, shutdown: &mut watch::Receiver<bool>) -> Option<TcpListener> {
    loop {
        match TcpListener::bind(replica.addr).await {
            Ok(l) => return Some(l),
            Err(e) => tracing::warn!(replica = %replica.name, "re-binding {}: {e}", replica.addr),
        }
        tokio::select! {
            () = stopped(shutdown) => return None,
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
}

/// Serves one connection (HTTP/1.1 or prior-knowledge HTTP/2) until it ends or
/// a handler kills it.
async fn connection(stream: TcpStream, app: Router) {
    let kill = Kill(Arc::new(Notify::new()));
    let handle = kill.clone();
    let svc = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        req.extensions_mut().insert(handle.clone());
        app.clone().call(req)
    });
    let builder = auto::Builder::new(TokioExecutor::new());
    let conn = builder.serve_connection(TokioIo::new(stream), svc);
    tokio::select! {
        _ = conn => {}
        _ = kill.0.notified() => {}
    }
}
