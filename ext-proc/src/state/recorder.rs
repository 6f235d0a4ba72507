//! Metric labelling, in one place: the counters of each event (a decision, a
//! refusal, a response) and the gauges of each tick, all named by the
//! topology's stage, fleet and replica names.

use std::time::Instant;

use super::Routed;
use super::accounting::Accounting;
use super::model::FleetModel;
use super::observation::Observation;
use crate::metrics::{
    FleetLabel, HitRate, Metrics, Outcome, Rejected, Replica, ReplicaStates, StageFleet,
    StageFleetArm, Tokens,
};
use crate::topology::{ById, Topology};

/// A decision: its request, shadow and predicted-cache counters.
pub(super) fn routed(m: &Metrics, topo: &Topology, r: &Routed) {
    let (Some(stage), Some(fleet)) = (topo.stages.by_id(r.stage), topo.fleets.by_id(r.fleet))
    else {
        return;
    };
    m.requests
        .get_or_create(&StageFleetArm {
            stage: stage.name.clone(),
            fleet: fleet.name.clone(),
            arm: r.arm.to_string(),
        })
        .inc();
    if let Some(s) = r.shadow.and_then(|s| topo.fleets.by_id(s)) {
        m.shadowed
            .get_or_create(&StageFleet {
                stage: stage.name.clone(),
                fleet: s.name.clone(),
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
}

/// fleetroute answered the request itself.
pub(super) fn rejected(m: &Metrics, stage: String, reason: &'static str) {
    m.rejected
        .get_or_create(&Rejected {
            stage,
            reason: reason.to_string(),
        })
        .inc();
}

/// Counters and histograms of one response.
pub(super) fn outcome(m: &Metrics, o: &Observation) {
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
    }
}

/// A replica left the topology: its own series go with it.
pub(super) fn replica_gone(m: &Metrics, fleet: &str, addr: &str) {
    let l = Replica {
        fleet: fleet.to_string(),
        replica: addr.to_string(),
    };
    m.inflight.remove(&l);
    m.queued_tokens.remove(&l);
}

/// The gauges of `/metrics`, from the writer's models.
pub(super) fn gauges(
    m: &Metrics,
    topo: &Topology,
    fleets: &[FleetModel],
    acc: &Accounting,
    now: Instant,
) {
    for (fleet, fm) in topo.fleets.iter().zip(fleets) {
        let label = FleetLabel {
            fleet: fleet.name.clone(),
        };
        let u = fm.saturation.utilisation;
        m.utilisation
            .get_or_create(&label)
            .set(if u.is_finite() { u } else { -1.0 });
        m.saturated
            .get_or_create(&label)
            .set(i64::from(fm.saturation.spilling));
        m.desired.get_or_create(&label).set(i64::from(fm.desired));
        m.tokens_per_sec
            .get_or_create(&label)
            .set(fm.figures.tokens_per_sec);
        if let Some(c) = &fleet.cost
            && let Some(p) = c.gpu_hour_usd
        {
            m.cost_gpu_hour.get_or_create(&label).set(p);
        }
        match fm.figures.usd_per_mtok {
            Some(c) => m.cost_mtok.get_or_create(&label).set(c),
            // Unknown again (an idle fleet priced by measured throughput): no
            // series rather than a stale price.
            None => {
                m.cost_mtok.remove(&label);
                0.0
            }
        };
        let labels: Vec<&str> = fm.replicas.values().map(|r| r.state(now).label()).collect();
        let leaving = labels.iter().filter(|&&l| l == "leaving").count();
        m.fleet_members
            .get_or_create(&label)
            .set((labels.len() - leaving) as i64);
        m.members_ignored
            .get_or_create(&label)
            .set(fm.waiting.len() as i64);
        for state in [
            "ready",
            "unhealthy",
            "warming",
            "ejected",
            "draining",
            "leaving",
            "unknown",
        ] {
            let n = labels.iter().filter(|&&l| l == state).count();
            m.replicas
                .get_or_create(&ReplicaStates {
                    fleet: fleet.name.clone(),
                    state: state.into(),
                })
                .set(n as i64);
        }
        // Own load only: the dashboard sums the series over instances.
        for r in fleet.replicas.values() {
            let l = Replica {
                fleet: fleet.name.clone(),
                replica: r.addr.clone(),
            };
            m.inflight
                .get_or_create(&l)
                .set(i64::from(r.load.own_inflight()));
            m.queued_tokens
                .get_or_create(&l)
                .set(r.load.own_pending_prefill() as i64);
        }
    }
    for stage in &topo.stages {
        for &f in &stage.fleets {
            let fleet = &topo.fleets[f].name;
            let sf = StageFleet {
                stage: stage.name.clone(),
                fleet: fleet.clone(),
            };
            m.traffic_share
                .get_or_create(&sf)
                .set(acc.share(&stage.name, fleet));
            let (predicted, engine) = acc.hit_rates(&stage.name, fleet);
            for (source, v) in [("predicted", predicted), ("engine", engine)] {
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
