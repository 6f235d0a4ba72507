//! Fleet policies: given the eligible fleets, pick one. Each policy is a small
//! function of the candidates and the snapshot; none of them writes state.

#[cfg(test)]
mod conformance;
mod cost;
mod latency;
mod priority;
mod weighted;

use super::eligible::{CandidateFleet, Candidates};
use super::key::RouteKey;
use super::rendezvous::{score, unit};
use crate::state::Snapshot;
use crate::topology::{Candidate, Policy, Stage};

pub struct PolicyInput<'a> {
    pub snap: &'a Snapshot,
    pub stage: &'a Stage,
    pub candidates: &'a Candidates,
    pub key: &'a RouteKey<'a>,
    /// Per-request randomness (exploration), passed in so tests are seeded.
    pub rng: u64,
}

/// A fleet policy returns a place in `candidates.fleets`, or `None` when no
/// candidate is acceptable to it.
pub trait FleetPolicy {
    fn choose(&self, input: &PolicyInput<'_>) -> Option<Candidate>;
}

pub fn choose(policy: &Policy, input: &PolicyInput<'_>) -> Option<Candidate> {
    match policy {
        Policy::Weighted { weights } => weighted::Weighted { weights }.choose(input),
        Policy::Priority { order } => priority::Priority { order }.choose(input),
        Policy::Latency => latency::Latency.choose(input),
        Policy::Cost => cost::Cost.choose(input),
    }
}

impl PolicyInput<'_> {
    /// Saturated now, or still spilling after a saturation (hysteresis).
    pub fn saturated(&self, c: &CandidateFleet) -> bool {
        self.snap.fleets[c.fleet].spilling || c.utilisation >= 1.0
    }

    /// Indices of candidates that are not saturated; all of them when every
    /// one is (some fleet must still take the request).
    pub fn unsaturated(&self) -> Vec<Candidate> {
        let all: Vec<Candidate> = Candidate::all(self.candidates.fleets.len()).collect();
        let free: Vec<Candidate> = all
            .iter()
            .copied()
            .filter(|&i| !self.saturated(&self.candidates.fleets[i]))
            .collect();
        if free.is_empty() { all } else { free }
    }

    /// The exploration draw: `Some(index)` of a uniformly random candidate
    /// among `among` with probability `share`.
    pub fn explore(&self, among: &[Candidate], share: f64) -> Option<Candidate> {
        if among.len() < 2 || unit(self.rng, 0x5eed) >= share {
            return None;
        }
        let pick = (unit(self.rng, 0xf1ee7) * among.len() as f64) as usize;
        among.get(pick.min(among.len() - 1)).copied()
    }

    /// Spreads near-equal candidates by the key: weighted rendezvous with
    /// weight = ready replicas, so each fleet's share follows its size and a
    /// key keeps its fleet while the set is unchanged.
    pub fn spread(&self, among: &[Candidate]) -> Option<Candidate> {
        among.iter().copied().max_by(|&a, &b| {
            let s = |i: Candidate| {
                let c = &self.candidates.fleets[i];
                score(
                    unit(self.key.key, self.snap.topo.fleets[c.fleet].seed),
                    c.ready.len() as f64,
                )
            };
            s(a).total_cmp(&s(b))
        })
    }

    /// The fleet's time to first token for this request as its figures
    /// predict it (ms): its speed (ms per 1000 prefill tokens) times the
    /// prefill already queued on its least-queued replica plus the part of the
    /// prompt the fleet does not hold. `None` when unmeasured.
    pub fn expected_ttft(&self, i: Candidate) -> Option<f64> {
        let c = &self.candidates.fleets[i];
        let per_k = self.snap.fleets[c.fleet].figures.latency?;
        let uncached =
            u64::from(self.key.prompt_tokens).saturating_sub(c.best_cached_tokens(self.key));
        let work = (uncached + c.min_queued) as f64 + crate::state::figures::OVERHEAD_TOKENS;
        Some(per_k * work / 1000.0)
    }

    /// Expected TTFTs of `among`, unmeasured fleets taking the mean of the
    /// measured ones (so they are neither shunned nor flooded).
    pub fn expected_ttfts(&self, among: &[Candidate]) -> Vec<f64> {
        let known: Vec<Option<f64>> = among.iter().map(|&i| self.expected_ttft(i)).collect();
        let measured: Vec<f64> = known.iter().flatten().copied().collect();
        let neutral = if measured.is_empty() {
            0.0
        } else {
            measured.iter().sum::<f64>() / measured.len() as f64
        };
        known.into_iter().map(|k| k.unwrap_or(neutral)).collect()
    }

    /// Candidates whose value is within `tolerance` of the lowest.
    pub fn near_best(among: &[Candidate], values: &[f64], tolerance: f64) -> Vec<Candidate> {
        let best = values.iter().copied().fold(f64::INFINITY, f64::min);
        among
            .iter()
            .zip(values)
            .filter(|(_, v)| **v <= best * (1.0 + tolerance) || (best <= 0.0 && **v <= 0.0))
            .map(|(&i, _)| i)
            .collect()
    }
}
