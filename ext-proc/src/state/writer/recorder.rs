//! Metric labelling, in one place: the counters of each event (a decision, a
//! refusal, a response) and the gauges of each tick, all named by the
//! topology's stage, fleet and replica names.

use std::time::Instant;

use crate::metrics::{
    Class, FellBack, FleetLabel, HitRate, HitSource, Metrics, Outcome, Rejected, Replica,
    ReplicaState, ReplicaStates, StageFleet, StageFleetArm, TokenKind, Tokens, Values,
};
use crate::state::Routed;
use crate::state::accounting::Accounting;
use crate::state::model::FleetModel;
use crate::state::observation::Observation;
use crate::topology::{ById, Topology};

/// A decision: its request, shadow and predicted-cache counters.
pub(super) fn routed(m: &Metrics, topo: &Topology, r: &Routed) {
    let (Some(stage), Some(fleet)) = (topo.stages.by_id(r.stage), topo.fleets.by_id(r.fleet))
    else {
        return;
    };
    m.routing
        .requests
        .get_or_create(&StageFleetArm {
            stage: stage.name.clone(),
            fleet: fleet.name.clone(),
            arm: r.arm.as_str().to_string(),
        })
        .inc();
    if let Some(f) = r.fallback
        && let Some(from) = topo.stages.by_id(f.from)
    {
        m.routing
            .fallbacks
            .get_or_create(&FellBack {
                stage: from.name.clone(),
                fallback: stage.name.clone(),
                reason: f.reason.as_str(),
            })
            .inc();
    }
    if let Some(s) = r.shadow.and_then(|s| topo.fleets.by_id(s)) {
        m.routing
            .shadowed
            .get_or_create(&StageFleet {
                stage: stage.name.clone(),
                fleet: s.name.clone(),
            })
            .inc();
    }
    m.routing
        .tokens
        .get_or_create(&Tokens {
            stage: stage.name.clone(),
            fleet: fleet.name.clone(),
            kind: TokenKind::PredictedCached,
        })
        .inc_by(r.predicted_cached_tokens);
}

/// fleetroute answered the request itself.
pub(super) fn rejected(m: &Metrics, stage: String, reason: &'static str) {
    m.routing
        .rejected
        .get_or_create(&Rejected { stage, reason })
        .inc();
}

/// Counters and histograms of one response.
pub(super) fn outcome(m: &Metrics, o: &Observation) {
    let class = match o.status {
        None => Class::NoResponse,
        Some(_) if o.ended_early => Class::EndedEarly,
        Some(s) if (200..300).contains(&s) => Class::Ok,
        Some(s) if (400..500).contains(&s) => Class::ClientError,
        Some(_) => Class::ServerError,
    };
    m.routing
        .responses
        .get_or_create(&Outcome {
            stage: o.stage.clone(),
            fleet: o.fleet.clone(),
            arm: o.arm.as_str().to_string(),
            class,
        })
        .inc();
    let sf = StageFleet {
        stage: o.stage.clone(),
        fleet: o.fleet.clone(),
    };
    m.routing
        .duration
        .get_or_create(&sf)
        .observe(o.total.as_secs_f64());
    if o.stream
        && o.succeeded()
        && let Some(t) = o.time_to_first_byte
    {
        m.routing.ttft.get_or_create(&sf).observe(t.as_secs_f64());
    }
    if let Some(u) = o.usage {
        for (kind, n) in [
            (TokenKind::Prompt, u.prompt_tokens),
            (TokenKind::Completion, u.completion_tokens),
            (TokenKind::Cached, u.cached_tokens().unwrap_or(0)),
        ] {
            m.routing
                .tokens
                .get_or_create(&Tokens {
                    stage: o.stage.clone(),
                    fleet: o.fleet.clone(),
                    kind,
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
    m.fleets.inflight.remove(&l);
    m.fleets.queued_tokens.remove(&l);
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
        m.fleets
            .utilisation
            .get_or_create(&label)
            .set(if u.is_finite() { u } else { -1.0 });
        m.fleets
            .saturated
            .get_or_create(&label)
            .set(i64::from(fm.saturation.spilling));
        m.fleets
            .desired
            .get_or_create(&label)
            .set(i64::from(fm.desired));
        m.fleets
            .tokens_per_sec
            .get_or_create(&label)
            .set(fm.figures.tokens_per_sec);
        if let Some(c) = &fleet.cost
            && let Some(p) = c.gpu_hour_usd
        {
            m.fleets.cost_gpu_hour.get_or_create(&label).set(p);
        }
        match fm.figures.usd_per_mtok {
            Some(c) => m.fleets.cost_mtok.get_or_create(&label).set(c),
            // Unknown again (an idle fleet priced by measured throughput): no
            // series rather than a stale price.
            None => {
                m.fleets.cost_mtok.remove(&label);
                0.0
            }
        };
        let labels: Vec<&str> = fm.replicas.values().map(|r| r.state(now).label()).collect();
        let leaving = labels.iter().filter(|&&l| l == "leaving").count();
        m.fleets
            .members
            .get_or_create(&label)
            .set((labels.len() - leaving) as i64);
        m.fleets
            .members_ignored
            .get_or_create(&label)
            .set(fm.waiting.len() as i64);
        for &state in ReplicaState::ALL {
            let n = labels.iter().filter(|&&l| l == state.as_str()).count();
            m.fleets
                .replicas
                .get_or_create(&ReplicaStates {
                    fleet: fleet.name.clone(),
                    state,
                })
                .set(n as i64);
        }
        // Own load only: the dashboard sums the series over instances.
        for r in fleet.replicas.values() {
            let l = Replica {
                fleet: fleet.name.clone(),
                replica: r.addr.clone(),
            };
            m.fleets
                .inflight
                .get_or_create(&l)
                .set(i64::from(r.load.own_inflight()));
            m.fleets
                .queued_tokens
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
            m.routing
                .traffic_share
                .get_or_create(&sf)
                .set(acc.share(&stage.name, fleet));
            let (predicted, engine) = acc.hit_rates(&stage.name, fleet);
            for (source, v) in [
                (HitSource::Predicted, predicted),
                (HitSource::Engine, engine),
            ] {
                if let Some(v) = v {
                    m.routing
                        .hit_rate
                        .get_or_create(&HitRate {
                            stage: stage.name.clone(),
                            fleet: fleet.clone(),
                            source,
                        })
                        .set(v);
                }
            }
        }
    }
}
