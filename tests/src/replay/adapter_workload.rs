//! A seeded workload of LoRA adapter requests: one base model, `adapters`
//! adapters with Zipf(`zipf`) popularity, Poisson arrivals at `rate`, and
//! (optionally) popularity that moves every `shift_every_s`: the ranks are
//! dealt to adapters afresh, so yesterday's tail is today's head. Each
//! request opens with its adapter's own system prompt (two blocks: an
//! application per adapter), then a user message of its own; single turns.
//! Lines are the Mooncake format plus `system_blocks` and `adapter`.

use serde_json::json;

use super::workload::Rng;

#[derive(Clone, Copy, Debug)]
pub struct AdapterParams {
    pub seed: u64,
    pub requests: usize,
    /// Requests per second.
    pub rate: f64,
    pub adapters: usize,
    pub zipf: f64,
    /// Popularity is dealt afresh this often; none: never.
    pub shift_every_s: Option<f64>,
    pub block_tokens: u64,
}

/// Blocks of each adapter's system prompt.
pub const SYSTEM_BLOCKS: u64 = 2;

/// The adapter's name as clients send it.
pub fn name(i: usize) -> String {
    format!("adapter-{i}")
}

/// The trace as JSON lines, in arrival order.
pub fn generate(p: &AdapterParams) -> String {
    let n = p.adapters.max(1);
    let mut rng = Rng::new(p.seed);
    // Zipf over ranks 1..=n, as a cumulative table.
    let weights: Vec<f64> = (1..=n).map(|k| 1.0 / (k as f64).powf(p.zipf)).collect();
    let total: f64 = weights.iter().sum();
    let mut cdf = Vec::with_capacity(n);
    let mut acc = 0.0;
    for w in &weights {
        acc += w / total;
        cdf.push(acc);
    }
    let mut deal: Vec<usize> = (0..n).collect();
    let mut epoch = 0u64;
    // Fresh block ids start past every system prompt's.
    let mut next_id = n as u64 * SYSTEM_BLOCKS;
    let mut out = String::new();
    let mut at_ms = 0.0;
    for _ in 0..p.requests {
        at_ms += rng.exp(1000.0 / p.rate.max(1e-9));
        if let Some(every) = p.shift_every_s {
            let now = (at_ms / 1000.0 / every) as u64;
            while epoch < now {
                shuffle(&mut deal, &mut rng);
                epoch += 1;
            }
        }
        let u = rng.unit();
        let rank = cdf.partition_point(|&c| c < u).min(n - 1);
        let adapter = deal[rank];
        let user_blocks = rng.range(1, 3);
        let mut ids: Vec<u64> = (0..SYSTEM_BLOCKS)
            .map(|j| adapter as u64 * SYSTEM_BLOCKS + j)
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
            "adapter": name(adapter),
        });
        out.push_str(&line.to_string());
        out.push('\n');
    }
    out
}

/// Fisher-Yates.
fn shuffle(v: &mut [usize], rng: &mut Rng) {
    for i in (1..v.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::trace;

    fn params(shift: Option<f64>) -> AdapterParams {
        AdapterParams {
            seed: 3,
            requests: 20_000,
            rate: 100.0,
            adapters: 300,
            zipf: 1.1,
            shift_every_s: shift,
            block_tokens: 16,
        }
    }

    fn counts(text: &str, from_ms: f64, to_ms: f64) -> Vec<usize> {
        let reqs = trace::load(text, 16).unwrap();
        let mut c = vec![0; 300];
        for r in reqs
            .iter()
            .filter(|r| (from_ms..to_ms).contains(&r.arrival_ms))
        {
            let i: usize = r.adapter.as_deref().unwrap()[8..].parse().unwrap();
            c[i] += 1;
        }
        c
    }

    #[test]
    fn zipf_popularity_seeded_and_moving_when_asked() {
        let text = generate(&params(None));
        assert_eq!(text, generate(&params(None)), "seeded");
        let c = counts(&text, 0.0, f64::MAX);
        // Zipf(1.1) over 300: the head takes about a sixth of requests, and
        // the tail still gets some.
        let head = *c.iter().max().unwrap() as f64 / 20_000.0;
        assert!((0.12..0.22).contains(&head), "head share {head}");
        assert!(c.iter().filter(|&&n| n > 0).count() > 200);
        // Shifts every 60 s: the head of the first minute is not the head
        // of the second.
        let text = generate(&params(Some(60.0)));
        let top = |c: Vec<usize>| (0..300).max_by_key(|&i| c[i]).unwrap();
        assert_ne!(
            top(counts(&text, 0.0, 60_000.0)),
            top(counts(&text, 60_000.0, 120_000.0))
        );
    }
}
