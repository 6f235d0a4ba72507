//! The writer's model of each fleet and its replicas, and what one event or
//! one tick does to it. Each part keeps its own rules (health hysteresis in
//! `health`, ejection in `outlier`, the window in `figures`, spilling in
//! `saturation`, the cache map in `prefix_index`); this file routes events to
//! them. The writer reads readiness from here, never back from a snapshot.

use std::time::{Duration, Instant};

use super::autoscale::{self, Signal, StepDown};
use super::figures::{FleetFigures, FleetWindow};
use super::health::{Health, HealthMachine};
use super::observation::Observation;
use super::outlier::{self, ReplicaOutlier};
use super::prefix_index::IndexWriter;
use super::saturation::Saturation;
use super::{ReplicaState, Routed};
use crate::config::{HealthCheckConfig, OutlierConfig};
use crate::membership::Member;
use crate::topology::{Fleet, FleetId, ReplicaId, Slots, Topology};

/// The writer's model of one replica.
#[derive(Debug, Default)]
pub(super) struct ReplicaModel {
    pub(super) health: HealthMachine,
    pub(super) warm: bool,
    pub(super) outlier: ReplicaOutlier,
    pub(super) draining: bool,
    /// Since when its source no longer lists it (see `members`).
    pub(super) leaving: Option<Instant>,
    /// Ejected as of the last tick (to say when an ejection ends).
    ejected: bool,
}

impl ReplicaModel {
    /// A replica that joins: it must pass warmup first when a stage has one.
    pub(super) fn joining(warmup: bool) -> Self {
        ReplicaModel {
            warm: !warmup,
            ..Default::default()
        }
    }

    pub(super) fn state(&self, now: Instant) -> ReplicaState {
        ReplicaState {
            health: self.health.state,
            warm: self.warm,
            ejected: self.outlier.is_ejected(now),
            draining: self.draining,
            leaving: self.leaving.is_some(),
        }
    }
}

#[derive(Debug)]
pub(super) struct FleetModel {
    pub(super) index: IndexWriter,
    pub(super) window: FleetWindow,
    pub(super) saturation: Saturation,
    pub(super) desired: u32,
    pub(super) step_down: StepDown,
    pub(super) figures: FleetFigures,
    /// The same slots as the topology's replicas of this fleet.
    pub(super) replicas: Slots<ReplicaModel>,
    /// Members the source lists beyond the fleet's slots, waiting for one.
    pub(super) waiting: Vec<Member>,
}

impl FleetModel {
    /// A fleet with no member yet.
    pub(super) fn new(kv_tokens: u64) -> Self {
        FleetModel {
            index: IndexWriter::new(kv_tokens),
            window: FleetWindow::default(),
            saturation: Saturation::default(),
            desired: 0,
            step_down: Default::default(),
            figures: FleetFigures::default(),
            replicas: Slots::new(),
            waiting: Vec::new(),
        }
    }

    /// One health probe; true when the replica's state changed.
    pub(super) fn health(
        &mut self,
        fleet: &Fleet,
        r: ReplicaId,
        ok: bool,
        cfg: &HealthCheckConfig,
        warmup: bool,
    ) -> bool {
        let Some(m) = self.replicas.get_mut(r) else {
            return false;
        };
        let Some(now) = m.health.record(ok, cfg) else {
            return false;
        };
        tracing::info!(fleet = %fleet.name, replica = %fleet.replicas[r].addr, health = ?now, "replica health changed");
        if now == Health::Unhealthy {
            // Its cache is gone or unreachable: stop predicting hits on it,
            // or that it holds an adapter.
            m.warm = !warmup;
            self.index.clear(r);
            if let Some(rep) = fleet.replicas.get(r) {
                rep.load.adapters.clear();
            }
        }
        true
    }

