//! Cost: the lowest cost per million tokens among fleets that meet the
//! stage's alarms (p95 time to first token, error rate over a window).
//!
//! A fleet's cost is its provider price, or its GPU-hour price over the tokens
//! it serves (see `state::figures`). When no fleet meets the alarms, the
//! fastest takes the request: cost never buys a broken answer. Near-equal
//! costs share by key, and an exploration share keeps every figure fresh.

use super::{FleetPolicy, PolicyInput};
use crate::topology::Candidate;

pub struct Cost;

impl FleetPolicy for Cost {
    fn choose(&self, input: &PolicyInput<'_>) -> Option<Candidate> {
        let among = input.unsaturated();
        let r = &input.stage.routing;
        if let Some(i) = input.explore(&among, r.exploration()) {
            return Some(i);
        }
        let healthy: Vec<Candidate> = among
            .iter()
            .copied()
            .filter(|&i| {
                input.snap.fleets[input.candidates.fleets[i].fleet]
                    .figures
                    .meets(&input.stage.alarms)
            })
            .collect();
        if healthy.is_empty() {
            let ttfts = input.expected_ttfts(&among);
            return input.spread(&PolicyInput::near_best(&among, &ttfts, 0.0));
        }
        let costs: Vec<f64> = healthy
            .iter()
            .map(|&i| {
                input.snap.fleets[input.candidates.fleets[i].fleet]
                    .figures
                    .usd_per_mtok
                    .unwrap_or(f64::MAX)
            })
            .collect();
        input.spread(&PolicyInput::near_best(&healthy, &costs, r.tolerance()))
    }
}
