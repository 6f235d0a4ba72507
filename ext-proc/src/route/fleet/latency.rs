//! Latency (the default): the fleet that will answer this request fastest now.
//!
//! Each fleet's figure is a decaying average of time to first token per 1000
//! uncached prompt tokens; this request's expected time on a fleet uses the
//! prefix that fleet already holds. Fleets within `tolerance` of the best
//! share the traffic by key (no herd onto one fleet when figures are close),
//! and an `exploration` share goes to a random fleet so every figure stays
//! fresh. Saturated fleets are skipped while any other can take the request.

use super::{FleetPolicy, PolicyInput};
use crate::topology::Candidate;

pub struct Latency;

impl FleetPolicy for Latency {
    fn choose(&self, input: &PolicyInput<'_>) -> Option<Candidate> {
        let among = input.unsaturated();
        let r = &input.stage.routing;
        if let Some(i) = input.explore(&among, r.exploration()) {
            return Some(i);
        }
        let ttfts = input.expected_ttfts(&among);
        input.spread(&PolicyInput::near_best(&among, &ttfts, r.tolerance()))
    }
}
