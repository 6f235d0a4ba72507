//! Decision time and placement quality, measured on the real decision path
//! (`route::decide` over a snapshot published by the writer).
//!
//! `cargo bench -p fleetroute --bench decision` prints criterion's timings,
//! then per-call percentiles, the prefix index's memory per block, and the
//! rendezvous placement figures (balance over 1M keys, keys moved when a
//! replica joins or a weight changes), and what a membership change costs
//! the writer in a fleet with a ~1M-block prefix index.
//! With tenant admission: decide alone and decide + admit interleaved call by
//! call (local ledger, then shared through a `redis-server` the bench starts);
//! `BENCH_ONLY=admission` runs only those.
#![allow(clippy::unwrap_used)] // a benchmark, like a test, says what it expects

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::Criterion;
use envoy_types::pb::envoy::config::core::v3::HeaderMap;
use fleetroute::admission::{Admission, Judged};
use fleetroute::config::{RouterConfig, ValidConfig};
use fleetroute::decision_trace::DecisionSpan;
use fleetroute::observe::Observation;
use fleetroute::request::tenant as admit;
use fleetroute::route::decide;
use fleetroute::route::experiment::Arm;
use fleetroute::route::key::RouteKey;
use fleetroute::route::rendezvous::{score, unit};
use fleetroute::state::{Change, Event, Routed, Shared, Writer};
use fleetroute::tenancy::ledger::Usage;
use fleetroute::topology::{FleetId, ReplicaId};
use fleetroute_filter::contract::KeySource;
use std::sync::Arc;

#[path = "decision/admission.rs"]
mod admission;
#[path = "decision/placement.rs"]
mod placement;

use admission::admission;
use placement::placement;

fn config(fleets: &[(&str, usize)], policy: &str, kv_tokens: u64) -> ValidConfig {
    config_with(fleets, policy, kv_tokens, "")
}

/// `extra` is appended to the config (tenants, Redis).
fn config_with(fleets: &[(&str, usize)], policy: &str, kv_tokens: u64, extra: &str) -> ValidConfig {
    config_full(fleets, policy, kv_tokens, "", extra)
}

/// `stage`: more lines of the stage (indented four spaces); `extra` is
/// appended to the config.
fn config_full(
    fleets: &[(&str, usize)],
    policy: &str,
    kv_tokens: u64,
    stage: &str,
    extra: &str,
) -> ValidConfig {
    let mut y = String::from("fleets:\n");
    for (f, (name, n)) in fleets.iter().enumerate() {
        let eps: Vec<String> = (0..*n)
            .map(|r| format!("\"10.{f}.{}.{}:8000\"", r / 250, r % 250 + 1))
            .collect();
        y += &format!(
            "  - name: {name}\n    region: r\n    endpoints: [{}]\n    capacity: {{ kv_cache_tokens: {kv_tokens}, max_inflight: 1000 }}\n",
            eps.join(", ")
        );
        if !extra.is_empty() {
            // Priced, so admission reserves a cost against the budget.
            y += "    cost: { usd_per_million_tokens: 1.0 }\n";
        }
    }
    let names: Vec<&str> = fleets.iter().map(|(n, _)| *n).collect();
    y += &format!(
        "stages:\n  - name: s\n    models: [m]\n    fleets: [{}]\n    routing: {{ policy: {policy} }}\n{stage}",
        names.join(", ")
    );
    y += extra;
    RouterConfig::parse_valid(&y).expect("bench config")
}

