//! Router state. One task, the writer (`writer`), owns the models of health,
//! warmup, ejection, figures, saturation, the prefix index, autoscaling and
//! the failed-conversation map, and publishes immutable snapshots of them;
//! the decision path reads the current snapshot and never waits on it.
//!
//! Shared state outside the writer's models, all of it here, and why:
//! - `topology::load::ReplicaLoad` (atomics per replica): requests in flight
//!   and prefill queued are counted by the request path when it places a
//!   request (`RequestGuard`) and uncounted when the guard is released (the
//!   access log observer ending its lease, a lease expiring, or the scraper
//!   reconciling with the engine); the engine's own queue and KV-cache
//!   figures are stored by the scraper (`scrape`). They change per request,
//!   faster than a snapshot could be republished, and the decision reads them
//!   live. With a peer link, the other instances' load sits next to them
//!   (written only by the link's task, see `peer_load`).
//! - `lease::Leases` (a bounded concurrent cache of guards, by decision
//!   nonce): filled by the request path, emptied by the observer, by expiry
//!   (run on the writer's tick) and by the scraper's reconciliation.
//! - The readers' halves of the prefix index and the failed-conversation map
//!   (lock-free maps): only the writer changes them; the decision reads them.
//! - The snapshot pointer (`ArcSwap`): only the writer stores it.
//! - The decision log (a mutex): only the writer appends; the admin API reads.
//! - `metrics::Metrics` (counters): each task counts its own events; the
//!   per-tenant series are brought up to date by the `/metrics` handler
//!   (`admin::tenant_metrics`, under a mutex only that handler takes).
//! - The replica view notification (a `watch`): only the writer bumps it,
//!   when a snapshot it publishes has a new topology or a replica whose
//!   state flipped; the EDS server waits on it.
//! - The peer outbox (a bounded channel, see `peer`): only the writer sends
//!   its own prefix changes; the peer link takes them to other instances.
//! - `tenancy::accountant::Accountant` (lock-free per-tenant counters): the
//!   request path reserves, the observer commits, leases expire; its limits
//!   are swapped in by the writer when the config changes.
//!
//!
//! Nothing else is shared: every other change goes to the writer as an
//! `Event` and is applied in its order.

pub mod accounting;
pub mod autoscale;

pub mod decision_log;
pub mod failed_keys;
pub mod figures;
pub mod health;
pub mod lease;
mod members;

mod engine_call;
mod model;
mod model_load;
pub mod observation;
pub mod outlier;
pub mod peer;
pub mod peer_load;
pub mod prefix_index;
pub mod probe;
pub mod readiness;
pub mod registrations;

pub mod saturation;
mod snapshot;
pub mod usage;
mod writer;

/// The per-replica load counters live with the topology they count for.
pub use crate::topology::load;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use serde::Serialize;
use tokio::sync::{mpsc, oneshot, watch};

use crate::tenancy::accountant::Accountant;
use crate::tenancy::charge::Charge;
use crate::topology::load::RequestGuard;
use decision_log::DecisionLog;
pub use decision_log::DecisionRecord;
use figures::FleetFigures;
use health::Health;
use lease::{LeaseInput, Leases};
use prefix_index::PrefixIndex;
pub use writer::Writer;
pub use writer::{Change, ChangeError};

use crate::config::{RouterConfig, Source};
use crate::membership::Member;
use crate::metrics::Metrics;
use crate::topology::{Arm, FleetId, Pick, ReplicaId, Slots, StageId, Topology};
use fleetroute_filter::contract::KeySource;
pub use observation::Observation;

/// What the decision path reads for one request.
#[derive(Debug)]
pub struct Snapshot {
    pub topo: Arc<Topology>,
    /// `[fleet][replica]`, the same slots as `topo.fleets[f].replicas`.
    pub replicas: Vec<Slots<ReplicaState>>,
    /// Parallel to `topo.fleets`.
    pub fleets: Vec<FleetState>,
    /// `[stage][i]`, parallel to `topo.stages[s].fleets`.
    pub stages: Vec<Vec<StageFleetFigures>>,
    /// The config in effect (the file plus changes made through the admin API).
    pub config: Arc<RouterConfig>,
    /// Conversations replicas failed (read lock-free; the writer's map).
    pub failed_keys: Arc<failed_keys::FailedKeys>,
}

