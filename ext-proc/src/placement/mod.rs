//! Placement ahead of demand on packed fleets (`packing.placement`): each
//! interval, every model's request rate on the fleet (from the routing
//! counters, averaged over `window_s`) and each replica's models give a plan
//! ([`plan::plan`]), and its loads start in the background through the same
//! single-flight loads requests use (a request for the model meanwhile waits
//! for that load rather than start another). At most
//! `max_loads_per_replica_per_min` such loads per replica.

pub mod plan;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::metrics::{AdapterLoad, StageFleetArm};
use crate::state::decision_log::DecisionRecord;
use crate::state::{Shared, Snapshot};
use crate::topology::{AdapterId, Fleet, FleetId, ReplicaId, StageId};
use plan::{Demand, Holder, plan};

/// Sleep when no fleet places models.
const IDLE: Duration = Duration::from_secs(1);

/// Longest a load runs (`load_timeout_ms` is at most this).
const MAX_LOAD: Duration = Duration::from_millis(crate::config::MAX_WAIT_CAP_MS);

/// A model's requests on a fleet: the counter last read and the average rate.
#[derive(Default)]
struct Rate {
    count: u64,
    per_sec: f64,
    /// Read this round: a stage or fleet gone by a reload is dropped.
    seen: bool,
}

/// Placement loads per replica in the current minute.
struct Minute {
    start: Instant,
    loads: u32,
}

/// Placement's memory between rounds: each model's rate, each replica's
/// loads this minute.
#[derive(Default)]
pub struct Placement {
    /// (fleet, stage) names → its rate.
    rates: HashMap<(String, String), Rate>,
    /// Replica identity → its loads this minute.
    minutes: HashMap<Arc<str>, Minute>,
    /// Loads started, until they could have ended (`load_timeout_ms`): held
    /// for the plan even while a scrape that read the engine before the
    /// load began says otherwise.
    started: HashMap<(Arc<str>, AdapterId), Instant>,
    last: Option<Instant>,
}

pub async fn run(shared: Arc<Shared>) {
    let mut p = Placement::default();
    loop {
        let snap = shared.snapshot_full();
        let interval = snap
            .topo
            .fleets
            .iter()
            .filter_map(|f| placement_of(f).map(|pl| pl.interval_ms))
            .min();
        let Some(interval) = interval else {
            p = Placement::default();
            tokio::time::sleep(IDLE).await;
            continue;
        };
        for load in p.round(&shared, &snap, crate::clock::now()) {
            start(&shared, &snap, load);
        }
        drop(snap);
        tokio::time::sleep(Duration::from_millis(interval)).await;
    }
}

fn placement_of(f: &Fleet) -> Option<&crate::config::PlacementConfig> {
    f.hold.as_ref()?.placement()
}

/// A load placement decided: the model of `stage` onto `replica` of `fleet`.
#[derive(Clone, Copy, Debug)]
pub struct Planned {
    pub stage: StageId,
    pub fleet: FleetId,
    pub replica: ReplicaId,
    pub id: AdapterId,
}

impl Placement {
    /// One round over every fleet with placement: the loads to start now
    /// (counted against their replicas' minute).
    pub fn round(&mut self, shared: &Shared, snap: &Snapshot, now: Instant) -> Vec<Planned> {
        let dt = self
            .last
            .map_or(0.0, |l| now.duration_since(l).as_secs_f64());
        self.last = Some(now);
        self.minutes
            .retain(|_, m| now.duration_since(m.start) < Duration::from_secs(60));
        self.started
            .retain(|_, at| now.duration_since(*at) < MAX_LOAD);
        let mut out = Vec::new();
        for r in self.rates.values_mut() {
            r.seen = false;
        }
        for (f, fleet) in snap.topo.fleets.iter().enumerate() {
            let (Some(pl), Some(hold)) = (placement_of(fleet), &fleet.hold) else {
                continue;
            };
            let f = FleetId(f);
            let stages: Vec<(StageId, Demand)> = snap
                .topo
                .stages
                .iter()
                .enumerate()
                .filter(|(_, s)| s.fleets.contains(&f))
                .filter_map(|(i, s)| {
                    let id = s.packed?;
                    let rate = self.rate(shared, &fleet.name, s, dt, pl.window_s);
                    Some((
                        StageId(i),
                        Demand {
                            id,
                            rate,
                            warm: s.warm_replicas,
                        },
                    ))
                })
                .collect();
            let (ready, mut holders) = self.holders(snap, f, pl);
            let demand: Vec<Demand> = stages.iter().map(|s| s.1).collect();
            for (h, id) in plan(&demand, &mut holders, hold.ready as usize) {
                let Some(&(stage, _)) = stages.iter().find(|s| s.1.id == id) else {
                    continue;
                };
                let identity = fleet.replicas[ready[h]].identity.clone();
                self.started.insert((identity.clone(), id), now);
                self.minutes
                    .entry(identity)
                    .or_insert(Minute {
                        start: now,
                        loads: 0,
                    })
                    .loads += 1;
                out.push(Planned {
                    stage,
                    fleet: f,
                    replica: ready[h],
                    id,
                });
            }
        }
        self.rates.retain(|_, r| r.seen);
        out
    }

