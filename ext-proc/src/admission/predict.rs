//! A request's predicted time to first token, from the prefill queued on a
//! replica and the fleet's measured prefill rate: `state::figures` keeps
//! ms of time to first token per 1000 prefill tokens (the request's own
//! uncached tokens plus those queued ahead, plus a fixed overhead), so the
//! prediction is that figure times this request's work.

use crate::config::{Priority, StageAdmission};
use crate::state::figures::OVERHEAD_TOKENS;

/// ms per 1000 prefill tokens assumed before a fleet has been measured (the
/// load leases assume the same).
pub const DEFAULT_MS_PER_K: f64 = 200.0;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Prediction {
    /// This request's own prefill, on an idle replica.
    pub own_ms: f64,
    /// On the chosen replica, behind what is queued there.
    pub ttft_ms: f64,
    /// On the stage's least loaded ready replica.
    pub best_ms: f64,
    /// The rate used, ms per 1000 prefill tokens.
    pub ms_per_k: f64,
}

impl Prediction {
    /// `latency`: the chosen fleet's figure, if measured.
    pub fn new(latency: Option<f64>, uncached: u64, queued: u64, min_queued: u64) -> Prediction {
        let ms_per_k = latency
            .filter(|v| v.is_finite() && *v > 0.0)
            .unwrap_or(DEFAULT_MS_PER_K);
        let ms = |tokens: u64| (tokens as f64 + OVERHEAD_TOKENS) * ms_per_k / 1000.0;
        Prediction {
            own_ms: ms(uncached),
            ttft_ms: ms(uncached.saturating_add(queued)),
            best_ms: ms(uncached.saturating_add(min_queued.min(queued))),
            ms_per_k,
        }
    }

    /// How long `tokens` of prefill take on one replica.
    pub fn ms_for(&self, tokens: u64) -> f64 {
        tokens as f64 * self.ms_per_k / 1000.0
    }
}

/// The objective a request is held to: its class's, or — for a prompt whose
/// own prefill nearly fills it — its own prefill plus half the objective, so
/// a long prompt may still queue a little and is not refused on every busy
/// replica.
pub fn effective_objective(objective_ms: f64, own_ms: f64) -> f64 {
    objective_ms.max(own_ms + objective_ms / 2.0)
}

/// How long after its last request a class still has the headroom it keeps
/// in the classes below it.
pub const ACTIVE_FOR: std::time::Duration = std::time::Duration::from_secs(10);

/// The predicted time to first token a replica may reach when it takes a
/// request of class `c`: `(1 − headroom)` × the tightest objective of a
/// higher class that sent requests within [`ACTIVE_FOR`] (`active`, by
/// rank), so that class still meets its own when its next request arrives.
/// `None` when no such class has an objective.
pub fn headroom_limit(cfg: &StageAdmission, c: Priority, active: [bool; 3]) -> Option<f64> {
    Priority::ALL[..c.rank()]
        .iter()
        .filter(|h| active[h.rank()])
        .filter_map(|&h| cfg.ttft_ms.get(h))
        .min_by(f64::total_cmp)
        .map(|o| (1.0 - cfg.headroom) * o)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ClassObjectives;

    #[test]
    fn prediction_follows_the_figure() {
        // 100 ms per 1000 tokens: 2000 uncached behind 8000 queued.
        let p = Prediction::new(Some(100.0), 2000, 8000, 1000);
        assert!((p.own_ms - 225.6).abs() < 1e-9);
        assert!((p.ttft_ms - 1025.6).abs() < 1e-9);
        assert!((p.best_ms - 325.6).abs() < 1e-9);
        // Unmeasured, or a bad figure: the default rate.
        let p = Prediction::new(None, 744, 0, 0);
        assert!((p.ttft_ms - 200.0).abs() < 1e-9);
        assert_eq!(Prediction::new(Some(f64::NAN), 744, 0, 0), p);
        // The best replica is never worse than the chosen one.
        let p = Prediction::new(Some(100.0), 0, 10, 500);
        assert!(p.best_ms <= p.ttft_ms);
    }

    #[test]
    fn long_prompts_and_headroom() {
        assert_eq!(effective_objective(1000.0, 100.0), 1000.0);
        assert_eq!(effective_objective(1000.0, 900.0), 1400.0);
        let cfg = StageAdmission {
            ttft_ms: ClassObjectives {
                critical: Some(1000.0),
                standard: Some(4000.0),
                sheddable: None,
            },
            ..Default::default()
        };
        let all = [true; 3];
        assert_eq!(headroom_limit(&cfg, Priority::Critical, all), None);
        assert_eq!(headroom_limit(&cfg, Priority::Standard, all), Some(500.0));
        assert_eq!(headroom_limit(&cfg, Priority::Sheddable, all), Some(500.0));
        // Critical idle: sheddable keeps headroom for standard only.
        let quiet = [false, true, true];
        assert_eq!(headroom_limit(&cfg, Priority::Standard, quiet), None);
        assert_eq!(
            headroom_limit(&cfg, Priority::Sheddable, quiet),
            Some(2000.0)
        );
        let only_standard = StageAdmission {
            ttft_ms: ClassObjectives {
                standard: Some(4000.0),
                ..Default::default()
            },
            headroom: 0.25,
            ..Default::default()
        };
        assert_eq!(
            headroom_limit(&only_standard, Priority::Standard, all),
            None
        );
        assert_eq!(
            headroom_limit(&only_standard, Priority::Sheddable, all),
            Some(3000.0)
        );
    }
}
