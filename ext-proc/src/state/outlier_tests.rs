//! Tests of outlier ejection (`outlier.rs`).

use super::*;

fn fleet(n: usize, slow: &[usize], now: Instant) -> Vec<ReplicaOutlier> {
    (0..n)
        .map(|i| {
            let mut r = ReplicaOutlier::default();
            let ttft = if slow.contains(&i) { 500.0 } else { 100.0 };
            for k in 0..20 {
                r.record(
                    now - Duration::from_millis(k * 10),
                    true,
                    Some(ttft),
                    Some(744),
                    ttft + 100.0,
                    11,
                );
            }
            r
        })
        .collect()
}

#[test]
fn a_first_token_that_waited_for_an_adapter_does_not_judge_the_replica() {
    let now = Instant::now();
    let cfg = OutlierConfig::default();
    // Replica 1's first tokens are five times slower per token of work...
    assert_eq!(
        evaluate(&mut fleet(4, &[1], now), &[true; 4], &cfg, false, now).len(),
        1
    );
    // ...but they waited for adapter loads (no work given): not judged.
    let mut f = fleet(4, &[], now);
    f[1] = ReplicaOutlier::default();
    for k in 0..20 {
        f[1].record(
            now - Duration::from_millis(k * 10),
            true,
            Some(500.0),
            None,
            600.0,
            11,
        );
    }
    assert!(evaluate(&mut f, &[true; 4], &cfg, false, now).is_empty());
}

#[test]
fn a_few_ms_over_a_fast_median_is_noise_not_an_outlier() {
    let now = Instant::now();
    // Replicas answering in 2 ms per 1000 tokens (and per output token),
    // one at 6: three times the median, 4 ms over it.
    let fleet = || -> Vec<ReplicaOutlier> {
        (0..4)
            .map(|i| {
                let mut r = ReplicaOutlier::default();
                let ms = if i == 2 { 6.0 } else { 2.0 };
                for k in 0..20 {
                    r.record(
                        now - Duration::from_millis(k),
                        true,
                        Some(ms),
                        Some(1000),
                        ms * 11.0,
                        11,
                    );
                }
                r
            })
            .collect()
    };
    let cfg = OutlierConfig::default();
    assert!(evaluate(&mut fleet(), &[true; 4], &cfg, false, now).is_empty());
    let no_gap = OutlierConfig {
        min_latency_gap_ms: 0.0,
        ..OutlierConfig::default()
    };
    assert_eq!(
        evaluate(&mut fleet(), &[true; 4], &no_gap, false, now).len(),
        1
    );
}

#[test]
fn the_slow_replica_is_ejected_with_backoff() {
    let now = Instant::now();
    let cfg = OutlierConfig::default();
    let mut f = fleet(4, &[2], now);
    let out = evaluate(&mut f, &[true; 4], &cfg, false, now);
    assert_eq!(out, vec![(2, Duration::from_secs(10))]);
    assert!(f[2].is_ejected(now));
    assert!(!f[2].is_ejected(now + Duration::from_secs(11)));
    // Ejected again on return: twice as long.
    let later = now + Duration::from_secs(11);
    for k in 0..20 {
        f[2].record(
            later - Duration::from_millis(k),
            true,
            Some(500.0),
            Some(744),
            600.0,
            11,
        );
        for i in [0, 1, 3] {
            f[i].record(
                later - Duration::from_millis(k),
                true,
                Some(100.0),
                Some(744),
                200.0,
                11,
            );
        }
    }
    assert_eq!(
        evaluate(&mut f, &[true; 4], &cfg, false, later),
        vec![(2, Duration::from_secs(20))]
    );
}

#[test]
fn never_more_than_the_share_and_never_without_company() {
    let now = Instant::now();
    let cfg = OutlierConfig {
        max_ejected_share: 0.25,
        ..Default::default()
    };
    let mut f = fleet(8, &[1, 5, 6], now);
    assert_eq!(evaluate(&mut f, &[true; 8], &cfg, false, now).len(), 2);
    let mut two = fleet(2, &[1], now);
    assert!(evaluate(&mut two, &[true; 2], &OutlierConfig::default(), true, now).is_empty());
}

