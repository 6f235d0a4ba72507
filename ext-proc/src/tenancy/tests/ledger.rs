use std::collections::HashMap;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use crate::tenancy::clock::Clock;
use crate::tenancy::config::{Budget, BudgetPeriod, TenantLimits, TenantsConfig};
use crate::tenancy::ledger::{Estimate, Ledger, Limit, OTHER, Reservation, Usage};

const T0: u64 = 1_780_000_000_000; // a fixed UTC instant, on a 70 s boundary
const PRICE: f64 = 1e-5;

fn est(prompt: u64, max: u64) -> Estimate {
    Estimate {
        prompt_tokens: prompt,
        max_tokens: max,
        cost_usd: (prompt + max) as f64 * PRICE,
        ttl: Some(Duration::from_secs(600)),
    }
}

fn ledger(default: TenantLimits) -> (Ledger, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    let (clock, h) = Clock::manual(T0);
    let cfg = TenantsConfig {
        default,
        ..Default::default()
    };
    (Ledger::new(cfg, clock), h)
}

fn micro(usd: f64) -> u64 {
    if usd > 0.0 {
        (usd * 1e6).round() as u64
    } else {
        0
    }
}

#[test]
fn in_flight_limits_name_themselves_and_free_on_commit() {
    let (l, _) = ledger(TenantLimits {
        max_requests_in_flight: Some(2),
        max_tokens_in_flight: Some(1000),
        ..Default::default()
    });
    let a = l.admit("t", &est(100, 100)).unwrap();
    let b = l.admit("t", &est(100, 100)).unwrap();
    let r = l.admit("t", &est(1, 1)).unwrap_err();
    assert_eq!(r.limit, Limit::MaxRequestsInFlight);
    assert_eq!(r.limit.as_str(), "max_requests_in_flight");
    l.commit(
        a,
        Usage {
            prompt: 100,
            cached: 0,
            completion: 10,
        },
        0.0,
    );
    let r = l.admit("t", &est(500, 500)).unwrap_err();
    assert_eq!(r.limit, Limit::MaxTokensInFlight);
    drop(b);
    let t = l.tenant("t");
    assert_eq!(t.requests.load(std::sync::atomic::Ordering::Relaxed), 0);
    assert_eq!(t.tokens.load(std::sync::atomic::Ordering::Relaxed), 0);
    // Another tenant is not affected by "t".
    let _c = l.admit("u", &est(500, 500)).unwrap();
}

#[test]
fn tokens_per_minute_slides_and_advises_when_to_retry() {
    let (l, now) = ledger(TenantLimits {
        tokens_per_minute: Some(1000),
        ..Default::default()
    });
    let a = l.admit("t", &est(300, 300)).unwrap();
    l.commit(
        a,
        Usage {
            prompt: 300,
            cached: 100,
            completion: 500,
        },
        0.0,
    );
    let r = l.admit("t", &est(100, 150)).unwrap_err();
    assert_eq!(r.limit, Limit::TokensPerMinute);
    // The 800 used at T0 leave the window when the bucket at T0 is 7 buckets old.
    assert_eq!(r.retry_after, Duration::from_secs(70));
    assert!(
        l.admit("t", &est(100, 100)).is_ok(),
        "200 more fit under 1000"
    );
    now.store(T0 + 60_000, std::sync::atomic::Ordering::Relaxed);
    let r = l.admit("t", &est(100, 150)).unwrap_err();
    assert_eq!(
        r.retry_after,
        Duration::from_secs(10),
        "never more than the limit in any 60 s"
    );
    now.store(T0 + 70_000, std::sync::atomic::Ordering::Relaxed);
    assert!(l.admit("t", &est(400, 400)).is_ok());
    // A request larger than the limit can never fit.
    assert_eq!(
        l.admit("t", &est(1000, 1000)).unwrap_err().retry_after,
        Duration::from_secs(60)
    );
}

#[test]
fn budget_refuses_until_the_next_period() {
    let (l, _) = ledger(TenantLimits {
        budget: Some(Budget {
            usd: 0.01,
            per: BudgetPeriod::Day,
        }),
        ..Default::default()
    });
    // 1000 tokens at 1e-5 = $0.01: exactly the budget.
    let a = l.admit("t", &est(500, 500)).unwrap();
    let r = l.admit("t", &est(1, 0)).unwrap_err();
    assert_eq!(r.limit, Limit::Budget);
    let to_midnight = 86_400_000 - T0 % 86_400_000;
    assert_eq!(r.retry_after, Duration::from_millis(to_midnight));
    l.commit(
        a,
        Usage {
            prompt: 500,
            cached: 0,
            completion: 100,
        },
        0.006,
    );
    assert!(l.admit("t", &est(200, 200)).is_ok(), "$0.004 left");
    assert_eq!(
        l.admit("t", &est(200, 201)).unwrap_err().limit,
        Limit::Budget
    );
}

