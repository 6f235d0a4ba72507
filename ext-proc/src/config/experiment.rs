//! Experiments on a stage's traffic: an A/B test between its fleets and a
//! shadow mirror.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Experiments on a stage's traffic, chosen deterministically by sampling key.
#[derive(Clone, Debug, Default, Deserialize, JsonSchema, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ExperimentConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ab: Option<AbTest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<Shadow>,
}

/// An A/B test: requests the policy sends to `control` are re-sampled among
/// control and the variants by these percentages.
#[derive(Clone, Debug, Deserialize, JsonSchema, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AbTest {
    /// The fleet whose requests are re-sampled.
    pub control: String,
    /// Fleets that take a share of the control's requests.
    pub variants: Vec<Variant>,
}

#[derive(Clone, Debug, Deserialize, JsonSchema, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Variant {
    /// A fleet of the stage.
    pub fleet: String,
    /// Share of the control's requests it takes, percent.
    pub percent: f64,
}

/// Mirror `percent` of the stage's requests to `fleet`; the client's answer
/// never depends on it.
#[derive(Clone, Debug, Deserialize, JsonSchema, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Shadow {
    /// The fleet mirrored to (need not be one of the stage's).
    pub fleet: String,
    /// Share of the stage's requests mirrored, percent.
    pub percent: f64,
}
