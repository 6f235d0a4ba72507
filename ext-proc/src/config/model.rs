//! The router config file as its users write it: fleets and stages.

use std::collections::BTreeMap;

use serde::Deserialize;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouterConfig {
    #[serde(default)]
    pub health_check: HealthCheckConfig,
    /// Stage for requests whose model names no stage (or that name none).
    #[serde(default)]
    pub default_stage: Option<String>,
    pub fleets: Vec<FleetConfig>,
    pub stages: Vec<StageConfig>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthCheckConfig {
    pub path: String,
    pub interval_ms: u64,
    pub timeout_ms: u64,
    /// Consecutive passes before an unhealthy replica rejoins.
    pub healthy_threshold: u32,
    /// Consecutive failures before a healthy replica leaves.
    pub unhealthy_threshold: u32,
}

impl Default for HealthCheckConfig {
    fn default() -> Self {
        HealthCheckConfig {
            path: "/health".into(),
            interval_ms: 1000,
            timeout_ms: 500,
            healthy_threshold: 2,
            unhealthy_threshold: 2,
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetConfig {
    /// Also the Envoy cluster name.
    pub name: String,
    pub region: String,
    #[serde(default)]
    pub endpoints: Vec<String>,
    #[serde(default)]
    pub cost: Option<CostConfig>,
    #[serde(default)]
    pub capacity: CapacityConfig,
    #[serde(default)]
    pub hosts: Option<Bounds>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostConfig {
    pub gpu_hour_usd: Option<f64>,
    pub gpus_per_replica: Option<u32>,
    /// A provider's price; when set it wins over the GPU-hour derivation.
    pub usd_per_million_tokens: Option<f64>,
}

/// What one replica of the fleet can take before it counts as saturated.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CapacityConfig {
    pub max_inflight: u32,
    pub max_waiting: u32,
    pub max_kv_usage: f64,
}

impl Default for CapacityConfig {
    fn default() -> Self {
        CapacityConfig {
            max_inflight: 64,
            max_waiting: 8,
            max_kv_usage: 0.95,
        }
    }
}

#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bounds {
    pub min: u32,
    pub max: u32,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageConfig {
    pub name: String,
    #[serde(default)]
    pub models: Vec<String>,
    pub fleets: Vec<String>,
    /// Regions the stage may never leave; absent = every fleet's region.
    #[serde(default)]
    pub residency: Option<OneOrMany>,
    #[serde(default)]
    pub replicas: Option<Bounds>,
    #[serde(default)]
    pub routing: RoutingConfig,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub fn to_vec(&self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s.clone()],
            OneOrMany::Many(v) => v.clone(),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum PolicyKind {
    Priority,
    Weighted,
    #[default]
    Latency,
    Cost,
}

/// One flat block for every policy; fields that belong to another policy are
/// refused by validation, so a typo cannot silently fall back to a default.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoutingConfig {
    #[serde(default)]
    pub policy: PolicyKind,
    /// priority: fleets in fill order.
    #[serde(default)]
    pub order: Option<Vec<String>>,
    /// weighted: weight per fleet (unlisted fleets weigh 1).
    #[serde(default)]
    pub weights: Option<BTreeMap<String, f64>>,
}
