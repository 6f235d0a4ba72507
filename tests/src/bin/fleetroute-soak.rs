//! Soak: sends N requests through the full chain (real Envoy, the Wasm
//! filter, fleetroute, simulated engines, all on loopback) with a unique
//! sampling key, tenant, model and prompt each, and reports Envoy's and
//! fleetroute's resident memory and the prefix index's size against its bound
//! as the run goes. Memory should be flat once the index has filled up.
//!
//!   PROFILE=release scripts/build.sh
//!   target/release/fleetroute-soak --requests 1000000      (or scripts/soak.sh)

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use fleetroute::config::RouterConfig;
use fleetroute_tests::harness::{Lab, LabSpec};

/// The demo's two fleets of two replicas (`{name}` is a replica's address).
const ROUTER: &str = r#"
health_check: { path: /health, interval_ms: 1000, timeout_ms: 500 }
default_stage: soak/prod
fleets:
  - name: base
    region: us
    endpoints: ["{base-1}", "{base-2}"]
    cost: { gpu_hour_usd: 9.5, gpus_per_replica: 8 }
  - name: burst
    region: us
    endpoints: ["{burst-1}", "{burst-2}"]
    cost: { gpu_hour_usd: 4.2, gpus_per_replica: 8 }
stages:
  - name: soak/prod
    models: [soak-model]
    fleets: [base, burst]
    residency: us
    routing: { policy: weighted, weights: { base: 3, burst: 1 } }
# Each request names its own tenant (trusted here), so tenant tracking stays bounded under churn.
tenants:
  identity: { source: header, header: x-tenant }
"#;

