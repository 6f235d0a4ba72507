//! The state writer: the one task that changes router state. It applies
//! events (health, decisions, observations, changes) and a periodic tick, and
//! publishes snapshots for the decision path.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tokio::sync::mpsc;

use super::accounting::Accounting;
use super::failed_keys::FailedKeysWriter;
use super::figures::{FleetFigures, FleetWindow};
use super::health::{Health, HealthMachine};
use super::lease::Leases;
use super::load::ReplicaLoad;
use super::outlier::{self, ReplicaOutlier};
use super::prefix_index::IndexWriter;
use super::{
    DecisionRecord, EVENT_QUEUE, Event, FleetState, ReplicaState, Routed, Shared, Snapshot,
    StageFleetFigures, TICK,
};
use crate::config::RouterConfig;
use crate::metrics::{Metrics, Outcome, StageFleet, StageFleetArm, Tokens};
use crate::observe::Observation;
use crate::topology::Topology;

/// The writer's model of one replica.
#[derive(Debug, Default)]
pub(super) struct ReplicaModel {
    pub(super) health: HealthMachine,
    pub(super) warm: bool,
    pub(super) outlier: ReplicaOutlier,
    pub(super) draining: bool,
}

#[derive(Debug)]
pub(super) struct FleetModel {
    pub(super) index: IndexWriter,
    pub(super) window: FleetWindow,
    pub(super) spilling: bool,
    pub(super) utilisation: f64,
    pub(super) desired: u32,
    pub(super) figures: FleetFigures,
    pub(super) replicas: Vec<ReplicaModel>,
}

/// Owns all mutable router state; the only publisher of snapshots.
pub struct Writer {
    pub(super) shared: Arc<Shared>,
    rx: mpsc::Receiver<Event>,
    pub(super) config: Arc<RouterConfig>,
    pub(super) topo: Arc<Topology>,
    pub(super) fleets: Vec<FleetModel>,
    pub(super) accounting: Accounting,
    failed_keys: FailedKeysWriter,
    loads: HashMap<(String, String), Arc<ReplicaLoad>>,
    pub(super) dirty: bool,
}

