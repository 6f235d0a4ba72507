//! Outlier ejection by fleet median: identical replicas under identical
//! traffic should show identical numbers, so a replica whose error rate or
//! normalised latency exceeds its fleet's median by a factor is ejected for
//! a while, with exponential backoff, and never more than a share of the
//! fleet at once.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::figures::per_k_tokens;
use crate::config::OutlierConfig;

const MAX_SAMPLES: usize = 512;

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
        work: u64,
        total_ms: f64,
        output_tokens: u64,
    ) {
        let ttft_norm = ttft_ms.map(|t| per_k_tokens(t, work));
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
pub fn evaluate(
    replicas: &mut [ReplicaOutlier],
    eligible: &[bool],
    cfg: &OutlierConfig,
    now: Instant,
) -> Vec<(usize, Duration)> {
    let stats: Vec<ReplicaStats> = replicas
        .iter_mut()
        .map(|r| r.stats(now, Duration::from_secs(cfg.window_s)))
        .collect();
    let judged: Vec<usize> = (0..replicas.len())
        .filter(|&i| {
            eligible[i]
                && !replicas[i].is_ejected(now)
                && stats[i].samples >= cfg.min_samples as usize
        })
        .collect();
    // A median needs company: with fewer than three comparable replicas one
    // slow replica is half the evidence.
    if judged.len() < 3 {
        return Vec::new();
    }
    let med = |f: &dyn Fn(&ReplicaStats) -> Option<f64>| {
        median(judged.iter().filter_map(|&i| f(&stats[i])).collect())
    };
    let err_med = med(&|s| Some(s.error_rate)).unwrap_or(0.0);
    let ttft_med = med(&|s| s.ttft_norm);
    let tok_med = med(&|s| s.per_token);
    let worse = |v: Option<f64>, m: Option<f64>| matches!((v, m), (Some(v), Some(m)) if m > 0.0 && v > m * cfg.factor);
    let mut outliers: Vec<(usize, f64)> = judged
        .iter()
        .filter_map(|&i| {
            let s = &stats[i];
            let bad_err = s.error_rate > err_med * cfg.factor
                && s.error_rate - err_med >= cfg.min_error_rate_gap;
            let bad = bad_err || worse(s.ttft_norm, ttft_med) || worse(s.per_token, tok_med);
            // Worst first, so a capped ejection takes the worst replicas.
            let severity = s.error_rate + s.ttft_norm.zip(ttft_med).map_or(0.0, |(v, m)| v / m);
            bad.then_some((i, severity))
        })
        .collect();
    outliers.sort_by(|a, b| b.1.total_cmp(&a.1));
    let already = replicas.iter().filter(|r| r.is_ejected(now)).count();
    let cap = ((replicas.len() as f64) * cfg.max_ejected_share).floor() as usize;
    outliers
        .into_iter()
        .take(cap.saturating_sub(already))
        .map(|(i, _)| (i, replicas[i].eject(now, cfg)))
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
                        744,
                        ttft + 100.0,
                        11,
                    );
                }
                r
            })
            .collect()
    }

    #[test]
    fn the_slow_replica_is_ejected_with_backoff() {
        let now = Instant::now();
        let cfg = OutlierConfig::default();
        let mut f = fleet(4, &[2], now);
        let out = evaluate(&mut f, &[true; 4], &cfg, now);
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
                744,
                600.0,
                11,
            );
            for i in [0, 1, 3] {
                f[i].record(
                    later - Duration::from_millis(k),
                    true,
                    Some(100.0),
                    744,
                    200.0,
                    11,
                );
            }
        }
        assert_eq!(
            evaluate(&mut f, &[true; 4], &cfg, later),
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
        assert_eq!(evaluate(&mut f, &[true; 8], &cfg, now).len(), 2);
        let mut two = fleet(2, &[1], now);
        assert!(evaluate(&mut two, &[true; 2], &OutlierConfig::default(), now).is_empty());
    }

    #[test]
    fn error_rates_need_a_real_gap() {
        let now = Instant::now();
        let cfg = OutlierConfig::default();
        let mut f = fleet(4, &[], now);
        // 1 error in 21 is 5%: more than 2x a 0% median, but under the gap.
        f[0].record(now, false, None, 0, 1.0, 0);
        assert!(evaluate(&mut f, &[true; 4], &cfg, now).is_empty());
        for _ in 0..10 {
            f[0].record(now, false, None, 0, 1.0, 0);
        }
        assert_eq!(evaluate(&mut f, &[true; 4], &cfg, now).len(), 1);
    }
}
