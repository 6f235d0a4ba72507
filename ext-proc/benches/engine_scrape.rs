//! What reading one engine's `/metrics` body costs: the captured vLLM and
//! llama.cpp bodies through their dialects (`engine::read`: the dialect's
//! families filtered out, then parsed by `openmetrics-parser`).
//!
//! `cargo bench -p fleetroute --bench engine_scrape`
#![allow(clippy::unwrap_used)] // a benchmark, like a test, says what it expects

use std::hint::black_box;

use criterion::Criterion;
use fleetroute::config::{Engine, MetricMap};
use fleetroute::engine::{Dialect, read};

fn fixture(name: &str) -> String {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/engines");
    std::fs::read_to_string(format!("{dir}/{name}")).unwrap()
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    for (engine, file) in [
        (Engine::Vllm, "vllm-metrics-busy.txt"),
        (Engine::Llamacpp, "llama-metrics-busy.txt"),
    ] {
        let body = fixture(file);
        let d = Dialect::new(engine, &MetricMap::default());
        c.bench_function(&format!("read {file} ({} bytes)", body.len()), |b| {
            b.iter(|| black_box(read(black_box(&body), &d).unwrap()))
        });
    }
    c.final_summary();
}