/// A writer with every replica healthy, its snapshot published.
fn ready(cfg: &ValidConfig) -> (Arc<Shared>, Writer) {
    let (shared, mut w) = Writer::new(cfg);
    let now = Instant::now();
    for (f, fleet) in cfg.fleets.iter().enumerate() {
        for r in 0..fleet.endpoints.len() {
            w.apply(
                Event::Health {
                    generation: 1,
                    fleet: FleetId(f),
                    replica: ReplicaId(r),
                    ok: true,
                },
                now,
            );
        }
    }
    w.drain(now);
    (shared, w)
}

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Prompts as block chains: `families` shared heads, each request extends one.
fn prompts(n: usize, families: usize, blocks: usize, seed: u64) -> Vec<Vec<u64>> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            let fam = (splitmix(&mut s) % families as u64) as usize;
            let shared = blocks / 2;
            (0..blocks)
                .map(|i| {
                    if i < shared {
                        (fam * 100_000 + i) as u64
                    } else {
                        splitmix(&mut s)
                    }
                })
                .map(|b| xxhash_rust::xxh3::xxh3_64(&b.to_le_bytes()))
                .collect()
        })
        .collect()
}

fn key(blocks: &[u64], k: u64) -> RouteKey<'static> {
    RouteKey {
        model: Some("m"),
        key: k,
        key_source: Some(KeySource::Content),
        blocks: blocks.to_vec(),
        block_tokens: 16,
        prompt_tokens: (blocks.len() * 16 + 7) as u32,
        ..Default::default()
    }
}

/// Routes `prompts` through decide + the writer, so the index holds them.
fn warm(shared: &Shared, w: &mut Writer, prompts: &[Vec<u64>]) {
    let now = Instant::now();
    for (i, p) in prompts.iter().enumerate() {
        let snap = shared.snapshot();
        let d = decide(&snap, &key(p, i as u64), i as u64).expect("routable");
        w.apply(
            Event::Routed(Box::new(Routed {
                generation: 1,
                decision_id: i as u64,
                request_id: String::new(),
                stage: d.stage,
                fleet: d.fleet,
                replica: *d.replicas.head(),
                key_source: Some(KeySource::Content),
                arm: Arm::None,
                pick: d.pick,
                shadow: None,
                prompt_tokens: (p.len() * 16) as u64,
                blocks: p.clone(),
                block_tokens: 16,
                predicted_cached_tokens: d.cached_tokens,
                adapter: d.adapter,
                fallback: None,
            })),
            now,
        );
        drop(snap);
        w.drain(now);
    }
}

/// Failures of keys `0..n` on replica 0 of both fleets (the probes' keys are
/// their indices).
fn remember_failures(w: &mut Writer, cfg: &RouterConfig, n: u64) {
    let now = Instant::now();
    for k in 0..n {
        let f = &cfg.fleets[(k % 2) as usize];
        w.apply(
            Event::Observed(Box::new(Observation {
                stage: "s".into(),
                fleet: f.name.clone(),
                replica: f.endpoints[0].clone(),
                served_by: None,
                status: Some(503),
                time_to_first_byte: None,
                total: Duration::from_millis(1),
                usage: None,
                predicted_cached_tokens: 0,
                uncached_tokens: 0,
                queued_tokens: 0,
                arm: Arm::None,
                stream: false,
                ended_early: false,
                key: Some(k),
                decided: None,
            })),
            now,
        );
    }
    w.drain(now);
}

