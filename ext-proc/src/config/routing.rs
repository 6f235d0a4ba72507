//! How a stage picks its fleet. Each policy carries only its own knobs, so a
//! field of another policy is refused while the file is read, with its path
//! (`stages[0].routing: weights is not a field of policy latency ...`).

use schemars::JsonSchema;
use std::collections::BTreeMap;
use std::fmt;

use serde::de::value::MapAccessDeserializer;
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

#[derive(Clone, Copy, Debug, Default, Deserialize, JsonSchema, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum PolicyKind {
    Priority,
    Weighted,
    #[default]
    Latency,
    Cost,
}

impl PolicyKind {
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Priority => "priority",
            PolicyKind::Weighted => "weighted",
            PolicyKind::Latency => "latency",
            PolicyKind::Cost => "cost",
        }
    }
}

/// Written as one block whose `policy` picks the variant; defaults are in
/// `defaults.rs`.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(tag = "policy", rename_all = "lowercase")]
pub enum RoutingConfig {
    Priority(PriorityRouting),
    Weighted(WeightedRouting),
    Latency(ScoredRouting),
    Cost(ScoredRouting),
}

#[derive(Clone, Debug, Deserialize, JsonSchema, Serialize, PartialEq)]
pub struct PriorityRouting {
    /// Fleets in fill order; absent = the stage's `fleets` order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<Vec<String>>,
    /// A saturated fleet spills; it takes traffic first again once its
    /// utilisation is back under this fraction of capacity.
    pub resume_below: f64,
}

#[derive(Clone, Debug, Default, Deserialize, JsonSchema, Serialize, PartialEq)]
pub struct WeightedRouting {
    /// Weight per fleet; unlisted fleets weigh 1.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub weights: BTreeMap<String, f64>,
}

/// The latency and cost policies: both rank fleets by a figure.
#[derive(Clone, Debug, Deserialize, JsonSchema, Serialize, PartialEq)]
pub struct ScoredRouting {
    /// Share of requests sent to a random eligible fleet so every fleet's
    /// figures stay fresh.
    pub exploration: f64,
    /// Fleets within this fraction of the best count as tied and share the
    /// traffic, so close figures do not herd onto one fleet.
    pub tolerance: f64,
}

impl RoutingConfig {
    pub fn policy(&self) -> PolicyKind {
        match self {
            RoutingConfig::Priority(_) => PolicyKind::Priority,
            RoutingConfig::Weighted(_) => PolicyKind::Weighted,
            RoutingConfig::Latency(_) => PolicyKind::Latency,
            RoutingConfig::Cost(_) => PolicyKind::Cost,
        }
    }

    /// The priority policy's fill order, if it names one.
    pub fn order(&self) -> Option<&[String]> {
        match self {
            RoutingConfig::Priority(p) => p.order.as_deref(),
            _ => None,
        }
    }

    /// A fleet's weight under the weighted policy (unlisted = 1).
    pub fn weight(&self, fleet: &str) -> f64 {
        match self {
            RoutingConfig::Weighted(w) => w.weights.get(fleet).copied().unwrap_or(1.0),
            _ => 1.0,
        }
    }

    fn scored(&self) -> Option<&ScoredRouting> {
        match self {
            RoutingConfig::Latency(s) | RoutingConfig::Cost(s) => Some(s),
            _ => None,
        }
    }

    pub fn exploration(&self) -> f64 {
        self.scored()
            .map_or(super::defaults::EXPLORATION, |s| s.exploration)
    }

    pub fn tolerance(&self) -> f64 {
        self.scored()
            .map_or(super::defaults::TOLERANCE, |s| s.tolerance)
    }

    /// Stages of other policies spill and resume at the default.
    pub fn resume_below(&self) -> f64 {
        match self {
            RoutingConfig::Priority(p) => p.resume_below,
            _ => super::defaults::RESUME_BELOW,
        }
    }
}

/// Read inside the block's own map, so an error carries the block's path
/// (`stages[0].routing`) and position rather than its stage's.
impl<'de> Deserialize<'de> for RoutingConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Block;
        impl<'de> Visitor<'de> for Block {
            type Value = RoutingConfig;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a routing block")
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RoutingConfig, A::Error> {
                let fields = RoutingFields::deserialize(MapAccessDeserializer::new(map))?;
                RoutingConfig::try_from(fields).map_err(de::Error::custom)
            }
        }
        d.deserialize_map(Block)
    }
}

/// The reference describes the block as written.
impl JsonSchema for RoutingConfig {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "RoutingConfig".into()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        RoutingFields::json_schema(generator)
    }
}

// The block as written: every policy's fields, checked against `policy`.
/// How the stage picks a fleet: `policy`, and that policy's own fields (a
/// field of another policy is an error).
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RoutingFields {
    /// How the stage spreads requests over its fleets.
    #[serde(default)]
    policy: PolicyKind,
    /// priority: fleets in fill order; absent = the stage's `fleets` order.
    order: Option<Vec<String>>,
    /// priority: a saturated fleet takes traffic first again once its
    /// utilisation is back under this fraction of capacity.
    #[schemars(extend("default" = super::defaults::RESUME_BELOW))]
    resume_below: Option<f64>,
    /// weighted: weight per fleet; unlisted fleets weigh 1. A fleet's share
    /// is its weight times its ready replicas.
    weights: Option<BTreeMap<String, f64>>,
    /// latency and cost: share of requests sent to a random eligible fleet,
    /// so every fleet's figures stay fresh.
    #[schemars(extend("default" = super::defaults::EXPLORATION))]
    exploration: Option<f64>,
    /// latency and cost: fleets within this fraction of the best count as
    /// tied and share the traffic.
    #[schemars(extend("default" = super::defaults::TOLERANCE))]
    tolerance: Option<f64>,
}

