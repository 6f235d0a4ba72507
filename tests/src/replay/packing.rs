//! Many models on one pool, replayed: each model on replicas of its own
//! (dedicated, sized per model to meet the SLO) against one shared pool
//! whose replicas hold `max_models` models at once and load others on
//! demand (fleetroute's `packing`), sized to meet the same SLO. The
//! simulated replicas hold models as adapter slots with no host tier
//! (`engine::lora` with `max_cpu_loras = max_loras`): a request for a model
//! its replica has not loaded waits `load_ms`, evicting the least recently
//! used model no running request uses.

use std::collections::BTreeMap;

use super::fleetroute::Fleetroute;
use super::policies::LeastLoaded;
use super::sim::{self, Outcome, SimConfig, SimRouter};
use super::trace::TraceRequest;
use crate::engine::lora::LoraModel;
use fleetroute::config::{RouterConfig, ValidConfig};

/// The shared pool's replicas and the SLO every model's stage must meet.
#[derive(Clone, Copy, Debug)]
pub struct Packing {
    pub max_models: usize,
    pub load_ms: f64,
    /// TTFT p90 every model must meet, ms.
    pub slo_ms: f64,
}

/// One setup's figures.
#[derive(Clone, Debug)]
pub struct PackingRow {
    pub setup: String,
    pub replicas: usize,
    pub ttft_p90: f64,
    /// The worst model's TTFT p90, and which.
    pub worst_p90: f64,
    pub worst_model: String,
    /// Model loads per hour of the trace, over all replicas.
    pub loads_per_hour: f64,
    /// Requests per hour that waited for their model to load (cold starts).
    pub cold_per_hour: f64,
    /// Requests never served (a replica's queue full): over any SLO.
    pub rejected: u64,
}

impl PackingRow {
    pub fn meets(&self, slo_ms: f64) -> bool {
        self.worst_p90 <= slo_ms
    }
}

fn endpoints(n: usize) -> String {
    (0..n)
        .map(|r| format!("\"10.0.{}.{}:8000\"", r / 250, r % 250 + 1))
        .collect::<Vec<_>>()
        .join(", ")
}

/// How the shared pool is routed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Router {
    Fleetroute,
    /// fleetroute with `packing.placement` (defaults).
    FleetroutePlaced,
    /// The least-loaded replica, whatever it holds.
    LeastLoaded,
}

/// fleetroute's config for the shared pool: one packed fleet, a stage per model.
pub fn shared_config(cfg: &SimConfig, p: &Packing, models: &[String], placed: bool) -> ValidConfig {
    let mut yaml = format!(
        "fleets:\n  - name: pool\n    region: r\n    endpoints: [{}]\n    capacity: {{ max_inflight: {}, kv_cache_tokens: {} }}\n    \
         packing: {{ max_models: {}, load_ms: {}, prefill_tokens_per_sec: {}{} }}\nstages:\n",
        endpoints(cfg.replicas),
        cfg.latency.max_batch,
        cfg.cache_tokens,
        p.max_models,
        p.load_ms,
        cfg.latency.prefill_tokens_per_sec,
        if placed { ", placement: {}" } else { "" },
    );
    for m in models {
        yaml.push_str(&format!("  - {{ name: {m}, fleets: [pool] }}\n"));
    }
    RouterConfig::parse_valid(&yaml).unwrap_or_else(|e| panic!("packing replay config: {e}"))
}

/// fleetroute's config for one model's dedicated replicas.
fn dedicated_config(cfg: &SimConfig) -> ValidConfig {
    let yaml = format!(
        "default_stage: own\nfleets:\n  - name: own\n    region: r\n    endpoints: [{}]\n    capacity: {{ max_inflight: {}, kv_cache_tokens: {} }}\nstages:\n  - {{ name: own, fleets: [own] }}\n",
        endpoints(cfg.replicas),
        cfg.latency.max_batch,
        cfg.cache_tokens,
    );
    RouterConfig::parse_valid(&yaml).unwrap_or_else(|e| panic!("dedicated replay config: {e}"))
}

/// A request's TTFT; one never served counts as infinitely late.
fn late(r: &sim::RequestOutcome) -> f64 {
    if r.ttft_ms.is_nan() {
        f64::INFINITY
    } else {
        r.ttft_ms
    }
}

