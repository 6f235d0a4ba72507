//! Priority: fill fleets in the configured order; spill to the next when the
//! current one is saturated (see `route::saturation`), and return to it as it
//! frees up. When every fleet is saturated, the least utilised one takes it.

use super::{FleetPolicy, PolicyInput};
use crate::topology::{Candidate, FleetId};

pub struct Priority<'a> {
    /// Fleets in fill order.
    pub order: &'a [FleetId],
}

impl FleetPolicy for Priority<'_> {
    fn choose(&self, input: &PolicyInput<'_>) -> Option<Candidate> {
        let cands = &input.candidates.fleets;
        let rank = |fleet: FleetId| {
            self.order
                .iter()
                .position(|&f| f == fleet)
                .unwrap_or(usize::MAX)
        };
        let mut ordered: Vec<Candidate> = Candidate::all(cands.len()).collect();
        ordered.sort_by_key(|&i| rank(cands[i].fleet));
        if let Some(&first_free) = ordered.iter().find(|&&i| !input.saturated(&cands[i])) {
            return Some(first_free);
        }
        ordered
            .into_iter()
            .min_by(|&a, &b| cands[a].utilisation.total_cmp(&cands[b].utilisation))
    }
}
