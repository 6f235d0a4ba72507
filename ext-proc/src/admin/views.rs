//! The API's views of a snapshot: the one place that reads the router's
//! internal state layout for the admin API.

use super::api::{FleetView, Health, LoraView, ReplicaState, ReplicaView, SnapshotView, StageView};
use crate::metrics::EngineMetrics;
use crate::state::{self, Snapshot, health};
use crate::topology::Policy;

fn health_view(h: health::Health) -> Health {
    match h {
        health::Health::Unknown => Health::Unknown,
        health::Health::Healthy => Health::Healthy,
        health::Health::Unhealthy => Health::Unhealthy,
    }
}

/// Same precedence as the state's own label (a test holds them equal).
fn replica_state(st: &state::ReplicaState) -> ReplicaState {
    if st.leaving {
        return ReplicaState::Leaving;
    }
    match st.health {
        health::Health::Unknown => ReplicaState::Unknown,
        health::Health::Unhealthy => ReplicaState::Unhealthy,
        health::Health::Healthy if st.draining => ReplicaState::Draining,
        health::Health::Healthy if st.ejected => ReplicaState::Ejected,
        health::Health::Healthy if !st.warm => ReplicaState::Warming,
        health::Health::Healthy => ReplicaState::Ready,
    }
}

fn fleet_view(snap: &Snapshot, f: usize, stage: Option<(usize, usize)>) -> FleetView {
    let fleet = &snap.topo.fleets[f];
    let fs = &snap.fleets[f];
    let sf = stage.map(|(s, i)| snap.stages[s][i]);
    let weight = stage.and_then(|(s, _)| match &snap.topo.stages[s].policy {
        Policy::Weighted { weights } => weights.get(f).copied(),
        _ => None,
    });
    FleetView {
        name: fleet.name.clone(),
        region: fleet.region.clone(),
        engine: fleet.engine.as_str().to_string(),
        engine_signals_missing: Vec::new(),
        weight,
        traffic_share: sf.map(|x| x.traffic_share),
        hit_rate_predicted: sf.and_then(|x| x.hit_rate_predicted),
        hit_rate_engine: sf.and_then(|x| x.hit_rate_engine),
        ttft_p95_ms: fs.figures.ttft_p95_ms,
        latency_ms_per_1k_tokens: fs.figures.latency,
        error_rate: fs.figures.error_rate,
        tokens_per_sec: fs.figures.tokens_per_sec,
        cost_usd_per_gpu_hour: fleet.cost.as_ref().and_then(|c| c.gpu_hour_usd),
        cost_usd_per_million_tokens: fs.figures.usd_per_mtok,
        utilisation: fs.utilisation.is_finite().then_some(fs.utilisation),
        saturated: fs.spilling,
        desired_replicas: fs.desired_replicas,
        hosts: fleet.hosts,
        prefix_blocks: fs.prefix.len(),
        replicas: fleet
            .replicas
            .iter()
            .map(|(r, rep)| {
                // An id is a name's hash: the name from the stages it serves.
                let adapter_name = |id| {
                    let mut stages = snap.topo.stages_of(crate::topology::FleetId(f));
                    stages.find_map(|s| s.held_name(id).map(|n| n.to_string()))
                };
                let st = snap.replicas[f][r];
                let (hits, queries) = rep.load.engine_prefix_cache();
                ReplicaView {
                    addr: rep.addr.clone(),
                    slot: r.index(),
                    member: (*rep.identity != *rep.addr).then(|| rep.identity.to_string()),
                    leaving: st.leaving,
                    state: replica_state(&st),
                    health: health_view(st.health),
                    ready: st.ready(),
                    warm: st.warm,
                    ejected: st.ejected,
                    draining: st.draining,
                    inflight: rep.load.own_inflight(),
                    queued_tokens: rep.load.own_pending_prefill(),
                    peer_inflight: rep.load.peers().inflight,
                    peer_queued_tokens: rep.load.peers().pending_prefill,
                    engine_running: rep.load.engine_running(),
                    engine_waiting: rep.load.engine_waiting(),
                    engine_kv_usage: rep.load.engine_kv_usage(),
                    engine_prefix_cache_hits: hits,
                    engine_prefix_cache_queries: queries,
                    engine_lora: rep.load.engine_lora().map(|l| LoraView {
                        max: l.max,
                        running: l.running.clone(),
                        waiting: l.waiting.clone(),
                    }),
                    adapters: fleet.hold.as_ref().map(|_| {
                        let held = rep.load.adapters.get().unwrap_or_default();
                        held.0.iter().filter_map(|&id| adapter_name(id)).collect()
                    }),
                }
            })
            .collect(),
    }
}

/// What the last scrape round of each fleet's engines lacked.
pub fn engine_reports(fleets: &mut [FleetView], engines: &EngineMetrics) {
    for f in fleets {
        if let Some(e) = engines.fleet(&f.name) {
            f.engine_signals_missing = e.missing.iter().map(|s| s.as_str().to_string()).collect();
        }
    }
}

pub fn stage_view(snap: &Snapshot, s: usize) -> StageView {
    let st = &snap.topo.stages[s];
    let cfg = snap.config.stages.iter().find(|c| c.name == st.name);
    StageView {
        name: st.name.clone(),
        models: cfg.map(|c| c.models.clone()).unwrap_or_default(),
        residency: st.residency.clone(),
        replicas: st.replicas,
        routing: st.routing.clone(),
        experiment: cfg.map(|c| c.experiment.clone()).unwrap_or_default(),
        fleets: st
            .fleets
            .iter()
            .enumerate()
            .map(|(i, &f)| fleet_view(snap, f.index(), Some((s, i))))
            .collect(),
    }
}

pub fn stage_by_name(snap: &Snapshot, name: &str) -> Option<StageView> {
    let &s = snap.topo.by_stage_name.get(name)?;
    Some(stage_view(snap, s.index()))
}

pub fn stage_views(snap: &Snapshot) -> Vec<StageView> {
    (0..snap.topo.stages.len())
        .map(|s| stage_view(snap, s))
        .collect()
}

pub fn snapshot_view(snap: &Snapshot) -> SnapshotView {
    SnapshotView {
        generation: snap.topo.generation,
        fleets: (0..snap.topo.fleets.len())
            .map(|f| fleet_view(snap, f, None))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_view_state_is_the_state_label() {
        for health in [
            health::Health::Unknown,
            health::Health::Healthy,
            health::Health::Unhealthy,
        ] {
            for bits in 0..16u8 {
                let st = state::ReplicaState {
                    health,
                    warm: bits & 1 != 0,
                    ejected: bits & 2 != 0,
                    draining: bits & 4 != 0,
                    leaving: bits & 8 != 0,
                };
                assert_eq!(replica_state(&st).as_str(), st.label(), "{st:?}");
            }
        }
    }
}