    /// One warmup run; true when the replica joined the rotation.
    pub(super) fn warmup(&mut self, fleet: &Fleet, r: ReplicaId, ok: bool) -> bool {
        let Some(m) = self.replicas.get_mut(r) else {
            return false;
        };
        if ok && !m.warm {
            m.warm = true;
            tracing::info!(fleet = %fleet.name, replica = %fleet.replicas[r].addr, "replica passed warmup, joins the rotation");
            return true;
        }
        false
    }

    pub(super) fn routed(&mut self, r: &Routed) {
        self.cached(r.replica, &r.blocks, r.block_tokens);
    }

    /// `blocks` were sent to replica `r` (by this instance or another). A
    /// leaver's entries are gone for good: a decision made just before it
    /// left must not bring them back.
    pub(super) fn cached(&mut self, r: ReplicaId, blocks: &[u64], block_tokens: u32) {
        if self.replicas.get(r).is_some_and(|m| m.leaving.is_none()) {
            self.index.insert(r, blocks, block_tokens);
        }
    }

    /// One finished request served by replica `r`; `as_routed` when that is
    /// the replica the decision chose (not a retry's host). True when it
    /// showed the replica lost its cache (its index entries were dropped).
    pub(super) fn outcome(
        &mut self,
        r: ReplicaId,
        o: &Observation,
        as_routed: bool,
        now: Instant,
    ) -> bool {
        let ok = o.succeeded();
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
        self.window.record(now, ok, ttft_ms, work, tokens);
        if o.counts_against_replica() {
            let out = o.usage.map_or(0, |u| u.completion_tokens);
            if let Some(m) = self.replicas.get_mut(r) {
                // An adapter's time to first token depends on the adapters
                // its replica runs (loads, slots taken), a packed replica's
                // on the models it holds and loads: not on its health.
                let adapter = o.decided.is_some_and(|d| d.adapter);
                let work = Some(work).filter(|_| !adapter);
                m.outlier
                    .record(now, ok, ttft_ms, work, o.total.as_secs_f64() * 1000.0, out);
            }
        }
        // The engine reports nothing cached where the router predicted a
        // real prefix: the replica lost its cache (restart, eviction storm).
        let lost = ok
            && cached == Some(0)
            && o.predicted_cached_tokens > 0
            && as_routed
            && self.replicas.get(r).is_some_and(|m| m.leaving.is_none());
        if lost {
            self.index.clear(r);
        }
        lost
    }

    /// Replicas in rotation now.
    pub(super) fn ready(&self, now: Instant) -> Vec<ReplicaId> {
        self.replicas
            .iter()
            .filter(|(_, m)| m.state(now).ready())
            .map(|(r, _)| r)
            .collect()
    }

    /// Periodic work on fleet `f`: saturation, figures, the end and start of
    /// ejections. `ready` is this fleet's ready replicas at the tick's start;
    /// `failover` whether another fleet can take its traffic.
    pub(super) fn tick(
        &mut self,
        topo: &Topology,
        f: FleetId,
        ready: &[ReplicaId],
        failover: bool,
        now: Instant,
    ) {
        let fleet = &topo.fleets[f];
        let resume = topo
            .stages_of(f)
            .map(|s| s.routing.resume_below())
            .fold(1.0f64, f64::min);
        if let Some(spilling) = self.saturation.tick(fleet, ready, resume) {
            tracing::info!(fleet = %fleet.name, saturated = spilling, "fleet saturation changed");
        }
        let window = topo
            .stages_of(f)
            .map(|s| s.alarms.window_s)
            .max()
            .unwrap_or(60);
        self.figures = self.window.figures(
            now,
            Duration::from_secs(window),
            ready.len(),
            fleet.cost.as_ref(),
        );
        // Ejections end by time; the replica rejoins once it passed its
        // warmup (or probe) again, which runs while it is out.
        for (r, m) in self.replicas.iter_mut() {
            let ejected = m.outlier.is_ejected(now);
            if m.ejected && !ejected {
                let addr = &fleet.replicas[r].addr;
                if m.warm {
                    tracing::info!(fleet = %fleet.name, replica = %addr, "ejection over, replica passed its probe and is re-admitted");
                } else {
                    tracing::info!(fleet = %fleet.name, replica = %addr, "ejection over, replica stays out until it passes its probe");
                }
            }
            m.ejected = ejected;
        }
        if let Some(cfg) = topo.outlier_for(f) {
            self.eject(fleet, cfg, failover, now);
        }
    }

