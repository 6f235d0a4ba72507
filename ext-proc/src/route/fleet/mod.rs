//! Fleet policies: given the eligible fleets, pick one. Each policy is a small
//! function of the candidates and the snapshot; none of them writes state.

mod weighted;

use super::eligible::Candidates;
use crate::state::Snapshot;
use crate::topology::Policy;

pub struct PolicyInput<'a> {
    pub snap: &'a Snapshot,
    pub candidates: &'a Candidates,
    pub key: u64,
}

/// A fleet policy returns an index into `candidates.fleets`, or `None` when no
/// candidate is acceptable to it.
pub trait FleetPolicy {
    fn choose(&self, input: &PolicyInput<'_>) -> Option<usize>;
}

pub fn choose(policy: &Policy, input: &PolicyInput<'_>) -> Option<usize> {
    match policy {
        Policy::Weighted { weights } => weighted::Weighted { weights }.choose(input),
        Policy::Priority { .. } | Policy::Latency | Policy::Cost => None,
    }
}
