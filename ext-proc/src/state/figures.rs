//! Per-fleet figures from observed responses: how fast it answers now, its
//! p95 time to first token and error rate over a window, its throughput and
//! its cost per million tokens.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::config::{AlarmsConfig, CostConfig};

/// Prompt tokens that cost as much as a request's fixed overhead: time to
/// first token is normalised by (uncached tokens + this).
pub const OVERHEAD_TOKENS: f64 = 256.0;
/// Weight of a new sample in the decaying latency average.
const EWMA_ALPHA: f64 = 0.2;
const MAX_SAMPLES: usize = 4096;

#[derive(Clone, Copy, Debug)]
struct Sample {
    at: Instant,
    ok: bool,
    ttft_ms: Option<f64>,
    tokens: u64,
}

/// What the writer keeps per fleet.
#[derive(Debug, Default)]
pub struct FleetWindow {
    samples: VecDeque<Sample>,
    /// Decaying average of normalised TTFT, ms per 1000 effective tokens.
    latency: Option<f64>,
    /// The first sample ever: throughput is averaged over the whole window
    /// once the fleet has been observed that long.
    first: Option<Instant>,
}

/// What the decision path reads per fleet.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct FleetFigures {
    /// ms of time to first token per 1000 uncached (+ overhead) tokens.
    pub latency: Option<f64>,
    pub ttft_p95_ms: Option<f64>,
    pub error_rate: f64,
    pub samples: u32,
    pub tokens_per_sec: f64,
    pub usd_per_mtok: Option<f64>,
}

impl FleetFigures {
    /// Whether the fleet meets the stage's alarms (too few samples count as
    /// meeting them: nothing is known against it yet).
    pub fn meets(&self, alarms: &AlarmsConfig) -> bool {
        if self.samples < alarms.min_samples {
            return true;
        }
        let ttft_ok = match (alarms.ttft_p95_ms, self.ttft_p95_ms) {
            (Some(limit), Some(p95)) => p95 <= limit,
            _ => true,
        };
        let err_ok = alarms
            .error_rate
            .is_none_or(|limit| self.error_rate <= limit);
        ttft_ok && err_ok
    }
}

/// Time to first token per 1000 tokens of prefill work (the request's own
/// uncached tokens plus those queued ahead of it, plus the fixed overhead).
pub fn per_k_tokens(ttft_ms: f64, work_tokens: u64) -> f64 {
    ttft_ms / ((work_tokens as f64 + OVERHEAD_TOKENS) / 1000.0)
}

impl FleetWindow {
    /// One finished request. `ttft_ms` only for streamed successes, where the
    /// first byte is the first token; `work` prefill tokens it waited for.
    pub fn record(&mut self, now: Instant, ok: bool, ttft_ms: Option<f64>, work: u64, tokens: u64) {
        if let Some(t) = ttft_ms {
            let norm = per_k_tokens(t, work);
            self.latency = Some(match self.latency {
                Some(l) => l + EWMA_ALPHA * (norm - l),
                None => norm,
            });
        }
        if self.samples.len() == MAX_SAMPLES {
            self.samples.pop_front();
        }
        self.first.get_or_insert(now);
        self.samples.push_back(Sample {
            at: now,
            ok,
            ttft_ms,
            tokens,
        });
    }

    fn trim(&mut self, now: Instant, window: Duration) {
        while self
            .samples
            .front()
            .is_some_and(|s| now.duration_since(s.at) > window)
        {
            self.samples.pop_front();
        }
    }

    pub fn figures(
        &mut self,
        now: Instant,
        window: Duration,
        ready_replicas: usize,
        cost: Option<&CostConfig>,
    ) -> FleetFigures {
        self.trim(now, window);
        let n = self.samples.len();
        let errors = self.samples.iter().filter(|s| !s.ok).count();
        let mut ttfts: Vec<f64> = self.samples.iter().filter_map(|s| s.ttft_ms).collect();
        ttfts.sort_by(f64::total_cmp);
        let p95 = (!ttfts.is_empty()).then(|| {
            ttfts[((ttfts.len() as f64 * 0.95).ceil() as usize).clamp(1, ttfts.len()) - 1]
        });
        // A fixed span (the window, or the time since the first sample if
        // shorter): throughput falls to 0 as an idle fleet's samples age out,
        // instead of rising as the span shrinks with them.
        let span = self.first.map_or(window, |f| {
            now.saturating_duration_since(f)
                .max(Duration::from_secs(1))
                .min(window)
        });
        let tokens: u64 = self.samples.iter().map(|s| s.tokens).sum();
        let tokens_per_sec = tokens as f64 / span.as_secs_f64();
        FleetFigures {
            latency: self.latency,
            ttft_p95_ms: p95,
            error_rate: if n == 0 {
                0.0
            } else {
                errors as f64 / n as f64
            },
            samples: n as u32,
            tokens_per_sec,
            usd_per_mtok: cost.and_then(|c| usd_per_mtok(c, tokens_per_sec, ready_replicas)),
        }
    }
}