    fn eject(&mut self, fleet: &Fleet, cfg: &OutlierConfig, failover: bool, now: Instant) {
        // The evaluation reads a dense list: the occupied slots, in order.
        let ids: Vec<ReplicaId> = self.replicas.ids().collect();
        let eligible: Vec<bool> = self
            .replicas
            .values()
            .map(|m| m.health.state == Health::Healthy && !m.draining && m.leaving.is_none())
            .collect();
        let mut outliers: Vec<ReplicaOutlier> = self
            .replicas
            .iter_mut()
            .map(|(_, m)| std::mem::take(&mut m.outlier))
            .collect();
        let ejected = outlier::evaluate(&mut outliers, &eligible, cfg, failover, now);
        for ((_, m), o) in self.replicas.iter_mut().zip(outliers) {
            m.outlier = o;
        }
        for (i, d) in ejected {
            let r = ids[i];
            let Some(m) = self.replicas.get_mut(r) else {
                continue;
            };
            m.ejected = true;
            // It must serve a probe (or the stage's golden prompts) before
            // it takes traffic again, not fail a request of a client.
            m.warm = false;
            tracing::warn!(fleet = %fleet.name, replica = %fleet.replicas[r].addr, seconds = d.as_secs(), "replica ejected: failing or far behind its fleet");
        }
    }
}

impl FleetModel {
    /// What autoscaling reads of the fleet now, with `ready` replicas.
    fn signal(&self, fleet: &Fleet, ready: u32) -> Signal {
        let (mut inflight, mut waiting) = (0.0, 0.0);
        for r in fleet.replicas.values() {
            inflight += f64::from(r.load.inflight());
            waiting += f64::from(
                r.load
                    .engine_waiting()
                    .max(r.load.prefilling().saturating_sub(1)),
            );
        }
        // Without host bounds: its members now (leaving ones not counted).
        let n = self
            .replicas
            .values()
            .filter(|m| m.leaving.is_none())
            .count() as u32;
        let bounds = fleet.hosts.map_or((n, n), |b| (b.min, b.max));
        Signal {
            ready,
            inflight,
            max_inflight: f64::from(fleet.capacity.max_inflight),
            waiting,
            target_queue: fleet.scaling.target_queue,
            tokens_per_sec: self.figures.tokens_per_sec,
            target_tokens_per_sec: fleet.scaling.target_tokens_per_sec,
            min: bounds.0,
            max: bounds.1,
            saturated: self.saturation.spilling,
        }
    }
}

/// Each fleet's desired replicas at this tick, held by its step-down.
/// `ready[f]` is fleet `f`'s ready replicas.
pub(super) fn autoscale(
    topo: &Topology,
    fleets: &mut [FleetModel],
    ready: &[Vec<ReplicaId>],
    now: Instant,
) {
    let signals: Vec<Signal> = topo
        .fleets
        .iter()
        .zip(fleets.iter())
        .zip(ready)
        .map(|((fleet, m), r)| m.signal(fleet, r.len() as u32))
        .collect();
    let last: Vec<u32> = fleets.iter().map(|m| m.desired).collect();
    let computed = autoscale::desired(topo, &signals, &last);
    for ((m, fleet), d) in fleets.iter_mut().zip(topo.fleets.iter()).zip(computed) {
        let hold = Duration::from_millis(fleet.scaling.scale_down_after_ms);
        m.desired = m.step_down.update(d, hold, now);
    }
}