#[test]
fn tenants_beyond_the_bound_share_other() {
    let (clock, _) = Clock::manual(T0);
    let l = Ledger::build(TenantsConfig::default(), clock, None, 2);
    assert_eq!(&*l.tenant("a").id, "a");
    assert_eq!(&*l.tenant("b").id, "b");
    assert_eq!(&*l.tenant("c").id, OTHER);
    assert_eq!(&*l.tenant(&"x".repeat(200)).id, OTHER);
    assert!(std::sync::Arc::ptr_eq(&l.tenant(OTHER), &l.other()));
    assert_eq!(l.tenants().len(), 2);
}

#[test]
fn a_lost_end_frees_capacity_when_the_lease_expires() {
    let (l, _) = ledger(TenantLimits {
        max_requests_in_flight: Some(1),
        tokens_per_minute: Some(100_000),
        ..Default::default()
    });
    let mut e = est(100, 100);
    e.ttl = Some(Duration::from_millis(50));
    let r = l.admit("t", &e).unwrap();
    let t = l.tenant("t");
    let deadline = Instant::now() + Duration::from_secs(5);
    while l.held() > 0 {
        assert!(Instant::now() < deadline, "lease never expired");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(l.admit("t", &est(1, 1)).is_ok(), "capacity came back");
    // The lost end was charged its estimate; the late commit corrects it.
    assert_eq!(
        t.charged_tokens.load(std::sync::atomic::Ordering::Relaxed),
        200
    );
    l.commit(
        r,
        Usage {
            prompt: 100,
            cached: 0,
            completion: 20,
        },
        0.0,
    );
    assert_eq!(
        t.charged_tokens.load(std::sync::atomic::Ordering::Relaxed),
        120
    );
    assert_eq!(t.minute_used(T0), 120);
}

#[derive(Clone, Debug)]
enum Op {
    Admit {
        tenant: u8,
        prompt: u64,
        max: u64,
    },
    Commit {
        idx: usize,
        prompt: u64,
        cached: u64,
        completion: u64,
    },
    Drop {
        idx: usize,
    },
    Expire {
        idx: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u8..3, 0u64..400, 0u64..400).prop_map(|(tenant, prompt, max)| Op::Admit { tenant, prompt, max }),
        2 => (any::<usize>(), 0u64..400, 0u64..400, 0u64..600)
            .prop_map(|(idx, prompt, cached, completion)| Op::Commit { idx, prompt, cached: cached.min(prompt), completion }),
        1 => any::<usize>().prop_map(|idx| Op::Drop { idx }),
        1 => any::<usize>().prop_map(|idx| Op::Expire { idx }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever the order of admissions, commits, drops and lease expiries,
    /// when every reservation has ended nothing is held and each tenant was
    /// charged exactly its committed usage (the estimate for a lost end that
    /// never committed).
    #[test]
    fn counters_end_at_exactly_the_committed_usage(ops in proptest::collection::vec(op(), 1..120)) {
        let (l, _) = ledger(TenantLimits {
            max_requests_in_flight: Some(6),
            max_tokens_in_flight: Some(3000),
            tokens_per_minute: Some(20_000),
            budget: Some(Budget { usd: 0.15, per: BudgetPeriod::Day }),
            ..Default::default()
        });
        let names = ["a", "b", "c"];
        // (reservation, tenant, estimate tokens, estimate micro-USD, expired)
        let mut live: Vec<(Reservation, usize, u64, u64, bool)> = Vec::new();
        let mut want_tokens: HashMap<usize, u64> = HashMap::new();
        let mut want_micro: HashMap<usize, u64> = HashMap::new();
        for o in ops {
            match o {
                Op::Admit { tenant, prompt, max } => {
                    let e = est(prompt, max);
                    if let Ok(r) = l.admit(names[tenant as usize], &e) {
                        let m = micro(e.tokens() as f64 * PRICE);
                        live.push((r, tenant as usize, e.tokens(), m, false));
                    }
                }
                Op::Commit { idx, prompt, cached, completion } if !live.is_empty() => {
                    let (r, t, _, _, _) = live.swap_remove(idx % live.len());
                    let u = Usage { prompt, cached, completion };
                    let cost = u.tokens() as f64 * PRICE;
                    l.commit(r, u, cost);
                    *want_tokens.entry(t).or_default() += u.tokens();
                    *want_micro.entry(t).or_default() += micro(cost);
                }
                Op::Drop { idx } if !live.is_empty() => {
                    let (r, t, tokens, m, expired) = live.swap_remove(idx % live.len());
                    drop(r);
                    if expired {
                        *want_tokens.entry(t).or_default() += tokens;
                        *want_micro.entry(t).or_default() += m;
                    }
                }
                Op::Expire { idx } if !live.is_empty() => {
                    let i = idx % live.len();
                    l.expire_now(&live[i].0);
                    live[i].4 = true;
                }
                _ => {}
            }
        }
        for (r, t, tokens, m, expired) in live.drain(..) {
            drop(r);
            if expired {
                *want_tokens.entry(t).or_default() += tokens;
                *want_micro.entry(t).or_default() += m;
            }
        }
        use std::sync::atomic::Ordering::Relaxed;
        prop_assert_eq!(l.held(), 0);
        for (i, n) in names.iter().enumerate() {
            let t = l.tenant(n);
            prop_assert_eq!(t.requests.load(Relaxed), 0);
            prop_assert_eq!(t.tokens.load(Relaxed), 0);
            // Every reservation ended exactly one way.
            prop_assert_eq!(
                t.admitted.load(Relaxed),
                t.committed.load(Relaxed) + t.expired.load(Relaxed) + t.dropped.load(Relaxed)
            );
            prop_assert_eq!(t.reserved_micro_usd.load(Relaxed), 0);
            let wt = want_tokens.get(&i).copied().unwrap_or(0);
            let wm = want_micro.get(&i).copied().unwrap_or(0);
            prop_assert_eq!(t.charged_tokens.load(Relaxed), wt);
            prop_assert_eq!(t.minute_used(T0), wt);
            prop_assert_eq!(t.charged_micro_usd.load(Relaxed), wm);
            prop_assert_eq!(t.spent_micro_usd(l.clock(), BudgetPeriod::Day), wm);
            prop_assert_eq!(t.spent_micro_usd(l.clock(), BudgetPeriod::Month), wm);
        }
    }
}

#[test]
fn a_reconfigure_changes_limits_and_keeps_counters_and_reservations() {
    let (l, _) = ledger(TenantLimits {
        tokens_per_minute: Some(1000),
        ..Default::default()
    });
    use std::sync::atomic::Ordering::Relaxed;
    let held = l.admit("t", &est(300, 300)).unwrap();
    assert_eq!(
        l.admit("t", &est(300, 300)).unwrap_err().limit,
        Limit::TokensPerMinute
    );
    // A named entry for "t", from now on: in flight at most 1, no per-minute limit.
    let mut cfg = TenantsConfig::default();
    cfg.named.insert(
        "t".into(),
        TenantLimits {
            max_requests_in_flight: Some(1),
            ..Default::default()
        },
    );
    cfg.named.insert("new".into(), TenantLimits::default());
    l.reconfigure(&cfg);
    let t = l.tenant("t");
    assert_eq!(t.limits().max_requests_in_flight, Some(1));
    assert_eq!(t.requests.load(Relaxed), 1, "the held reservation stays");
    assert_eq!(
        l.admit("t", &est(1, 1)).unwrap_err().limit,
        Limit::MaxRequestsInFlight
    );
    assert!(l.find("new").is_some(), "a newly named tenant is tracked");
    l.commit(
        held,
        Usage {
            prompt: 300,
            cached: 0,
            completion: 50,
        },
        0.0,
    );
    assert_eq!(t.requests.load(Relaxed), 0);
    assert_eq!(t.charged_tokens.load(Relaxed), 350);
    // Back to a per-minute limit: the usage made meanwhile counts against it.
    l.reconfigure(&TenantsConfig {
        default: TenantLimits {
            tokens_per_minute: Some(400),
            ..Default::default()
        },
        ..Default::default()
    });
    assert_eq!(t.limits().max_requests_in_flight, None, "back to default");
    assert_eq!(
        l.admit("t", &est(30, 30)).unwrap_err().limit,
        Limit::TokensPerMinute,
        "350 used + 60 > 400"
    );
    assert!(l.admit("t", &est(25, 25)).is_ok());
}

#[test]
fn a_late_commit_after_an_expiry_is_counted_once() {
    let (l, _) = ledger(TenantLimits::default());
    use std::sync::atomic::Ordering::Relaxed;
    let r = l.admit("t", &est(100, 100)).unwrap();
    r.expire();
    r.expire();
    let t = l.tenant("t");
    assert_eq!(
        (t.expired.load(Relaxed), t.charged_tokens.load(Relaxed)),
        (1, 200)
    );
    r.commit(
        Usage {
            prompt: 100,
            cached: 0,
            completion: 5,
        },
        0.0,
    );
    assert_eq!(
        (
            t.expired.load(Relaxed),
            t.committed.load(Relaxed),
            t.late_commits.load(Relaxed),
            t.dropped.load(Relaxed)
        ),
        (0, 1, 1, 0)
    );
    assert_eq!(t.charged_tokens.load(Relaxed), 105);
}
