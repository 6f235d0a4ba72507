//! One replica's state. Replicas in one process share nothing.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};

use axum::http::HeaderValue;
use serde::Serialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use super::cache::PrefixCache;
use super::faults::Fault;
use super::latency::LatencyModel;

/// What every replica of a process is configured with.
#[derive(Clone, Debug)]
pub struct ReplicaSettings {
    pub block_bytes: usize,
    pub cache_tokens: usize,
    pub latency: LatencyModel,
    pub default_max_tokens: u64,
    /// Accepted model names; empty accepts any.
    pub models: Vec<String>,
    /// Completions need `Authorization: Bearer <key>` (401 otherwise), as an
    /// external provider's API does.
    pub api_key: Option<String>,
    /// LoRA adapters, as vLLM with `--enable-lora` serves them.
    pub adapters: Option<super::adapters::AdapterSettings>,
    /// Several models loaded on demand, as llama.cpp's router serves them.
    pub packed: Option<super::models::ModelSettings>,
}

pub struct Replica {
    pub name: String,
    pub name_header: HeaderValue,
    /// The bound address; a refusing replica re-opens this same port.
    pub addr: SocketAddr,
    pub settings: ReplicaSettings,
    cache: Mutex<PrefixCache>,
    /// The batch: a fair (FIFO) semaphore of `max_batch` permits.
    slots: Arc<Semaphore>,
    /// Prefills run one at a time, in arrival order: a prompt's prefill takes
    /// the accelerator's compute while the batch's decodes continue.
    prefill_lane: tokio::sync::Mutex<()>,
    pub fault: watch::Sender<Fault>,
    pub stats: Stats,
    /// Every `Authorization` a completion request brought, so a test can tell
    /// whose credentials reached this replica.
    seen: Mutex<SeenAuth>,
    /// Its LoRA adapters (`settings.adapters`), its own.
    pub adapters: Option<Arc<super::adapters::Adapters>>,
    /// Its models (`settings.packed`), its own.
    pub packed: Option<Arc<super::models::Models>>,
}

/// Distinct `Authorization` values (at most [`MAX_SEEN`]) and requests without one.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SeenAuth {
    pub values: Vec<String>,
    pub without: u64,
}

/// Distinct values a replica remembers (it is a test tool, not a log).
pub const MAX_SEEN: usize = 32;

/// Counters and gauges, as the metrics and the control endpoint report them.
#[derive(Default)]
pub struct Stats {
    pub running: AtomicU64,
    pub waiting: AtomicU64,
    pub success: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub cached_tokens: AtomicU64,
    pub generation_tokens: AtomicU64,
    next_id: AtomicU64,
}

/// A point-in-time view of a replica, for `/metrics` and `GET /replicas`.
#[derive(Clone, Debug, Serialize)]
pub struct Snapshot {
    pub name: String,
    pub addr: SocketAddr,
    /// The `model_name` label: the first accepted model, else `fleetroute-sim`.
    pub model: String,
    pub fault: Fault,
    pub requests_served: u64,
    pub running: u64,
    pub waiting: u64,
    pub cache_used_tokens: u64,
    pub cache_capacity_tokens: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub generation_tokens: u64,
    pub authorization: SeenAuth,
}

/// Holds a batch slot; counts the request as running until dropped.
pub struct Running {
    replica: Arc<Replica>,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.replica.stats.running.fetch_sub(1, Relaxed);
    }
}

/// Counts a request as waiting until dropped, even if its client goes away.
struct Waiting<'a>(&'a AtomicU64);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

impl Replica {
    pub fn new(name: &str, addr: SocketAddr, settings: ReplicaSettings) -> Result<Self, String> {
        let name_header = HeaderValue::from_str(name)
            .map_err(|_| format!("replica name '{name}' is not a header value"))?;
        let block_tokens = settings.block_bytes / fleetroute_filter::config::BYTES_PER_TOKEN;
        Ok(Replica {
            name: name.to_string(),
            name_header,
            addr,
            cache: Mutex::new(PrefixCache::new(settings.cache_tokens, block_tokens)),
            slots: Arc::new(Semaphore::new(settings.latency.max_batch)),
            prefill_lane: tokio::sync::Mutex::new(()),
            fault: watch::Sender::new(Fault::default()),
            stats: Stats::default(),
            seen: Mutex::new(SeenAuth::default()),
            adapters: settings
                .adapters
                .clone()
                .map(|a| Arc::new(super::adapters::Adapters::new(a))),
            packed: settings
                .packed
                .clone()
                .map(|m| Arc::new(super::models::Models::new(m))),
            settings,
        })
    }

    /// Records what a completion request brought; true when it may proceed.
    pub fn authorize(&self, authorization: Option<&str>) -> bool {
        {
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            match authorization {
                None => seen.without += 1,
                Some(v) => {
                    if !seen.values.iter().any(|s| s == v) && seen.values.len() < MAX_SEEN {
                        seen.values.push(v.to_string());
                    }
                }
            }
        }
        match &self.settings.api_key {
            None => true,
            Some(key) => authorization
                .and_then(|v| v.strip_prefix("Bearer "))
                .is_some_and(|k| k == key),
        }
    }

    pub fn fault(&self) -> Fault {
        self.fault.borrow().clone()
    }

    /// The latency model under the current slow factor.
    pub fn latency(&self) -> LatencyModel {
        self.settings.latency.slowed(self.fault.borrow().slow())
    }

    pub fn cache(&self) -> MutexGuard<'_, PrefixCache> {
        // The cache has no invariant a panicking holder could break half-way.
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits in the FIFO queue for a batch slot.
    pub async fn admit(self: &Arc<Self>) -> Running {
        self.stats.waiting.fetch_add(1, Relaxed);
        let waiting = Waiting(&self.stats.waiting);
        let permit = self
            .slots
            .clone()
            .acquire_owned()
            .await
            .expect("batch semaphore is never closed");
        drop(waiting);
        self.stats.running.fetch_add(1, Relaxed);
        Running {
            replica: self.clone(),
            _permit: permit,
        }
    }

    /// Waits for the prefill lane (FIFO); prefill runs while the guard lives.
    pub async fn prefill_lane(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.prefill_lane.lock().await
    }

    /// Returns once the replica is not told to hang.
    pub async fn unhung(&self) {
        let mut rx = self.fault.subscribe();
        // The sender lives as long as `self`, so this cannot fail.
        let _ = rx.wait_for(|f| !f.hang).await;
    }

    /// A response id unique within this replica.
    pub fn next_id(&self, prefix: &str) -> String {
        format!(
            "{prefix}-{}-{}",
            self.name,
            self.stats.next_id.fetch_add(1, Relaxed)
        )
    }

    pub fn snapshot(&self) -> Snapshot {
        let (used, capacity) = {
            let c = self.cache();
            (c.used_tokens() as u64, c.capacity_tokens() as u64)
        };
        let s = &self.stats;
        Snapshot {
            name: self.name.clone(),
            addr: self.addr,
            model: self
                .settings
                .models
                .first()
                .cloned()
                .unwrap_or_else(|| "fleetroute-sim".into()),
            fault: self.fault(),
            requests_served: s.success.load(Relaxed),
            running: s.running.load(Relaxed),
            waiting: s.waiting.load(Relaxed),
            cache_used_tokens: used,
            cache_capacity_tokens: capacity,
            prompt_tokens: s.prompt_tokens.load(Relaxed),
            cached_tokens: s.cached_tokens.load(Relaxed),
            generation_tokens: s.generation_tokens.load(Relaxed),
            authorization: self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        }
    }
}
