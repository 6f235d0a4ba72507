use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use super::redis_server::RedisServer;
use crate::tenancy::clock::Clock;
use crate::tenancy::config::{TenantLimits, TenantsConfig};
use crate::tenancy::ledger::{Estimate, Limit, Usage};
use crate::tenancy::shared::{Shared, SharedConfig};

const T0: u64 = 1_780_000_020_000; // 20 s into a UTC minute
const LIMIT: u64 = 10_000;

fn shared(url: &str) -> Arc<Shared> {
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
    Shared::new(tenants, cfg, clock).unwrap()
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
    let (a, b) = (shared(&redis.url()), shared(&redis.url()));
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
    let a = shared(&redis.url());
    let before = drain(&a, "acme", 100).await;
    assert_eq!(before, LIMIT, "alone, the instance gets the whole limit");

    redis.stop();
    // Redis gone: the instance falls back to limit ÷ 2 for this minute.
    let during = drain(&a, "acme", 100).await;
    let st = a.state();
    assert!(st.degraded());
    assert_eq!(during, LIMIT / 2, "fallback share");
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
    // The fresh Redis learned the spend made without it.
    assert_eq!(a.state().caught_up_tokens.load(Relaxed), during);
    assert_eq!(a.redis_count("acme").await.unwrap(), during);
    // And grants only what is left of the limit.
    let after = drain(&a, "acme", 100).await;
    assert_eq!(after, LIMIT - during);
}
