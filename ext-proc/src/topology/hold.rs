//! What a fleet's replicas load on demand, LoRA adapters (`lora`) or whole
//! models (`packing`), and what loading one costs: one shape for both, so
//! the replica choice weighs them the same way.

use crate::config::{LoraConfig, PackingConfig};

/// How a fleet's replicas hold adapters or models.
#[derive(Clone, Debug, PartialEq)]
pub struct Hold {
    pub kind: HoldKind,
    /// Held ready to run (adapters on the GPU, models loaded).
    pub ready: u32,
    /// Held at all, the ready ones included (adapters in host memory).
    pub kept: u32,
    /// Time to make a kept one ready, ms.
    pub kept_load_ms: f64,
    /// Time to load one that is not kept, ms.
    pub load_ms: f64,
    /// Added when a load evicts a ready one: its own load when next asked for, ms.
    pub evict_ms: f64,
    pub prefill_tokens_per_sec: f64,
    pub load_timeout_ms: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub enum HoldKind {
    /// LoRA adapters; registered at run time when `load_path` is set.
    Adapters { load_path: Option<String> },
    /// Whole models, loaded through llama.cpp's router API; `placement`
    /// loads them ahead of demand.
    Models {
        placement: Option<crate::config::PlacementConfig>,
    },
}

impl Hold {
    pub fn adapters(l: &LoraConfig) -> Hold {
        Hold {
            kind: HoldKind::Adapters {
                load_path: l.load_path.clone(),
            },
            ready: l.max_loras,
            kept: l.max_cpu_loras,
            kept_load_ms: l.gpu_load_ms,
            load_ms: l.disk_load_ms,
            evict_ms: l.gpu_load_ms,
            prefill_tokens_per_sec: l.prefill_tokens_per_sec,
            load_timeout_ms: l.load_timeout_ms,
        }
    }

    pub fn models(p: &PackingConfig) -> Hold {
        Hold {
            kind: HoldKind::Models {
                placement: p.placement.clone(),
            },
            ready: p.max_models,
            // An unloaded model is gone from memory: nothing kept beyond.
            kept: p.max_models,
            kept_load_ms: p.load_ms,
            load_ms: p.load_ms,
            evict_ms: p.load_ms,
            prefill_tokens_per_sec: p.prefill_tokens_per_sec,
            load_timeout_ms: p.load_timeout_ms,
        }
    }

    /// Prefill tokens worth `ms` of a replica's time.
    pub fn tokens(&self, ms: f64) -> f64 {
        ms * self.prefill_tokens_per_sec / 1000.0
    }

    pub fn is_models(&self) -> bool {
        matches!(self.kind, HoldKind::Models { .. })
    }

    /// Placement ahead of demand, on a packed fleet that has it.
    pub fn placement(&self) -> Option<&crate::config::PlacementConfig> {
        match &self.kind {
            HoldKind::Models { placement } => placement.as_ref(),
            HoldKind::Adapters { .. } => None,
        }
    }
}