/// Per-call times over at least 20 000 decisions (the probes cycled), so a
/// p99 is not one scheduler hiccup among a few thousand calls.
fn percentiles(label: &str, shared: &Shared, keys: &[RouteKey<'static>]) {
    let n = keys.len().max(20_000);
    let mut t = Vec::with_capacity(n);
    for i in 0..n {
        let k = &keys[i % keys.len()];
        let start = Instant::now();
        let snap = shared.snapshot();
        black_box(decide(&snap, black_box(k), i as u64).ok());
        t.push(start.elapsed());
    }
    t.sort();
    let p = |q: f64| t[((t.len() as f64 * q) as usize).min(t.len() - 1)];
    println!(
        "{label}: p50 {:.1} µs, p99 {:.1} µs, p99.9 {:.1} µs over {} decisions",
        p(0.5).as_secs_f64() * 1e6,
        p(0.99).as_secs_f64() * 1e6,
        p(0.999).as_secs_f64() * 1e6,
        t.len()
    );
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn main() {
    // A subscriber at the default level: decision spans are off.
    tracing_subscriber::fmt()
        .with_env_filter("info")
        .with_writer(std::io::sink)
        .init();
    // `BENCH_ONLY=admission` runs the tenant admission figures alone.
    if std::env::var("BENCH_ONLY").as_deref() == Ok("admission") {
        admission();
        return;
    }
    let mut c = Criterion::default()
        .configure_from_args()
        .measurement_time(Duration::from_secs(3));

    // Issue-sized fleet: 2 fleets × 32 replicas, weighted, 64-block prompts.
    let cfg = config(&[("a", 32), ("b", 32)], "weighted", 10_000_000);
    let (shared, mut w) = ready(&cfg);
    let warmup = prompts(20_000, 200, 64, 1);
    warm(&shared, &mut w, &warmup);
    let probe: Vec<RouteKey<'static>> = prompts(2_000, 200, 64, 2)
        .iter()
        .enumerate()
        .map(|(i, p)| key(p, i as u64))
        .collect();
    c.bench_function("decide/2x32 replicas, 64 blocks", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % probe.len();
            let snap = shared.snapshot();
            black_box(decide(&snap, &probe[i], i as u64).ok())
        })
    });
    // The same with the decision span compiled in and disabled, as in a
    // router running at the default log level.
    c.bench_function("decide with span off/2x32 replicas, 64 blocks", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % probe.len();
            let trace = DecisionSpan::start();
            let _entered = trace.span().enter();
            let snap = shared.snapshot();
            let d = decide(&snap, &probe[i], i as u64);
            if let Ok(d) = &d {
                trace.routed(&snap, d);
            }
            black_box(d.ok())
        })
    });
    let no_prefix = key(&[], 42);
    c.bench_function("decide/2x32 replicas, no blocks", |b| {
        b.iter(|| black_box(decide(&shared.snapshot(), black_box(&no_prefix), 7).ok()))
    });
    // Admission on the same fleets: the decision plus what a request routed
    // at once adds (class, prediction, queue depths, tenant account, count).
    let acfg = config_full(
        &[("a", 32), ("b", 32)],
        "weighted",
        10_000_000,
        "    admission: { ttft_ms: { critical: 1000, standard: 4000 } }\n",
        "",
    );
    let (ashared, mut aw) = ready(&acfg);
    warm(&ashared, &mut aw, &warmup);
    let gate = Admission::new(Instant::now());
    let headers = HeaderMap::default();
    let admit = |i: usize| {
        let snap = ashared.snapshot_full();
        let d = decide(&snap, &probe[i], i as u64).expect("routable");
        let j = gate.judge(
            &ashared.metrics,
            &snap,
            &headers,
            &probe[i],
            d,
            Instant::now(),
        );
        assert!(matches!(j, Judged::Admit(_)), "an idle stage admits");
        j
    };
    c.bench_function("decide + admission/2x32 replicas, 64 blocks", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % probe.len();
            black_box(admit(i))
        })
    });
    c.bench_function("decide, owned snapshot/2x32 replicas, 64 blocks", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % probe.len();
            let snap = ashared.snapshot_full();
            black_box(decide(&snap, &probe[i], i as u64).ok())
        })
    });
    c.final_summary();
    percentiles("decide, 2x32 replicas, 64-block prompts", &shared, &probe);
    {
        let n = probe.len().max(20_000);
        let mut t = Vec::with_capacity(n);
        for i in 0..n {
            let start = Instant::now();
            black_box(admit(i % probe.len()));
            t.push(start.elapsed());
        }
        t.sort();
        let p = |q: f64| t[((t.len() as f64 * q) as usize).min(t.len() - 1)];
        println!(
            "decide + admission (admitted at once), 2x32 replicas, 64-block prompts: p50 {:.1} µs, p99 {:.1} µs, p99.9 {:.1} µs over {} decisions",
            p(0.5).as_secs_f64() * 1e6,
            p(0.99).as_secs_f64() * 1e6,
            p(0.999).as_secs_f64() * 1e6,
            t.len()
        );
    }
    drop((ashared, aw));
    // The same with 60,000 conversations a replica failed remembered, every
    // probe's among them: each decision then skips a replica.
    remember_failures(&mut w, &cfg, 60_000);
    percentiles(
        "decide, 2x32 replicas, 64-block prompts, 60,000 failed keys remembered",
        &shared,
        &probe,
    );
    drop((shared, w));

    // 1M blocks in one fleet's index, 64 replicas, 128-block prompts.
    let cfg = config(&[("big", 64)], "latency", 16 * 20_000);
    let before = rss_bytes();
    let (shared, mut w) = ready(&cfg);
    let fill = prompts(16_000, 2_000, 128, 3);
    warm(&shared, &mut w, &fill);
    let blocks = shared.snapshot().fleets[0].prefix.len();
    let after = rss_bytes();
    println!(
        "prefix index: {blocks} blocks over 64 replicas; process memory grew {:.1} MiB = {:.0} bytes per block (shared map + per-replica LRUs)",
        (after - before) as f64 / (1 << 20) as f64,
        (after - before) as f64 / blocks.max(1) as f64
    );
    let probe: Vec<RouteKey<'static>> = prompts(20_000, 2_000, 128, 4)
        .iter()
        .enumerate()
        .map(|(i, p)| key(p, i as u64))
        .collect();
    percentiles(
        "decide, 64 replicas, ~1M-block index, 128-block prompts",
        &shared,
        &probe,
    );
    membership_change(&shared, &mut w, &cfg);
    drop((shared, w));

    admission();
    placement();
}

