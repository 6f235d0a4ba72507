//! The tenant accountant's cost: admit + commit on the local ledger, and the
//! Redis round trip that refills a shared allowance.
//!
//! `cargo bench -p fleetroute --bench tenancy` prints criterion's timings,
//! then per-call percentiles. The Redis part starts its own `redis-server`
//! on a free loopback port and is skipped when the binary is absent.
#![allow(clippy::unwrap_used)] // a benchmark, like a test, says what it expects

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::Criterion;
use fleetroute::tenancy::clock::Clock;
use fleetroute::tenancy::config::{Budget, BudgetPeriod, TenantLimits, TenantsConfig};
use fleetroute::tenancy::ledger::{Estimate, Ledger, Usage};
use fleetroute::tenancy::shared::{Shared, SharedConfig};

fn limits() -> TenantLimits {
    TenantLimits {
        max_requests_in_flight: Some(1 << 30),
        max_tokens_in_flight: Some(1 << 38),
        tokens_per_minute: Some(1 << 39),
        budget: Some(Budget {
            usd: 1e6,
            per: BudgetPeriod::Month,
        }),
        ..Default::default()
    }
}

fn est() -> Estimate {
    Estimate {
        prompt_tokens: 1500,
        max_tokens: 256,
        cost_usd: 1756.0 * 1e-6,
        ttl: Some(Duration::from_secs(600)),
    }
}

const USAGE: Usage = Usage {
    prompt: 1500,
    cached: 1000,
    completion: 200,
};

fn percentiles(name: &str, mut ns: Vec<u64>) {
    ns.sort_unstable();
    let p = |q: f64| ns[((ns.len() as f64 * q) as usize).min(ns.len() - 1)];
    println!(
        "{name}: n={} p50={} ns p90={} ns p99={} ns p99.9={} ns",
        ns.len(),
        p(0.5),
        p(0.9),
        p(0.99),
        p(0.999)
    );
}

fn local(c: &mut Criterion) {
    let cfg = TenantsConfig {
        default: limits(),
        ..Default::default()
    };
    let l = Ledger::new(cfg, Clock::real());
    let ids: Vec<String> = (0..1000).map(|i| format!("tenant-{i}")).collect();
    let mut i = 0;
    c.bench_function("ledger admit+commit (1000 tenants)", |b| {
        b.iter(|| {
            i = (i + 1) % ids.len();
            let r = l.admit(black_box(&ids[i]), &est()).unwrap();
            l.commit(r, USAGE, 0.0017);
        })
    });
    let mut ns = Vec::with_capacity(200_000);
    for k in 0..200_000 {
        let t = Instant::now();
        let r = l.admit(&ids[k % ids.len()], &est()).unwrap();
        l.commit(r, USAGE, 0.0017);
        ns.push(t.elapsed().as_nanos() as u64);
    }
    percentiles("ledger admit+commit per call", ns);
}

fn redis(c: &mut Criterion) {
    // Not under scripts/test.sh: a bench without Redis prints the rest.
    let Some(server) = fleetroute_test_kit::RedisServer::start() else {
        println!("redis-server not on PATH: Redis figures skipped");
        return;
    };
    let url = server.url();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let tenants = TenantsConfig {
        default: limits(),
        ..Default::default()
    };
    let shared = Shared::new(
        tenants,
        SharedConfig {
            url,
            instances: 2,
            prefix: "bench".into(),
            slice_fraction: 0.05,
            timeout_ms: 1000,
        },
        Clock::real(),
        "bench",
    )
    .unwrap();
    let t = shared.ledger().tenant("acme");
    c.bench_function("redis refill (one slice claim)", |b| {
        b.iter(|| assert!(rt.block_on(shared.refill(&t, 0))))
    });
    let mut ns = Vec::with_capacity(5000);
    for _ in 0..5000 {
        let s = Instant::now();
        assert!(rt.block_on(shared.refill(&t, 0)));
        ns.push(s.elapsed().as_nanos() as u64);
    }
    percentiles("redis refill per call", ns);
    // Decisions served from the local allowance (no round trip).
    let refills = || {
        shared
            .state()
            .refills
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let before = refills();
    let mut ns = Vec::with_capacity(100_000);
    rt.block_on(async {
        for _ in 0..100_000 {
            let s = Instant::now();
            let r = shared.admit("acme", &est()).await.unwrap();
            shared.ledger().commit(r, USAGE, 0.0017);
            ns.push(s.elapsed().as_nanos() as u64);
        }
    });
    println!(
        "round trips during the shared admit loop: {}",
        refills() - before
    );
    percentiles("shared admit+commit per call", ns);
    drop(server);
}

fn main() {
    let mut c = Criterion::default()
        .configure_from_args()
        .measurement_time(Duration::from_secs(3));
    local(&mut c);
    redis(&mut c);
    c.final_summary();
}