    /// The fleet's ready replicas, and each as the plan sees it: its models
    /// (with the loads started for it that may still be running), its
    /// loads left this minute.
    fn holders(
        &self,
        snap: &Snapshot,
        f: FleetId,
        pl: &crate::config::PlacementConfig,
    ) -> (Vec<ReplicaId>, Vec<Holder>) {
        let fleet = &snap.topo.fleets[f];
        let ready: Vec<ReplicaId> = fleet
            .replicas
            .ids()
            .filter(|&r| snap.replicas[f].get(r).is_some_and(|s| s.ready()))
            .collect();
        let holders = ready
            .iter()
            .map(|&r| {
                let rep = &fleet.replicas[r];
                let mut held = rep
                    .load
                    .adapters
                    .get()
                    .map_or_else(Vec::new, |h| h.0.clone());
                for (who, id) in self.started.keys() {
                    if *who == rep.identity && !held.contains(id) {
                        held.insert(0, *id);
                    }
                }
                let used = self.minutes.get(&rep.identity).map_or(0, |m| m.loads);
                Holder {
                    held,
                    seed: rep.seed,
                    loads_left: pl.max_loads_per_replica_per_min.saturating_sub(used),
                }
            })
            .collect();
        (ready, holders)
    }

    /// The averaged request rate of `stage` on `fleet`, from the counters of
    /// requests routed there (every arm of an A/B test).
    fn rate(
        &mut self,
        shared: &Shared,
        fleet: &str,
        stage: &crate::topology::Stage,
        dt: f64,
        window_s: u64,
    ) -> f64 {
        let arms: &[&str] = if stage.experiment.ab.is_some() {
            &["none", "control", "variant"]
        } else {
            &["none"]
        };
        let count: u64 = arms
            .iter()
            .map(|arm| {
                let labels = StageFleetArm {
                    stage: stage.name.clone(),
                    fleet: fleet.to_string(),
                    arm: arm.to_string(),
                };
                shared.metrics.routing.requests.get_or_create(&labels).get()
            })
            .sum();
        let r = self
            .rates
            .entry((fleet.to_string(), stage.name.clone()))
            .or_insert(Rate {
                count,
                per_sec: 0.0,
                seen: true,
            });
        if dt > 0.0 {
            let now = count.saturating_sub(r.count) as f64 / dt;
            let a = (dt / window_s.max(1) as f64).min(1.0);
            r.per_sec += a * (now - r.per_sec);
        }
        r.count = count;
        r.seen = true;
        r.per_sec
    }
}

/// Starts one planned load in the background: the single-flight load first,
/// then the model is marked held, so a request decided from then on goes
/// there and waits for this load.
fn start(shared: &Arc<Shared>, snap: &Snapshot, p: Planned) {
    let fleet = &snap.topo.fleets[p.fleet];
    let rep = &fleet.replicas[p.replica];
    let at = (p.stage, p.fleet, p.replica);
    let Some(pending) = shared.registrations.needed(&snap.topo, at, p.id, false) else {
        return;
    };
    let Some(hold) = &fleet.hold else { return };
    // What the load is expected to evict: the least recently used model of
    // a full replica.
    let held = rep.load.adapters.get().unwrap_or_default();
    let evicts = held
        .0
        .get((hold.ready as usize).saturating_sub(1))
        .filter(|_| held.0.len() >= hold.ready as usize)
        .and_then(|&id| snap.topo.stages_of(p.fleet).find_map(|s| s.held_name(id)))
        .map(String::from);
    rep.load.adapters.used(&[p.id], hold.kept);
    tracing::info!(fleet = %fleet.name, replica = %rep.addr, model = %pending.name, evicts = ?evicts, "placement: loading ahead of demand");
    let stage = &snap.topo.stages[p.stage].name;
    shared.log_decision(DecisionRecord::placement(
        (stage, &fleet.name, &rep.addr),
        &pending.name,
        hold.tokens(hold.load_ms),
        evicts,
    ));
    let shared = shared.clone();
    tokio::spawn(async move {
        let result = match shared.registrations.run(&pending).await {
            Ok(_) => AdapterLoad::Ok,
            Err(why) => {
                tracing::warn!(model = %pending.name, %why, "placement: load failed");
                AdapterLoad::Failed
            }
        };
        shared.metrics.routing.placement_loads.inc(result);
    });
}
