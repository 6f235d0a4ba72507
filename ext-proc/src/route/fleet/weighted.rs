//! Weighted: fixed shares. A fleet's share of keys is its weight × its ready
//! replicas; sticky per sampling key by weighted rendezvous hashing, so a
//! change of weights or membership moves only the keys it must.

use super::{FleetPolicy, PolicyInput};
use crate::route::rendezvous::score;
use crate::topology::Candidate;

pub struct Weighted<'a> {
    /// Per `Topology::fleets` index.
    pub weights: &'a [f64],
}

impl FleetPolicy for Weighted<'_> {
    fn choose(&self, input: &PolicyInput<'_>) -> Option<Candidate> {
        // The fleet holding the key's best replica overall: the best replica
        // of a fleet of weight w has score w / -ln(max unit), so comparing
        // fleets equals a flat weighted rendezvous over all ready replicas.
        input
            .candidates
            .fleets
            .iter()
            .enumerate()
            .filter(|(_, c)| self.weights.get(c.fleet.index()).is_some_and(|&w| w > 0.0))
            .max_by(|(_, a), (_, b)| {
                score(a.best_unit, self.weights[a.fleet])
                    .total_cmp(&score(b.best_unit, self.weights[b.fleet]))
            })
            .map(|(i, _)| Candidate(i))
    }
}
