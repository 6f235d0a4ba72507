//! LoRA adapters on a shared pool: a seeded adapter workload (Zipf
//! popularity, optionally moving) replayed through fleetroute, the GIE-style
//! endpoint picker and a load-only router on simulated replicas that hold
//! adapters as vLLM does, with the all-resident bound. One table per
//! workload: (a) fixed popularity, (b) popularity dealt afresh every
//! `--shift-every-s`.

use clap::Parser;
use fleetroute_tests::engine::latency::LatencyModel;
use fleetroute_tests::engine::lora::LoraModel;
use fleetroute_tests::replay::adapter_workload::{AdapterParams, generate};
use fleetroute_tests::replay::adapters::{compare, table};
use fleetroute_tests::replay::sim::SimConfig;
use fleetroute_tests::replay::trace;

#[derive(Parser)]
#[command(about = "LoRA adapter routing: fleetroute against the GIE-style picker")]
struct Args {
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long, default_value_t = 108_000)]
    requests: usize,
    /// Requests per second.
    #[arg(long, default_value_t = 60.0)]
    rate: f64,
    #[arg(long, default_value_t = 300)]
    adapters: usize,
    #[arg(long, default_value_t = 1.1)]
    zipf: f64,
    /// Workload (b): popularity dealt afresh this often.
    #[arg(long, default_value_t = 600.0)]
    shift_every_s: f64,
    #[arg(long, default_value_t = 16)]
    replicas: usize,
    #[arg(long, default_value_t = 8)]
    max_loras: usize,
    #[arg(long, default_value_t = 32)]
    max_cpu_loras: usize,
    #[arg(long, default_value_t = 25.0)]
    gpu_load_ms: f64,
    #[arg(long, default_value_t = 370.0)]
    disk_load_ms: f64,
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
}

fn main() {
    let a = Args::parse();
    let cfg = SimConfig {
        replicas: a.replicas,
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
        // As often as fleetroute scrapes engines by default.
        scrape_ms: Some(1000.0),
        lora: None,
    };
    let lora = LoraModel {
        max_loras: a.max_loras,
        max_cpu_loras: a.max_cpu_loras,
        gpu_load_ms: a.gpu_load_ms,
        disk_load_ms: a.disk_load_ms,
        overlapped: false,
    };
    println!(
        "{} replicas, {} adapter slots each ({} in host memory), loads {} ms from host / {} ms from disk; {} adapters, Zipf({}), {} requests at {}/s, seed {}\n",
        a.replicas,
        a.max_loras,
        a.max_cpu_loras,
        a.gpu_load_ms,
        a.disk_load_ms + a.gpu_load_ms,
        a.adapters,
        a.zipf,
        a.requests,
        a.rate,
        a.seed
    );
    for (label, shift) in [
        ("(a) fixed popularity", None),
        ("(b) popularity dealt afresh", Some(a.shift_every_s)),
    ] {
        let p = AdapterParams {
            seed: a.seed,
            requests: a.requests.min(2_000_000),
            rate: a.rate,
            adapters: a.adapters,
            zipf: a.zipf,
            shift_every_s: shift,
            block_tokens: a.block_tokens,
        };
        let reqs = trace::load(&generate(&p), a.block_tokens).expect("generated trace");
        match shift {
            Some(s) => println!("### {label} every {s} s\n"),
            None => println!("### {label}\n"),
        }
        println!("{}", table(&compare(&cfg, lora, &reqs)));
    }
}