impl Writer {
    pub fn new(cfg: &RouterConfig) -> (Arc<Shared>, Writer) {
        let (tx, rx) = mpsc::channel(EVENT_QUEUE);
        let mut loads = HashMap::new();
        let topo = Arc::new(build_topology(cfg, 1, &mut loads));
        let fleets = fleet_models(&topo, Vec::new(), &Topology::empty());
        let config = Arc::new(cfg.clone());
        let failed_keys = FailedKeysWriter::default();
        let metrics = Metrics::new();
        let shared = Arc::new(Shared {
            snapshot: ArcSwap::from_pointee(snapshot(
                &topo,
                &config,
                &fleets,
                &Accounting::default(),
                &failed_keys,
                Instant::now(),
            )),
            events: tx,
            leases: Leases::new(metrics.leases_released.clone()),
            decisions: Mutex::default(),
            metrics,
        });
        let writer = Writer {
            shared: shared.clone(),
            rx,
            config,
            topo,
            fleets,
            accounting: Accounting::default(),
            failed_keys,
            loads,
            dirty: false,
        };
        shared.metrics.prime(&writer.topo);
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
                    self.shared.leases.run_pending();
                    self.shared.metrics.leases_held.set(self.shared.leases.held() as i64);
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
                    self.on_warmup(fleet, replica, ok);
                }
            }
            Event::Routed(r) => self.on_routed(*r),
            Event::Rejected { stage, reason } => {
                self.shared
                    .metrics
                    .rejected
                    .get_or_create(&crate::metrics::Rejected {
                        stage,
                        reason: reason.to_string(),
                    })
                    .inc();
            }
            Event::Observed(o) => self.on_observed(&o, now),
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

    fn on_warmup(&mut self, fleet: usize, replica: usize, ok: bool) {
        let m = &mut self.fleets[fleet].replicas[replica];
        if ok && !m.warm {
            m.warm = true;
            let f = &self.topo.fleets[fleet];
            tracing::info!(fleet = %f.name, replica = %f.replicas[replica].addr, "replica passed warmup, joins the rotation");
            self.dirty = true;
        }
    }

    fn on_routed(&mut self, r: Routed) {
        if r.generation != self.topo.generation {
            return;
        }
        if let Some(f) = self.fleets.get_mut(r.fleet) {
            f.index.insert(r.replica, &r.blocks, r.block_tokens);
        }
        let topo = &self.topo;
        let (Some(stage), Some(fleet)) = (topo.stages.get(r.stage), topo.fleets.get(r.fleet))
        else {
            return;
        };
        let m = &self.shared.metrics;
        m.requests
            .get_or_create(&StageFleetArm {
                stage: stage.name.clone(),
                fleet: fleet.name.clone(),
                arm: r.arm.to_string(),
            })
            .inc();
        let shadow = r
            .shadow
            .and_then(|s| topo.fleets.get(s))
            .map(|s| s.name.clone());
        if let Some(s) = &shadow {
            m.shadowed
                .get_or_create(&StageFleet {
                    stage: stage.name.clone(),
                    fleet: s.clone(),
                })
                .inc();
        }
        m.tokens
            .get_or_create(&Tokens {
                stage: stage.name.clone(),
                fleet: fleet.name.clone(),
                kind: "predicted_cached".into(),
            })
            .inc_by(r.predicted_cached_tokens);
        self.accounting.routed(
            &stage.name,
            &fleet.name,
            r.prompt_tokens,
            r.predicted_cached_tokens,
        );
        let record = DecisionRecord {
            decision_id: format!("{:016x}", r.decision_id),
            request_id: r.request_id,
            stage: stage.name.clone(),
            fleet: fleet.name.clone(),
            replica: fleet
                .replicas
                .get(r.replica)
                .map(|x| x.addr.clone())
                .unwrap_or_default(),
            key_source: r.key_source,
            arm: r.arm,
            shadow,
            predicted_cached_tokens: r.predicted_cached_tokens,
        };
        self.shared
            .decisions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(record);
    }

    fn on_observed(&mut self, o: &Observation, now: Instant) {
        self.count_outcome(o);
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
        if !ok
            && o.counts_against_replica()
            && let Some(key) = o.key
        {
            // Its next turn goes to another replica.
            self.failed_keys
                .record(now, key, self.topo.generation, f, r);
        }
        let cached = o.usage.and_then(|u| u.cached_tokens());
        // Time to first token is the prefill queued ahead plus this prompt's
        // own: normalising by both gives a figure of the replica's speed that
        // does not depend on how busy routing made it.
        let uncached = match (o.usage, cached) {
            (Some(u), Some(c)) => u.prompt_tokens.saturating_sub(c),
            _ => o.uncached_tokens,
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
                work,
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

    /// Counters and histograms of one response.
    fn count_outcome(&mut self, o: &Observation) {
        let m = &self.shared.metrics;
        let class = match o.status {
            None => "no_response",
            Some(_) if o.ended_early => "ended_early",
            Some(s) if (200..300).contains(&s) => "ok",
            Some(s) if (400..500).contains(&s) => "client_error",
            Some(_) => "server_error",
        };
        m.responses
            .get_or_create(&Outcome {
                stage: o.stage.clone(),
                fleet: o.fleet.clone(),
                arm: o.arm.as_str().to_string(),
                class: class.to_string(),
            })
            .inc();
        let sf = StageFleet {
            stage: o.stage.clone(),
            fleet: o.fleet.clone(),
        };
        m.duration.get_or_create(&sf).observe(o.total.as_secs_f64());
        if o.stream
            && o.succeeded()
            && let Some(t) = o.time_to_first_byte
        {
            m.ttft.get_or_create(&sf).observe(t.as_secs_f64());
        }
        if let Some(u) = o.usage {
            for (kind, n) in [
                ("prompt", u.prompt_tokens),
                ("completion", u.completion_tokens),
                ("cached", u.cached_tokens().unwrap_or(0)),
            ] {
                m.tokens
                    .get_or_create(&Tokens {
                        stage: o.stage.clone(),
                        fleet: o.fleet.clone(),
                        kind: kind.into(),
                    })
                    .inc_by(n);
            }
            // The engine hit rate only counts engines that report cached tokens.
            if let Some(c) = u.cached_tokens() {
                self.accounting
                    .observed(&o.stage, &o.fleet, u.prompt_tokens, c);
            }
        }
    }

    /// Periodic work: saturation (with hysteresis), figures, outliers,
    /// autoscaling signals, metrics.
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
            fm.utilisation = crate::route::saturation::utilisation(fleet, ready.iter().copied());
            let spilling = crate::route::saturation::spilling(fleet, &ready, fm.spilling, resume);
            if spilling != fm.spilling {
                tracing::info!(fleet = %fleet.name, saturated = spilling, "fleet saturation changed");
                fm.spilling = spilling;
            }
            let window = self
                .topo
                .stages_of(f)
                .map(|s| s.alarms.window_s)
                .max()
                .unwrap_or(60);
            fm.figures = fm.window.figures(
                now,
                Duration::from_secs(window),
                ready.len(),
                fleet.cost.as_ref(),
            );
            // Ejections end by time.
            for (r, m) in fm.replicas.iter().enumerate() {
                let was = snap
                    .replicas
                    .get(f)
                    .and_then(|v| v.get(r))
                    .is_some_and(|s| s.ejected);
                if was && !m.outlier.is_ejected(now) {
                    tracing::info!(fleet = %fleet.name, replica = %fleet.replicas[r].addr, "ejection over, replica re-admitted");
                }
            }
            if let Some(cfg) = self.topo.outlier_for(f) {
                let failover = failover(&self.topo, &snap, f);
                let eligible: Vec<bool> = fm
                    .replicas
                    .iter()
                    .map(|m| m.health.state == Health::Healthy && !m.draining)
                    .collect();
                let mut outliers: Vec<ReplicaOutlier> = fm
                    .replicas
                    .iter_mut()
                    .map(|m| std::mem::take(&mut m.outlier))
                    .collect();
                let ejected = outlier::evaluate(&mut outliers, &eligible, cfg, failover, now);
                for (m, o) in fm.replicas.iter_mut().zip(outliers) {
                    m.outlier = o;
                }
                for (r, d) in ejected {
                    tracing::warn!(fleet = %fleet.name, replica = %fleet.replicas[r].addr, seconds = d.as_secs(), "replica ejected: failing or far behind its fleet");
                }
            }
        }
        drop(snap);
        self.failed_keys.expire(now);
        self.accounting.fold(now);
        super::report::desired_replicas(self);
        // Figures move every tick: publish every tick.
        self.dirty = true;
        self.publish_if_dirty(now);
        super::report::gauges(self);
    }

    /// Swaps in a new config (already validated). Replicas whose fleet and
    /// address are unchanged keep their health, load and keys.
    pub(super) fn install(&mut self, cfg: RouterConfig) {
        let topo = Arc::new(build_topology(
            &cfg,
            self.topo.generation + 1,
            &mut self.loads,
        ));
        let old = std::mem::take(&mut self.fleets);
        self.fleets = fleet_models(&topo, old, &self.topo);
        let renamed = series_names(&topo) != series_names(&self.topo);
        self.topo = topo;
        self.config = Arc::new(cfg);
        // Counters of replicas that left go with them.
        let live: HashSet<(String, String)> = self
            .topo
            .fleets
            .iter()
            .flat_map(|f| f.replicas.iter().map(|r| (f.name.clone(), r.addr.clone())))
            .collect();
        self.loads.retain(|k, _| live.contains(k));
        let pairs: HashSet<(String, String)> = self
            .topo
            .stages
            .iter()
            .flat_map(|s| {
                s.fleets
                    .iter()
                    .map(|&f| (s.name.clone(), self.topo.fleets[f].name.clone()))
            })
            .collect();
        self.accounting
            .retain(|s, f| pairs.contains(&(s.to_string(), f.to_string())));
        if renamed {
            // Series of stages, fleets or replicas that left go with them; a
            // change of weights or bounds keeps every series (and counter).
            self.shared.metrics.clear_config_series();
        }
        self.shared.metrics.prime(&self.topo);
        tracing::info!(generation = self.topo.generation, "router config applied");
        self.dirty = true;
    }

    pub(super) fn publish_if_dirty(&mut self, now: Instant) {
        if std::mem::take(&mut self.dirty) {
            let snap = snapshot(
                &self.topo,
                &self.config,
                &self.fleets,
                &self.accounting,
                &self.failed_keys,
                now,
            );
            self.shared.snapshot.store(Arc::new(snap));
        }
    }
}

