//! Per-minute tenant limits shared through a real `redis-server`, on the
//! decision path of the real service behind real Envoy: slices are claimed
//! from Redis, a Redis that dies leaves each instance its fallback share
//! (limit ÷ instances, still enforced, counted), and a Redis that comes back
//! learns the spend made without it.
#![cfg(feature = "e2e")] // needs Envoy and the built binaries: scripts/test.sh

use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fleetroute_tests::harness::client::{blocking_get, chat_body_tokens, metric_sum, post};
use fleetroute_tests::harness::redis::Redis;
use fleetroute_tests::harness::scenario::{FAST_ENGINES, chat_url};
use fleetroute_tests::harness::{Lab, LabSpec, pace, wait_until};

const ENGINE: &str = env!("CARGO_BIN_EXE_fleetroute-engine");

const ROUTER: &str = r#"
health_check: { interval_ms: 500, timeout_ms: 500, healthy_threshold: 1, unhealthy_threshold: 3 }
fleets:
  - name: pool
    region: us
    endpoints: ["{r1}", "{r2}"]
stages:
  - name: chat
    models: [m1]
    fleets: [pool]
tenants:
  # A gateway in front is trusted to write x-tenant (the clients here).
  identity: { source: header, header: x-tenant }
  named:
    acme: { tokens_per_minute: 4000 }
    small: { tokens_per_minute: 300 }
tenants_redis: { url: "URL", instances: 2, prefix: e2e, timeout_ms: 300 }
"#;

fn redis_metric(lab: &Lab, result: &str) -> f64 {
    let (_, m) = blocking_get(&format!("{}/metrics", lab.admin)).expect("/metrics");
    metric_sum(
        &m,
        "fleetroute_tenant_redis_total",
        &[&format!("result=\"{result}\"")],
    )
}

fn ask(lab: &Lab, tenant: &str) -> u16 {
    let body = chat_body_tokens("m1", None, "Count to three.", false, 20);
    let r = post(&chat_url(lab), body, &[("x-tenant", tenant)]);
    assert!(
        r.status == 200 || r.status == 429,
        "{}: {}",
        r.status,
        r.body
    );
    if r.status == 429 {
        assert_eq!(r.json()["error"]["code"], "tokens_per_minute", "{}", r.body);
    }
    r.status
}

/// What Redis holds for a tenant this minute (every instance's claimed slices).
fn redis_count(redis: &Redis, tenant: &str) -> u64 {
    let minute = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / 60;
    let out = Command::new("redis-cli")
        .args(["-p", &redis.port.to_string(), "HVALS"])
        .arg(format!("e2e:tpm-by:{tenant}:{minute}"))
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().parse::<u64>().ok())
        .sum()
}

#[test]
fn redis_shares_the_limits_and_a_dead_redis_leaves_the_fallback_share() {
    let mut redis = Redis::require();
    // The phases below must share one UTC minute (Redis counts per minute):
    // start early in one.
    wait_until("the start of a UTC minute", Duration::from_secs(70), || {
        let s = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
            % 60;
        (1..20).contains(&s)
    });
    let router = ROUTER.replace("URL", &redis.url());
    let lab = Lab::start(
        ENGINE,
        LabSpec {
            router: &router,
            engine_args: FAST_ENGINES,
            ..Default::default()
        },
    );

    // Redis up: slices are claimed, most decisions make no round trip.
    let mut sent = 0;
    for _ in 0..10 {
        assert_eq!(ask(&lab, "acme"), 200);
        sent += 1;
    }
    let refills = redis_metric(&lab, "refills");
    assert!(refills >= 1.0, "no slice was claimed");
    assert!(
        refills <= sent as f64,
        "more round trips ({refills}) than decisions ({sent})"
    );
    assert!(redis_count(&redis, "acme") > 0, "Redis holds acme's claims");
    assert_eq!(redis_metric(&lab, "errors"), 0.0);

    // Redis dies: requests go on, on the fallback share.
    redis.stop();
    for _ in 0..20 {
        assert_eq!(
            ask(&lab, "acme"),
            200,
            "acme's fallback share (2000) covers these"
        );
    }
    wait_until("the outage to be seen", Duration::from_secs(10), || {
        redis_metric(&lab, "errors") >= 1.0 && redis_metric(&lab, "fallback_decisions") >= 1.0
    });
    // The fallback share is enforced: small (300 per minute, 2 instances)
    // gets 150 tokens here, about 4 requests (8 if the minute turns).
    let mut admitted = 0;
    let mut refused = false;
    for _ in 0..12 {
        if ask(&lab, "small") == 429 {
            refused = true;
            break;
        }
        admitted += 1;
    }
    assert!(refused, "small was never refused on its fallback share");
    assert!(
        (1..=8).contains(&admitted),
        "{admitted} admitted on a 150-token share"
    );

    // Redis is back (empty): the spend made without it is reported, then
    // slices are claimed again.
    redis.restart();
    wait_until("the catch-up", Duration::from_secs(15), || {
        redis_metric(&lab, "caught_up_tokens") > 0.0
    });
    assert!(
        redis_count(&redis, "acme") > 0,
        "the fresh Redis learned acme's spend during the outage"
    );
    let before = redis_metric(&lab, "refills");
    for _ in 0..10 {
        assert_eq!(ask(&lab, "acme"), 200);
    }
    wait_until("slices claimed again", Duration::from_secs(10), || {
        redis_metric(&lab, "refills") > before
    });
}

