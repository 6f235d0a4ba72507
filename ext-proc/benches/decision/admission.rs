//! Decision plus admission, call by call: class admission, the local tenant
//! ledger, then the ledger shared through a `redis-server` the bench starts.

use super::*;

/// Tenant limits every decision is checked against (high enough that none
/// refuses: the figure is the accounting's cost, not a refusal's).
/// Class admission on the bench's stage.
const CLASSES: &str = "    admission: { ttft_ms: { critical: 1000, standard: 4000 } }\n";

const TENANTS: &str = "tenants:\n  default: { max_requests_in_flight: 1000000, max_tokens_in_flight: 1000000000000, tokens_per_minute: 1000000000000, budget: { usd: 1000000, per: month } }\n";

/// Keys spread over 1000 tenants.
fn tenant_keys(prompts: &[Vec<u64>]) -> Vec<RouteKey<'static>> {
    let ids: &'static [String] = Box::leak((0..1000).map(|i| format!("tenant-{i}")).collect());
    prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut k = key(p, i as u64);
            k.tenant = ids[i % ids.len()].as_str().into();
            k.max_tokens = Some(256);
            k
        })
        .collect()
}

const USAGE: Usage = Usage {
    prompt: 1024,
    cached: 512,
    completion: 200,
};

fn pct(t: &mut [Duration], q: f64) -> f64 {
    t.sort();
    t[((t.len() as f64 * q) as usize).min(t.len() - 1)].as_secs_f64() * 1e6
}

/// Per call, alternating on the same snapshot so both see the same machine:
/// the decision alone, and the decision followed by the tenant's admission
/// on the chosen fleet (what the ext_proc stream does before it answers).
/// The commit, which the access log observer makes later, is not timed.
/// `gate`: class admission too, for a config whose stage has `admission`
/// (every request is admitted at once: the stage is idle).
fn admitted_percentiles(
    label: &str,
    shared: &Shared,
    keys: &[RouteKey<'static>],
    rt: &tokio::runtime::Runtime,
    gate: Option<&Admission>,
) {
    let headers = HeaderMap::default();
    let n = keys.len().max(20_000);
    let (mut alone, mut admitted) = (Vec::with_capacity(n), Vec::with_capacity(n));
    // Which of the two goes first alternates: the second decision of a key
    // finds its prefix entries in the CPU's caches.
    rt.block_on(async {
        for i in 0..n {
            let k = &keys[i % keys.len()];
            for first in [i % 2 == 0, i % 2 == 1] {
                if first {
                    let start = Instant::now();
                    let snap = shared.snapshot_full();
                    black_box(decide(&snap, black_box(k), i as u64).ok());
                    alone.push(start.elapsed());
                    continue;
                }
                let start = Instant::now();
                let snap = shared.snapshot_full();
                let mut d = decide(&snap, black_box(k), i as u64).expect("routable");
                if let Some(g) = gate {
                    match g.judge(&shared.metrics, &snap, &headers, k, d, Instant::now()) {
                        Judged::Admit(admitted) => d = admitted,
                        _ => panic!("an idle stage admits"),
                    }
                }
                let c = admit::admit(shared, &snap, &d, k).await.expect("admitted");
                admitted.push(start.elapsed());
                c.reservation.commit(USAGE, 0.001);
            }
        }
    });
    let (a50, a99, a999) = (
        pct(&mut alone, 0.5),
        pct(&mut alone, 0.99),
        pct(&mut alone, 0.999),
    );
    let (t50, t99, t999) = (
        pct(&mut admitted, 0.5),
        pct(&mut admitted, 0.99),
        pct(&mut admitted, 0.999),
    );
    println!(
        "{label}: decide + admit p50 {t50:.1} µs, p99 {t99:.1} µs, p99.9 {t999:.1} µs; decide alone, interleaved: p50 {a50:.1} µs, p99 {a99:.1} µs, p99.9 {a999:.1} µs; ratio p50 {:.2}, p99 {:.2} over {n} decisions each",
        t50 / a50,
        t99 / a99
    );
}

/// Decision time with tenant admission on: the local ledger, then limits
/// shared through a real `redis-server` (skipped when it is not installed).
pub fn admission() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let warmup = prompts(20_000, 200, 64, 1);
    let probe = prompts(2_000, 200, 64, 2);
    let keys = tenant_keys(&probe);

    let cfg = config_with(&[("a", 32), ("b", 32)], "weighted", 10_000_000, TENANTS);
    let (shared, mut w) = ready(&cfg);
    warm(&shared, &mut w, &warmup);
    admitted_percentiles(
        "decide + admit, local ledger, 1000 tenants, every limit set",
        &shared,
        &keys,
        &rt,
        None,
    );
    let mut c = Criterion::default()
        .configure_from_args()
        .measurement_time(Duration::from_secs(3));
    c.bench_function("decide + admit + commit/local ledger, 1000 tenants", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % keys.len();
            let k = &keys[i];
            let snap = shared.snapshot_full();
            let d = decide(&snap, k, i as u64).expect("routable");
            let c =
                futures::executor::block_on(admit::admit(&shared, &snap, &d, k)).expect("admitted");
            c.reservation.commit(USAGE, 0.001);
        })
    });
    c.final_summary();
    drop((shared, w));

    // Both admissions: the stage's classes (every tenant standard, with
    // objectives) then the tenant's limits.
    let cfg = config_full(
        &[("a", 32), ("b", 32)],
        "weighted",
        10_000_000,
        CLASSES,
        TENANTS,
    );
    let (shared, mut w) = ready(&cfg);
    warm(&shared, &mut w, &warmup);
    let gate = Admission::new(Instant::now());
    admitted_percentiles(
        "decide + class admission + admit, local ledger, 1000 tenants, every limit set",
        &shared,
        &keys,
        &rt,
        Some(&gate),
    );
    drop((shared, w));

    let Some(redis) = fleetroute_test_kit::RedisServer::start() else {
        println!("redis-server not on PATH: the shared admission figures are skipped");
        return;
    };
    let extra = format!(
        "{TENANTS}tenants_redis: {{ url: \"redis://127.0.0.1:{}/\", instances: 2, timeout_ms: 1000 }}\n",
        redis.port
    );
    let cfg = config_full(
        &[("a", 32), ("b", 32)],
        "weighted",
        10_000_000,
        CLASSES,
        &extra,
    );
    let (shared, mut w) = ready(&cfg);
    warm(&shared, &mut w, &warmup);
    let gate = Admission::new(Instant::now());
    let round_trips = || {
        let r = shared.tenants.redis().expect("Redis on");
        r.refills.load(std::sync::atomic::Ordering::Relaxed)
            + r.redis_errors.load(std::sync::atomic::Ordering::Relaxed)
    };
    let decisions = keys.len().max(20_000);
    // First pass: each tenant's first decision claims its first slice.
    // Second: the allowances cover every decision.
    for pass in ["first pass, each tenant's first slice", "second pass"] {
        let before = round_trips();
        admitted_percentiles(
            &format!(
                "decide + class admission + admit, shared through Redis, 1000 tenants, {pass}"
            ),
            &shared,
            &keys,
            &rt,
            Some(&gate),
        );
        println!(
            "  Redis round trips during those decisions: {} ({:.3} per decision; background refills included)",
            round_trips() - before,
            (round_trips() - before) as f64 / decisions as f64
        );
    }
    drop((shared, w));
}
