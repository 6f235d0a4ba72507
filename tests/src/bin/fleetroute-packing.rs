//! Many models on one pool: a seeded workload of `--models` models with
//! Zipf demand that swings through a (compressed) day, replayed on
//! dedicated replicas per model and on one shared pool whose replicas
//! hold `--max-models` at once and load others on demand, each sized to
//! the fewest replicas at which every model meets the TTFT p90 SLO.

use clap::Parser;
use fleetroute_tests::engine::latency::LatencyModel;
use fleetroute_tests::replay::model_workload::{ModelParams, generate};
use fleetroute_tests::replay::packing::{Packing, compare, table};
use fleetroute_tests::replay::sim::SimConfig;
use fleetroute_tests::replay::trace;

#[derive(Parser)]
#[command(about = "Model packing: a shared pool against dedicated replicas per model")]
struct Args {
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Requests per second, the day's mean.
    #[arg(long, default_value_t = 20.0)]
    rate: f64,
    /// Seconds of trace (one day, compressed).
    #[arg(long, default_value_t = 3600.0)]
    day_s: f64,
    /// The peak is (1 + swing) × the mean rate, the trough (1 - swing) ×.
    #[arg(long, default_value_t = 0.5)]
    swing: f64,
    #[arg(long, default_value_t = 20)]
    models: usize,
    #[arg(long, default_value_t = 1.1)]
    zipf: f64,
    /// Models a shared replica holds at once.
    #[arg(long, default_value_t = 4)]
    max_models: usize,
    /// Time to load a model onto a replica, ms.
    #[arg(long, default_value_t = 5000.0)]
    load_ms: f64,
    /// TTFT p90 every model must meet, ms.
    #[arg(long, default_value_t = 1000.0)]
    slo_ms: f64,
    #[arg(long, default_value_t = 1_000_000)]
    cache_tokens: u64,
    #[arg(long, default_value_t = 512)]
    block_tokens: u64,
    #[arg(long, default_value_t = 10_000.0)]
    prefill_tokens_per_sec: f64,
    #[arg(long, default_value_t = 20.0)]
    decode_ms_per_token: f64,
    #[arg(long, default_value_t = 32)]
    max_batch: usize,
    /// Also print the shared pool at every size from this one up to the
    /// smallest that meets the SLO.
    #[arg(long)]
    sweep_from: Option<usize>,
}

fn main() {
    let a = Args::parse();
    let p = ModelParams {
        seed: a.seed,
        requests: (a.rate * a.day_s).clamp(1.0, 2_000_000.0) as usize,
        rate: a.rate,
        models: a.models.clamp(1, 1000),
        zipf: a.zipf,
        day_s: a.day_s,
        swing: a.swing,
        block_tokens: a.block_tokens,
    };
    let reqs = trace::load(&generate(&p), a.block_tokens).expect("generated trace");
    let cfg = SimConfig {
        replicas: 1,
        cache_tokens: a.cache_tokens,
        router_cache_tokens: None,
        block_tokens: a.block_tokens,
        latency: LatencyModel {
            prefill_tokens_per_sec: a.prefill_tokens_per_sec,
            decode_ms_per_token: a.decode_ms_per_token,
            decode_ms_per_running: 0.0,
            max_batch: a.max_batch,
        },
        max_queue: 100_000,
        speedup: 1.0,
        scrape_ms: Some(1000.0),
        lora: None,
    };
    let packing = Packing {
        max_models: a.max_models,
        load_ms: a.load_ms,
        slo_ms: a.slo_ms,
    };
    println!(
        "{} models, Zipf({}), {} requests at {}/s mean (swing ±{:.0}% over {} s), TTFT p90 SLO {} ms per model; shared replicas hold {} models, a load takes {} ms; seed {}\n",
        p.models,
        a.zipf,
        reqs.len(),
        a.rate,
        a.swing * 100.0,
        a.day_s,
        a.slo_ms,
        a.max_models,
        a.load_ms,
        a.seed
    );
    let (rows, sizes) = compare(&cfg, &packing, &reqs, 64);
    println!("{}", table(&rows, a.slo_ms));
    println!("dedicated replicas per model (most popular first): {sizes:?}");
    println!(
        "shared / dedicated replicas: {:.3}",
        rows[1].replicas as f64 / rows[0].replicas.max(1) as f64
    );
    if let Some(from) = a.sweep_from {
        let sizes: Vec<_> = (from.max(1)..rows[1].replicas)
            .map(|n| {
                fleetroute_tests::replay::packing::shared(
                    &cfg,
                    &packing,
                    &reqs,
                    n,
                    fleetroute_tests::replay::packing::Router::Fleetroute,
                )
            })
            .collect();
        println!("\n{}", table(&sizes, a.slo_ms));
    }
}
