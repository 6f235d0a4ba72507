//! Router state. One task (the writer) owns every change and publishes
//! immutable snapshots; the decision path reads the current snapshot and the
//! per-replica atomics, and never waits on the writer.

pub mod figures;
pub mod health;
pub mod load;
pub mod outlier;
pub mod prefix_index;
pub mod scrape;
pub mod warmup;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use moka::sync::Cache;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::config::RouterConfig;
use crate::observe::Observation;
use crate::topology::Topology;
use figures::{FleetFigures, FleetWindow};
use health::{Health, HealthMachine};
use load::{ReplicaLoad, RequestGuard};
use outlier::ReplicaOutlier;
use prefix_index::{IndexWriter, PrefixIndex};

/// What the decision path reads for one request.
#[derive(Debug)]
pub struct Snapshot {
    pub topo: Arc<Topology>,
    /// `[fleet][replica]`, parallel to `topo.fleets[f].replicas`.
    pub replicas: Vec<Vec<ReplicaState>>,
    /// Parallel to `topo.fleets`.
    pub fleets: Vec<FleetState>,
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
}

#[derive(Clone, Debug)]
pub struct FleetState {
    pub prefix: Arc<PrefixIndex>,
    pub figures: FleetFigures,
    /// The priority policy's saturation, with hysteresis (see `saturation`).
    pub spilling: bool,
}

/// A decision, as the writer learns it.
#[derive(Clone, Debug)]
pub struct Routed {
    pub generation: u64,
    pub request_id: String,
    pub stage: usize,
    pub fleet: usize,
    pub replica: usize,
    pub key_source: &'static str,
    pub blocks: Vec<u64>,
    pub block_tokens: u32,
    pub predicted_cached_tokens: u64,
}

/// A decision as `/debug/decisions` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct DecisionRecord {
    pub request_id: String,
    pub stage: String,
    pub fleet: String,
    pub replica: String,
    pub key_source: &'static str,
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
    Observed(Box<Observation>),
    Reload(Box<RouterConfig>),
}

/// How long a decision's load waits for the observing stream to claim it
/// before it is released anyway (the observer was never reached).
const UNCLAIMED_TTL: Duration = Duration::from_secs(30);
const DECISION_LOG: usize = 4096;
const EVENT_QUEUE: usize = 65_536;
/// How often saturation, figures and outliers are re-evaluated.
pub const TICK: Duration = Duration::from_millis(250);

/// Everything shared between the gRPC streams, the admin API and the writer.
pub struct Shared {
    snapshot: ArcSwap<Snapshot>,
    events: mpsc::Sender<Event>,
    /// Load guards of routed requests, by request id, until observed.
    pending: Cache<String, Arc<RequestGuard>>,
    /// Recent decisions for `/debug/decisions`; only the writer appends.
    decisions: Mutex<VecDeque<DecisionRecord>>,
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

    /// Never blocks the request path: when the writer is far behind, the event
    /// is dropped (it only refines state that later events correct).
    pub fn emit(&self, event: Event) {
        let _ = self.events.try_send(event);
    }

    pub fn events(&self) -> mpsc::Sender<Event> {
        self.events.clone()
    }

    pub fn hold_load(&self, request_id: &str, guard: RequestGuard) {
        if !request_id.is_empty() {
            self.pending.insert(request_id.to_string(), Arc::new(guard));
        }
    }

    /// The observing stream takes over a request's load.
    pub fn claim_load(&self, request_id: &str) -> Option<Arc<RequestGuard>> {
        self.pending.remove(request_id)
    }

    pub fn recent_decisions(&self, request_id: Option<&str>, limit: usize) -> Vec<DecisionRecord> {
        let log = self.decisions.lock().unwrap_or_else(|e| e.into_inner());
        log.iter()
            .rev()
            .filter(|d| request_id.is_none_or(|id| d.request_id == id))
            .take(limit)
            .cloned()
            .collect()
    }
}

/// The writer's model of one replica.
#[derive(Debug, Default)]
struct ReplicaModel {
    health: HealthMachine,
    warm: bool,
    outlier: ReplicaOutlier,
    draining: bool,
}

#[derive(Debug)]
struct FleetModel {
    index: IndexWriter,
    window: FleetWindow,
    spilling: bool,
    figures: FleetFigures,
    replicas: Vec<ReplicaModel>,
}