const TWO_INSTANCES: &str = r#"
health_check: { interval_ms: 500, timeout_ms: 500, healthy_threshold: 1, unhealthy_threshold: 3 }
fleets:
  - name: pool
    region: us
    endpoints: ["{r1}", "{r2}"]
stages:
  - name: chat
    models: [m1]
    fleets: [pool]
tenants:
  identity: { source: header, header: x-tenant }
  named:
    acme: { tokens_per_minute: 3000 }
tenants_redis: { url: "URL", instances: 2, prefix: e2e, timeout_ms: 300 }
"#;

/// Tokens charged to `tenant` by every instance.
fn charged(lab: &Lab, tenant: &str) -> u64 {
    lab.admins()
        .iter()
        .map(|admin| {
            let (_, body) =
                blocking_get(&format!("{admin}/v1/tenant?name={tenant}")).expect("admin");
            let v: serde_json::Value = serde_json::from_str(&body).expect("a tenant view");
            v["usage"]["tokens_charged"].as_u64().unwrap_or(0)
        })
        .sum()
}

#[test]
fn a_redis_killed_and_restarted_empty_under_load_keeps_the_minute_within_its_bound() {
    let mut redis = Redis::require();
    wait_until("the start of a UTC minute", Duration::from_secs(70), || {
        let s = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
            % 60;
        (1..8).contains(&s)
    });
    let router = TWO_INSTANCES.replace("URL", &redis.url());
    let lab = Lab::start(
        ENGINE,
        LabSpec {
            router: &router,
            engine_args: FAST_ENGINES,
            instances: Some(2),
            ..Default::default()
        },
    );
    let second = || {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
            % 60
    };
    let (mut ok, mut refused) = (0, 0);
    let mut restarted = false;
    let mut stopped = false;
    // Bounded: one request every 10 ms at most, until 50 s into the minute.
    for _ in 0..6000 {
        pace(Duration::from_millis(10));
        let s = second();
        if !(1..50).contains(&s) {
            break;
        }
        if s >= 20 && !stopped {
            redis.stop();
            stopped = true;
        }
        if s >= 26 && !restarted {
            redis.restart();
            restarted = true;
        }
        match ask(&lab, "acme") {
            200 => ok += 1,
            _ => refused += 1,
        }
    }
    assert!(stopped && restarted, "the minute ran out before the outage");
    lab.wait_settled();
    let total = charged(&lab, "acme");
    let restored = redis_metric(&lab, "restored_tokens");
    println!(
        "one minute, limit 3000 tokens over 2 instances, Redis killed at :20 and restarted empty at :26: \
         {ok} admitted, {refused} refused, {total} tokens charged (bound 4500); {restored} tokens restored to Redis by instance 0"
    );
    assert!(refused > 0, "the limit never bit");
    // The limit plus (instances - 1) / instances of it, at most.
    assert!(
        total <= 4500,
        "{total} tokens charged in one minute, over the bound of 4500"
    );
}
