//! What a stage degrades to instead of failing: other stages, in order,
//! each for the conditions the operator names.

use std::collections::BTreeSet;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One entry of a stage's `fallbacks`.
#[derive(Clone, Debug, Deserialize, JsonSchema, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FallbackConfig {
    /// The stage that answers instead (its model, its fleets, its prices),
    /// used only inside this stage's residency and the request's.
    pub stage: String,
    /// When it applies; absent: `saturated`, `unhealthy` and `context` (which
    /// only matters with the stage's `context_tokens`). `upstream` is listed
    /// explicitly: it needs the `retry/` clusters `fleetroute bootstrap`
    /// renders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on: Option<Vec<Condition>>,
}

impl FallbackConfig {
    /// The conditions in effect.
    pub fn conditions(&self) -> Vec<Condition> {
        match &self.on {
            Some(on) => on.clone(),
            None => vec![
                Condition::Saturated,
                Condition::Unhealthy,
                Condition::Context,
            ],
        }
    }
}

/// The first fleet that rules out retries across the two stages, and why.
pub fn blocks_retry<'c>(
    cfg: &'c super::RouterConfig,
    from: &super::StageConfig,
    to: &super::StageConfig,
) -> Option<(&'c str, &'static str)> {
    from.fleet_names().chain(to.fleet_names()).find_map(|name| {
        let f = cfg.fleets.iter().find(|f| &f.name == name)?;
        if f.credentials.is_some() {
            Some((
                f.name.as_str(),
                "has its own credentials (its key would reach the other stage's fleets)",
            ))
        } else if f.packing.is_some() {
            Some((
                f.name.as_str(),
                "packs models (the retry's model may not be loaded)",
            ))
        } else {
            None
        }
    })
}

/// Why a request leaves its stage for a fallback.
#[derive(Clone, Copy, Debug, Deserialize, JsonSchema, Serialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum Condition {
    /// Admission refuses the request (or gives up holding it), or, on a
    /// stage without admission, every eligible fleet is saturated.
    Saturated,
    /// No fleet of the stage has a ready replica the policy accepts.
    Unhealthy,
    /// The prompt (the filter's token estimate) is longer than the stage's
    /// `context_tokens`.
    Context,
    /// The chosen replica failed before its first response byte (5xx,
    /// reset, connect failure): Envoy retries once on the fallback.
    Upstream,
}

impl Condition {
    pub const ALL: [Condition; 4] = [
        Condition::Saturated,
        Condition::Unhealthy,
        Condition::Context,
        Condition::Upstream,
    ];

    /// As the client reads it in `x-fleetroute-fallback` and metrics label it.
    pub fn as_str(self) -> &'static str {
        match self {
            Condition::Saturated => "saturated",
            Condition::Unhealthy => "unhealthy",
            Condition::Context => "context",
            Condition::Upstream => "upstream",
        }
    }
}

/// Every pair of fleets a stage's request may be retried across: a fleet of
/// the stage, then a fleet of one of its `upstream` fallbacks inside the
/// stage's residency. Each is an Envoy cluster (`retry/<from>/<to>`).
pub fn retry_pairs(cfg: &super::RouterConfig) -> BTreeSet<(String, String)> {
    let region = |name: &str| {
        cfg.fleets
            .iter()
            .find(|f| f.name == name)
            .map(|f| f.region.as_str())
    };
    let mut out = BTreeSet::new();
    for s in &cfg.stages {
        let inside = |fleet: &str| match (&s.residency, region(fleet)) {
            (Some(r), Some(g)) => r.to_vec().iter().any(|x| x == g),
            (None, Some(g)) => s.fleet_names().any(|n| region(n) == Some(g)),
            (_, None) => false,
        };
        for f in &s.fallbacks {
            let Some(to) = cfg.stages.iter().find(|t| t.name == f.stage) else {
                continue;
            };
            if !f.conditions().contains(&Condition::Upstream) {
                continue;
            }
            for from in s.fleet_names() {
                for g in to.fleet_names().filter(|g| inside(g)) {
                    out.insert((from.clone(), g.clone()));
                }
            }
        }
    }
    out
}

/// The cluster that pairs `from`'s replicas with an `upstream` fallback's
/// fleet `to` (fleet names hold no '/').
pub fn retry_cluster(from: &str, to: &str) -> String {
    format!(
        "{}{from}/{to}",
        fleetroute_filter::contract::RETRY_CLUSTER_PREFIX
    )
}
