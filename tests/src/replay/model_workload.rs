//! A seeded workload of many models on one pool: `models` models with
//! Zipf(`zipf`) demand, arrivals a Poisson process whose rate swings
//! through a day (`rate` × (1 + `swing` × sin), one day every `day_s`
//! seconds, so a trace can hold a compressed day). Each request opens with
//! its model's own system prompt (two blocks), then a user message of its
//! own; single turns. Lines are the Mooncake format plus `system_blocks`
//! and `model`.

use serde_json::json;

use super::workload::Rng;

#[derive(Clone, Copy, Debug)]
pub struct ModelParams {
    pub seed: u64,
    pub requests: usize,
    /// Mean requests per second over a day.
    pub rate: f64,
    pub models: usize,
    pub zipf: f64,
    /// Length of one day, seconds.
    pub day_s: f64,
    /// 0: flat; 0.5: the peak is 1.5× the mean, the trough 0.5×.
    pub swing: f64,
    pub block_tokens: u64,
}

/// Blocks of each model's system prompt.
pub const SYSTEM_BLOCKS: u64 = 2;

/// The model's name as clients send it (and its stage's).
pub fn name(i: usize) -> String {
    format!("model-{i}")
}

/// The request rate at `t_s` seconds into the trace.
pub fn rate_at(p: &ModelParams, t_s: f64) -> f64 {
    let phase = std::f64::consts::TAU * t_s / p.day_s.max(1e-9);
    p.rate * (1.0 + p.swing.clamp(0.0, 1.0) * phase.sin())
}

/// The trace as JSON lines, in arrival order.
pub fn generate(p: &ModelParams) -> String {
    let n = p.models.max(1);
    let mut rng = Rng::new(p.seed);
    let weights: Vec<f64> = (1..=n).map(|k| 1.0 / (k as f64).powf(p.zipf)).collect();
    let total: f64 = weights.iter().sum();
    let mut cdf = Vec::with_capacity(n);
    let mut acc = 0.0;
    for w in &weights {
        acc += w / total;
        cdf.push(acc);
    }
    // Arrivals thinned from the peak rate: a Poisson process at `rate_at`.
    let peak = p.rate.max(1e-9) * (1.0 + p.swing.clamp(0.0, 1.0));
    let mut next_id = n as u64 * SYSTEM_BLOCKS;
    let mut out = String::new();
    let mut at_ms = 0.0;
    let mut made = 0;
    while made < p.requests {
        at_ms += rng.exp(1000.0 / peak);
        if rng.unit() * peak > rate_at(p, at_ms / 1000.0) {
            continue;
        }
        made += 1;
        let u = rng.unit();
        let model = cdf.partition_point(|&c| c < u).min(n - 1);
        let user_blocks = rng.range(1, 3);
        let mut ids: Vec<u64> = (0..SYSTEM_BLOCKS)
            .map(|j| model as u64 * SYSTEM_BLOCKS + j)
            .collect();
        ids.extend(next_id..next_id + user_blocks);
        next_id += user_blocks;
        let input =
            (SYSTEM_BLOCKS + user_blocks) * p.block_tokens + rng.range(0, p.block_tokens - 1);
        let line = json!({
            "timestamp": at_ms.round(),
            "input_length": input,
            "output_length": rng.range(50, 250),
            "hash_ids": ids,
            "system_blocks": SYSTEM_BLOCKS,
            "model": name(model),
        });
        out.push_str(&line.to_string());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::trace;

    #[test]
    fn zipf_demand_that_swings_through_the_day_seeded() {
        let p = ModelParams {
            seed: 4,
            requests: 40_000,
            rate: 20.0,
            models: 20,
            zipf: 1.1,
            day_s: 2000.0,
            swing: 0.5,
            block_tokens: 16,
        };
        let text = generate(&p);
        assert_eq!(text, generate(&p), "seeded");
        let reqs = trace::load(&text, 16).unwrap();
        let mut per_model = [0usize; 20];
        for r in &reqs {
            per_model[r.adapter.as_deref().unwrap()[6..].parse::<usize>().unwrap()] += 1;
        }
        // Zipf(1.1) over 20: the head takes about 30%, the last about 1%.
        let share = |i: usize| per_model[i] as f64 / reqs.len() as f64;
        assert!((0.25..0.36).contains(&share(0)), "head {}", share(0));
        assert!((0.005..0.02).contains(&share(19)), "tail {}", share(19));
        // The busiest quarter of the day (around its peak, at a quarter)
        // sees about three times the quietest (around its trough).
        let in_window = |from: f64| {
            reqs.iter()
                .filter(|r| (from..from + 250_000.0).contains(&r.arrival_ms))
                .count() as f64
        };
        let ratio = in_window(375_000.0) / in_window(1_375_000.0);
        assert!((2.2..4.0).contains(&ratio), "peak/trough {ratio}");
    }
}
