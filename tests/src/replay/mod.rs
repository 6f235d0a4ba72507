//! Trace replay: the same requests, with the same arrival times, through each
//! routing policy against simulated replicas, in one run.

pub mod adapter_workload;
pub mod adapters;
pub mod fleetroute;
mod fleetroute_config;
pub mod model_workload;
pub mod multi;
pub mod overload;
pub mod packing;
pub mod policies;
pub mod prompt;
pub mod sim;
mod sim_replica;
pub mod trace;
pub mod workload;

use sim::{Outcome, SimConfig, SimRouter};

/// One policy's figures.
#[derive(Clone, Debug)]
pub struct Row {
    pub policy: String,
    pub hit_rate: f64,
    pub ttft_p50: f64,
    pub ttft_p90: f64,
    pub ttft_p99: f64,
    /// Max over mean of requests served per replica.
    pub max_mean_requests: f64,
    /// Max over mean of prompt tokens prefilled per replica.
    pub max_mean_prefill: f64,
    pub rejected: u64,
}

pub(crate) fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

fn max_mean(v: &[u64]) -> f64 {
    let mean = v.iter().sum::<u64>() as f64 / v.len().max(1) as f64;
    *v.iter().max().unwrap_or(&0) as f64 / mean.max(f64::MIN_POSITIVE)
}

pub fn row(name: String, o: &Outcome) -> Row {
    let mut t = o.ttft_ms.clone();
    t.sort_by(f64::total_cmp);
    Row {
        policy: name,
        hit_rate: o.cached_tokens as f64 / o.prompt_tokens.max(1) as f64,
        ttft_p50: pct(&t, 0.5),
        ttft_p90: pct(&t, 0.9),
        ttft_p99: pct(&t, 0.99),
        max_mean_requests: max_mean(&o.per_replica),
        max_mean_prefill: max_mean(&o.prefill_per_replica),
        rejected: o.rejected,
    }
}

pub fn replay(cfg: &SimConfig, reqs: &[trace::TraceRequest], router: &mut dyn SimRouter) -> Row {
    let o = sim::run(cfg, reqs, router);
    row(router.name(), &o)
}

/// Every policy of the comparison, fleetroute last, with its stage's
/// `replica_choice` and `outlier` YAML blocks (empty for the defaults).
pub fn all_policies(
    cfg: &SimConfig,
    requests: usize,
    replica_choice: &str,
    outlier: &str,
) -> Vec<Box<dyn SimRouter>> {
    vec![
        Box::new(policies::Random(42)),
        Box::new(policies::RoundRobin(0)),
        Box::new(policies::LeastLoaded),
        Box::new(policies::FirstBlockHash),
        Box::new(policies::SglangCacheAware::new(
            cfg.replicas,
            cfg.router_cache_tokens.unwrap_or(cfg.cache_tokens),
            cfg.block_tokens,
        )),
        Box::new(policies::DynamoCost::new(
            cfg.replicas,
            requests,
            cfg.block_tokens,
        )),
        Box::new(fleetroute::Fleetroute::new(
            &fleetroute::config(
                cfg.replicas,
                cfg.router_cache_tokens.unwrap_or(cfg.cache_tokens),
                cfg.latency.max_batch,
                replica_choice,
                outlier,
            ),
            requests,
            cfg.block_tokens,
            "fleetroute",
        )),
    ]
}

pub fn table(rows: &[Row]) -> String {
    let mut s = String::from(
        "| policy | hit rate | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms | max/mean requests | max/mean prefill | rejected |\n|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | {:.3} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} | {} |\n",
            r.policy,
            r.hit_rate,
            r.ttft_p50,
            r.ttft_p90,
            r.ttft_p99,
            r.max_mean_requests,
            r.max_mean_prefill,
            r.rejected
        ));
    }
    s
}
