//! LoRA adapters on a shared pool, replayed: fleetroute against the
//! endpoint picker of the Gateway API Inference Extension (GIE) / llm-d
//! and a load-only router, and the bound where every adapter is always
//! loaded. The simulated replicas hold adapters as vLLM does
//! (`engine::lora`): a request whose adapter is not on the GPU waits for its
//! load, and one whose GPU slots all serve running requests waits for one.

use super::fleetroute::Fleetroute;
use super::policies::LeastLoaded;
use super::row;
use super::sim::{self, Outcome, SimConfig, SimRouter, View};
use super::trace::TraceRequest;
use crate::engine::lora::LoraModel;
use fleetroute::config::{RouterConfig, ValidConfig};

/// The GIE endpoint picker's LoRA affinity, as its scorer weighs it: 1 for
/// a replica running the adapter, 0.8 for one with it waiting, 0.6 for one
/// with a free adapter slot, 0 otherwise, added to its queue scorer
/// (fewest waiting requests, min-max scaled over the replicas) and its
/// KV-cache scorer (least used). No placement: engines load adapters as
/// requests arrive. It reads the replicas' figures exactly and at once, not
/// through a scrape: a stronger baseline than a deployed one.
pub struct GieLora {
    pub max_batch: usize,
}

impl SimRouter for GieLora {
    fn name(&self) -> String {
        "GIE-style LoRA affinity + queue + KV".into()
    }

    fn route(&mut self, _: f64, id: usize, req: &TraceRequest, v: &View<'_>) -> usize {
        let n = v.inflight.len();
        let waiting: Vec<f64> = v
            .adapters
            .iter()
            .map(|a| a.waiting.values().sum::<u32>() as f64)
            .collect();
        let (lo, hi) = waiting
            .iter()
            .fold((f64::MAX, f64::MIN), |(l, h), &w| (l.min(w), h.max(w)));
        let score = |r: usize| {
            let a = &v.adapters[r];
            let lora = match &req.adapter {
                None => 1.0,
                Some(ad) if a.running.contains_key(ad) => 1.0,
                Some(ad) if a.waiting.contains_key(ad) => 0.8,
                Some(_) => {
                    let active = a.running.len()
                        + a.waiting
                            .keys()
                            .filter(|k| !a.running.contains_key(*k))
                            .count();
                    if active < a.max_loras { 0.6 } else { 0.0 }
                }
            };
            let queue = if hi > lo {
                1.0 - (waiting[r] - lo) / (hi - lo)
            } else {
                1.0
            };
            let running = a.running.values().sum::<u32>() as f64;
            let kv = 1.0 - (running / self.max_batch as f64).min(1.0);
            lora + queue + kv
        };
        // Ties rotate, so equal replicas share.
        (0..n)
            .map(|k| (k + id) % n)
            .max_by(|&a, &b| score(a).total_cmp(&score(b)).then(b.cmp(&a)))
            .unwrap_or(0)
    }
}

/// One router's figures on an adapter workload.
#[derive(Clone, Debug)]
pub struct AdapterRow {
    pub router: String,
    pub hit_rate: f64,
    pub ttft_p50: f64,
    pub ttft_p90: f64,
    pub ttft_p99: f64,
    /// Adapter loads onto a GPU per minute of the trace, from host memory
    /// and from disk, over all replicas.
    pub host_loads_per_min: f64,
    pub disk_loads_per_min: f64,
    pub rejected: u64,
}

fn adapter_row(name: String, o: &Outcome, minutes: f64) -> AdapterRow {
    let r = row(name.clone(), o);
    AdapterRow {
        router: name,
        hit_rate: r.hit_rate,
        ttft_p50: r.ttft_p50,
        ttft_p90: r.ttft_p90,
        ttft_p99: r.ttft_p99,
        host_loads_per_min: o.host_loads as f64 / minutes,
        disk_loads_per_min: o.disk_loads as f64 / minutes,
        rejected: o.rejected,
    }
}

/// fleetroute's config for the pool: one fleet holding adapters as `lora`
/// says, one stage listing `adapters`.
pub fn config(cfg: &SimConfig, lora: &LoraModel, adapters: &[String]) -> ValidConfig {
    let eps: Vec<String> = (0..cfg.replicas)
        .map(|r| format!("\"10.0.{}.{}:8000\"", r / 250, r % 250 + 1))
        .collect();
    let yaml = format!(
        "fleets:\n  - name: pool\n    region: r\n    endpoints: [{}]\n    capacity: {{ max_inflight: {}, kv_cache_tokens: {} }}\n    \
         lora: {{ max_loras: {}, max_cpu_loras: {}, gpu_load_ms: {}, disk_load_ms: {}, prefill_tokens_per_sec: {} }}\n\
         stages:\n  - name: trace\n    models: [trace]\n    fleets: [pool]\n    adapters: [{}]\n",
        eps.join(", "),
        cfg.latency.max_batch,
        cfg.router_cache_tokens.unwrap_or(cfg.cache_tokens),
        lora.max_loras,
        lora.max_cpu_loras.max(lora.max_loras),
        lora.gpu_load_ms,
        lora.disk_load_ms,
        cfg.latency.prefill_tokens_per_sec,
        adapters.join(", ")
    );
    RouterConfig::parse_valid(&yaml).unwrap_or_else(|e| panic!("adapter replay config: {e}"))
}

