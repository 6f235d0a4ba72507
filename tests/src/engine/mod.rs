//! A simulated OpenAI-compatible inference engine. One process serves several
//! replicas, each with its own prefix cache, batch and queue, so routing
//! decisions have observable consequences (cache hits, queueing) without a GPU.
//!
//! The pure parts, [`cache::PrefixCache`] and [`latency::LatencyModel`], are
//! shared with simulations that replay traces without servers.

pub mod adapters;
pub mod cache;
mod completions;
mod control;
pub mod faults;
pub mod latency;
pub mod lora;
pub mod metrics;
pub mod models;
pub mod openai;
pub mod replica;
mod server;

#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use openai::MAX_COMPLETION_TOKENS;
use replica::{Replica, ReplicaSettings};

/// Everything an engine process is started with.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Replica names and the loopback addresses they listen on (port 0 picks one).
    pub replicas: Vec<(String, SocketAddr)>,
    pub control: Option<SocketAddr>,
    pub settings: ReplicaSettings,
    /// Allow addresses other than loopback (inside a container, where the
    /// container's network is the boundary).
    pub any_address: bool,
    /// (replica, model): that replica serves only this model name (404 for
    /// others, as vLLM's `--served-model-name` does).
    pub served_models: Vec<(String, String)>,
    /// (replica, key): that replica demands this API key.
    pub api_keys: Vec<(String, String)>,
}

impl EngineConfig {
    /// Checks the configuration; the error names the offending value.
    pub fn validate(&self) -> Result<(), String> {
        if self.replicas.is_empty() {
            return Err("at least one replica is required".into());
        }
        let addrs = self
            .replicas
            .iter()
            .map(|(_, a)| a)
            .chain(self.control.as_ref());
        let mut ports = Vec::new();
        for addr in addrs {
            if !self.any_address && !addr.ip().is_loopback() {
                return Err(format!(
                    "{addr}: the engine only binds loopback addresses (127.0.0.1) unless --any-address is given"
                ));
            }
            if addr.port() != 0 && ports.contains(&addr.port()) {
                return Err(format!("{addr}: port is used twice"));
            }
            ports.push(addr.port());
        }
        for (i, (name, _)) in self.replicas.iter().enumerate() {
            let ok = !name.is_empty()
                && name.len() <= 64
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
            if !ok {
                return Err(format!(
                    "replica name '{name}' must be 1-64 of [A-Za-z0-9._-]"
                ));
            }
            if self.replicas[..i].iter().any(|(n, _)| n == name) {
                return Err(format!("replica name '{name}' is used twice"));
            }
        }
        for (what, list) in [
            ("served-model", &self.served_models),
            ("require-api-key", &self.api_keys),
        ] {
            for (name, _) in list {
                if !self.replicas.iter().any(|(n, _)| n == name) {
                    return Err(format!("{what}: no replica named '{name}'"));
                }
            }
        }
        let s = &self.settings;
        let bpt = fleetroute_filter::config::BYTES_PER_TOKEN;
        if s.block_bytes < 16 || !s.block_bytes.is_multiple_of(bpt) {
            return Err(format!(
                "block-bytes must be a multiple of {bpt} and at least 16"
            ));
        }
        let l = &s.latency;
        if !(l.prefill_tokens_per_sec.is_finite() && l.prefill_tokens_per_sec > 0.0) {
            return Err("prefill-tokens-per-sec must be a positive number".into());
        }
        if !(l.decode_ms_per_token.is_finite() && l.decode_ms_per_token >= 0.0) {
            return Err("decode-ms-per-token must be zero or more".into());
        }
        if !(l.decode_ms_per_running.is_finite() && l.decode_ms_per_running >= 0.0) {
            return Err("decode-ms-per-running must be zero or more".into());
        }
        if l.max_batch == 0 || l.max_batch > 1 << 20 {
            return Err("max-batch must be between 1 and 1048576".into());
        }
        if s.default_max_tokens > MAX_COMPLETION_TOKENS {
            return Err(format!(
                "default-max-tokens must be at most {MAX_COMPLETION_TOKENS}"
            ));
        }
        Ok(())
    }
}

