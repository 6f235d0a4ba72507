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
#[path = "outlier_tests.rs"]
mod tests;