/// Owns all mutable router state; the only publisher of snapshots.
pub struct Writer {
    shared: Arc<Shared>,
    rx: mpsc::Receiver<Event>,
    topo: Arc<Topology>,
    fleets: Vec<FleetModel>,
    loads: HashMap<(String, String), Arc<ReplicaLoad>>,
    dirty: bool,
}

impl Writer {
    pub fn new(cfg: &RouterConfig) -> (Arc<Shared>, Writer) {
        let (tx, rx) = mpsc::channel(EVENT_QUEUE);
        let mut loads = HashMap::new();
        let topo = Arc::new(build_topology(cfg, 1, &mut loads));
        let fleets = fleet_models(&topo, Vec::new(), &Topology::empty());
        let shared = Arc::new(Shared {
            snapshot: ArcSwap::from_pointee(snapshot(&topo, &fleets)),
            events: tx,
            pending: Cache::builder()
                .max_capacity(1 << 20)
                .time_to_live(UNCLAIMED_TTL)
                .build(),
            decisions: Mutex::new(VecDeque::with_capacity(DECISION_LOG)),
        });
        let writer = Writer {
            shared: shared.clone(),
            rx,
            topo,
            fleets,
            loads,
            dirty: false,
        };
        (shared, writer)
    }

    pub async fn run(mut self) {
        let mut tick = tokio::time::interval(TICK);
        loop {
            tokio::select! {
                ev = self.rx.recv() => match ev {
                    Some(ev) => {
                        let now = Instant::now();
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
                    self.tick(Instant::now());
                    self.shared.pending.run_pending_tasks();
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
                if generation == self.topo.generation {
                    self.on_health(fleet, replica, ok);
                }
            }
            Event::Warmup {
                generation,
                fleet,
                replica,
                ok,
            } => {
                if generation == self.topo.generation {
                    let m = &mut self.fleets[fleet].replicas[replica];
                    if ok && !m.warm {
                        m.warm = true;
                        let f = &self.topo.fleets[fleet];
                        tracing::info!(fleet = %f.name, replica = %f.replicas[replica].addr, "replica passed warmup, joins the rotation");
                        self.dirty = true;
                    }
                }
            }
            Event::Routed(r) => self.on_routed(*r),
            Event::Observed(o) => self.on_observed(&o, now),
            Event::Reload(cfg) => self.reload(&cfg, now),
        }
    }

    fn on_health(&mut self, fleet: usize, replica: usize, ok: bool) {
        let cfg = self.topo.health_check.clone();
        let warmup = self.topo.stages_of(fleet).any(|s| s.warmup.is_some());
        let m = &mut self.fleets[fleet].replicas[replica];
        let Some(now) = m.health.record(ok, &cfg) else {
            return;
        };
        let f = &self.topo.fleets[fleet];
        tracing::info!(fleet = %f.name, replica = %f.replicas[replica].addr, health = ?now, "replica health changed");
        if now == Health::Unhealthy {
            // Its cache is gone or unreachable: stop predicting hits on it.
            self.fleets[fleet].index.clear(replica);
            self.fleets[fleet].replicas[replica].warm = !warmup;
        }
        self.dirty = true;
    }

    fn on_routed(&mut self, r: Routed) {
        if r.generation == self.topo.generation
            && let Some(f) = self.fleets.get_mut(r.fleet)
        {
            f.index.insert(r.replica, &r.blocks, r.block_tokens);
        }
        let topo = &self.topo;
        let (Some(stage), Some(fleet)) = (topo.stages.get(r.stage), topo.fleets.get(r.fleet))
        else {
            return;
        };
        let record = DecisionRecord {
            request_id: r.request_id,
            stage: stage.name.clone(),
            fleet: fleet.name.clone(),
            replica: fleet
                .replicas
                .get(r.replica)
                .map(|x| x.addr.clone())
                .unwrap_or_default(),
            key_source: r.key_source,
            predicted_cached_tokens: r.predicted_cached_tokens,
        };
        let mut log = self
            .shared
            .decisions
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if log.len() == DECISION_LOG {
            log.pop_front();
        }
        log.push_back(record);
    }

    fn on_observed(&mut self, o: &Observation, now: Instant) {
        let Some(f) = self.topo.fleet_index(&o.fleet) else {
            return;
        };
        let addr = o.served_by.as_deref().unwrap_or(&o.replica);
        let Some(r) = self.topo.fleets[f]
            .replicas
            .iter()
            .position(|x| x.addr == addr)
        else {
            return;
        };
        let ok = o.succeeded();
        let cached = o.usage.map(|u| u.cached_tokens());
        // Time to first token is the prefill queued ahead plus this prompt's
        // own: normalising by both gives a figure of the replica's speed that
        // does not depend on how busy routing made it.
        let uncached = match o.usage {
            Some(u) => u.prompt_tokens.saturating_sub(u.cached_tokens()),
            None => o.uncached_tokens,
        };
        let work = uncached + o.queued_tokens;
        let ttft_ms = o
            .time_to_first_byte
            .filter(|_| ok && o.stream)
            .map(|d| d.as_secs_f64() * 1000.0);
        let tokens = o.usage.map_or(0, |u| u.prompt_tokens + u.completion_tokens);
        let fm = &mut self.fleets[f];
        fm.window.record(now, ok, ttft_ms, work, tokens);
        if o.counts_against_replica() {
            let out = o.usage.map_or(0, |u| u.completion_tokens);
            fm.replicas[r].outlier.record(
                now,
                ok,
                ttft_ms,
                uncached,
                o.total.as_secs_f64() * 1000.0,
                out,
            );
        }
        // The engine reports nothing cached where the router predicted a
        // real prefix: the replica lost its cache (restart, eviction storm).
        if ok && cached == Some(0) && o.predicted_cached_tokens > 0 && addr == o.replica {
            fm.index.clear(r);
        }
    }

    /// Periodic work: saturation (with hysteresis), figures, outliers.
    pub fn tick(&mut self, now: Instant) {
        let snap = self.shared.snapshot();
        for (f, fleet) in self.topo.fleets.iter().enumerate() {
            let ready: Vec<usize> = (0..fleet.replicas.len())
                .filter(|&r| {
                    snap.replicas
                        .get(f)
                        .and_then(|v| v.get(r))
                        .is_some_and(|s| s.ready())
                })
                .collect();
            let fm = &mut self.fleets[f];
            let resume = self
                .topo
                .stages_of(f)
                .map(|s| s.routing.resume_below())
                .fold(1.0f64, f64::min);
            let spilling = crate::route::saturation::spilling(fleet, &ready, fm.spilling, resume);
            if spilling != fm.spilling {
                tracing::info!(fleet = %fleet.name, saturated = spilling, "fleet saturation changed");
                fm.spilling = spilling;
                self.dirty = true;
            }
            let window = self
                .topo
                .stages_of(f)
                .map(|s| s.alarms.window_s)
                .max()
                .unwrap_or(60);
            let figures = fm.window.figures(
                now,
                Duration::from_secs(window),
                ready.len(),
                fleet.cost.as_ref(),
            );
            if figures_changed(&fm.figures, &figures) {
                fm.figures = figures;
                self.dirty = true;
            }
            // Ejections end by time.
            for (r, m) in fm.replicas.iter().enumerate() {
                let was = snap
                    .replicas
                    .get(f)
                    .and_then(|v| v.get(r))
                    .is_some_and(|s| s.ejected);
                if was && !m.outlier.is_ejected(now) {
                    tracing::info!(fleet = %fleet.name, replica = %fleet.replicas[r].addr, "ejection over, replica re-admitted");
                    self.dirty = true;
                }
            }
            if let Some(cfg) = self.topo.outlier_for(f) {
                let eligible: Vec<bool> = (0..fleet.replicas.len())
                    .map(|r| fm.replicas[r].health.state == Health::Healthy)
                    .collect();
                let mut outliers: Vec<ReplicaOutlier> = fm
                    .replicas
                    .iter_mut()
                    .map(|m| std::mem::take(&mut m.outlier))
                    .collect();
                let ejected = outlier::evaluate(&mut outliers, &eligible, cfg, now);
                for (m, o) in fm.replicas.iter_mut().zip(outliers) {
                    m.outlier = o;
                }
                for (r, d) in ejected {
                    tracing::warn!(fleet = %fleet.name, replica = %fleet.replicas[r].addr, seconds = d.as_secs(), "replica ejected: behind its fleet's median");
                    self.dirty = true;
                }
            }
        }
        drop(snap);
        self.publish_if_dirty(now);
    }

    fn reload(&mut self, cfg: &RouterConfig, now: Instant) {
        let topo = Arc::new(build_topology(
            cfg,
            self.topo.generation + 1,
            &mut self.loads,
        ));
        let old = std::mem::take(&mut self.fleets);
        self.fleets = fleet_models(&topo, old, &self.topo);
        self.topo = topo;
        // Counters of replicas that left go with them.
        let live: std::collections::HashSet<(String, String)> = self
            .topo
            .fleets
            .iter()
            .flat_map(|f| f.replicas.iter().map(|r| (f.name.clone(), r.addr.clone())))
            .collect();
        self.loads.retain(|k, _| live.contains(k));
        tracing::info!(generation = self.topo.generation, "router config applied");
        self.dirty = true;
        self.publish_if_dirty(now);
    }

    fn publish_if_dirty(&mut self, now: Instant) {
        if std::mem::take(&mut self.dirty) {
            self.shared
                .snapshot
                .store(Arc::new(snapshot_at(&self.topo, &self.fleets, now)));
        }
    }
}

fn figures_changed(a: &FleetFigures, b: &FleetFigures) -> bool {
    a.samples != b.samples
        || a.latency != b.latency
        || a.ttft_p95_ms != b.ttft_p95_ms
        || a.usd_per_mtok != b.usd_per_mtok
}

fn build_topology(
    cfg: &RouterConfig,
    generation: u64,
    loads: &mut HashMap<(String, String), Arc<ReplicaLoad>>,
) -> Topology {
    Topology::build(cfg, generation, |fleet, addr| {
        loads
            .entry((fleet.to_string(), addr.to_string()))
            .or_default()
            .clone()
    })
}

/// Models for a new topology: a fleet whose replica list is unchanged keeps
/// everything (its prefix index included); other fleets keep what they can
/// per replica address.
fn fleet_models(topo: &Topology, mut old: Vec<FleetModel>, old_topo: &Topology) -> Vec<FleetModel> {
    let mut out = Vec::with_capacity(topo.fleets.len());
    for (f, fleet) in topo.fleets.iter().enumerate() {
        let warmup = topo.stages_of(f).any(|s| s.warmup.is_some());
        let prev = old_topo.fleet_index(&fleet.name);
        let same_members = prev.is_some_and(|p| {
            old_topo.fleets[p]
                .replicas
                .iter()
                .map(|r| &r.addr)
                .eq(fleet.replicas.iter().map(|r| &r.addr))
        });
        if same_members
            && let Some(p) = prev
            && p < old.len()
        {
            let m = std::mem::replace(&mut old[p], empty_model(0, 1));
            out.push(m);
            continue;
        }
        let mut m = empty_model(fleet.replicas.len(), fleet.capacity.kv_cache_tokens);
        for (r, rep) in fleet.replicas.iter().enumerate() {
            let carried = prev.and_then(|p| {
                let oi = old_topo.fleets[p]
                    .replicas
                    .iter()
                    .position(|x| x.addr == rep.addr)?;
                old.get_mut(p)
                    .and_then(|fm| fm.replicas.get_mut(oi))
                    .map(std::mem::take)
            });
            m.replicas[r] = carried.unwrap_or(ReplicaModel {
                warm: !warmup,
                ..Default::default()
            });
        }
        out.push(m);
    }
    out
}

fn empty_model(replicas: usize, kv_tokens: u64) -> FleetModel {
    FleetModel {
        index: IndexWriter::new(replicas, kv_tokens),
        window: FleetWindow::default(),
        spilling: false,
        figures: FleetFigures::default(),
        replicas: (0..replicas).map(|_| ReplicaModel::default()).collect(),
    }
}

fn snapshot(topo: &Arc<Topology>, fleets: &[FleetModel]) -> Snapshot {
    snapshot_at(topo, fleets, Instant::now())
}

fn snapshot_at(topo: &Arc<Topology>, fleets: &[FleetModel], now: Instant) -> Snapshot {
    Snapshot {
        topo: topo.clone(),
        replicas: fleets
            .iter()
            .map(|fm| {
                fm.replicas
                    .iter()
                    .map(|m| ReplicaState {
                        health: m.health.state,
                        warm: m.warm,
                        ejected: m.outlier.is_ejected(now),
                        draining: m.draining,
                    })
                    .collect()
            })
            .collect(),
        fleets: fleets
            .iter()
            .map(|fm| FleetState {
                prefix: fm.index.index(),
                figures: fm.figures,
                spilling: fm.spilling,
            })
            .collect(),
    }
}
