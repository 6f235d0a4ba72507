//! What the writer reports each tick: autoscaling signals and the gauges of
//! `/metrics`.

use super::autoscale::{Signal, allocate};
use super::writer::Writer;
use crate::metrics::{FleetLabel, HitRate, Replica, ReplicaStates, StageFleet};
use crate::topology::Policy;

/// Desired replicas per fleet, from each stage that uses it (the largest).
pub(super) fn desired_replicas(w: &mut Writer) {
    let snap = w.shared.snapshot();
    let signals: Vec<Signal> = w
        .topo
        .fleets
        .iter()
        .enumerate()
        .map(|(f, fleet)| {
            let (mut inflight, mut waiting) = (0.0, 0.0);
            for r in &fleet.replicas {
                inflight += f64::from(r.load.inflight());
                waiting += f64::from(
                    r.load
                        .engine_waiting()
                        .max(r.load.prefilling().saturating_sub(1)),
                );
            }
            let n = fleet.replicas.len() as u32;
            let bounds = fleet.hosts.map_or((n, n), |b| (b.min, b.max));
            Signal {
                ready: snap.replicas[f].iter().filter(|r| r.ready()).count() as u32,
                inflight,
                max_inflight: f64::from(fleet.capacity.max_inflight),
                waiting,
                target_queue: fleet.scaling.target_queue,
                tokens_per_sec: w.fleets[f].figures.tokens_per_sec,
                target_tokens_per_sec: fleet.scaling.target_tokens_per_sec,
                min: bounds.0,
                max: bounds.1,
                saturated: w.fleets[f].spilling,
            }
        })
        .collect();
    drop(snap);
    let mut desired: Vec<Option<u32>> = vec![None; w.topo.fleets.len()];
    for stage in &w.topo.stages {
        let (order, priority) = match &stage.policy {
            Policy::Priority { order } => {
                let mut o = order.clone();
                o.extend(stage.fleets.iter().filter(|f| !order.contains(f)));
                (o, true)
            }
            _ => (stage.fleets.clone(), false),
        };
        let (min, max) = stage.replicas.map_or((0, u32::MAX), |b| (b.min, b.max));
        let sig: Vec<Signal> = order.iter().map(|&f| signals[f]).collect();
        for (&f, d) in order.iter().zip(allocate(&sig, priority, min, max)) {
            desired[f] = Some(desired[f].map_or(d, |x: u32| x.max(d)));
        }
    }
    for (f, d) in desired.into_iter().enumerate() {
        let fm = &mut w.fleets[f];
        fm.desired = d.unwrap_or_else(|| signals[f].min.max(signals[f].ready.min(signals[f].max)));
    }
}

pub(super) fn gauges(w: &Writer) {
    let m = &w.shared.metrics;
    let snap = w.shared.snapshot();
    for (f, fleet) in w.topo.fleets.iter().enumerate() {
        let label = FleetLabel {
            fleet: fleet.name.clone(),
        };
        let fs = &snap.fleets[f];
        m.utilisation
            .get_or_create(&label)
            .set(if fs.utilisation.is_finite() {
                fs.utilisation
            } else {
                -1.0
            });
        m.saturated
            .get_or_create(&label)
            .set(i64::from(fs.spilling));
        m.desired
            .get_or_create(&label)
            .set(i64::from(fs.desired_replicas));
        m.tokens_per_sec
            .get_or_create(&label)
            .set(fs.figures.tokens_per_sec);
        if let Some(c) = &fleet.cost
            && let Some(p) = c.gpu_hour_usd
        {
            m.cost_gpu_hour.get_or_create(&label).set(p);
        }
        match fs.figures.usd_per_mtok {
            Some(c) => m.cost_mtok.get_or_create(&label).set(c),
            // Unknown again (an idle fleet priced by measured throughput): no
            // series rather than a stale price.
            None => {
                m.cost_mtok.remove(&label);
                0.0
            }
        };
        for state in [
            "ready",
            "unhealthy",
            "warming",
            "ejected",
            "draining",
            "unknown",
        ] {
            let n = snap.replicas[f]
                .iter()
                .filter(|r| r.label() == state)
                .count();
            m.replicas
                .get_or_create(&ReplicaStates {
                    fleet: fleet.name.clone(),
                    state: state.into(),
                })
                .set(n as i64);
        }
        for r in &fleet.replicas {
            let l = Replica {
                fleet: fleet.name.clone(),
                replica: r.addr.clone(),
            };
            m.inflight
                .get_or_create(&l)
                .set(i64::from(r.load.inflight()));
            m.queued_tokens
                .get_or_create(&l)
                .set(r.load.pending_prefill() as i64);
        }
    }
    for (s, stage) in w.topo.stages.iter().enumerate() {
        for (i, &f) in stage.fleets.iter().enumerate() {
            let fig = snap.stages[s][i];
            let fleet = w.topo.fleets[f].name.clone();
            m.traffic_share
                .get_or_create(&StageFleet {
                    stage: stage.name.clone(),
                    fleet: fleet.clone(),
                })
                .set(fig.traffic_share);
            for (source, v) in [
                ("predicted", fig.hit_rate_predicted),
                ("engine", fig.hit_rate_engine),
            ] {
                if let Some(v) = v {
                    m.hit_rate
                        .get_or_create(&HitRate {
                            stage: stage.name.clone(),
                            fleet: fleet.clone(),
                            source: source.into(),
                        })
                        .set(v);
                }
            }
        }
    }
}
