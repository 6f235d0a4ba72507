//! The state writer: the one task that changes the writer's models. It takes
//! events (health, decisions, observations, membership, changes) and a
//! periodic tick, hands each to the models it concerns, and publishes
//! snapshots for the decision path. The rules live in the models (`model`),
//! the metric labels in `recorder`, reload migration in `migrate`,
//! membership in `members`, snapshots in `snapshot`. Every topology change
//! goes through [`Writer::set_topology`].

mod changes;

pub use changes::{Change, ChangeError};
mod membership;
mod peers;
mod recorder;
mod reload;
mod retried;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tokio::sync::mpsc;

use crate::config::{RouterConfig, Source, ValidConfig};
use crate::metrics::PrefixUpdate;
use crate::state::accounting::Accounting;
use crate::state::decision_log::DecisionRecord;
use crate::state::failed_keys::FailedKeysWriter;
use crate::state::lease::Leases;
use crate::state::members::{self, FleetChange};
use crate::state::model::FleetModel;
use crate::state::observation::Observation;
use crate::state::peer::{PeerChange, PeerUpdate};
use crate::state::{EVENT_QUEUE, Event, Routed, Shared, TICK, model, snapshot};
use crate::tenancy::accountant::Accountant;
use crate::topology::{ById, FleetId, ReplicaId, Slots, Topology};

/// Owns all the writer's models; the only publisher of snapshots.
pub struct Writer {
    shared: Arc<Shared>,
    rx: mpsc::Receiver<Event>,
    config: Arc<RouterConfig>,
    topo: Arc<Topology>,
    fleets: Vec<FleetModel>,
    accounting: Accounting,
    failed_keys: FailedKeysWriter,
    dirty: bool,
    /// Where this instance's prefix changes go for other instances (none
    /// when it runs alone).
    outbox: Option<mpsc::Sender<PeerUpdate>>,
    /// When the replicas' recent request counts were last decayed.
    recent_at: Instant,
}

/// Half-life of each replica's count of recent requests, which bounds the
/// share of new conversations it takes (`replica_choice.share_factor`).
pub const RECENT_HALF_LIFE: Duration = Duration::from_secs(60);

impl Writer {
    /// Takes a validated config: the topology it builds relies on names
    /// resolving and at most 64 replicas per static fleet. Dynamic fleets
    /// start with no member.
    pub fn new(cfg: &ValidConfig) -> (Arc<Shared>, Writer) {
        Self::named(cfg, format!("{:016x}", crate::clock::random_u64()))
    }

    /// `new`, for the instance called `instance` (an id of the peers'
    /// charset: the caller checks it).
    pub fn named(cfg: &ValidConfig, instance: String) -> (Arc<Shared>, Writer) {
        let (tx, rx) = mpsc::channel(EVENT_QUEUE);
        let now = crate::clock::now();
        let mut fleets: Vec<FleetModel> = cfg
            .fleets
            .iter()
            .map(|f| FleetModel::new(f.capacity.kv_cache_tokens))
            .collect();
        let mut replicas: Vec<Slots<_>> = cfg
            .fleets
            .iter()
            .zip(&mut fleets)
            .map(|(f, model)| match f.source() {
                Source::Static => {
                    let change = FleetChange {
                        fleet: &f.name,
                        current: &Slots::new(),
                        model,
                        generation: 1,
                        warmup: members::warms_up(cfg, &f.name),
                        now,
                    };
                    let (slots, _) = change.reconcile(&members::static_members(f));
                    model.desired = slots.len() as u32;
                    slots
                }
                Source::Dns(_) | Source::Kubernetes(_) => Slots::new(),
            })
            .collect();
        let topo = Arc::new(Topology::build(cfg, 1, 1, |f, _| {
            std::mem::take(&mut replicas[f.index()])
        }));
        let config = Arc::new(RouterConfig::clone(cfg));
        let failed_keys = FailedKeysWriter::default();
        let metrics = crate::metrics::Metrics::new();
        let first = snapshot::build(
            &topo,
            &config,
            &fleets,
            &Accounting::default(),
            &failed_keys,
            crate::clock::now(),
        );
        let shared = Arc::new(Shared {
            snapshot: ArcSwap::from_pointee(first),
            events: tx,
            leases: Leases::new(
                metrics.access_log.leases_released.clone(),
                metrics.access_log.prefill_ended.clone(),
            ),
            decisions: Mutex::default(),
            metrics,
            replica_view: tokio::sync::watch::Sender::new(0),
            tenants: Accountant::new(&cfg.tenants, cfg.tenants_redis.as_ref(), &instance),
            instance,
            started: crate::clock::now(),
            shutdown: Arc::default(),
            deciding: std::sync::atomic::AtomicBool::new(true),
            registrations: Default::default(),
        });
        let writer = Writer {
            shared: shared.clone(),
            rx,
            config,
            topo,
            fleets,
            accounting: Accounting::default(),
            failed_keys,
            dirty: false,
            outbox: None,
            recent_at: now,
        };
        shared.metrics.prime(&writer.topo);
        (shared, writer)
    }

