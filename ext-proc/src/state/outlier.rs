//! Outlier ejection by fleet median: identical replicas under identical
//! traffic should show identical numbers, so a replica whose error rate or
//! normalised latency exceeds its fleet's median by a factor is ejected for
//! a while, with exponential backoff, and never more than a share of the
//! fleet at once. A median needs three comparable replicas; below that (and
//! for replicas that fail most of what they serve) an absolute error rate
//! decides, so one- and two-replica fleets are protected too.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::figures::per_k_tokens;
use crate::config::OutlierConfig;

const MAX_SAMPLES: usize = 512;
/// Outcomes that judge a replica back from an ejection (until a long clean
/// spell clears its strikes): a replica that is still broken fails a few
/// requests on return, not another `min_samples`.
const PROBATION_SAMPLES: usize = 3;

#[derive(Clone, Copy, Debug)]
struct Sample {
    at: Instant,
    ok: bool,
    /// ms per 1000 uncached (+ overhead) prompt tokens, streamed successes.
    ttft_norm: Option<f64>,
    /// ms per output token after the first, streamed successes.
    per_token: Option<f64>,
}

#[derive(Debug, Default)]
pub struct ReplicaOutlier {
    samples: VecDeque<Sample>,
    ejected_until: Option<Instant>,
    /// Ejections in a row (reset after a long clean spell): the backoff exponent.
    strikes: u32,
    last_ejected: Option<Instant>,
}

/// A replica's figures over the window.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ReplicaStats {
    pub samples: usize,
    pub error_rate: f64,
    pub ttft_norm: Option<f64>,
    pub per_token: Option<f64>,
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    })
}

impl ReplicaOutlier {
    pub fn record(
        &mut self,
        now: Instant,
        ok: bool,
        ttft_ms: Option<f64>,
        work: Option<u64>,
        total_ms: f64,
        output_tokens: u64,
    ) {
        // No work: the first token waited on something else than this
        // replica's speed (an adapter's load), only the decode is judged.
        let ttft_norm = ttft_ms.zip(work).map(|(t, w)| per_k_tokens(t, w));
        let per_token = ttft_ms
            .filter(|_| output_tokens > 1)
            .map(|t| (total_ms - t).max(0.0) / (output_tokens - 1) as f64);
        if self.samples.len() == MAX_SAMPLES {
            self.samples.pop_front();
        }
        self.samples.push_back(Sample {
            at: now,
            ok,
            ttft_norm,
            per_token,
        });
    }

    pub fn is_ejected(&self, now: Instant) -> bool {
        self.ejected_until.is_some_and(|u| now < u)
    }

    pub fn stats(&mut self, now: Instant, window: Duration) -> ReplicaStats {
        while self
            .samples
            .front()
            .is_some_and(|s| now.duration_since(s.at) > window)
        {
            self.samples.pop_front();
        }
        let n = self.samples.len();
        ReplicaStats {
            samples: n,
            error_rate: if n == 0 {
                0.0
            } else {
                self.samples.iter().filter(|s| !s.ok).count() as f64 / n as f64
            },
            ttft_norm: median(self.samples.iter().filter_map(|s| s.ttft_norm).collect()),
            per_token: median(self.samples.iter().filter_map(|s| s.per_token).collect()),
        }
    }

    fn eject(&mut self, now: Instant, cfg: &OutlierConfig) -> Duration {
        if self
            .last_ejected
            .is_some_and(|t| now.duration_since(t) > Duration::from_secs(cfg.max_ejection_s * 2))
        {
            self.strikes = 0;
        }
        let secs = cfg
            .base_ejection_s
            .saturating_mul(1u64 << self.strikes.min(16))
            .min(cfg.max_ejection_s);
        self.strikes += 1;
        self.last_ejected = Some(now);
        self.ejected_until = Some(now + Duration::from_secs(secs));
        // Its old samples would eject it again the moment it returns.
        self.samples.clear();
        Duration::from_secs(secs)
    }
}

/// One evaluation of a fleet: which replicas to eject now. `eligible[i]` is
/// false for replicas that are out of rotation for other reasons.
/// `failover` says the fleet's stages have another fleet (or a fallback
/// stage) with a ready replica: then a fleet whose `max_ejected_share`
/// rounds to no replica (a one-replica fleet) may still lose one, and every
/// replica failing at least `max_error_rate` of what it serves leaves, past
/// the share and even when the whole fleet fails alike: its traffic has
/// somewhere to go.
pub fn evaluate(
    replicas: &mut [ReplicaOutlier],
    eligible: &[bool],
    cfg: &OutlierConfig,
    failover: bool,
    now: Instant,
) -> Vec<(usize, Duration)> {
    let stats: Vec<ReplicaStats> = replicas
        .iter_mut()
        .map(|r| r.stats(now, Duration::from_secs(cfg.window_s)))
        .collect();
    let live = |i: usize| eligible[i] && !replicas[i].is_ejected(now);
    let judged: Vec<usize> = (0..replicas.len())
        .filter(|&i| live(i) && stats[i].samples >= cfg.min_samples as usize)
        .collect();
    // A median needs company: with fewer than three comparable replicas one
    // slow replica is half the evidence.
    let relative = judged.len() >= 3;
    let med = |f: &dyn Fn(&ReplicaStats) -> Option<f64>| {
        median(judged.iter().filter_map(|&i| f(&stats[i])).collect())
    };
    let err_med = med(&|s| Some(s.error_rate)).unwrap_or(0.0);
    let ttft_med = med(&|s| s.ttft_norm);
    let tok_med = med(&|s| s.per_token);
    let worse = |v: Option<f64>, m: Option<f64>| {
        matches!((v, m), (Some(v), Some(m))
            if m > 0.0 && v > m * cfg.factor && v - m >= cfg.min_latency_gap_ms)
    };
    let mut outliers: Vec<(usize, f64, bool)> = (0..replicas.len())
        .filter(|&i| live(i))
        .filter_map(|i| {
            let s = &stats[i];
            let enough = s.samples >= cfg.min_samples as usize
                || (replicas[i].strikes > 0 && s.samples >= PROBATION_SAMPLES);
            if !enough {
                return None;
            }
            let gap = s.error_rate - err_med >= cfg.min_error_rate_gap;
            // Absolute: fails most of what it serves. With company it must
            // also stand out, so a fleet-wide failure ejects no one.
            let failing = s.error_rate >= cfg.max_error_rate && (!relative || gap || failover);
            let bad = failing
                || (relative
                    && judged.contains(&i)
                    && ((s.error_rate > err_med * cfg.factor && gap)
                        || worse(s.ttft_norm, ttft_med)
                        || worse(s.per_token, tok_med)));
            // Worst first, so a capped ejection takes the worst replicas.
            let severity = s.error_rate + s.ttft_norm.zip(ttft_med).map_or(0.0, |(v, m)| v / m);
            bad.then_some((i, severity, failing))
        })
        .collect();
    outliers.sort_by(|a, b| b.1.total_cmp(&a.1));
    let already = replicas.iter().filter(|r| r.is_ejected(now)).count();
    let mut cap = ((replicas.len() as f64) * cfg.max_ejected_share).floor() as usize;
    let on = cfg.max_ejected_share > 0.0;
    if cap == 0 && on && failover {
        cap = 1;
    }
    let room = cap.saturating_sub(already);
    outliers
        .into_iter()
        .enumerate()
        .filter(|&(k, (_, _, failing))| k < room || (on && failover && failing))
        .map(|(_, (i, _, _))| (i, replicas[i].eject(now, cfg)))
        .collect()
}

#[cfg(test)]
mod tests {
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
}
