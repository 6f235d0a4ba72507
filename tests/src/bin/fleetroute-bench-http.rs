//! Open-loop replay of a trace over real HTTP, for comparing routers: each
//! request is sent at its (time-compressed) arrival time whatever is still in
//! flight, streamed, with usage in the last chunk. Measures on the client the
//! time to the first content token, cached prompt tokens as the engine reports
//! them, failures (status, transport, timeouts), and reads requests served per
//! replica from the engine's control endpoint. Prints one JSON line.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use fleetroute_tests::replay::prompt::{RawLine, chat_body, load_raw};
use fleetroute_tests::replay::trace;
use futures::StreamExt;
use tokio::sync::Mutex;

#[derive(Parser)]
#[command(about = "Open-loop streamed replay of a trace against a router over HTTP")]
struct Args {
    /// A trace in the Mooncake format.
    trace: std::path::PathBuf,
    /// Base URL(s) to send to; several are used in turn (round robin).
    #[arg(long, value_delimiter = ',', required = true)]
    target: Vec<String>,
    /// The engine's control endpoint (`GET /replicas`), for requests per replica.
    #[arg(long)]
    control: String,
    /// Requests replayed (the trace's first ones).
    #[arg(long, default_value_t = 600)]
    requests: usize,
    /// Multiple of the trace's request rate.
    #[arg(long, default_value_t = 1.0)]
    rate: f64,
    /// Time compression: arrivals are divided by this on top of `rate`; the
    /// engines must run prefill and decode that much faster too.
    #[arg(long, default_value_t = 4.0)]
    compress: f64,
    /// Send `prompt_cache_key` (one per conversation).
    #[arg(long)]
    prompt_cache_key: bool,
    #[arg(long, default_value_t = 512)]
    block_tokens: u64,
    #[arg(long, default_value = "trace")]
    model: String,
    /// A request with no first token after this many seconds of trace time
    /// counts as timed out.
    #[arg(long, default_value_t = 60.0)]
    timeout_s: f64,
    /// Label printed with the figures.
    #[arg(long, default_value = "")]
    label: String,
}

#[derive(Default)]
struct Tally {
    ttft_ms: Vec<f64>,
    prompt_tokens: u64,
    cached_tokens: u64,
    failed: u64,
    timed_out: u64,
}

enum End {
    Ok {
        ttft: Duration,
        prompt: u64,
        cached: u64,
    },
    Failed,
    TimedOut,
}

async fn one(client: &reqwest::Client, url: &str, body: String, ttft_limit: Duration) -> End {
    let start = Instant::now();
    let sent = client
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send();
    let resp = match tokio::time::timeout(ttft_limit, sent).await {
        Err(_) => return End::TimedOut,
        Ok(Err(_)) => return End::Failed,
        Ok(Ok(r)) if !r.status().is_success() => return End::Failed,
        Ok(Ok(r)) => r,
    };
    let mut stream = resp.bytes_stream();
    let mut buf = Vec::new();
    let (mut ttft, mut usage) = (None, None);
    loop {
        let wait = match ttft {
            None => ttft_limit.saturating_sub(start.elapsed()),
            Some(_) => ttft_limit * 4,
        };
        let chunk = match tokio::time::timeout(wait, stream.next()).await {
            Err(_) if ttft.is_none() => return End::TimedOut,
            Err(_) | Ok(Some(Err(_))) => return End::Failed,
            Ok(None) => break,
            Ok(Some(Ok(c))) => c,
        };
        buf.extend_from_slice(&chunk);
        // Whole SSE lines only; the rest waits for the next chunk.
        while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=nl).collect();
            let Some(data) = line.strip_prefix(b"data: ") else {
                continue;
            };
            let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else {
                continue;
            };
            if ttft.is_none()
                && v["choices"][0]["delta"]["content"]
                    .as_str()
                    .is_some_and(|c| !c.is_empty())
            {
                ttft = Some(start.elapsed());
            }
            if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
                usage = Some((
                    u["prompt_tokens"].as_u64().unwrap_or(0),
                    u["prompt_tokens_details"]["cached_tokens"]
                        .as_u64()
                        .unwrap_or(0),
                ));
            }
        }
    }
    match (ttft, usage) {
        (Some(ttft), Some((prompt, cached))) => End::Ok {
            ttft,
            prompt,
            cached,
        },
        _ => End::Failed,
    }
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

