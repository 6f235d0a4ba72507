//! Router state. One task (the writer) owns every change and publishes
//! immutable snapshots; the decision path reads the current snapshot and the
//! per-replica atomics, and never waits on the writer.

pub mod health;
pub mod load;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use moka::sync::Cache;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::config::RouterConfig;
use crate::topology::Topology;
use health::{Health, HealthMachine};
use load::{InflightGuard, ReplicaLoad};

/// What the decision path reads for one request.
#[derive(Debug)]
pub struct Snapshot {
    pub topo: Arc<Topology>,
    /// `[fleet][replica]`, parallel to `topo.fleets[f].replicas`.
    pub replicas: Vec<Vec<ReplicaState>>,
}

#[derive(Clone, Copy, Debug, Serialize)]
pub struct ReplicaState {
    pub health: Health,
}

impl ReplicaState {
    pub fn ready(&self) -> bool {
        self.health == Health::Healthy
    }
}

/// A decision, as the writer and the debug log keep it.
#[derive(Clone, Debug, Serialize)]
pub struct Routed {
    pub request_id: String,
    pub stage: String,
    pub fleet: String,
    pub replica: String,
    pub key_source: &'static str,
}

#[derive(Debug)]
pub enum Event {
    Health {
        generation: u64,
        fleet: usize,
        replica: usize,
        ok: bool,
    },
    Routed(Box<Routed>),
    Observed(Box<crate::observe::Observation>),
    Reload(Box<RouterConfig>),
}

/// How long a decision's in-flight count waits for the observing stream to
/// claim it before it is released anyway (the observer was never reached).
const UNCLAIMED_TTL: Duration = Duration::from_secs(30);
const DECISION_LOG: usize = 4096;
const EVENT_QUEUE: usize = 65_536;

/// Everything shared between the gRPC streams, the admin API and the writer.
pub struct Shared {
    snapshot: ArcSwap<Snapshot>,
    events: mpsc::Sender<Event>,
    /// In-flight guards of routed requests, by request id, until observed.
    pending: Cache<String, Arc<InflightGuard>>,
    /// Recent decisions for `/debug/decisions`; only the writer appends.
    decisions: Mutex<VecDeque<Routed>>,
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
    /// is dropped (it only refines state that the next events correct).
    pub fn emit(&self, event: Event) {
        let _ = self.events.try_send(event);
    }

    pub fn events(&self) -> mpsc::Sender<Event> {
        self.events.clone()
    }

    pub fn hold_inflight(&self, request_id: &str, guard: InflightGuard) {
        if !request_id.is_empty() {
            self.pending.insert(request_id.to_string(), Arc::new(guard));
        }
    }

    /// The observing stream takes over a request's in-flight count.
    pub fn claim_inflight(&self, request_id: &str) -> Option<Arc<InflightGuard>> {
        self.pending.remove(request_id)
    }

    pub fn recent_decisions(&self, request_id: Option<&str>, limit: usize) -> Vec<Routed> {
        let log = self.decisions.lock().unwrap_or_else(|e| e.into_inner());
        log.iter()
            .rev()
            .filter(|d| request_id.is_none_or(|id| d.request_id == id))
            .take(limit)
            .cloned()
            .collect()
    }
}

/// Owns all mutable router state; the only publisher of snapshots.
pub struct Writer {
    shared: Arc<Shared>,
    rx: mpsc::Receiver<Event>,
    topo: Arc<Topology>,
    health: Vec<Vec<HealthMachine>>,
    loads: HashMap<(String, String), Arc<ReplicaLoad>>,
}

impl Writer {
    pub fn new(cfg: &RouterConfig) -> (Arc<Shared>, Writer) {
        let (tx, rx) = mpsc::channel(EVENT_QUEUE);
        let mut loads = HashMap::new();
        let topo = Arc::new(build_topology(cfg, 1, &mut loads));
        let health = fresh_health(&topo, &[], &Topology::empty());
        let snapshot = Snapshot {
            replicas: replica_states(&topo, &health),
            topo: topo.clone(),
        };
        let shared = Arc::new(Shared {
            snapshot: ArcSwap::from_pointee(snapshot),
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
            health,
            loads,
        };
        (shared, writer)
    }

    pub async fn run(mut self) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                ev = self.rx.recv() => match ev {
                    Some(ev) => self.apply(ev),
                    None => return,
                },
                _ = tick.tick() => self.shared.pending.run_pending_tasks(),
            }
        }
    }

    fn apply(&mut self, ev: Event) {
        match ev {
            Event::Health {
                generation,
                fleet,
                replica,
                ok,
            } => {
                if generation != self.topo.generation {
                    return;
                }
                let cfg = &self.topo.health_check;
                if let Some(now) = self.health[fleet][replica].record(ok, cfg) {
                    let f = &self.topo.fleets[fleet];
                    tracing::info!(fleet = %f.name, replica = %f.replicas[replica].addr, health = ?now, "replica health changed");
                    self.publish();
                }
            }
            Event::Routed(r) => {
                let mut log = self
                    .shared
                    .decisions
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                if log.len() == DECISION_LOG {
                    log.pop_front();
                }
                log.push_back(*r);
            }
            Event::Observed(_) => {}
            Event::Reload(cfg) => {
                let topo = Arc::new(build_topology(
                    &cfg,
                    self.topo.generation + 1,
                    &mut self.loads,
                ));
                self.health = fresh_health(&topo, &self.health, &self.topo);
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
                self.publish();
            }
        }
    }

    fn publish(&self) {
        self.shared.snapshot.store(Arc::new(Snapshot {
            topo: self.topo.clone(),
            replicas: replica_states(&self.topo, &self.health),
        }));
    }
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

/// Health for a new topology: replicas that were already known keep theirs.
fn fresh_health(
    topo: &Topology,
    old: &[Vec<HealthMachine>],
    old_topo: &Topology,
) -> Vec<Vec<HealthMachine>> {
    topo.fleets
        .iter()
        .map(|f| {
            f.replicas
                .iter()
                .map(|r| {
                    old_topo
                        .fleet_index(&f.name)
                        .and_then(|of| {
                            let oi = old_topo.fleets[of]
                                .replicas
                                .iter()
                                .position(|x| x.addr == r.addr)?;
                            old.get(of)?.get(oi).copied()
                        })
                        .unwrap_or_default()
                })
                .collect()
        })
        .collect()
}

fn replica_states(topo: &Topology, health: &[Vec<HealthMachine>]) -> Vec<Vec<ReplicaState>> {
    topo.fleets
        .iter()
        .enumerate()
        .map(|(f, fleet)| {
            (0..fleet.replicas.len())
                .map(|r| ReplicaState {
                    health: health[f][r].state,
                })
                .collect()
        })
        .collect()
}