/// The trace through each router on replicas holding adapters as `lora`
/// says, then fleetroute with every adapter resident (the bound).
pub fn compare(cfg: &SimConfig, lora: LoraModel, reqs: &[TraceRequest]) -> Vec<AdapterRow> {
    let mut names: Vec<String> = reqs.iter().filter_map(|r| r.adapter.clone()).collect();
    names.sort();
    names.dedup();
    let minutes = reqs
        .last()
        .map_or(1.0, |r| r.arrival_ms / cfg.speedup / 60_000.0)
        .max(1e-9);
    let with = SimConfig {
        lora: Some(lora),
        ..*cfg
    };
    let mut rows = Vec::new();
    let routers: Vec<Box<dyn SimRouter>> = vec![
        Box::new(LeastLoaded),
        Box::new(GieLora {
            max_batch: cfg.latency.max_batch,
        }),
        Box::new(Fleetroute::new(
            &config(cfg, &lora, &names),
            reqs.len(),
            cfg.block_tokens,
            "fleetroute",
        )),
    ];
    for mut r in routers {
        let o = sim::run(&with, reqs, r.as_mut());
        rows.push(adapter_row(r.name(), &o, minutes));
    }
    // Every adapter in every replica's host memory: only copies onto the
    // GPU remain (what host memory costs), then every adapter always on
    // every GPU (no load ever waits: the bound).
    let host = LoraModel {
        max_cpu_loras: names.len().max(lora.max_loras),
        ..lora
    };
    let all = LoraModel {
        max_loras: names.len().max(1),
        max_cpu_loras: names.len().max(1),
        gpu_load_ms: 0.0,
        disk_load_ms: 0.0,
        overlapped: false,
    };
    for (label, model) in [
        ("fleetroute, every adapter in host memory", host),
        ("bound: fleetroute, every adapter resident", all),
    ] {
        let run = SimConfig {
            lora: Some(model),
            ..*cfg
        };
        let mut fr = Fleetroute::new(
            &config(cfg, &model, &names),
            reqs.len(),
            cfg.block_tokens,
            label,
        );
        let o = sim::run(&run, reqs, &mut fr);
        rows.push(adapter_row(label.into(), &o, minutes));
    }
    rows
}

pub fn table(rows: &[AdapterRow]) -> String {
    let mut s = String::from(
        "| router | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms | hit rate | loads/min from host | loads/min from disk | rejected |\n|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.3} | {:.1} | {:.1} | {} |\n",
            r.router,
            r.ttft_p50,
            r.ttft_p90,
            r.ttft_p99,
            r.hit_rate,
            r.host_loads_per_min,
            r.disk_loads_per_min,
            r.rejected
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::adapter_workload::{AdapterParams, generate};
    use crate::replay::trace;

    #[test]
    fn fleetroute_loads_fewer_adapters_and_answers_sooner_than_the_gie_picker() {
        let p = AdapterParams {
            seed: 5,
            requests: 4000,
            rate: 10.0,
            adapters: 60,
            zipf: 1.1,
            shift_every_s: None,
            block_tokens: 512,
        };
        let reqs = trace::load(&generate(&p), 512).unwrap();
        let cfg = SimConfig {
            replicas: 4,
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
        let lora = LoraModel {
            max_loras: 4,
            max_cpu_loras: 8,
            ..LoraModel::default()
        };
        let rows = compare(&cfg, lora, &reqs);
        println!("{}", table(&rows));
        let (gie, fr, bound) = (&rows[1], &rows[2], &rows[4]);
        assert!(fr.router == "fleetroute" && gie.router.starts_with("GIE"));
        let loads = |r: &AdapterRow| r.host_loads_per_min + r.disk_loads_per_min;
        assert!(loads(fr) < loads(gie), "{}", table(&rows));
        assert!(
            fr.disk_loads_per_min < gie.disk_loads_per_min,
            "{}",
            table(&rows)
        );
        assert!(fr.ttft_p90 < gie.ttft_p90, "{}", table(&rows));
        assert!(bound.ttft_p90 <= fr.ttft_p90, "{}", table(&rows));
    }
}
