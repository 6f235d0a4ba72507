//! Which inference engine a fleet runs (`engine:`), and where its health and
//! metrics endpoints are when they are not the engine's own defaults
//! (`engine_api:`). What each engine's metrics mean is `crate::engine`'s.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The engine a fleet's replicas run: it names the metrics the router
/// scrapes and the health path it probes.
#[derive(Clone, Copy, Debug, Default, Deserialize, JsonSchema, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// vLLM (`vllm:` metrics).
    #[default]
    Vllm,
    /// SGLang (`sglang:` metrics).
    Sglang,
    /// llama.cpp's `llama-server` (`llamacpp:` metrics, started with `--metrics`).
    Llamacpp,
    /// Hugging Face Text Generation Inference (`tgi_` metrics).
    Tgi,
    /// TensorRT-LLM behind Triton (`nv_trt_llm_` metrics).
    Trtllm,
    /// Anything else: `engine_api.metric_map` names every metric.
    Custom,
}

impl Engine {
    pub const ALL: [Engine; 6] = [
        Engine::Vllm,
        Engine::Sglang,
        Engine::Llamacpp,
        Engine::Tgi,
        Engine::Trtllm,
        Engine::Custom,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Engine::Vllm => "vllm",
            Engine::Sglang => "sglang",
            Engine::Llamacpp => "llamacpp",
            Engine::Tgi => "tgi",
            Engine::Trtllm => "trtllm",
            Engine::Custom => "custom",
        }
    }

    /// The path that answers 200 once the engine serves: every one of them
    /// has a cheap `/health` (llama.cpp answers 503 while it loads the model;
    /// SGLang's `/health_generate` and TGI's `/health` run a generation),
    /// except Triton, whose OpenAI frontend answers `/health/ready`.
    pub fn health_path(self) -> &'static str {
        match self {
            Engine::Trtllm => "/health/ready",
            _ => "/health",
        }
    }
}

/// A fleet's engine endpoints and metric names, where they differ from the
/// engine's defaults.
#[derive(Clone, Debug, Default, Deserialize, JsonSchema, PartialEq, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineApi {
    /// Health path; unset: `health_check.path`, else the engine's own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health_path: Option<String>,
    /// Prometheus path; unset: `engine_metrics.path`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_path: Option<String>,
    /// The port metrics are served on when it is not the serving port
    /// (Triton's is 8002).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_port: Option<u16>,
    /// Metric names that replace the engine's (all of them for `custom`).
    #[serde(skip_serializing_if = "MetricMap::is_empty")]
    pub metric_map: MetricMap,
}

/// What the router reads from an engine, each as one metric (summed over the
/// series that match).
#[derive(Clone, Debug, Default, Deserialize, JsonSchema, PartialEq, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricMap {
    /// Requests the engine is running.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub running: Option<MetricSelector>,
    /// Requests queued in the engine.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting: Option<MetricSelector>,
    /// KV-cache usage, a fraction from 0 to 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_usage: Option<MetricSelector>,
    /// Prompt tokens served from the prefix cache (a counter).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix_cache_hits: Option<MetricSelector>,
    /// Prompt tokens looked up in the prefix cache (a counter).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix_cache_queries: Option<MetricSelector>,
}

impl EngineApi {
    pub fn is_default(&self) -> bool {
        *self == EngineApi::default()
    }
}

impl MetricMap {
    pub fn is_empty(&self) -> bool {
        *self == MetricMap::default()
    }
}

/// One metric: its name, and label values a series must carry to count.
#[derive(Clone, Debug, Default, Deserialize, JsonSchema, PartialEq, Eq, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MetricSelector {
    pub metric: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

impl MetricSelector {
    pub fn named(metric: &str) -> Self {
        MetricSelector {
            metric: metric.to_string(),
            labels: BTreeMap::new(),
        }
    }

    /// `[a-zA-Z_:][a-zA-Z0-9_:]*`, as the text format writes a bare name.
    pub fn valid_name(name: &str) -> bool {
        let mut chars = name.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    }

    pub fn with(metric: &str, label: &str, value: &str) -> Self {
        MetricSelector {
            metric: metric.to_string(),
            labels: BTreeMap::from([(label.to_string(), value.to_string())]),
        }
    }
}

#[derive(Clone, Debug, Deserialize, JsonSchema, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthCheckConfig {
    /// Path answered with 200 by a healthy replica; unset: each fleet's
    /// engine's own (`/health`; Triton's `/health/ready`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Time between two checks of a replica, at least 10.
    pub interval_ms: u64,
    /// Bound on one check, 1 to `interval_ms`.
    pub timeout_ms: u64,
    /// Consecutive passes before an unhealthy replica rejoins.
    pub healthy_threshold: u32,
    /// Consecutive failures before a healthy replica leaves.
    pub unhealthy_threshold: u32,
}

/// Scraping each replica's Prometheus endpoint, read in its fleet's engine's
/// metric names.
#[derive(Clone, Debug, Deserialize, JsonSchema, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineMetricsConfig {
    /// Path of the Prometheus endpoint on each replica.
    pub path: String,
    /// 0 turns scraping off.
    pub interval_ms: u64,
    /// Bound on one scrape, 1 to `interval_ms`.
    pub timeout_ms: u64,
}