#[test]
fn error_rates_need_a_real_gap() {
    let now = Instant::now();
    let cfg = OutlierConfig::default();
    let mut f = fleet(4, &[], now);
    // 1 error in 21 is 5%: more than 2x a 0% median, but under the gap.
    f[0].record(now, false, None, Some(0), 1.0, 0);
    assert!(evaluate(&mut f, &[true; 4], &cfg, false, now).is_empty());
    for _ in 0..10 {
        f[0].record(now, false, None, Some(0), 1.0, 0);
    }
    assert_eq!(evaluate(&mut f, &[true; 4], &cfg, false, now).len(), 1);
}

/// `n` replicas with 20 outcomes each; replica `i` fails `fails[i]` of them.
fn failing(n: usize, fails: &[usize], now: Instant) -> Vec<ReplicaOutlier> {
    (0..n)
        .map(|i| {
            let mut r = ReplicaOutlier::default();
            for k in 0..20 {
                let ok = k >= fails.get(i).copied().unwrap_or(0);
                r.record(now, ok, None, Some(0), 10.0, 0);
            }
            r
        })
        .collect()
}

#[test]
fn a_failing_replica_leaves_a_two_replica_fleet() {
    let now = Instant::now();
    let cfg = OutlierConfig::default();
    // 60% of its streams end early; the other replica is fine.
    let mut two = failing(2, &[0, 12], now);
    assert_eq!(
        evaluate(&mut two, &[true; 2], &cfg, false, now),
        vec![(1, Duration::from_secs(10))]
    );
    // Under the threshold: kept (no median to compare with).
    let mut mild = failing(2, &[0, 8], now);
    assert!(evaluate(&mut mild, &[true; 2], &cfg, false, now).is_empty());
    // Too few outcomes yet.
    let mut young = failing(2, &[0, 0], now);
    young[1] = ReplicaOutlier::default();
    for _ in 0..cfg.min_samples - 1 {
        young[1].record(now, false, None, Some(0), 10.0, 0);
    }
    assert!(evaluate(&mut young, &[true; 2], &cfg, false, now).is_empty());
}

#[test]
fn a_single_replica_leaves_only_when_its_traffic_can_fail_over() {
    let now = Instant::now();
    let cfg = OutlierConfig::default();
    let mut one = failing(1, &[20], now);
    assert!(evaluate(&mut one, &[true], &cfg, false, now).is_empty());
    assert_eq!(evaluate(&mut one, &[true], &cfg, true, now).len(), 1);
    // A share of 0 turns ejection off, failover or not.
    let off = OutlierConfig {
        max_ejected_share: 0.0,
        ..Default::default()
    };
    let mut one = failing(1, &[20], now);
    assert!(evaluate(&mut one, &[true], &off, true, now).is_empty());
}

#[test]
fn a_fleet_wide_failure_ejects_no_one_but_two_broken_of_four_leave() {
    let now = Instant::now();
    let cfg = OutlierConfig::default();
    let mut all = failing(4, &[12, 12, 13, 12], now);
    assert!(evaluate(&mut all, &[true; 4], &cfg, false, now).is_empty());
    // With somewhere for its traffic to go, the failing fleet leaves
    // whole, past its share; a sound replica of it stays.
    let mut all = failing(4, &[12, 12, 13, 0], now);
    let mut out: Vec<usize> = evaluate(&mut all, &[true; 4], &cfg, true, now)
        .into_iter()
        .map(|(i, _)| i)
        .collect();
    out.sort_unstable();
    assert_eq!(out, vec![0, 1, 2]);
    // The median of two broken and two sound replicas is 50%: relative
    // ejection alone would keep both broken ones.
    let mut half = failing(4, &[0, 20, 0, 20], now);
    let mut out: Vec<usize> = evaluate(&mut half, &[true; 4], &cfg, false, now)
        .into_iter()
        .map(|(i, _)| i)
        .collect();
    out.sort_unstable();
    assert_eq!(out, vec![1, 3]);
}

#[test]
fn a_replica_back_from_ejection_is_judged_on_a_few_outcomes() {
    let now = Instant::now();
    let cfg = OutlierConfig::default();
    let mut two = failing(2, &[0, 20], now);
    assert_eq!(evaluate(&mut two, &[true; 2], &cfg, false, now).len(), 1);
    let back = now + Duration::from_secs(11);
    for _ in 0..PROBATION_SAMPLES {
        two[1].record(back, false, None, Some(0), 10.0, 0);
    }
    two[0].record(back, true, None, Some(0), 10.0, 0);
    assert_eq!(
        evaluate(&mut two, &[true; 2], &cfg, false, back),
        vec![(1, Duration::from_secs(20))]
    );
}
