//! The filter's work per request, natively: parsing the request body and
//! hashing its prompt blocks (`extract`), and reading usage off a response
//! (`UsageScanner`), per prompt size.
//!
//! `cargo bench -p fleetroute-filter --bench extract` prints criterion's
//! timings, then µs per KB of body for each size.
#![allow(clippy::unwrap_used)] // a benchmark, like a test, says what it expects

use std::hint::black_box;
use std::time::Instant;

use criterion::Criterion;
use fleetroute_filter::config::FilterConfig;
use fleetroute_filter::extract::extract;
use fleetroute_filter::response::UsageScanner;

const SIZES: [usize; 5] = [1 << 10, 4 << 10, 64 << 10, 256 << 10, 1 << 20];

fn body(prompt_bytes: usize) -> Vec<u8> {
    let words = "lorem ipsum dolor sit amet consectetur ";
    let content: String = words.repeat(prompt_bytes / words.len() + 1)[..prompt_bytes].to_string();
    serde_json::json!({
        "model": "demo-model",
        "user": "bench-user",
        "messages": [{ "role": "user", "content": content }],
        "max_tokens": 1
    })
    .to_string()
    .into_bytes()
}

/// A streamed response of `n` token events, the last one carrying usage.
fn sse(n: usize) -> Vec<u8> {
    let mut s = String::new();
    for i in 0..n {
        s += &format!(
            "data: {{\"id\":\"c\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"tok{i} \"}}}}],\"usage\":null}}\n\n"
        );
    }
    s += "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":32}}}\n\ndata: [DONE]\n\n";
    s.into_bytes()
}

fn per_kb(label: &str, bytes: usize, mut f: impl FnMut()) {
    let iters = (64 << 20) / bytes.max(1) + 8;
    let start = Instant::now();
    for _ in 0..iters {
        f();
    }
    let us = start.elapsed().as_secs_f64() * 1e6 / iters as f64;
    println!(
        "{label}: {:>8.1} µs per call, {:.3} µs per KB",
        us,
        us / (bytes as f64 / 1024.0)
    );
}

fn main() {
    // As the shipped bootstrap configures the filter.
    let cfg = FilterConfig {
        max_body_bytes: 4 << 20,
        ..FilterConfig::default()
    };
    let mut c = Criterion::default().configure_from_args();
    let bodies: Vec<(usize, Vec<u8>)> = SIZES.iter().map(|&s| (s, body(s))).collect();
    for (size, b) in &bodies {
        c.bench_function(&format!("extract {} KB", size / 1024), |bench| {
            bench.iter(|| black_box(extract(black_box(b), &cfg).headers(&cfg)))
        });
    }
    let stream = sse(256);
    c.bench_function("usage scan, 256-token SSE response", |bench| {
        bench.iter(|| {
            let mut s = UsageScanner::default();
            for chunk in stream.chunks(128) {
                s.push(chunk);
            }
            black_box(s.tag)
        })
    });
    c.final_summary();

    println!("\nper KB of request body (parse + block hashes + header values):");
    for (size, b) in &bodies {
        per_kb(&format!("extract {:>5} KB", size / 1024), b.len(), || {
            black_box(extract(black_box(b), &cfg).headers(&cfg));
        });
    }
    println!("\nper KB of response body (usage scan):");
    per_kb(
        &format!("usage scan {:.1} KB SSE", stream.len() as f64 / 1024.0),
        stream.len(),
        || {
            let mut s = UsageScanner::default();
            s.push(black_box(&stream));
            black_box(s.tag);
        },
    );
}