/// Each model's TTFT p90; a request never served counts as infinitely late.
fn p90_by_model(reqs: &[TraceRequest], o: &Outcome) -> BTreeMap<String, f64> {
    let mut by: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for (r, out) in reqs.iter().zip(&o.requests) {
        let t = late(out);
        by.entry(r.adapter.clone().unwrap_or_default())
            .or_default()
            .push(t);
    }
    by.into_iter().map(|(m, mut t)| (m, p90(&mut t))).collect()
}

fn p90(t: &mut [f64]) -> f64 {
    if t.is_empty() {
        return 0.0;
    }
    t.sort_by(f64::total_cmp);
    t[((t.len() as f64 * 0.9).ceil() as usize).clamp(1, t.len()) - 1]
}

fn hours(reqs: &[TraceRequest], cfg: &SimConfig) -> f64 {
    reqs.last()
        .map_or(1.0, |r| r.arrival_ms / cfg.speedup / 3_600_000.0)
        .max(1e-9)
}

fn models(reqs: &[TraceRequest]) -> Vec<String> {
    let mut names: Vec<String> = reqs.iter().filter_map(|r| r.adapter.clone()).collect();
    names.sort();
    names.dedup();
    names
}

/// The shared pool of `replicas` through `router`.
pub fn shared(
    cfg: &SimConfig,
    p: &Packing,
    reqs: &[TraceRequest],
    replicas: usize,
    router: Router,
) -> PackingRow {
    let cfg = SimConfig {
        replicas,
        lora: Some(LoraModel {
            max_loras: p.max_models,
            max_cpu_loras: p.max_models,
            gpu_load_ms: 0.0,
            disk_load_ms: p.load_ms,
            overlapped: true,
        }),
        ..*cfg
    };
    let label = match router {
        Router::Fleetroute => "fleetroute",
        Router::FleetroutePlaced => "fleetroute with placement",
        Router::LeastLoaded => "least loaded",
    };
    let mut router: Box<dyn SimRouter> = match router {
        Router::LeastLoaded => Box::new(LeastLoaded),
        r => Box::new(Fleetroute::new(
            &shared_config(&cfg, p, &models(reqs), r == Router::FleetroutePlaced),
            reqs.len(),
            cfg.block_tokens,
            label,
        )),
    };
    let o = sim::run(&cfg, reqs, router.as_mut());
    let by = p90_by_model(reqs, &o);
    let (worst_model, worst_p90) = worst(&by);
    let mut all: Vec<f64> = o.requests.iter().map(late).collect();
    PackingRow {
        setup: format!("shared pool, {label}"),
        replicas,
        ttft_p90: p90(&mut all),
        worst_p90,
        worst_model,
        loads_per_hour: (o.host_loads + o.disk_loads) as f64 / hours(reqs, &cfg),
        cold_per_hour: o.cold_requests as f64 / hours(reqs, &cfg),
        rejected: o.rejected,
    }
}

fn worst(by: &BTreeMap<String, f64>) -> (String, f64) {
    by.iter()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map_or((String::new(), 0.0), |(m, &t)| (m.clone(), t))
}

/// The fewest shared replicas (up to `max`) whose every model meets the
/// SLO through fleetroute, by bisection (more replicas never hurt here).
pub fn smallest_shared(
    cfg: &SimConfig,
    p: &Packing,
    reqs: &[TraceRequest],
    max: usize,
) -> PackingRow {
    let (mut lo, mut hi) = (1, max.max(1));
    let mut best = shared(cfg, p, reqs, hi, Router::Fleetroute);
    while lo < hi {
        let mid = (lo + hi) / 2;
        let row = shared(cfg, p, reqs, mid, Router::Fleetroute);
        if row.meets(p.slo_ms) {
            hi = mid;
            best = row;
        } else {
            lo = mid + 1;
        }
    }
    best
}

