//! Which fleets and replicas may serve a request: inside the residency (the
//! stage's, narrowed by the request's), and ready.

use fleetroute_filter::contract::split_regions;

use super::Reject;
use super::rendezvous::unit;
use crate::state::Snapshot;
use crate::topology::Stage;

#[derive(Debug)]
pub struct Candidates {
    pub stage: usize,
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
}

#[derive(Clone, Copy, Debug)]
pub struct ReadyReplica {
    /// Index into the fleet's replicas.
    pub replica: usize,
    /// This request key's rendezvous unit for the replica.
    pub unit: f64,
}

pub fn candidates(
    snap: &Snapshot,
    stage_idx: usize,
    stage: &Stage,
    residency: Option<&str>,
    key: u64,
) -> Result<Candidates, Reject> {
    let topo = &snap.topo;
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
    for &f in &stage.fleets {
        let fleet = &topo.fleets[f];
        if !allowed(&fleet.region) {
            continue;
        }
        let mut best_unit = 0.0f64;
        let ready: Vec<ReadyReplica> = fleet
            .replicas
            .iter()
            .enumerate()
            .filter(|(r, _)| snap.replicas[f][*r].ready())
            .map(|(r, rep)| {
                let u = unit(key, rep.seed);
                best_unit = best_unit.max(u);
                ReadyReplica {
                    replica: r,
                    unit: u,
                }
            })
            .collect();
        if !ready.is_empty() {
            fleets.push(CandidateFleet {
                fleet: f,
                ready,
                best_unit,
            });
        }
    }
    if fleets.is_empty() {
        let mut regions: Vec<&str> = stage
            .residency
            .iter()
            .map(String::as_str)
            .filter(|r| allowed(r))
            .collect();
        regions.dedup();
        return Err(Reject::NoReadyReplica {
            stage: stage.name.clone(),
            residency: regions.join(","),
        });
    }
    Ok(Candidates {
        stage: stage_idx,
        fleets,
    })
}