/// Which policies own each field.
const OWNERS: [(&str, &[PolicyKind]); 5] = [
    ("order", &[PolicyKind::Priority]),
    ("resume_below", &[PolicyKind::Priority]),
    ("weights", &[PolicyKind::Weighted]),
    ("exploration", &[PolicyKind::Latency, PolicyKind::Cost]),
    ("tolerance", &[PolicyKind::Latency, PolicyKind::Cost]),
];

impl TryFrom<RoutingFields> for RoutingConfig {
    type Error = String;

    fn try_from(f: RoutingFields) -> Result<Self, String> {
        let set = [
            f.order.is_some(),
            f.resume_below.is_some(),
            f.weights.is_some(),
            f.exploration.is_some(),
            f.tolerance.is_some(),
        ];
        let misplaced: Vec<String> = OWNERS
            .iter()
            .zip(set)
            .filter(|((_, owners), set)| *set && !owners.contains(&f.policy))
            .map(|((field, owners), _)| {
                let names: Vec<&str> = owners.iter().map(|p| p.name()).collect();
                format!(
                    "{field} is not a field of policy {} (only of {})",
                    f.policy.name(),
                    names.join(" and ")
                )
            })
            .collect();
        if !misplaced.is_empty() {
            return Err(misplaced.join("; "));
        }
        let scored = || ScoredRouting {
            exploration: f.exploration.unwrap_or(super::defaults::EXPLORATION),
            tolerance: f.tolerance.unwrap_or(super::defaults::TOLERANCE),
        };
        Ok(match f.policy {
            PolicyKind::Priority => RoutingConfig::Priority(PriorityRouting {
                order: f.order.clone(),
                resume_below: f.resume_below.unwrap_or(super::defaults::RESUME_BELOW),
            }),
            PolicyKind::Weighted => RoutingConfig::Weighted(WeightedRouting {
                weights: f.weights.clone().unwrap_or_default(),
            }),
            PolicyKind::Latency => RoutingConfig::Latency(scored()),
            PolicyKind::Cost => RoutingConfig::Cost(scored()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RouterConfig;

    const POLICIES: [PolicyKind; 4] = [
        PolicyKind::Priority,
        PolicyKind::Weighted,
        PolicyKind::Latency,
        PolicyKind::Cost,
    ];

    fn stage_with(routing: &str) -> String {
        format!(
            "fleets:\n  - {{ name: a, region: r, endpoints: [\"10.0.0.1:8000\"], cost: {{ gpu_hour_usd: 1 }} }}\nstages:\n  - name: s\n    fleets: [a]\n    routing: {routing}\n"
        )
    }

    fn value_of(field: &str) -> &'static str {
        match field {
            "order" => "[a]",
            "weights" => "{ a: 2 }",
            _ => "0.3",
        }
    }

    /// Every field under every policy: accepted by its owners, refused with
    /// the block's path by the others.
    #[test]
    fn each_field_belongs_to_its_policies_only() {
        for policy in POLICIES {
            for (field, owners) in OWNERS {
                let yaml = stage_with(&format!(
                    "{{ policy: {}, {field}: {} }}",
                    policy.name(),
                    value_of(field)
                ));
                let got = RouterConfig::parse(&yaml).map_err(|e| e.to_string());
                if owners.contains(&policy) {
                    assert!(got.is_ok(), "{field} under {policy:?}: {got:?}");
                } else {
                    let want = format!(
                        "stages[0].routing: {field} is not a field of policy {}",
                        policy.name()
                    );
                    assert!(
                        got.as_ref().is_err_and(|e| e.starts_with(&want)),
                        "{field} under {policy:?}: {got:?}"
                    );
                }
            }
        }
    }

    /// What is written back reads as the same routing, in YAML and in the
    /// admin API's JSON.
    #[test]
    fn every_policy_round_trips() {
        for routing in [
            "{ policy: priority, order: [a], resume_below: 0.5 }",
            "{ policy: weighted, weights: { a: 2 } }",
            "{ policy: latency, exploration: 0.2 }",
            "{ policy: cost, tolerance: 0.3 }",
            "{}",
        ] {
            let cfg = RouterConfig::parse(&stage_with(routing)).unwrap();
            let r = &cfg.stages[0].routing;
            let yaml = yaml_serde::to_string(r).unwrap();
            let back: RoutingConfig = yaml_serde::from_str(&yaml).unwrap();
            assert_eq!(&back, r, "{routing} -> {yaml}");
            let json = serde_json::to_string(r).unwrap();
            let back: RoutingConfig = serde_json::from_str(&json).unwrap();
            assert_eq!(&back, r, "{routing} -> {json}");
        }
    }

    #[test]
    fn unset_knobs_take_the_defaults() {
        let cfg = RouterConfig::parse(&stage_with("{ policy: priority }")).unwrap();
        assert_eq!(cfg.stages[0].routing.resume_below(), 0.8);
        let cfg = RouterConfig::parse(&stage_with("{}")).unwrap();
        let r = &cfg.stages[0].routing;
        assert_eq!(r.policy(), PolicyKind::Latency);
        assert_eq!((r.exploration(), r.tolerance()), (0.05, 0.1));
    }
}
