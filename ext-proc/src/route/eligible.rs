//! Which fleets and replicas may serve a request: inside the residency (the
//! stage's, narrowed by the request's), and ready. For each eligible fleet it
//! also reads what the prefix index predicts each replica holds.

use fleetroute_filter::contract::split_regions;

use super::Reject;
use super::key::RouteKey;
use super::rendezvous::unit;
use super::saturation;
use crate::state::Snapshot;
use crate::state::prefix_index::Matches;
use crate::topology::Stage;

#[derive(Debug)]
pub struct Candidates {
    /// Eligible fleets with at least one ready replica, in the stage's order.
    pub fleets: Vec<CandidateFleet>,
}

#[derive(Debug)]
pub struct CandidateFleet {
    /// Index into `Topology::fleets`.
    pub fleet: usize,
    pub ready: Vec<ReadyReplica>,
    /// The highest rendezvous unit among `ready`, for weighted choices.
    pub best_unit: f64,
    /// The longest cached prefix any ready replica holds, in blocks.
    pub best_match: u16,
    /// See `route::saturation`, over the ready replicas.
    pub utilisation: f64,
    /// The least prefill queued on any ready replica, in tokens.
    pub min_queued: u64,
}

#[derive(Clone, Copy, Debug)]
pub struct ReadyReplica {
    /// Index into the fleet's replicas.
    pub replica: usize,
    /// This request key's rendezvous unit for the replica.
    pub unit: f64,
    /// Leading prompt blocks the replica is predicted to hold.
    pub matched: u16,
}

impl CandidateFleet {
    /// Prompt tokens this fleet would not have to prefill, at best.
    pub fn best_cached_tokens(&self, key: &RouteKey<'_>) -> u64 {
        cached_tokens(self.best_match, key)
    }
}

pub fn cached_tokens(matched: u16, key: &RouteKey<'_>) -> u64 {
    (u64::from(matched) * u64::from(key.block_tokens)).min(u64::from(key.prompt_tokens))
}

pub fn candidates(
    snap: &Snapshot,
    stage: &Stage,
    key: &RouteKey<'_>,
) -> Result<Candidates, Reject> {
    let topo = &snap.topo;
    let residency = key.residency;
    let allowed = |region: &str| {
        stage.residency.iter().any(|r| r == region)
            && residency.is_none_or(|req| split_regions(req).any(|r| r == region))
    };
    if residency.is_some() && !stage.residency.iter().any(|r| allowed(r)) {
        return Err(Reject::ResidencyUnsatisfiable {
            stage: stage.name.clone(),
            requested: residency.unwrap_or_default().to_string(),
            stage_residency: stage.residency.join(","),
        });
    }
    let mut fleets = Vec::with_capacity(stage.fleets.len());
    let mut matches: Matches = [0; 64];
    for &f in &stage.fleets {
        let fleet = &topo.fleets[f];
        if !allowed(&fleet.region) {
            continue;
        }
        let depth = if key.blocks.is_empty() {
            0
        } else {
            snap.fleets[f].prefix.matches(&key.blocks, &mut matches)
        };
        let mut best_unit = 0.0f64;
        let mut best_match = 0u16;
        let ready: Vec<ReadyReplica> = fleet
            .replicas
            .iter()
            .enumerate()
            .filter(|(r, _)| snap.replicas[f][*r].ready())
            .map(|(r, rep)| {
                let u = unit(key.key, rep.seed);
                let matched = if depth == 0 { 0 } else { matches[r] };
                best_unit = best_unit.max(u);
                best_match = best_match.max(matched);
                ReadyReplica {
                    replica: r,
                    unit: u,
                    matched,
                }
            })
            .collect();
        if !ready.is_empty() {
            let utilisation = saturation::utilisation(fleet, ready.iter().map(|r| r.replica));
            let min_queued = ready
                .iter()
                .map(|r| fleet.replicas[r.replica].load.pending_prefill())
                .min()
                .unwrap_or(0);
            fleets.push(CandidateFleet {
                fleet: f,
                ready,
                best_unit,
                best_match,
                utilisation,
                min_queued,
            });
        }
    }
    if fleets.is_empty() {
        let regions: Vec<&str> = stage
            .residency
            .iter()
            .map(String::as_str)
            .filter(|r| allowed(r))
            .collect();
        return Err(Reject::NoReadyReplica {
            stage: stage.name.clone(),
            residency: regions.join(","),
        });
    }
    Ok(Candidates { fleets })
}
