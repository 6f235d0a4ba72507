use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use crate::tenancy::clock::Clock;
use crate::tenancy::config::{TenantLimits, TenantsConfig};
use crate::tenancy::ledger::{Estimate, Limit, Usage};
use crate::tenancy::shared::{Shared, SharedConfig};
use fleetroute_test_kit::RedisServer;

const T0: u64 = 1_780_000_020_000; // 20 s into a UTC minute
const LIMIT: u64 = 10_000;

/// Instance `name` of a deployment of two.
fn shared(url: &str, name: &str) -> Arc<Shared> {
    let tenants = TenantsConfig {
        default: TenantLimits {
            tokens_per_minute: Some(LIMIT),
            ..Default::default()
        },
        ..Default::default()
    };
    let cfg = SharedConfig {
        url: url.into(),
        instances: 2,
        prefix: "fr-test".into(),
        slice_fraction: 0.05,
        // Generous: a stalled test machine must not look like an outage.
        timeout_ms: 3000,
    };
    // Both instances at the same fixed instant: one shared minute.
    let (clock, _) = Clock::manual(T0);
    Shared::new(tenants, cfg, clock, name).unwrap()
}

fn est(tokens: u64) -> Estimate {
    Estimate {
        prompt_tokens: tokens / 2,
        max_tokens: tokens - tokens / 2,
        cost_usd: 0.0,
        ttl: Some(Duration::from_secs(60)),
    }
}

/// Admits `tokens`-sized requests on `s` until refused (bounded); the tokens admitted.
async fn drain(s: &Arc<Shared>, tenant: &str, tokens: u64) -> u64 {
    let mut n = 0;
    for _ in 0..1000 {
        match s.admit(tenant, &est(tokens)).await {
            Ok(r) => {
                s.ledger().commit(
                    r,
                    Usage {
                        prompt: tokens / 2,
                        cached: 0,
                        completion: tokens - tokens / 2,
                    },
                    0.0,
                );
                n += tokens;
            }
            Err(r) => {
                assert_eq!(r.limit, Limit::TokensPerMinute);
                return n;
            }
        }
    }
    panic!("never refused after 1000 requests");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_one_limit() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let (a, b) = (shared(&redis.url(), "a"), shared(&redis.url(), "b"));
    let mut total = 0;
    // Alternate between instances until both are refused.
    let mut refused = (false, false);
    for i in 0..400 {
        let s = if i % 2 == 0 { &a } else { &b };
        match s.admit("acme", &est(100)).await {
            Ok(r) => {
                s.ledger().commit(
                    r,
                    Usage {
                        prompt: 50,
                        cached: 0,
                        completion: 50,
                    },
                    0.0,
                );
                total += 100;
            }
            Err(_) if i % 2 == 0 => refused.0 = true,
            Err(_) => refused.1 = true,
        }
        if refused == (true, true) {
            break;
        }
    }
    assert!(refused.0 && refused.1, "both instances refused in the end");
    assert!(
        total <= LIMIT,
        "admitted {total} over the shared limit {LIMIT}"
    );
    // Unused slices lapse: at most one slice per instance is lost.
    assert!(total >= LIMIT - 2 * 500, "admitted only {total} of {LIMIT}");
    assert_eq!(a.state().fallback_decisions.load(Relaxed), 0);
    assert!(a.redis_count("acme").await.unwrap() <= LIMIT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn falls_back_to_its_share_and_catches_up() {
    let Some(mut redis) = RedisServer::start() else {
        return;
    };
    let a = shared(&redis.url(), "a");
    // A fifth of the limit before the outage (and the slices it holds).
    let mut before = 0;
    while before < LIMIT / 5 {
        let r = a.admit("acme", &est(100)).await.expect("within the limit");
        a.ledger().commit(
            r,
            Usage {
                prompt: 50,
                cached: 0,
                completion: 50,
            },
            0.0,
        );
        before += 100;
    }
    let granted = a.redis_count("acme").await.unwrap();
    assert!(granted >= before);

    redis.stop();
    // Redis gone: the instance falls back to limit ÷ 2 for this minute, what
    // Redis granted it before counted in.
    let during = drain(&a, "acme", 100).await;
    let st = a.state();
    assert!(st.degraded());
    assert_eq!(before + during, LIMIT / 2, "fallback share");
    assert!(st.fallback_decisions.load(Relaxed) > 0);
    assert!(st.redis_errors.load(Relaxed) > 0);

    redis.restart();
    let upkeep = a.spawn_upkeep(Duration::from_millis(20));
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.state().degraded() {
        assert!(Instant::now() < deadline, "never left the fallback");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    upkeep.abort();
    // The fresh Redis learned the spend made without it, and what it had
    // granted before and lost with its restart. Spend during the outage out
    // of a slice granted before it counts as fallback spend too (so Redis
    // may learn up to that slice twice: refusing early, never late).
    let caught_up = a.state().caught_up_tokens.load(Relaxed);
    assert!(
        caught_up > 0 && caught_up <= during,
        "caught up {caught_up} of {during}"
    );
    let held = a.redis_count("acme").await.unwrap();
    assert!(
        held >= before + during,
        "Redis holds {held}, less than the {} spent",
        before + during
    );
    assert!(a.state().restored_tokens.load(Relaxed) >= granted);
    // And grants only what is left of the limit.
    let after = drain(&a, "acme", 100).await;
    assert!(
        before + during + after <= LIMIT,
        "{before} + {during} + {after} over the limit"
    );
    assert_eq!(after, LIMIT.saturating_sub(held) / 100 * 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_forgot_the_minute_learns_each_instances_claims_back() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let (a, b) = (shared(&redis.url(), "a"), shared(&redis.url(), "b"));
    // a takes 60% of the limit, then Redis loses everything (an empty
    // failover, a FLUSHALL) without any instance seeing an error.
    let mut first = 0;
    while first < LIMIT * 6 / 10 {
        let r = a.admit("acme", &est(100)).await.expect("within the limit");
        a.ledger().commit(
            r,
            Usage {
                prompt: 50,
                cached: 0,
                completion: 50,
            },
            0.0,
        );
        first += 100;
    }
    let client = redis::Client::open(redis.url()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("FLUSHALL").query_async(&mut c).await.unwrap();
    assert_eq!(a.redis_count("acme").await.unwrap(), 0);
    // a's upkeep tells Redis again what a holds, before b asks for more.
    a.refresh().await;
    // All it was granted, its unspent slice included.
    assert!(a.redis_count("acme").await.unwrap() >= first);
    // Both go on until refused: together they stay within the one limit.
    let rest = drain(&b, "acme", 100).await + drain(&a, "acme", 100).await;
    assert!(
        first + rest <= LIMIT,
        "{first} + {rest} admitted against a limit of {LIMIT}"
    );
    assert!(a.state().restored_tokens.load(Relaxed) >= first);
    assert!(!a.state().degraded() && !b.state().degraded());
}