/// Each model on replicas of its own, as few as meet the SLO (at least
/// one each, at most `max`), every model always loaded; routed by
/// fleetroute. The replicas per model, and the figures over all.
pub fn dedicated(
    cfg: &SimConfig,
    p: &Packing,
    reqs: &[TraceRequest],
    max: usize,
) -> (PackingRow, Vec<usize>) {
    let mut sizes = Vec::new();
    let (mut all, mut by, mut rejected) = (Vec::new(), BTreeMap::new(), 0);
    for m in models(reqs) {
        let own: Vec<TraceRequest> = reqs
            .iter()
            .filter(|r| r.adapter.as_ref() == Some(&m))
            .cloned()
            .collect();
        let mut k = 1;
        loop {
            let c = SimConfig {
                replicas: k,
                lora: None,
                ..*cfg
            };
            let mut fr = Fleetroute::new(
                &dedicated_config(&c),
                own.len(),
                c.block_tokens,
                "dedicated",
            );
            let o = sim::run(&c, &own, &mut fr);
            let t = p90_by_model(&own, &o)[&m];
            if t <= p.slo_ms || k >= max {
                all.extend(o.requests.iter().map(late));
                by.insert(m.clone(), t);
                rejected += o.rejected;
                sizes.push(k);
                break;
            }
            k += 1;
        }
    }
    let (worst_model, worst_p90) = worst(&by);
    let row = PackingRow {
        setup: "dedicated replicas per model, fleetroute".into(),
        replicas: sizes.iter().sum(),
        ttft_p90: p90(&mut all),
        worst_p90,
        worst_model,
        loads_per_hour: 0.0,
        cold_per_hour: 0.0,
        rejected,
    };
    (row, sizes)
}

/// Dedicated, the smallest shared pool through fleetroute, then fleetroute
/// with placement and a load-only router on a pool of that size.
pub fn compare(
    cfg: &SimConfig,
    p: &Packing,
    reqs: &[TraceRequest],
    max: usize,
) -> (Vec<PackingRow>, Vec<usize>) {
    let (ded, sizes) = dedicated(cfg, p, reqs, max);
    let fr = smallest_shared(cfg, p, reqs, ded.replicas);
    let placed = shared(cfg, p, reqs, fr.replicas, Router::FleetroutePlaced);
    let ll = shared(cfg, p, reqs, fr.replicas, Router::LeastLoaded);
    (vec![ded, fr, placed, ll], sizes)
}

pub fn table(rows: &[PackingRow], slo_ms: f64) -> String {
    let mut s = String::from(
        "| setup | replicas | TTFT p90 ms | worst model's p90 ms | meets SLO | model loads/hour | requests waiting for a load /hour | rejected |\n|---|---:|---:|---:|---|---:|---:|---:|\n",
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {:.0} | {:.0} ({}) | {} | {:.0} | {:.0} | {} |\n",
            r.setup,
            r.replicas,
            r.ttft_p90,
            r.worst_p90,
            r.worst_model,
            if r.meets(slo_ms) { "yes" } else { "no" },
            r.loads_per_hour,
            r.cold_per_hour,
            r.rejected
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::model_workload::{ModelParams, generate};
    use crate::replay::trace;

    #[test]
    fn a_shared_pool_meets_the_slo_on_fewer_replicas_and_routing_keeps_loads_rare() {
        let p = ModelParams {
            seed: 2,
            requests: 3000,
            rate: 10.0,
            models: 8,
            zipf: 1.1,
            day_s: 300.0,
            swing: 0.5,
            block_tokens: 512,
        };
        let reqs = trace::load(&generate(&p), 512).unwrap();
        let cfg = SimConfig {
            replicas: 1,
            cache_tokens: 1_000_000,
            router_cache_tokens: None,
            block_tokens: 512,
            latency: crate::engine::latency::LatencyModel {
                prefill_tokens_per_sec: 10_000.0,
                decode_ms_per_token: 20.0,
                decode_ms_per_running: 0.0,
                max_batch: 32,
            },
            max_queue: 100_000,
            speedup: 1.0,
            scrape_ms: Some(1000.0),
            lora: None,
        };
        let packing = Packing {
            max_models: 4,
            load_ms: 5000.0,
            slo_ms: 1000.0,
        };
        let (rows, sizes) = compare(&cfg, &packing, &reqs, 16);
        let t = table(&rows, packing.slo_ms);
        let (ded, fr, ll) = (&rows[0], &rows[1], &rows[3]);
        assert_eq!(sizes.len(), 8, "{t}");
        assert!(ded.meets(1000.0) && fr.meets(1000.0), "{t}");
        assert!(fr.replicas * 2 <= ded.replicas, "{t}");
        // The same pool routed on load alone loads models over and over.
        assert!(ll.loads_per_hour > 10.0 * fr.loads_per_hour.max(1.0), "{t}");
        assert!(!ll.meets(1000.0), "{t}");
    }
}