    /// Another instance's prefix change, found by names in this topology.
    fn on_peer(&mut self, u: PeerUpdate) {
        let topo = &self.topo;
        let found = topo
            .fleet_index(&u.fleet)
            .and_then(|f| Some((f, topo.fleets.by_id(f)?.replica_index(&u.replica)?)));
        let Some((f, r)) = found else {
            self.shared.metrics.peers.updates.inc(PrefixUpdate::Unknown);
            return;
        };
        match u.change {
            PeerChange::Routed {
                blocks,
                block_tokens,
            } => self.fleets[f].cached(r, &blocks, block_tokens),
            PeerChange::Cleared => self.fleets[f].index.clear(r),
        }
        self.shared.metrics.peers.updates.inc(PrefixUpdate::Applied);
    }

    pub async fn run(mut self) {
        let mut tick = tokio::time::interval(TICK);
        loop {
            tokio::select! {
                ev = self.rx.recv() => match ev {
                    Some(ev) => {
                        let now = crate::clock::now();
                        self.apply(ev, now);
                        // Drain what else is queued before publishing once.
                        while let Ok(ev) = self.rx.try_recv() {
                            self.apply(ev, now);
                        }
                        self.publish_if_dirty(now);
                    }
                    None => return,
                },
                _ = tick.tick() => {
                    self.tick(crate::clock::now());
                    self.shared.leases.run_pending();
                    self.shared.metrics.access_log.leases_held.set(self.shared.leases.held() as i64);
                }
            }
        }
    }

    /// Applies every queued event now (used by simulations that drive the
    /// writer synchronously with their own clock).
    pub fn drain(&mut self, now: Instant) {
        while let Ok(ev) = self.rx.try_recv() {
            self.apply(ev, now);
        }
        self.publish_if_dirty(now);
    }

    pub fn apply(&mut self, ev: Event, now: Instant) {
        match ev {
            Event::Health {
                generation,
                fleet,
                replica,
                ok,
            } => {
                if self.topo.resolves(generation, fleet, replica).is_some()
                    && let (Some(fl), Some(fm)) =
                        (self.topo.fleets.by_id(fleet), self.fleets.by_id_mut(fleet))
                {
                    let warmup = self.topo.stages_of(fleet).any(|s| s.warmup.is_some());
                    let cfg = &self.topo.health_check;
                    self.dirty |= fm.health(fl, replica, ok, cfg, warmup);
                }
            }
            Event::Warmup {
                generation,
                fleet,
                replica,
                ok,
            } => {
                if self.topo.resolves(generation, fleet, replica).is_some()
                    && let (Some(fl), Some(fm)) =
                        (self.topo.fleets.by_id(fleet), self.fleets.by_id_mut(fleet))
                {
                    self.dirty |= fm.warmup(fl, replica, ok);
                }
            }
            Event::Routed(r) => self.on_routed(*r),
            Event::Rejected { stage, reason } => {
                recorder::rejected(&self.shared.metrics, stage, reason);
            }
            Event::Observed(o) => self.on_observed(&o, now),
            Event::Peer(u) => self.on_peer(*u),
            Event::Membership {
                fleet,
                source,
                members,
            } => {
                self.on_membership(&fleet, &source, &members, now);
                self.publish_if_dirty(now);
            }
            Event::Change { change, reply } => {
                let result = self.change(*change, now);
                match &result {
                    Ok(what) => tracing::info!("change applied: {what}"),
                    Err(why) => tracing::warn!("change refused: {why}"),
                }
                if let Some(reply) = reply {
                    let _ = reply.send(result);
                }
            }
        }
    }

    fn on_routed(&mut self, mut r: Routed) {
        if !self.topo.knows(r.generation) {
            return;
        }
        // The prefix index (here and at the peers) only for the member that
        // was chosen, while its slot holds it; the counts and the log for
        // every decision.
        let chosen = self
            .topo
            .resolves(r.generation, r.fleet, r.replica)
            .is_some();
        if chosen && let Some(f) = self.fleets.by_id_mut(r.fleet) {
            f.routed(&r);
        }
        if chosen && self.outbox.is_some() && !r.blocks.is_empty() {
            let change = PeerChange::Routed {
                blocks: std::mem::take(&mut r.blocks),
                block_tokens: r.block_tokens,
            };
            self.publish(r.fleet, r.replica, change);
        }
        let topo = &self.topo;
        let (Some(stage), Some(fleet)) = (topo.stages.by_id(r.stage), topo.fleets.by_id(r.fleet))
        else {
            return;
        };
        recorder::routed(&self.shared.metrics, topo, &r);
        self.accounting.routed(
            &stage.name,
            &fleet.name,
            r.prompt_tokens,
            r.predicted_cached_tokens,
        );
        let record = DecisionRecord::of(topo, r);
        self.shared
            .decisions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(record);
    }