impl Snapshot {
    /// The limits and priority class that apply to `tenant` now (its named
    /// entry in `tenants:`, else `default`; also for requests with no
    /// tenant), as the config in effect says: hot reloads and admin changes
    /// included.
    pub fn tenant(&self, tenant: &str) -> &crate::config::TenantLimits {
        self.config.tenants.limits_for(tenant)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ReplicaState {
    pub health: Health,
    /// Passed the stage's golden prompts since it last (re)joined.
    pub warm: bool,
    pub ejected: bool,
    pub draining: bool,
    /// Its source (or the config) no longer lists it: no new requests, and
    /// it is removed once idle or after `membership.removal_grace_ms`.
    pub leaving: bool,
}

impl ReplicaState {
    pub fn ready(&self) -> bool {
        self.health == Health::Healthy
            && self.warm
            && !self.ejected
            && !self.draining
            && !self.leaving
    }

    /// The one word an operator sees.
    pub fn label(&self) -> &'static str {
        if self.leaving {
            return "leaving";
        }
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

/// A decision's ids, kept with its load under its nonce (`lease`) until the
/// access log reports the request's end: the observation finds the stage,
/// fleet and replica it concerns by that nonce, not by their names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decided {
    /// The topology generation the ids belong to.
    pub generation: u64,
    pub stage: StageId,
    pub fleet: FleetId,
    pub replica: ReplicaId,
    /// It named a LoRA adapter, or went to a packed replica: its first
    /// token is not judged (see `state::outlier`).
    pub adapter: bool,
}

/// A decision, as the writer learns it.
#[derive(Clone, Debug)]
pub struct Routed {
    pub generation: u64,
    /// fleetroute's own id of the decision (the observation's nonce).
    pub decision_id: u64,
    /// The client's `x-request-id`, already truncated (`route::key`).
    pub request_id: String,
    pub stage: StageId,
    pub fleet: FleetId,
    pub replica: ReplicaId,
    /// Where the sampling key came from (none: no key).
    pub key_source: Option<KeySource>,
    pub arm: Arm,
    /// Why this replica of the fleet (`route::replica::ReplicaChoice::pick`).
    pub pick: Pick,
    pub shadow: Option<FleetId>,
    pub blocks: Vec<u64>,
    pub block_tokens: u32,
    pub prompt_tokens: u64,
    pub predicted_cached_tokens: u64,
    /// The request's LoRA adapter and what loading it on the chosen replica
    /// was expected to cost, prefill tokens.
    pub adapter: Option<(crate::topology::AdapterId, f64)>,
    /// Set when `stage` is a fallback of the stage the client named.
    pub fallback: Option<crate::topology::Fallen>,
}

#[derive(Debug)]
pub enum Event {
    Health {
        generation: u64,
        fleet: FleetId,
        replica: ReplicaId,
        ok: bool,
    },
    Warmup {
        generation: u64,
        fleet: FleetId,
        replica: ReplicaId,
        ok: bool,
    },
    Routed(Box<Routed>),
    /// fleetroute answered the request itself (no model, no replica, ...).
    Rejected {
        stage: String,
        reason: &'static str,
    },
    Observed(Box<Observation>),
    /// A prefix-index change another instance made (see `peer`).
    Peer(Box<peer::PeerUpdate>),
    /// A fleet's full member set from its source (see `sources`); applied
    /// only while the fleet's configured source is still `source`.
    Membership {
        fleet: String,
        source: Source,
        members: Vec<Member>,
    },
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
    /// Bumped by the writer whenever it publishes a snapshot whose topology
    /// (the members) or any replica's state differs from the one before.
    replica_view: watch::Sender<u64>,
    /// This instance's name, in its decisions' tags and on the peer link.
    pub instance: String,
    /// Tenant limits and budgets (lock-free counters; limits follow the
    /// config) and the audit log.
    pub tenants: Accountant,
    /// When the state was made (readiness waits for sources from here).
    pub started: std::time::Instant,
    /// Where stopping is: draining withdraws readiness, closing ends the
    /// long-lived streams.
    pub shutdown: Arc<crate::shutdown::Shutdown>,
    /// Whether routing calls are decided: `serve` clears it at start and
    /// sets it once the instance is ready (members known, replicas probed);
    /// until then a call fails open, as if no instance answered, instead of
    /// answering 503 for replicas not probed yet (Envoy may call an instance
    /// before its health checks see it ready).
    pub deciding: std::sync::atomic::AtomicBool,
    /// Adapters registered on replicas (`lora.load_path`).
    pub registrations: registrations::Registrations,
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
            self.metrics.control.events_dropped.inc();
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

    /// Wakes when the replicas change: a new topology installed (a reload,
    /// an admin edit, a member joining, leaving or removed: every one goes
    /// through `Writer::set_topology`) or a replica's state flipped. Read
    /// the snapshot after waking; changes in between coalesce.
    pub fn watch_replicas(&self) -> watch::Receiver<u64> {
        self.replica_view.subscribe()
    }

    pub fn events(&self) -> mpsc::Sender<Event> {
        self.events.clone()
    }

    /// Holds a decision's load, and its tenant's charge, under a lease (see
    /// `lease`).
    pub fn hold_load(
        &self,
        nonce: u64,
        guard: RequestGuard,
        decided: Decided,
        input: &LeaseInput,
        charge: Option<Charge>,
    ) {
        let snap = self.snapshot.load();
        self.leases
            .hold(nonce, guard, decided, &snap.config.leases, input, charge);
    }

    /// A decision made outside a request (a placement load) into the log.
    pub fn log_decision(&self, record: DecisionRecord) {
        self.decisions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(record);
    }

    pub fn recent_decisions(&self, q: decision_log::Query<'_>) -> Vec<DecisionRecord> {
        let log = self.decisions.lock().unwrap_or_else(|e| e.into_inner());
        log.find(q)
    }
}
