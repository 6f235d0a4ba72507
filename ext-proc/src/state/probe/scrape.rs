//! Load signals from the engines themselves: each replica's Prometheus
//! endpoint, read on an interval, with vLLM's metric names. Missing metrics
//! read as zero; an engine that does not answer keeps its last figures.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;

use crate::state::Shared;

/// Added to a lease's age before the engine's count can end it.
const RECONCILE_SLACK: Duration = Duration::from_secs(2);

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EngineLoad {
    pub running: f64,
    pub waiting: f64,
    pub kv_usage: f64,
}

/// Sums each metric over its label sets (one engine may serve several models).
pub fn parse(text: &str) -> EngineLoad {
    let mut l = EngineLoad::default();
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some((name_labels, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(v) = value.trim().parse::<f64>() else {
            continue;
        };
        let name = name_labels.split('{').next().unwrap_or("").trim();
        match name {
            "vllm:num_requests_running" => l.running += v,
            "vllm:num_requests_waiting" => l.waiting += v,
            // Older vLLM releases call it gpu_cache_usage_perc.
            "vllm:kv_cache_usage_perc" | "vllm:gpu_cache_usage_perc" => {
                l.kv_usage = l.kv_usage.max(v)
            }
            _ => {}
        }
    }
    l
}

pub async fn run_scrapes(shared: Arc<Shared>) {
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("http client");
    loop {
        let snap = shared.snapshot();
        let cfg = snap.topo.engine_metrics.clone();
        if cfg.interval_ms == 0 {
            tokio::time::sleep(Duration::from_secs(5)).await;
            continue;
        }
        let timeout = Duration::from_millis(cfg.timeout_ms);
        // Older than two scrapes and a log flush: has reached the engine.
        let grace = Duration::from_millis(2 * cfg.interval_ms) + RECONCILE_SLACK;
        let scrapes = snap
            .topo
            .fleets
            .iter()
            .flat_map(|f| f.replicas.values().map(move |r| (f, r)))
            .map(|(f, r)| {
                let url = format!("http://{}{}", r.addr, cfg.path);
                let req = super::with_key(client.get(&url).timeout(timeout), f);
                let load = r.load.clone();
                let shared = &shared;
                async move {
                    let Ok(resp) = req.send().await else {
                        return;
                    };
                    if !resp.status().is_success() {
                        return;
                    }
                    if let Ok(text) = resp.text().await {
                        let l = parse(&text);
                        load.set_engine(l.running as u32, l.waiting as u32, l.kv_usage);
                        // Leases the engine no longer knows of were lost in
                        // the access log: end them now rather than at their bound.
                        let count = (l.running + l.waiting) as u32;
                        shared.leases.reconcile(&load, count, grace);
                    }
                }
            });
        join_all(scrapes).await;
        drop(snap);
        tokio::time::sleep(Duration::from_millis(cfg.interval_ms)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_names_summed_and_missing_tolerated() {
        let text = "# HELP vllm:num_requests_running x\n\
vllm:num_requests_running{model_name=\"a\"} 3.0\n\
vllm:num_requests_running{model_name=\"b\"} 1\n\
vllm:num_requests_waiting{model_name=\"a\"} 2\n\
vllm:gpu_cache_usage_perc{model_name=\"a\"} 0.5\n\
garbage line\n";
        assert_eq!(
            parse(text),
            EngineLoad {
                running: 4.0,
                waiting: 2.0,
                kv_usage: 0.5
            }
        );
        assert_eq!(parse(""), EngineLoad::default());
    }
}
