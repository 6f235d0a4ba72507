//! Each engine's metric names for what the router reads, from the engines'
//! own sources: vLLM `vllm/v1/metrics/loggers.py`, SGLang
//! `python/sglang/srt/metrics/collector.py`, llama.cpp
//! `tools/server/server.cpp` (`/metrics`, with `--metrics`), TGI
//! `router/src/` (`tgi_` gauges), Triton's TensorRT-LLM backend
//! (`nv_trt_llm_*_metrics` by `request_type` / `kv_cache_block_type`).
//! What an engine does not export is `None` here and never reported missing:
//! llama.cpp and TGI have no KV-usage gauge, only vLLM reports its LoRA
//! adapters.

use super::{Signal, Signals};
use crate::config::{Engine, MetricMap, MetricSelector as Sel};

/// Where each signal comes from, for one fleet.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Dialect {
    pub engine: Engine,
    pub running: Option<Sel>,
    pub waiting: Option<Sel>,
    pub kv_usage: Option<Sel>,
    /// Counters; summed over every selector (llama.cpp counts cached and
    /// uncached prompt tokens apart).
    pub prefix_cache_hits: Vec<Sel>,
    pub prefix_cache_queries: Vec<Sel>,
    /// vLLM's `lora_requests_info`: one series per label set ever seen, the
    /// value a timestamp; the newest is the current state.
    pub lora_info: Option<Sel>,
}

impl Dialect {
    /// The engine's names, with the fleet's `metric_map` over them.
    pub fn new(engine: Engine, map: &MetricMap) -> Dialect {
        let mut d = Dialect::of(engine);
        let over = |d: &mut Option<Sel>, m: &Option<Sel>| {
            if let Some(m) = m {
                *d = Some(m.clone());
            }
        };
        over(&mut d.running, &map.running);
        over(&mut d.waiting, &map.waiting);
        over(&mut d.kv_usage, &map.kv_usage);
        if let Some(h) = &map.prefix_cache_hits {
            d.prefix_cache_hits = vec![h.clone()];
        }
        if let Some(q) = &map.prefix_cache_queries {
            d.prefix_cache_queries = vec![q.clone()];
        }
        d
    }

    /// Every metric name it reads.
    pub fn metric_names(&self) -> Vec<&str> {
        [
            &self.running,
            &self.waiting,
            &self.kv_usage,
            &self.lora_info,
        ]
        .into_iter()
        .flatten()
        .chain(&self.prefix_cache_hits)
        .chain(&self.prefix_cache_queries)
        .map(|s| s.metric.as_str())
        .collect()
    }

    /// The signals this dialect names: a scrape that lacks one reports it.
    pub fn expected(&self) -> Signals {
        let mut s = Signals::default();
        for (sig, named) in [
            (Signal::Running, self.running.is_some()),
            (Signal::Waiting, self.waiting.is_some()),
            (Signal::KvUsage, self.kv_usage.is_some()),
            (Signal::PrefixCacheHits, !self.prefix_cache_hits.is_empty()),
            (
                Signal::PrefixCacheQueries,
                !self.prefix_cache_queries.is_empty(),
            ),
        ] {
            if named {
                s.insert(sig);
            }
        }
        s
    }

    fn of(engine: Engine) -> Dialect {
        let n = |m: &str| Some(Sel::named(m));
        let base = Dialect {
            engine,
            ..Dialect::default()
        };
        match engine {
            Engine::Vllm => Dialect {
                running: n("vllm:num_requests_running"),
                waiting: n("vllm:num_requests_waiting"),
                // Counts the blocks of running requests only: 0 when idle,
                // whatever prefixes the cache still holds.
                kv_usage: n("vllm:kv_cache_usage_perc"),
                prefix_cache_hits: vec![Sel::named("vllm:prefix_cache_hits_total")],
                prefix_cache_queries: vec![Sel::named("vllm:prefix_cache_queries_total")],
                lora_info: n("vllm:lora_requests_info"),
                ..base
            },
            Engine::Sglang => Dialect {
                running: n("sglang:num_running_reqs"),
                waiting: n("sglang:num_queue_reqs"),
                // Tokens held over the pool's size.
                kv_usage: n("sglang:token_usage"),
                prefix_cache_hits: vec![Sel::named("sglang:cached_tokens_total")],
                prefix_cache_queries: vec![Sel::named("sglang:prompt_tokens_total")],
                ..base
            },
            Engine::Llamacpp => Dialect {
                running: n("llamacpp:requests_processing"),
                waiting: n("llamacpp:requests_deferred"),
                // `prompt_tokens_total` excludes cached tokens: looked up is
                // both.
                prefix_cache_hits: vec![Sel::named("llamacpp:prompt_tokens_cached_total")],
                prefix_cache_queries: vec![
                    Sel::named("llamacpp:prompt_tokens_cached_total"),
                    Sel::named("llamacpp:prompt_tokens_total"),
                ],
                ..base
            },
            Engine::Tgi => Dialect {
                running: n("tgi_batch_current_size"),
                waiting: n("tgi_queue_size"),
                ..base
            },
            Engine::Trtllm => Dialect {
                running: Some(Sel::with(
                    "nv_trt_llm_request_metrics",
                    "request_type",
                    "scheduled",
                )),
                waiting: Some(Sel::with(
                    "nv_trt_llm_request_metrics",
                    "request_type",
                    "waiting",
                )),
                kv_usage: Some(Sel::with(
                    "nv_trt_llm_kv_cache_block_metrics",
                    "kv_cache_block_type",
                    "fraction",
                )),
                ..base
            },
            Engine::Custom => base,
        }
    }
}