/// Whether every stage of fleet `f` has another fleet with a ready replica,
/// to take its traffic if its last replica is ejected.
fn failover(topo: &Topology, snap: &Snapshot, f: usize) -> bool {
    let mut stages = topo.stages_of(f).peekable();
    stages.peek().is_some()
        && stages.all(|s| {
            s.fleets.iter().any(|&g| {
                g != f
                    && snap
                        .replicas
                        .get(g)
                        .is_some_and(|v| v.iter().any(|r| r.ready()))
            })
        })
}

/// The names metric series are labelled with.
fn series_names(t: &Topology) -> Vec<String> {
    let mut names: Vec<String> = t
        .stages
        .iter()
        .map(|s| format!("s:{}:{:?}", s.name, s.fleets))
        .collect();
    for f in &t.fleets {
        names.push(format!("f:{}", f.name));
        names.extend(
            f.replicas
                .iter()
                .map(|r| format!("r:{}/{}", f.name, r.addr)),
        );
    }
    names
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

/// Models for a new topology: a fleet whose replica list and cache size are
/// unchanged keeps everything (its prefix index included); other fleets keep
/// what they can per replica address.
fn fleet_models(topo: &Topology, mut old: Vec<FleetModel>, old_topo: &Topology) -> Vec<FleetModel> {
    let mut out = Vec::with_capacity(topo.fleets.len());
    for (f, fleet) in topo.fleets.iter().enumerate() {
        let warmup = topo.stages_of(f).any(|s| s.warmup.is_some());
        let prev = old_topo.fleet_index(&fleet.name);
        let unchanged = prev.is_some_and(|p| {
            let o = &old_topo.fleets[p];
            o.capacity.kv_cache_tokens == fleet.capacity.kv_cache_tokens
                && o.replicas
                    .iter()
                    .map(|r| &r.addr)
                    .eq(fleet.replicas.iter().map(|r| &r.addr))
        });
        if unchanged
            && let Some(p) = prev
            && p < old.len()
        {
            out.push(std::mem::replace(&mut old[p], empty_model(0, 1)));
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
        utilisation: 0.0,
        desired: replicas as u32,
        figures: FleetFigures::default(),
        replicas: (0..replicas).map(|_| ReplicaModel::default()).collect(),
    }
}

fn snapshot(
    topo: &Arc<Topology>,
    config: &Arc<RouterConfig>,
    fleets: &[FleetModel],
    acc: &Accounting,
    failed_keys: &FailedKeysWriter,
    now: Instant,
) -> Snapshot {
    Snapshot {
        failed_keys: failed_keys.keys(),
        topo: topo.clone(),
        config: config.clone(),
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
                utilisation: fm.utilisation,
                desired_replicas: fm.desired,
            })
            .collect(),
        stages: topo
            .stages
            .iter()
            .map(|s| {
                s.fleets
                    .iter()
                    .map(|&f| {
                        let fleet = &topo.fleets[f].name;
                        let (p, e) = acc.hit_rates(&s.name, fleet);
                        StageFleetFigures {
                            traffic_share: acc.share(&s.name, fleet),
                            hit_rate_predicted: p,
                            hit_rate_engine: e,
                        }
                    })
                    .collect()
            })
            .collect(),
    }
}
