//! The rename root's work, natively, per body size: finding and replacing the
//! request's top-level `model` (`rename::request::rename`, which scans the
//! whole body), next to the first root's parse of the same body (`extract`),
//! and rewriting a streamed response's `model` back (`ModelRewriter`) next to
//! the usage scanner that reads every response anyway.
//!
//! `cargo bench -p fleetroute-filter --bench rename` prints µs per call and
//! per KB; the ratios matter, not the absolute figures (Envoy runs the same
//! code compiled to Wasm).
#![allow(clippy::unwrap_used)] // a benchmark, like a test, says what it expects

use std::hint::black_box;
use std::time::Instant;

use fleetroute_filter::config::FilterConfig;
use fleetroute_filter::extract::extract;
use fleetroute_filter::rename::request::rename;
use fleetroute_filter::rename::response::{Format, ModelRewriter};
use fleetroute_filter::response::UsageScanner;

const SIZES: [usize; 4] = [1 << 10, 64 << 10, 256 << 10, 1 << 20];

/// A chat body as the openai client writes it: messages first, model after.
fn body(prompt_bytes: usize) -> Vec<u8> {
    let words = "lorem ipsum dolor sit amet consectetur ";
    let content: String = words.repeat(prompt_bytes / words.len() + 1)[..prompt_bytes].to_string();
    serde_json::json!({
        "messages": [{ "role": "user", "content": content }],
        "model": "demo-model",
        "user": "bench-user",
        "max_tokens": 1
    })
    .to_string()
    .into_bytes()
}

/// A streamed answer of `n` token events as vLLM sends it, each with the model.
fn sse(n: usize) -> Vec<u8> {
    let mut s = String::new();
    for i in 0..n {
        s += &format!(
            "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"meta-llama/Llama-3.1-70B-Instruct\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"tok{i} \"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
        );
    }
    s += "data: [DONE]\n\n";
    s.into_bytes()
}

fn time(label: &str, bytes: usize, mut f: impl FnMut()) -> f64 {
    let iters = (256 << 20) / bytes.max(1) + 16;
    let start = Instant::now();
    for _ in 0..iters {
        f();
    }
    let us = start.elapsed().as_secs_f64() * 1e6 / iters as f64;
    println!(
        "{label}: {us:>9.2} µs per call, {:.4} µs per KB",
        us / (bytes as f64 / 1024.0)
    );
    us
}

fn main() {
    let cfg = FilterConfig {
        max_body_bytes: 4 << 20,
        ..FilterConfig::default()
    };
    for size in SIZES {
        let b = body(size);
        let parse = time(&format!("extract {:>7} B", b.len()), b.len(), || {
            black_box(extract(black_box(&b), &cfg));
        });
        // The root reads the body into a buffer with room to spare, then renames in place.
        let mut buf = Vec::with_capacity(b.len() + 4096);
        let splice = time(&format!("rename  {:>7} B", b.len()), b.len(), || {
            buf.clear();
            buf.extend_from_slice(&b);
            black_box(rename(&mut buf, "meta-llama/Llama-3.1-70B-Instruct").unwrap());
        });
        let copy = time(&format!("copy    {:>7} B", b.len()), b.len(), || {
            buf.clear();
            buf.extend_from_slice(black_box(&b));
            black_box(&buf);
        });
        println!(
            "  rename / extract = {:.3}; rename less its copy / extract = {:.3}",
            splice / parse,
            (splice - copy).max(0.0) / parse
        );
    }
    for events in [16, 256] {
        let s = sse(events);
        // Envoy hands chunks of a few events; 4 KiB pieces here.
        let usage = time(&format!("usage scan {events:>3} events"), s.len(), || {
            let mut u = UsageScanner::default();
            for c in s.chunks(4096) {
                black_box(u.push(c));
            }
        });
        let rewrite = time(&format!("rewrite    {events:>3} events"), s.len(), || {
            let mut r = ModelRewriter::new(Format::Sse, "llama");
            for c in s.chunks(4096) {
                black_box(r.push(c, false));
            }
        });
        println!("  rewrite / usage scan = {:.2}", rewrite / usage);
    }
}
