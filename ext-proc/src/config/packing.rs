//! Model packing: a fleet whose replicas serve several models, each loaded
//! when wanted and evicted least recently used first (llama.cpp's router
//! mode: `llama-server --models-dir … --models-max N`).
//!
//! Every stage that lists a packed fleet is one of the models it serves;
//! the replica choice prefers a replica that has the stage's model loaded,
//! and fleetroute loads it (`POST /models/load`) on the replica it routes
//! a request to when none has it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How a fleet's replicas hold whole models.
#[derive(Clone, Debug, Deserialize, JsonSchema, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PackingConfig {
    /// Models a replica keeps loaded at once: llama.cpp's `--models-max`.
    pub max_models: u32,
    /// Time to load a model onto a replica, ms: what a request for a model
    /// the replica does not hold waits, and what evicting one costs when it
    /// is next asked for.
    pub load_ms: f64,
    /// Prompt tokens one replica prefills per second: turns `load_ms` into
    /// the replica choice's unit (prefill tokens).
    pub prefill_tokens_per_sec: f64,
    /// Longest a request waits for its model to load; past it the client
    /// gets a 503 `model_unavailable` with `retry-after`. At most 30 s.
    pub load_timeout_ms: u64,
    /// Loading models ahead of their requests: a model with a larger share
    /// of the fleet's requests on more replicas, and each stage's
    /// `warm_replicas` kept loaded. Unset: models load when a request needs
    /// them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<PlacementConfig>,
}

/// How placement ahead of demand runs on a packed fleet.
#[derive(Clone, Debug, Deserialize, JsonSchema, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PlacementConfig {
    /// How often demand is looked at and loads are started, ms.
    pub interval_ms: u64,
    /// Demand is each model's request rate averaged over about this long, s.
    pub window_s: u64,
    /// Loads placement starts on one replica per minute at most (requests'
    /// own loads are not counted): bounds the churn of a workload that
    /// moves back and forth.
    pub max_loads_per_replica_per_min: u32,
}

impl Default for PlacementConfig {
    fn default() -> Self {
        PlacementConfig {
            interval_ms: 1000,
            window_s: 60,
            max_loads_per_replica_per_min: 2,
        }
    }
}

impl Default for PackingConfig {
    fn default() -> Self {
        PackingConfig {
            max_models: 4,
            load_ms: 5_000.0,
            prefill_tokens_per_sec: 10_000.0,
            load_timeout_ms: 30_000,
            placement: None,
        }
    }
}
