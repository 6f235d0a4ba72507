//! Experiments on the chosen fleet: an A/B test re-samples requests the
//! policy sent to the control fleet among control and variants; a shadow
//! mirrors a share of requests to another fleet. Both draw from the sampling
//! key (a user stays in one arm while the test is unchanged) with their own
//! seeds, so arms, shadow and replica choice are independent.

use fleetroute_filter::contract::split_regions;

use super::eligible::Candidates;
use super::key::RouteKey;
use super::rendezvous::unit;
use crate::state::Snapshot;
use crate::topology::{Candidate, FleetId, Stage};

const AB_SEED: u64 = 0xab_7e57;
const SHADOW_SEED: u64 = 0x5_4ad0;

pub use crate::topology::Arm;

/// Re-samples a choice of the control fleet. `chosen` indexes
/// `candidates.fleets`; a variant without a ready replica keeps the request
/// on control.
pub fn ab(stage: &Stage, candidates: &Candidates, chosen: Candidate, key: u64) -> (Candidate, Arm) {
    let Some((control, variants)) = &stage.experiment.ab else {
        return (chosen, Arm::None);
    };
    if candidates.fleets[chosen].fleet != *control {
        return (chosen, Arm::None);
    }
    let draw = unit(key, AB_SEED) * 100.0;
    let mut upto = 0.0;
    for &(fleet, percent) in variants {
        upto += percent;
        if draw < upto {
            return match candidates.fleets.iter().position(|c| c.fleet == fleet) {
                Some(i) => (Candidate(i), Arm::Variant),
                None => (chosen, Arm::Control),
            };
        }
    }
    (chosen, Arm::Control)
}

/// The shadow fleet this request is mirrored to, if it is sampled, the
/// shadow fleet has a ready replica, and its region is inside the request's
/// residency (the stage's residency is checked when the config is loaded).
/// A mirror is a copy of the request as it goes to `primary`: never of one
/// that carries the primary fleet's own key, nor under a model name the
/// shadow fleet would not serve.
pub fn shadow(
    stage: &Stage,
    snap: &Snapshot,
    key: &RouteKey<'_>,
    primary: FleetId,
) -> Option<FleetId> {
    let (fleet, percent) = stage.experiment.shadow?;
    let name = |f| stage.served_as(f).or(key.model);
    if snap.topo.fleets[primary].key.is_some() || name(primary) != name(fleet) {
        return None;
    }
    let sampled = unit(key.key, SHADOW_SEED) * 100.0 < percent;
    let region = &snap.topo.fleets[fleet].region;
    let resident = key
        .residency
        .is_none_or(|r| split_regions(r).any(|x| x == region));
    (sampled && resident && snap.replicas[fleet].values().any(|r| r.ready())).then_some(fleet)
}
