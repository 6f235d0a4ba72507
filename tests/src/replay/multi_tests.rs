//! Tests of `multi.rs`.

use super::*;
use crate::engine::latency::LatencyModel;
use crate::replay::workload::{Kind, Params, generate};
use crate::replay::{sim, trace};

fn run(routers: usize, share: bool) -> (sim::Outcome, LeaseCounts) {
    let reqs = trace::load(
        &generate(&Params {
            kind: Kind::Agent,
            seed: 3,
            requests: 300,
            session_rate: 0.4,
            block_tokens: 512,
        }),
        512,
    )
    .unwrap();
    let cfg = SimConfig {
        replicas: 4,
        cache_tokens: 1_000_000,
        router_cache_tokens: None,
        block_tokens: 512,
        latency: LatencyModel {
            prefill_tokens_per_sec: 10_000.0,
            decode_ms_per_token: 20.0,
            decode_ms_per_running: 0.0,
            max_batch: 32,
        },
        max_queue: 256,
        speedup: 1.0,
        scrape_ms: Some(1000.0),
        lora: None,
    };
    let opts = Options {
        routers,
        spread: Spread::Alternate,
        share_ms: share.then_some(25.0),
        forward: share,
        load_stale_ms: None,
        log_flush_ms: 50.0,
    };
    let mut m = MultiRouter::new(&cfg, reqs.len(), opts, "t");
    let out = sim::run(&cfg, &reqs, &mut m);
    (out, m.counts)
}

#[test]
fn entries_reach_their_decider_only_when_forwarded() {
    let (_, one) = run(1, false);
    assert_eq!(one.foreign, 0, "one instance decides everything");
    let (_, alone) = run(2, false);
    assert!(alone.foreign > 0, "{alone:?}");
    assert!(alone.expired + alone.reconciled > 0, "{alone:?}");
    let (out, linked) = run(2, true);
    assert_eq!(linked.foreign, 0, "{linked:?}");
    assert!(
        linked.logged as usize >= out.ttft_ms.len() * 9 / 10,
        "{linked:?}"
    );
    assert!(
        linked.overhang_ms / (linked.logged as f64) < 200.0,
        "{linked:?}"
    );
    // Deterministic: the same run gives the same figures.
    let (again, _) = run(2, true);
    assert_eq!(again.ttft_ms, out.ttft_ms);
}