/// A reload swapping one of 63 replicas for a new one, through the writer:
/// the leaver's entries go, nobody else's index is touched. Then the same
/// reload path when the fleet's whole index is dropped (a changed cache size;
/// before stable slots, any change of the list did that).
fn membership_change(shared: &Shared, w: &mut Writer, cfg: &ValidConfig) {
    let t0 = Instant::now();
    let reload = |w: &mut Writer, c: &RouterConfig, at: Instant| {
        let config = Box::new(fleetroute::config::validate(c.clone()).expect("bench config"));
        let start = Instant::now();
        w.apply(
            Event::Change {
                change: Box::new(Change::Reload {
                    config,
                    source: "bench".into(),
                }),
                reply: None,
            },
            at,
        );
        start.elapsed()
    };
    let blocks = || shared.snapshot().fleets[0].prefix.len();
    let mut c = RouterConfig::clone(cfg);
    // A free slot first: the last replica leaves and, idle, goes on a tick.
    c.fleets[0].endpoints.pop();
    reload(w, &c, t0);
    w.tick(t0 + Duration::from_secs(1));
    let mut times = Vec::new();
    for i in 0..5 {
        let at = t0 + Duration::from_secs(2 + i as u64);
        let before = blocks();
        c.fleets[0].endpoints[i] = format!("10.99.0.{}:8000", i + 1);
        let d = reload(w, &c, at);
        times.push((d, before, blocks()));
        w.tick(at + Duration::from_millis(500));
    }
    for (d, before, after) in &times {
        println!(
            "membership change, 1 of 63 replicas leaves and 1 joins: {:.2} ms; index {before} -> {after} blocks",
            d.as_secs_f64() * 1e3
        );
    }
    let before = blocks();
    c.fleets[0].capacity.kv_cache_tokens += 16;
    let d = reload(w, &c, t0 + Duration::from_secs(10));
    println!(
        "the same reload dropping the fleet's whole index: {:.2} ms; index {before} -> {} blocks",
        d.as_secs_f64() * 1e3,
        blocks()
    );
}