/// A provider price as configured, else the GPU-hour price over the tokens a
/// replica serves: the measured rate, or the configured `tokens_per_sec` when
/// that is higher (a lightly used fleet is not dearer per token than its
/// capacity makes it; without the estimate an idle fleet has no price).
pub fn usd_per_mtok(cost: &CostConfig, fleet_tokens_per_sec: f64, ready: usize) -> Option<f64> {
    if let Some(p) = cost.usd_per_million_tokens {
        return Some(p);
    }
    let replica_hour = cost.gpu_hour_usd? * f64::from(cost.gpus_per_replica.unwrap_or(1));
    let measured =
        (ready > 0 && fleet_tokens_per_sec > 0.0).then(|| fleet_tokens_per_sec / ready as f64);
    let tps = match (measured, cost.tokens_per_sec) {
        (Some(m), Some(c)) => m.max(c),
        (m, c) => m.or(c)?,
    };
    Some(replica_hour / (tps * 3600.0) * 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_figures_and_alarms() {
        let t0 = Instant::now();
        let mut w = FleetWindow::default();
        for i in 0..100u64 {
            let ttft = if i < 90 { 100.0 } else { 1000.0 };
            w.record(
                t0 + Duration::from_millis(i * 10),
                i % 10 != 0,
                Some(ttft),
                744,
                10,
            );
        }
        let f = w.figures(
            t0 + Duration::from_secs(1),
            Duration::from_secs(60),
            2,
            None,
        );
        assert_eq!(f.samples, 100);
        assert!((f.error_rate - 0.1).abs() < 1e-9);
        assert_eq!(f.ttft_p95_ms, Some(1000.0));
        assert!((f.tokens_per_sec - 1000.0).abs() < 1e-6);
        let strict = AlarmsConfig {
            ttft_p95_ms: Some(500.0),
            ..Default::default()
        };
        assert!(!f.meets(&strict));
        assert!(f.meets(&AlarmsConfig {
            ttft_p95_ms: Some(2000.0),
            ..Default::default()
        }));
        // Samples leave the window.
        let later = w.figures(
            t0 + Duration::from_secs(120),
            Duration::from_secs(60),
            2,
            None,
        );
        assert_eq!(later.samples, 0);
        assert_eq!(later.tokens_per_sec, 0.0, "an idle fleet serves nothing");
        assert!(later.meets(&strict), "no samples, nothing against it");
    }

    #[test]
    fn cost_per_million_tokens() {
        let gpu = CostConfig {
            gpu_hour_usd: Some(2.0),
            gpus_per_replica: Some(8),
            tokens_per_sec: Some(1000.0),
            ..Default::default()
        };
        // $16/h over 3.6M tokens/h.
        assert!((usd_per_mtok(&gpu, 0.0, 2).unwrap() - 16.0 / 3.6).abs() < 1e-9);
        // Measured 4000 tok/s over 2 replicas = 2000 per replica.
        assert!((usd_per_mtok(&gpu, 4000.0, 2).unwrap() - 16.0 / 7.2).abs() < 1e-9);
        // Lightly used (500 per replica): priced at its capacity, not dearer.
        assert!((usd_per_mtok(&gpu, 1000.0, 2).unwrap() - 16.0 / 3.6).abs() < 1e-9);
        let measured_only = CostConfig {
            tokens_per_sec: None,
            ..gpu.clone()
        };
        assert_eq!(
            usd_per_mtok(&measured_only, 0.0, 2),
            None,
            "idle, no estimate: unknown"
        );
        let provider = CostConfig {
            usd_per_million_tokens: Some(0.5),
            ..gpu
        };
        assert_eq!(usd_per_mtok(&provider, 4000.0, 2), Some(0.5));
    }
}
