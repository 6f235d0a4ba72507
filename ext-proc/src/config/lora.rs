//! LoRA adapters: what a fleet's replicas hold at once and what loading one
//! costs, in the units of the replica choice.
//!
//! A stage lists the adapters of its model that clients may name in `model`
//! (`StageConfig::adapters`); each fleet of such a stage says how its
//! replicas hold adapters (`FleetConfig::lora`). Load times default to
//! figures published for vLLM-style engines (see docs/concepts/adapters.md):
//! a copy from host memory onto the GPU takes milliseconds, a first load
//! from disk hundreds.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Most adapters one stage may list.
pub const MAX_ADAPTERS_PER_STAGE: usize = 4096;

/// How a fleet's replicas hold LoRA adapters (vLLM's `--max-loras`,
/// `--max-cpu-loras`).
#[derive(Clone, Debug, Deserialize, JsonSchema, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LoraConfig {
    /// Adapters a replica runs at once (on the GPU): `--max-loras`.
    pub max_loras: u32,
    /// Adapters a replica keeps in host memory, those on the GPU included:
    /// `--max-cpu-loras` (vLLM's default is `max_loras`).
    pub max_cpu_loras: u32,
    /// Time to move an adapter from host memory onto the GPU, ms.
    pub gpu_load_ms: f64,
    /// Time to read an adapter from disk (a first load), ms.
    pub disk_load_ms: f64,
    /// Prompt tokens one replica prefills per second: turns a load time
    /// into the replica choice's unit (prefill tokens).
    pub prefill_tokens_per_sec: f64,
    /// Where an adapter's weights are, with `{adapter}` for its name. When
    /// set, fleetroute registers an adapter on the replica it routes it to
    /// (`POST /v1/load_lora_adapter`) before the first request; unset: the
    /// replicas know every adapter already (`--lora-modules`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_path: Option<String>,
    /// Longest a request waits for its adapter to be registered (with
    /// `load_path`); past it the client gets a 503 with `retry-after`.
    pub load_timeout_ms: u64,
}

impl Default for LoraConfig {
    fn default() -> Self {
        LoraConfig {
            max_loras: 8,
            max_cpu_loras: 8,
            gpu_load_ms: 25.0,
            disk_load_ms: 370.0,
            prefill_tokens_per_sec: 10_000.0,
            load_path: None,
            load_timeout_ms: 10_000,
        }
    }
}

impl LoraConfig {
    /// Prefill tokens worth `ms` of a replica's time.
    pub fn tokens(&self, ms: f64) -> f64 {
        ms * self.prefill_tokens_per_sec / 1000.0
    }

    /// The path to load `adapter` from, when fleetroute registers adapters.
    pub fn path_of(&self, adapter: &str) -> Option<String> {
        self.load_path
            .as_ref()
            .map(|p| p.replace("{adapter}", adapter))
    }
}
