//! Replays a request trace (Mooncake format) through every routing policy
//! against simulated replicas and prints one table per cache size. With
//! `--overload`, replays it through fleetroute with admission off and on,
//! with tenants of each priority class, and prints figures per class.

use std::path::PathBuf;

use clap::Parser;
use fleetroute_tests::engine::latency::LatencyModel;
use fleetroute_tests::replay::multi::{MultiRouter, Options, Spread};
use fleetroute_tests::replay::overload::{self, Objectives};
use fleetroute_tests::replay::{all_policies, replay, row, sim, sim::SimConfig, table, trace};

#[derive(Parser)]
#[command(about = "Trace replay: fleetroute against common routing policies")]
struct Args {
    /// A trace in the Mooncake format (JSON lines with timestamp,
    /// input_length, output_length, hash_ids).
    #[arg(default_value = "tests/traces/mooncake_synthetic.jsonl")]
    trace: PathBuf,
    #[arg(long, default_value_t = 8)]
    replicas: usize,
    /// KV-cache capacity per replica in tokens; repeat for several runs.
    #[arg(long = "cache-tokens", default_values_t = [3_000_000u64, 1_000_000])]
    cache_tokens: Vec<u64>,
    /// The KV-cache capacity the routers are configured with, when it differs
    /// from what the replicas keep (a misconfigured `kv_cache_tokens`).
    #[arg(long)]
    router_cache_tokens: Option<u64>,
    /// Tokens per hash id in the trace.
    #[arg(long, default_value_t = 512)]
    block_tokens: u64,
    #[arg(long, default_value_t = 10_000.0)]
    prefill_tokens_per_sec: f64,
    #[arg(long, default_value_t = 20.0)]
    decode_ms_per_token: f64,
    #[arg(long, default_value_t = 32)]
    max_batch: usize,
    #[arg(long, default_value_t = 256)]
    max_queue: usize,
    /// Replay only the trace's first N requests.
    #[arg(long)]
    requests: Option<usize>,
    /// Arrival times are divided by this (2 = twice the request rate);
    /// repeat for several runs.
    #[arg(long, default_values_t = [1.0])]
    speedup: Vec<f64>,
    /// Replay through fleetroute with admission off and on, conversations
    /// given to tenants of each class (see `replay::overload`).
    #[arg(long)]
    overload: bool,
    /// Critical's time to first token objective, ms (with --overload).
    #[arg(long, default_value_t = 1000.0)]
    critical_ms: f64,
    /// Standard's objective, ms (with --overload).
    #[arg(long, default_value_t = 4000.0)]
    standard_ms: f64,
    /// The stage's admission headroom (with --overload).
    #[arg(long, default_value_t = 0.5)]
    headroom: f64,
    /// fleetroute's `replica_choice` block as YAML, e.g. '{ prefix_weight: 2 }'.
    #[arg(long, default_value = "")]
    replica_choice: String,
    /// fleetroute's `outlier` block as YAML, e.g. '{ enabled: false }'.
    #[arg(long, default_value = "")]
    outlier: String,
    /// Several fleetroute instances instead of the policy comparison: one
    /// run per count (repeat the flag: --routers 1 --routers 2 --routers 4),
    /// each instance with its own state, engines scraped every second.
    #[arg(long)]
    routers: Vec<usize>,
    /// With --routers: the batch interval of shared prefix changes and
    /// forwarded access log entries, in ms.
    #[arg(long, default_value_t = 25.0)]
    share_ms: f64,
    /// With --routers: client connections for the connection-hash spread.
    #[arg(long, default_value_t = 32)]
    connections: u64,
    /// With --routers: Envoy's access log flush interval, in ms.
    #[arg(long, default_value_t = 50.0)]
    log_flush_ms: f64,
    /// With --routers: how often instances scrape the engines' queue
    /// figures (`engine_metrics.interval_ms`), in ms.
    #[arg(long, default_value_t = 1000.0)]
    scrape_ms: f64,
    /// With --routers: what the instances share, one run each (repeat the
    /// flag; default all): nothing, prefixes, log (prefixes + access log
    /// forwarded), load (prefixes + log + per-replica load).
    #[arg(long, value_enum)]
    sharing: Vec<Sharing>,
    /// With --routers and load shared: how long a load report counts
    /// (`peers.load_stale_ms`).
    #[arg(long, default_value_t = 1000.0)]
    load_stale_ms: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Sharing {
    Nothing,
    Prefixes,
    Log,
    Load,
}

/// One table row per instance count, spread and sharing, fleetroute only.
fn several_routers(a: &Args, cfg: &SimConfig, reqs: &[trace::TraceRequest]) {
    let cfg = SimConfig {
        scrape_ms: Some(a.scrape_ms),
        lora: None,
        ..*cfg
    };
    let mut runs = Vec::new();
    for &n in &a.routers {
        let spreads: &[Spread] = if n == 1 {
            &[Spread::Alternate]
        } else {
            &[Spread::Alternate, Spread::Connection(a.connections)]
        };
        for &spread in spreads {
            let all = [
                Sharing::Nothing,
                Sharing::Prefixes,
                Sharing::Log,
                Sharing::Load,
            ];
            let sharing: &[Sharing] = if n == 1 {
                &[Sharing::Nothing]
            } else if a.sharing.is_empty() {
                &all
            } else {
                &a.sharing
            };
            for &s in sharing {
                runs.push(Options {
                    routers: n,
                    spread,
                    share_ms: (s != Sharing::Nothing).then_some(a.share_ms),
                    forward: matches!(s, Sharing::Log | Sharing::Load),
                    load_stale_ms: (s == Sharing::Load).then_some(a.load_stale_ms),
                    log_flush_ms: a.log_flush_ms,
                });
            }
        }
    }
    println!(
        "| routers | spread | shared | hit rate | TTFT p50 ms | p90 ms | p99 ms | max/mean requests | rejected | leases logged / expired / reconciled | entries foreign / late | lease overhang mean ms | link bytes per request: prefixes / load (reports) |\n|---:|---|---|---:|---:|---:|---:|---:|---:|---|---|---:|---|"
    );
    for o in runs {
        let spread = match o.spread {
            Spread::Alternate => "alternate".to_string(),
            Spread::Connection(c) => format!("connection ({c})"),
        };
        let shared = match (o.share_ms, o.forward, o.load_stale_ms) {
            (None, _, _) => "nothing".to_string(),
            (Some(ms), false, _) => format!("prefixes ({ms} ms)"),
            (Some(ms), true, None) => format!("prefixes + log ({ms} ms)"),
            (Some(ms), true, Some(stale)) => {
                format!("prefixes + log + load ({ms} ms, stale {stale} ms)")
            }
        };
        let mut m = MultiRouter::new(&cfg, reqs.len(), o, "fleetroute");
        let out = sim::run(&cfg, reqs, &mut m);
        let r = row(String::new(), &out);
        let c = m.counts;
        let finished = (c.logged + c.expired + c.reconciled).max(1);
        let per_req = |b: u64| b as f64 / reqs.len().max(1) as f64;
        println!(
            "| {} | {spread} | {shared} | {:.3} | {:.0} | {:.0} | {:.0} | {:.2} | {} | {} / {} / {} | {} / {} | {:.0} | {:.0} / {:.0} ({}) |",
            o.routers,
            r.hit_rate,
            r.ttft_p50,
            r.ttft_p90,
            r.ttft_p99,
            r.max_mean_requests,
            r.rejected,
            c.logged,
            c.expired,
            c.reconciled,
            c.foreign,
            c.late,
            c.overhang_ms / finished as f64,
            per_req(m.bytes.prefix),
            per_req(m.bytes.load),
            m.bytes.load_reports,
        );
    }
    println!();
}

fn main() {
    let a = Args::parse();
    let text =
        std::fs::read_to_string(&a.trace).unwrap_or_else(|e| panic!("{}: {e}", a.trace.display()));
    let mut reqs =
        trace::load(&text, a.block_tokens).unwrap_or_else(|e| panic!("{}: {e}", a.trace.display()));
    reqs.truncate(a.requests.unwrap_or(usize::MAX));
    let bound = trace::infinite_cache_hit_rate(&reqs, a.block_tokens);
    println!(
        "trace {}: {} requests; infinite-cache hit rate {:.3}\n\
         model: {} replicas, prefill {} tokens/s (one lane), decode {} ms/token, max batch {}, queue {}\n",
        a.trace.display(),
        reqs.len(),
        bound,
        a.replicas,
        a.prefill_tokens_per_sec,
        a.decode_ms_per_token,
        a.max_batch,
        a.max_queue,
    );
    if a.overload {
        overload::assign_tenants(&mut reqs);
    }
    for &speedup in &a.speedup {
        for &cache_tokens in &a.cache_tokens {
            let cfg = SimConfig {
                replicas: a.replicas,
                cache_tokens,
                router_cache_tokens: a.router_cache_tokens,
                block_tokens: a.block_tokens,
                latency: LatencyModel {
                    prefill_tokens_per_sec: a.prefill_tokens_per_sec,
                    decode_ms_per_token: a.decode_ms_per_token,
                    decode_ms_per_running: 0.0,
                    max_batch: a.max_batch,
                },
                max_queue: a.max_queue,
                speedup,
                scrape_ms: None,
                lora: None,
            };
            if !a.routers.is_empty() {
                println!(
                    "### {speedup}x, {cache_tokens} tokens of KV cache per replica, several instances\n"
                );
                several_routers(&a, &cfg, &reqs);
                continue;
            }
            if a.overload {
                let obj = Objectives {
                    critical_ms: a.critical_ms,
                    standard_ms: a.standard_ms,
                    headroom: a.headroom,
                };
                println!(
                    "### {speedup}x, {cache_tokens} tokens of KV cache per replica; objectives critical {} ms, standard {} ms, headroom {}\n",
                    obj.critical_ms, obj.standard_ms, obj.headroom
                );
                println!("{}", overload::table(&overload::compare(&cfg, &reqs, obj)));
                continue;
            }
            let rows: Vec<_> = all_policies(&cfg, reqs.len(), &a.replica_choice, &a.outlier)
                .iter_mut()
                .map(|p| replay(&cfg, &reqs, p.as_mut()))
                .collect();
            println!("### {speedup}x, {cache_tokens} tokens of KV cache per replica\n");
            println!("{}", table(&rows));
            let f = rows.last().expect("fleetroute row");
            println!(
                "fleetroute hit rate / infinite-cache bound: {:.3}\n",
                f.hit_rate / bound
            );
        }
    }
}
