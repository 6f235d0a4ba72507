//! Replica choice inside the chosen fleet.

use super::eligible::CandidateFleet;

/// Fallback hosts Envoy may retry on, after the chosen one.
pub const FALLBACKS: usize = 2;

#[derive(Debug)]
pub struct ReplicaChoice {
    /// Replica indices, the chosen one first, then fallbacks for retries.
    pub order: Vec<usize>,
}

/// The key's rendezvous order among the fleet's ready replicas.
pub fn choose(fleet: &CandidateFleet) -> ReplicaChoice {
    let mut ranked: Vec<_> = fleet.ready.iter().map(|r| (r.unit, r.replica)).collect();
    ranked.sort_unstable_by(|a, b| b.0.total_cmp(&a.0));
    ReplicaChoice {
        order: ranked.iter().take(1 + FALLBACKS).map(|&(_, r)| r).collect(),
    }
}