/// A running engine; [`Engine::shutdown`] stops it.
pub struct Engine {
    replicas: Arc<Vec<Arc<Replica>>>,
    control: Option<SocketAddr>,
    shutdown: watch::Sender<bool>,
    tasks: JoinSet<()>,
}

impl Engine {
    /// Binds every listener, then serves in the background.
    pub async fn start(cfg: EngineConfig) -> Result<Engine, String> {
        cfg.validate()?;
        let (shutdown, _) = watch::channel(false);
        let mut tasks = JoinSet::new();
        let mut replicas = Vec::new();
        let mut listeners = Vec::new();
        for (name, addr) in &cfg.replicas {
            let l = bind(*addr, &format!("replica {name}")).await?;
            let bound = l.local_addr().map_err(|e| e.to_string())?;
            let mut settings = cfg.settings.clone();
            if let Some((_, m)) = cfg.served_models.iter().find(|(n, _)| n == name) {
                settings.models = vec![m.clone()];
            }
            if let Some((_, k)) = cfg.api_keys.iter().find(|(n, _)| n == name) {
                settings.api_key = Some(k.clone());
            }
            replicas.push(Arc::new(Replica::new(name, bound, settings)?));
            listeners.push(l);
        }
        for (rep, l) in replicas.iter().zip(listeners) {
            tasks.spawn(server::serve(rep.clone(), l, shutdown.subscribe()));
        }
        let replicas = Arc::new(replicas);
        let mut control = None;
        if let Some(addr) = cfg.control {
            let l = bind(addr, "control").await?;
            control = Some(l.local_addr().map_err(|e| e.to_string())?);
            let app = control::router(replicas.clone());
            let mut stop = shutdown.subscribe();
            tasks.spawn(async move {
                let stopped = async move {
                    let _ = stop.wait_for(|s| *s).await;
                };
                if let Err(e) = axum::serve(l, app).with_graceful_shutdown(stopped).await {
                    tracing::error!("control server: {e}");
                }
            });
        }
        Ok(Engine {
            replicas,
            control,
            shutdown,
            tasks,
        })
    }

    /// The bound address of each replica, in configuration order.
    pub fn replicas(&self) -> Vec<(String, SocketAddr)> {
        self.replicas
            .iter()
            .map(|r| (r.name.clone(), r.addr))
            .collect()
    }

    pub fn replica_addr(&self, name: &str) -> Option<SocketAddr> {
        self.replicas
            .iter()
            .find(|r| r.name == name)
            .map(|r| r.addr)
    }

    pub fn control_addr(&self) -> Option<SocketAddr> {
        self.control
    }

    /// Closes every listener and connection, then waits for the servers.
    pub async fn shutdown(mut self) {
        self.shutdown.send_replace(true);
        let all = async { while self.tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(Duration::from_secs(5), all)
            .await
            .is_err()
        {
            tracing::warn!("engine tasks did not stop in time; aborting them");
        }
    }
}

async fn bind(addr: SocketAddr, what: &str) -> Result<TcpListener, String> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| format!("{what}: cannot listen on {addr}: {e}"))
}

/// Starts the engine, prints one line per listener and `ready`, and serves
/// until SIGTERM or SIGINT.
pub async fn run(cfg: EngineConfig) -> Result<(), String> {
    use tokio::signal::unix::{SignalKind, signal};
    // Handlers go in before `ready`, so a harness may signal as soon as it reads it.
    let handler = |kind: SignalKind| signal(kind).map_err(|e| format!("signal handler: {e}"));
    let (mut term, mut int) = (
        handler(SignalKind::terminate())?,
        handler(SignalKind::interrupt())?,
    );
    let engine = Engine::start(cfg).await?;
    for (name, addr) in engine.replicas() {
        println!("engine replica {name} listening on {addr}");
    }
    if let Some(addr) = engine.control_addr() {
        println!("engine control listening on {addr}");
    }
    println!("ready");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    engine.shutdown().await;
    Ok(())
}
