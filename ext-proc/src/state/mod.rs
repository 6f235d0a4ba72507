//! Router state. One task (the writer) owns every change and publishes
//! immutable snapshots; the decision path reads the current snapshot and the
//! per-replica atomics, and never waits on the writer.

pub mod accounting;
pub mod autoscale;
mod changes;
pub mod decision_log;
pub mod failed_keys;
pub mod figures;
pub mod health;
pub mod lease;
pub mod load;
pub mod outlier;
pub mod prefix_index;
mod report;
pub mod scrape;
pub mod warmup;
mod writer;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};

pub use changes::{Change, ChangeError};
use decision_log::DecisionLog;
pub use decision_log::DecisionRecord;
use figures::FleetFigures;
use health::Health;
use lease::{LeaseInput, Leases};
use load::RequestGuard;
use prefix_index::PrefixIndex;
pub use writer::Writer;

use crate::config::RouterConfig;
use crate::metrics::Metrics;
use crate::observe::Observation;
use crate::topology::Topology;

/// What the decision path reads for one request.
#[derive(Debug)]
pub struct Snapshot {
    pub topo: Arc<Topology>,
    /// `[fleet][replica]`, parallel to `topo.fleets[f].replicas`.
    pub replicas: Vec<Vec<ReplicaState>>,
    /// Parallel to `topo.fleets`.
    pub fleets: Vec<FleetState>,
    /// `[stage][i]`, parallel to `topo.stages[s].fleets`.
    pub stages: Vec<Vec<StageFleetFigures>>,
    /// The config in effect (the file plus changes made through the admin API).
    pub config: Arc<RouterConfig>,
    /// Conversations replicas failed (read lock-free; the writer's map).
    pub failed_keys: Arc<failed_keys::FailedKeys>,
}

#[derive(Clone, Copy, Debug, Serialize)]
pub struct ReplicaState {
    pub health: Health,
    /// Passed the stage's golden prompts since it last (re)joined.
    pub warm: bool,
    pub ejected: bool,
    pub draining: bool,
}

impl ReplicaState {
    pub fn ready(&self) -> bool {
        self.health == Health::Healthy && self.warm && !self.ejected && !self.draining
    }

    /// The one word an operator sees.
    pub fn label(&self) -> &'static str {
        match self.health {
            Health::Unknown => "unknown",
            Health::Unhealthy => "unhealthy",
            Health::Healthy if self.draining => "draining",
            Health::Healthy if self.ejected => "ejected",
            Health::Healthy if !self.warm => "warming",
            Health::Healthy => "ready",
        }
    }
}

#[derive(Clone, Debug)]
pub struct FleetState {
    pub prefix: Arc<PrefixIndex>,
    pub figures: FleetFigures,
    /// The priority policy's saturation, with hysteresis (see `saturation`).
    pub spilling: bool,
    pub utilisation: f64,
    /// The autoscaling signal.
    pub desired_replicas: u32,
}

/// A fleet's figures within one stage's traffic (decaying, ~30 s).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct StageFleetFigures {
    pub traffic_share: f64,
    pub hit_rate_predicted: Option<f64>,
    pub hit_rate_engine: Option<f64>,
}

/// A decision, as the writer learns it.
#[derive(Clone, Debug)]
pub struct Routed {
    pub generation: u64,
    /// fleetroute's own id of the decision (the observation's nonce).
    pub decision_id: u64,
    /// The client's `x-request-id`, already truncated (`route::key`).
    pub request_id: String,
    pub stage: usize,
    pub fleet: usize,
    pub replica: usize,
    pub key_source: &'static str,
    pub arm: &'static str,
    pub shadow: Option<usize>,
    pub blocks: Vec<u64>,
    pub block_tokens: u32,
    pub prompt_tokens: u64,
    pub predicted_cached_tokens: u64,
}

#[derive(Debug)]
pub enum Event {
    Health {
        generation: u64,
        fleet: usize,
        replica: usize,
        ok: bool,
    },
    Warmup {
        generation: u64,
        fleet: usize,
        replica: usize,
        ok: bool,
    },
    Routed(Box<Routed>),
    /// fleetroute answered the request itself (no model, no replica, ...).
    Rejected {
        stage: String,
        reason: &'static str,
    },
    Observed(Box<Observation>),
    /// A change of config or replica state; the reply says what changed, or
    /// why it was refused (the running state then stays as it was).
    Change {
        change: Box<Change>,
        reply: Option<oneshot::Sender<Result<String, ChangeError>>>,
    },
}

const EVENT_QUEUE: usize = 65_536;
/// How often saturation, figures, outliers and metrics are re-evaluated.
pub const TICK: Duration = Duration::from_millis(250);

/// Everything shared between the gRPC streams, the admin API and the writer.
pub struct Shared {
    snapshot: ArcSwap<Snapshot>,
    events: mpsc::Sender<Event>,
    /// Load of routed requests, by decision nonce, until logged or expired.
    pub leases: Leases,
    /// Recent decisions for `/debug/decisions`; only the writer appends.
    decisions: Mutex<DecisionLog>,
    pub metrics: Metrics,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

impl Shared {
    pub fn snapshot(&self) -> arc_swap::Guard<Arc<Snapshot>> {
        self.snapshot.load()
    }

    /// The current snapshot, owned (kept beyond the current call).
    pub fn snapshot_full(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    /// Never blocks the request path: when the writer is far behind, the event
    /// is dropped and counted (it only refines state that later events correct).
    pub fn emit(&self, event: Event) {
        if self.events.try_send(event).is_err() {
            self.metrics.events_dropped.inc();
        }
    }

    /// Applies a change through the writer and waits for its verdict.
    pub async fn change(&self, change: Change) -> Result<String, ChangeError> {
        let (tx, rx) = oneshot::channel();
        self.events
            .send(Event::Change {
                change: Box::new(change),
                reply: Some(tx),
            })
            .await
            .map_err(|_| ChangeError::Stopped)?;
        rx.await.map_err(|_| ChangeError::Stopped)?
    }

    pub fn events(&self) -> mpsc::Sender<Event> {
        self.events.clone()
    }

    /// Holds a decision's load under a lease (see `lease`).
    pub fn hold_load(&self, nonce: u64, guard: RequestGuard, input: &LeaseInput) {
        let snap = self.snapshot.load();
        self.leases.hold(nonce, guard, &snap.config.leases, input);
    }

    pub fn recent_decisions(&self, q: decision_log::Query<'_>) -> Vec<DecisionRecord> {
        let log = self.decisions.lock().unwrap_or_else(|e| e.into_inner());
        log.find(q)
    }
}
