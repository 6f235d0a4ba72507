//! Priority: fill fleets in the configured order; spill to the next when the
//! current one is saturated (see `route::saturation`), and return to it as it
//! frees up. When every fleet is saturated, the least utilised one takes it.

use super::{FleetPolicy, PolicyInput};
use crate::route::saturation::utilisation;

pub struct Priority<'a> {
    /// `Topology::fleets` indices in fill order.
    pub order: &'a [usize],
}

impl FleetPolicy for Priority<'_> {
    fn choose(&self, input: &PolicyInput<'_>) -> Option<usize> {
        let cands = &input.candidates.fleets;
        let rank = |fleet: usize| {
            self.order
                .iter()
                .position(|&f| f == fleet)
                .unwrap_or(usize::MAX)
        };
        let mut ordered: Vec<usize> = (0..cands.len()).collect();
        ordered.sort_by_key(|&i| rank(cands[i].fleet));
        if let Some(&first_free) = ordered.iter().find(|&&i| !input.saturated(&cands[i])) {
            return Some(first_free);
        }
        ordered.into_iter().min_by(|&a, &b| {
            let u = |i: usize| {
                let ready: Vec<usize> = cands[i].ready.iter().map(|r| r.replica).collect();
                utilisation(&input.snap.topo.fleets[cands[i].fleet], &ready)
            };
            u(a).total_cmp(&u(b))
        })
    }
}