    fn on_observed(&mut self, o: &Observation, now: Instant) {
        recorder::outcome(&self.shared.metrics, o);
        // The engine hit rate only counts engines that report cached tokens.
        if let Some(u) = o.usage
            && let Some(c) = u.cached_tokens()
        {
            self.accounting
                .observed(&o.stage, &o.fleet, u.prompt_tokens, c);
        }
        // By the decision's nonce; by name only for an entry that came after
        // its lease ended.
        let topo = &self.topo;
        let routed = match o.decided {
            Some(d) if topo.resolves(d.generation, d.fleet, d.replica).is_some() => {
                Some((d.fleet, d.replica))
            }
            Some(_) => None,
            None => topo
                .fleet_index(&o.fleet)
                .and_then(|f| Some((f, topo.fleets.by_id(f)?.replica_index(&o.replica)?))),
        };
        let Some((f, routed)) = routed else {
            return;
        };
        let Some(fleet) = topo.fleets.by_id(f) else {
            return;
        };
        // A retry may have landed on another host of the fleet.
        let (r, as_routed) = match o.served_by.as_deref() {
            Some(addr) if fleet.replicas.get(routed).is_none_or(|x| x.addr != addr) => {
                let Some(r) = fleet.replica_index(addr) else {
                    let addr = addr.to_string();
                    self.retried_elsewhere(o, (f, routed), &addr, now);
                    return;
                };
                (r, false)
            }
            _ => (routed, true),
        };
        if !o.succeeded()
            && o.counts_against_replica()
            && let Some(key) = o.key
        {
            // Its next turn goes to another replica.
            self.failed_keys.record(now, key, &self.topo, f, r);
        }
        if self.fleets[f].outcome(r, o, as_routed, now) {
            self.publish(f, r, PeerChange::Cleared);
        }
    }

    /// Periodic work: saturation (with hysteresis), figures, outliers,
    /// autoscaling signals, metrics. Reads the models, not the snapshot.
    pub fn tick(&mut self, now: Instant) {
        self.sweep_leavers(now);
        self.decay_recent(now);
        let ready: Vec<Vec<ReplicaId>> = self.fleets.iter().map(|fm| fm.ready(now)).collect();
        for (f, fm) in self.fleets.iter_mut().enumerate() {
            let f = FleetId(f);
            fm.tick(
                &self.topo,
                f,
                &ready[f],
                failover(&self.topo, &ready, f),
                now,
            );
        }
        self.failed_keys.expire(now);
        self.accounting.fold(now);
        model::autoscale(&self.topo, &mut self.fleets, &ready, now);
        // Figures move every tick: publish every tick.
        self.dirty = true;
        self.publish_if_dirty(now);
        recorder::gauges(
            &self.shared.metrics,
            &self.topo,
            &self.fleets,
            &self.accounting,
            now,
        );
    }

    /// Fades every replica's recent request count by the time since the last
    /// tick: half per [`RECENT_HALF_LIFE`].
    fn decay_recent(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(std::mem::replace(&mut self.recent_at, now));
        let keep = 0.5f64.powf(dt.as_secs_f64() / RECENT_HALF_LIFE.as_secs_f64());
        for fleet in &self.topo.fleets {
            for replica in fleet.replicas.values() {
                replica.load.decay_recent(keep);
            }
        }
    }

    pub(super) fn publish_if_dirty(&mut self, now: Instant) {
        if std::mem::take(&mut self.dirty) {
            let snap = snapshot::build(
                &self.topo,
                &self.config,
                &self.fleets,
                &self.accounting,
                &self.failed_keys,
                now,
            );
            let old = self.shared.snapshot.swap(Arc::new(snap));
            let new = self.shared.snapshot.load();
            if old.topo.generation != new.topo.generation || old.replicas != new.replicas {
                self.shared.replica_view.send_modify(|v| *v += 1);
            }
        }
    }
}

/// Whether every stage of fleet `f` has another fleet with a ready replica,
/// or an `unhealthy` fallback with one, to take its traffic if its last
/// replica is ejected.
fn failover(topo: &Topology, ready: &[Vec<ReplicaId>], f: FleetId) -> bool {
    let elsewhere = |g: &FleetId| *g != f && ready.by_id(*g).is_some_and(|v| !v.is_empty());
    let mut stages = topo.stages_of(f).peekable();
    stages.peek().is_some()
        && stages.all(|s| {
            s.fleets.iter().any(elsewhere)
                || s.fallbacks
                    .iter()
                    .filter(|(_, on)| on.contains(&crate::config::Condition::Unhealthy))
                    .any(|(to, _)| topo.stages[*to].fleets.iter().any(elsewhere))
        })
}

#[cfg(test)]
mod tests;