async fn per_replica(client: &reqwest::Client, control: &str) -> Vec<u64> {
    let Ok(r) = client.get(format!("{control}/replicas")).send().await else {
        return Vec::new();
    };
    let v: serde_json::Value = r.json().await.unwrap_or_default();
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|r| r["requests_served"].as_u64().unwrap_or(0))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::main]
async fn main() {
    let a = Args::parse();
    let text =
        std::fs::read_to_string(&a.trace).unwrap_or_else(|e| panic!("{}: {e}", a.trace.display()));
    let lines: Vec<RawLine> = load_raw(&text, a.requests.min(100_000))
        .unwrap_or_else(|e| panic!("{}: {e}", a.trace.display()));
    let bound = {
        let reqs = trace::load(&text, a.block_tokens).expect("trace");
        trace::infinite_cache_hit_rate(&reqs[..lines.len().min(reqs.len())], a.block_tokens)
    };
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(512)
        .build()
        .expect("http client");
    let scale = a.rate * a.compress;
    let ttft_limit = Duration::from_secs_f64(a.timeout_s / a.compress);
    let tally = Arc::new(Mutex::new(Tally::default()));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        let at = Duration::from_secs_f64(line.timestamp / 1000.0 / scale);
        tokio::time::sleep_until((start + at).into()).await;
        let key = a
            .prompt_cache_key
            .then(|| format!("conv-{:016x}", line.content_key()));
        let body = chat_body(&a.model, line, a.block_tokens, i as u64, key.as_deref());
        let url = format!(
            "{}/v1/chat/completions",
            a.target[i % a.target.len()].trim_end_matches('/')
        );
        let (client, tally) = (client.clone(), tally.clone());
        tasks.push(tokio::spawn(async move {
            let end = one(&client, &url, body, ttft_limit).await;
            let mut t = tally.lock().await;
            match end {
                End::Ok {
                    ttft,
                    prompt,
                    cached,
                } => {
                    t.ttft_ms.push(ttft.as_secs_f64() * 1000.0);
                    t.prompt_tokens += prompt;
                    t.cached_tokens += cached;
                }
                End::Failed => t.failed += 1,
                End::TimedOut => t.timed_out += 1,
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let wall = start.elapsed().as_secs_f64();
    let served = per_replica(&client, &a.control).await;
    let t = tally.lock().await;
    let mut ttft = t.ttft_ms.clone();
    ttft.sort_by(f64::total_cmp);
    let mean = served.iter().sum::<u64>() as f64 / served.len().max(1) as f64;
    let max = served.iter().copied().max().unwrap_or(0) as f64;
    let hit = t.cached_tokens as f64 / t.prompt_tokens.max(1) as f64;
    // TTFT in trace time: wall-clock milliseconds times the compression.
    let c = a.compress;
    println!(
        "{}",
        serde_json::json!({
            "label": a.label,
            "requests": lines.len(),
            "rate": a.rate,
            "ok": ttft.len(),
            "failed": t.failed,
            "timed_out": t.timed_out,
            "ttft_p50_ms": pct(&ttft, 0.5) * c,
            "ttft_p90_ms": pct(&ttft, 0.9) * c,
            "ttft_p99_ms": pct(&ttft, 0.99) * c,
            "hit_rate": hit,
            "bound": bound,
            "hit_of_bound": hit / bound.max(f64::MIN_POSITIVE),
            "per_replica": served,
            "max_mean_requests": max / mean.max(f64::MIN_POSITIVE),
            "wall_s": wall,
        })
    );
}