#[derive(Parser)]
#[command(about = "Soak the full chain and report memory and prefix-index size")]
struct Args {
    /// Requests to send.
    #[arg(long, default_value_t = 1_000_000)]
    requests: u64,
    /// Connections (requests in flight at once).
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Prompt bytes per request (each prompt is unique, so every request adds
    /// about prompt_bytes / block_bytes new blocks to the index).
    #[arg(long, default_value_t = 4096)]
    prompt_bytes: usize,
    /// Every n-th request streams (SSE); the rest are plain JSON.
    #[arg(long, default_value_t = 4)]
    stream_every: u64,
    /// Prompt bytes per block of the filter (its `block_bytes`), for the bound.
    #[arg(long, default_value_t = 1024)]
    block_bytes: u64,
    /// Progress line every this many seconds.
    #[arg(long, default_value_t = 30)]
    progress_s: u64,
    /// Give up (and report) after this many seconds.
    #[arg(long, default_value_t = 3600)]
    max_seconds: u64,
}

/// Resident memory of a process in KiB, from /proc/<pid>/status.
fn rss_kib(pid: Option<u32>) -> u64 {
    let Some(pid) = pid else { return 0 };
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// Blocks in all fleets' prefix indexes, from fleetroute's `/debug/snapshot`.
async fn index_blocks(client: &reqwest::Client, admin: &str) -> Option<u64> {
    let v: serde_json::Value = client
        .get(format!("{admin}/debug/snapshot"))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    v["fleets"]
        .as_array()?
        .iter()
        .map(|f| f["prefix_blocks"].as_u64())
        .sum()
}

/// The sum over fleets of replicas × blocks one replica's cache holds.
fn index_bound(router: &std::path::Path, block_bytes: u64) -> u64 {
    let cfg = RouterConfig::load(router).expect("the lab's router config");
    let block_tokens = (block_bytes / 4).max(1);
    cfg.fleets
        .iter()
        .map(|f| f.endpoints.len() as u64 * (f.capacity.kv_cache_tokens / block_tokens))
        .sum()
}

/// A prompt nobody sent before: the request number first, so even the first
/// block is new.
fn body(i: u64, prompt_bytes: usize, stream: bool) -> String {
    let mut prompt = format!("request {i}: ");
    while prompt.len() < prompt_bytes {
        prompt.push_str(&format!("soak text {i} "));
    }
    prompt.truncate(prompt_bytes);
    serde_json::json!({
        "model": format!("soak-model-{i}"),
        "prompt_cache_key": format!("soak-key-{i}"),
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 1,
        "stream": stream,
    })
    .to_string()
}

#[derive(Default)]
struct Counts {
    sent: AtomicU64,
    ok: AtomicU64,
    bad_status: AtomicU64,
    failed: AtomicU64,
}

struct Row {
    done: u64,
    seconds: f64,
    envoy_kib: u64,
    fleetroute_kib: u64,
    engine_kib: u64,
    blocks: Option<u64>,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let exe = std::env::current_exe().expect("own path");
    let engine: PathBuf = exe.with_file_name("fleetroute-engine");
    // Engines that answer at once, so the proxy chain is what is soaked.
    let lab = Lab::start(
        engine.to_str().expect("utf-8 path"),
        LabSpec {
            router: ROUTER,
            engine_args: &[
                "--prefill-tokens-per-sec",
                "1000000000",
                "--decode-ms-per-token",
                "0",
                "--max-batch",
                "256",
                "--block-bytes",
                &args.block_bytes.to_string(),
            ],
            ..LabSpec::default()
        },
    );
    let bound = index_bound(&lab.router_path, args.block_bytes);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let rows = rt.block_on(soak(&args, &lab));
    let Some(rows) = rows else {
        return std::process::ExitCode::FAILURE;
    };
    let (counts, rows) = rows;

    let fell_open = envoy_failure_mode_allowed(&lab);
    println!();
    println!(
        "| requests done | seconds | Envoy RSS MiB | fleetroute RSS MiB | engine RSS MiB | prefix index blocks (bound {bound}) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {:.0} | {:.1} | {:.1} | {:.1} | {} |",
            r.done,
            r.seconds,
            r.envoy_kib as f64 / 1024.0,
            r.fleetroute_kib as f64 / 1024.0,
            r.engine_kib as f64 / 1024.0,
            r.blocks.map_or("?".into(), |b| b.to_string()),
        );
    }
    let last = rows.last().expect("at least the start row");
    let ok = counts.ok.load(Ordering::Relaxed);
    println!();
    println!(
        "{} requests in {:.0} s ({:.0}/s), {} connections; 200: {}, other status: {}, failed: {}; ext_proc failed open: {}",
        counts.sent.load(Ordering::Relaxed),
        last.seconds,
        last.done as f64 / last.seconds.max(1e-9),
        args.concurrency,
        ok,
        counts.bad_status.load(Ordering::Relaxed),
        counts.failed.load(Ordering::Relaxed),
        fell_open.map_or("?".into(), |n| n.to_string()),
    );
    let over_bound = rows.iter().any(|r| r.blocks.is_some_and(|b| b > bound));
    if over_bound {
        println!("FAILED: the prefix index grew past its bound");
    }
    if ok != args.requests || over_bound || fell_open != Some(0) {
        return std::process::ExitCode::FAILURE;
    }
    std::process::ExitCode::SUCCESS
}

/// Envoy's count of requests that skipped fleetroute (ext_proc failing open):
/// any means the run did not measure the full chain. Prints every non-zero
/// ext_proc counter, which tells timeouts from failed streams.
fn envoy_failure_mode_allowed(lab: &Lab) -> Option<u64> {
    let (_, stats) =
        fleetroute_tests::harness::client::blocking_get(&format!("{}/stats", lab.envoy_admin))?;
    for l in stats.lines().filter(|l| l.contains("ext_proc.")) {
        if l.rsplit(' ').next().is_some_and(|v| v != "0") {
            println!("envoy {l}");
        }
    }
    Some(
        stats
            .lines()
            .filter(|l| l.contains("ext_proc.failure_mode_allowed:"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum(),
    )
}

async fn soak(args: &Args, lab: &Lab) -> Option<(Arc<Counts>, Vec<Row>)> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency)
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    let url = format!("{}/v1/chat/completions", lab.envoy);
    let counts = Arc::new(Counts::default());
    let next = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + Duration::from_secs(args.max_seconds);
    let (envoy_pid, fleetroute_pid, engine_pid) =
        (lab.envoy_proc.pid(), lab.fleetroute.pid(), lab.engine.pid());
    let row = |done: u64, blocks: Option<u64>| Row {
        done,
        seconds: start.elapsed().as_secs_f64(),
        envoy_kib: rss_kib(envoy_pid),
        fleetroute_kib: rss_kib(fleetroute_pid),
        engine_kib: rss_kib(engine_pid),
        blocks,
    };
    let mut rows = vec![row(0, index_blocks(&client, &lab.admin).await)];

    let mut workers = Vec::new();
    for _ in 0..args.concurrency {
        let (client, url, counts, next, done) = (
            client.clone(),
            url.clone(),
            counts.clone(),
            next.clone(),
            done.clone(),
        );
        let (n, prompt_bytes, every) = (args.requests, args.prompt_bytes, args.stream_every);
        workers.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n || Instant::now() > deadline {
                    break;
                }
                counts.sent.fetch_add(1, Ordering::Relaxed);
                let stream = every > 0 && i % every == 0;
                let res = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .header("authorization", format!("Bearer soak-token-{i}"))
                    .header("x-tenant", format!("soak-tenant-{i}"))
                    .body(body(i, prompt_bytes, stream))
                    .send()
                    .await;
                match res {
                    Ok(r) => {
                        let status = r.status();
                        // Read the whole response, as a client would.
                        let read = r.bytes().await.is_ok();
                        if status == 200 && read {
                            counts.ok.fetch_add(1, Ordering::Relaxed);
                        } else if !read {
                            counts.failed.fetch_add(1, Ordering::Relaxed);
                        } else {
                            counts.bad_status.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Err(_) => {
                        counts.failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }

    // Checkpoints at these shares of the run; progress lines in between.
    let marks: Vec<u64> = [10u64, 25, 50, 75]
        .iter()
        .map(|p| args.requests * p / 100)
        .filter(|&m| m > 0)
        .collect();
    let mut mark = 0;
    let mut last_progress = Instant::now();
    while workers.iter().any(|w| !w.is_finished()) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let d = done.load(Ordering::Relaxed);
        if mark < marks.len() && d >= marks[mark] {
            let blocks = index_blocks(&client, &lab.admin).await;
            rows.push(row(d, blocks));
            mark += 1;
        }
        if last_progress.elapsed() >= Duration::from_secs(args.progress_s) {
            last_progress = Instant::now();
            eprintln!(
                "{d}/{} done in {:.0} s; Envoy {} KiB, fleetroute {} KiB",
                args.requests,
                start.elapsed().as_secs_f64(),
                rss_kib(envoy_pid),
                rss_kib(fleetroute_pid)
            );
        }
    }
    for w in workers {
        if w.await.is_err() {
            eprintln!("a load worker panicked");
            return None;
        }
    }
    let d = done.load(Ordering::Relaxed);
    rows.push(row(d, index_blocks(&client, &lab.admin).await));
    Some((counts, rows))
}
