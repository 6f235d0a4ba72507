//! Decaying sums per stage and fleet, for the figures that are shares or
//! ratios over recent traffic: each fleet's share of the stage's requests and
//! the KV-cache hit rate, predicted and engine-reported. Folded on every tick
//! with a ~30 s time constant; bounded by the config's stages × fleets.

use std::collections::HashMap;
use std::time::{Duration, Instant};

const TAU: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug, Default)]
struct Sums {
    routed: f64,
    prompt: f64,
    predicted: f64,
    engine_prompt: f64,
    engine_cached: f64,
}

impl Sums {
    fn scaled(self, k: f64) -> Sums {
        Sums {
            routed: self.routed * k,
            prompt: self.prompt * k,
            predicted: self.predicted * k,
            engine_prompt: self.engine_prompt * k,
            engine_cached: self.engine_cached * k,
        }
    }

    fn plus(self, o: Sums) -> Sums {
        Sums {
            routed: self.routed + o.routed,
            prompt: self.prompt + o.prompt,
            predicted: self.predicted + o.predicted,
            engine_prompt: self.engine_prompt + o.engine_prompt,
            engine_cached: self.engine_cached + o.engine_cached,
        }
    }
}

type Key = (String, String);

#[derive(Debug, Default)]
pub struct Accounting {
    fresh: HashMap<Key, Sums>,
    decayed: HashMap<Key, Sums>,
    last: Option<Instant>,
}

impl Accounting {
    pub fn routed(&mut self, stage: &str, fleet: &str, prompt_tokens: u64, predicted_cached: u64) {
        let s = self
            .fresh
            .entry((stage.to_string(), fleet.to_string()))
            .or_default();
        s.routed += 1.0;
        s.prompt += prompt_tokens as f64;
        s.predicted += predicted_cached as f64;
    }

    pub fn observed(&mut self, stage: &str, fleet: &str, prompt_tokens: u64, cached: u64) {
        let s = self
            .fresh
            .entry((stage.to_string(), fleet.to_string()))
            .or_default();
        s.engine_prompt += prompt_tokens as f64;
        s.engine_cached += cached as f64;
    }

    pub fn fold(&mut self, now: Instant) {
        let k = match self.last {
            Some(t) => {
                (-(now.saturating_duration_since(t).as_secs_f64()) / TAU.as_secs_f64()).exp()
            }
            None => 1.0,
        };
        self.last = Some(now);
        for v in self.decayed.values_mut() {
            *v = v.scaled(k);
        }
        for (key, s) in self.fresh.drain() {
            let d = self.decayed.entry(key).or_default();
            *d = d.plus(s);
        }
    }

    /// Keeps only stage/fleet pairs that still exist.
    pub fn retain(&mut self, keep: impl Fn(&str, &str) -> bool) {
        self.decayed.retain(|(s, f), _| keep(s, f));
        self.fresh.retain(|(s, f), _| keep(s, f));
    }

    /// The fleet's share of the stage's recent requests (0 without traffic).
    pub fn share(&self, stage: &str, fleet: &str) -> f64 {
        let total: f64 = self
            .decayed
            .iter()
            .filter(|((s, _), _)| s == stage)
            .map(|(_, v)| v.routed)
            .sum();
        let mine = self
            .decayed
            .get(&(stage.to_string(), fleet.to_string()))
            .map_or(0.0, |v| v.routed);
        if total > 0.0 { mine / total } else { 0.0 }
    }

    /// (predicted, engine-reported) hit rates; `None` without traffic.
    pub fn hit_rates(&self, stage: &str, fleet: &str) -> (Option<f64>, Option<f64>) {
        let Some(v) = self.decayed.get(&(stage.to_string(), fleet.to_string())) else {
            return (None, None);
        };
        let ratio = |a: f64, b: f64| (b > 0.0).then(|| a / b);
        (
            ratio(v.predicted, v.prompt),
            ratio(v.engine_cached, v.engine_prompt),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_and_hit_rates_decay() {
        let t0 = Instant::now();
        let mut a = Accounting::default();
        for _ in 0..3 {
            a.routed("s", "a", 100, 50);
        }
        a.routed("s", "b", 100, 0);
        a.observed("s", "a", 300, 240);
        a.fold(t0);
        assert!((a.share("s", "a") - 0.75).abs() < 1e-9);
        assert_eq!(a.hit_rates("s", "a"), (Some(0.5), Some(0.8)));
        assert_eq!(a.hit_rates("s", "c"), (None, None));
        // Later traffic only to b: after a long time b has nearly all of it.
        for _ in 0..30 {
            a.routed("s", "b", 1, 0);
        }
        a.fold(t0 + Duration::from_secs(300));
        assert!(a.share("s", "b") > 0.99, "{}", a.share("s", "b"));
        a.retain(|_, f| f == "b");
        assert_eq!(a.share("s", "a"), 0.0);
    }
}
