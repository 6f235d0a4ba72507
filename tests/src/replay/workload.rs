//! Seeded generators of traces in the Mooncake format, for workloads the
//! shipped trace does not stress:
//!
//! - `chat`: multi-turn conversations that all open with one long shared
//!   system prompt; each turn resends the conversation so far plus the answer
//!   and a new user message.
//! - `agent`: sessions that open with one of a few long tool prefixes
//!   (popularity skewed), then a short task, then many short turns in quick
//!   succession.
//!
//! Each line carries `system_blocks`: how many leading blocks are the system
//! prompt (the prompt builder puts them in the system message; the next
//! block is the first user message), so the content key that the filter
//! derives (system plus first user message) is known to the replay too.
//! The same seed gives the same trace, byte for byte.

/// A small deterministic generator (SplitMix64): no dependency, stable
/// across versions, which a documented seed needs.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in [lo, hi].
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }
    /// Exponential with the given mean.
    pub fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Agent,
}

#[derive(Clone, Copy, Debug)]
pub struct Params {
    pub kind: Kind,
    pub seed: u64,
    /// Requests to generate (the last sessions are cut at this count).
    pub requests: usize,
    /// New sessions per second.
    pub session_rate: f64,
    pub block_tokens: u64,
}

struct Line {
    at_ms: f64,
    input: u64,
    output: u64,
    ids: Vec<u64>,
    system_blocks: usize,
}

/// The trace as JSON lines, sorted by arrival.
pub fn generate(p: &Params) -> String {
    let mut rng = Rng::new(p.seed);
    let mut next_id = 0u64;
    let mut fresh = |n: u64| -> Vec<u64> {
        let v = (next_id..next_id + n).collect();
        next_id += n;
        v
    };
    // Shared prefixes: one long system prompt (chat), or a few tool
    // prefixes of different lengths (agent), chosen with Zipf-like weights.
    let prefixes: Vec<Vec<u64>> = match p.kind {
        Kind::Chat => vec![fresh(8)],
        Kind::Agent => [24, 20, 16, 16, 12, 12].iter().map(|&n| fresh(n)).collect(),
    };
    let weights: Vec<f64> = (1..=prefixes.len()).map(|k| 1.0 / k as f64).collect();
    let total_w: f64 = weights.iter().sum();

    let mut lines = Vec::new();
    let mut t = 0.0;
    while lines.len() < p.requests * 2 {
        t += rng.exp(1000.0 / p.session_rate);
        let prefix = {
            let mut x = rng.unit() * total_w;
            let mut k = 0;
            while k + 1 < weights.len() && x >= weights[k] {
                x -= weights[k];
                k += 1;
            }
            &prefixes[k]
        };
        let (turns, first_user, turn_blocks, think_ms, out_lo, out_hi) = match p.kind {
            // Geometric number of turns, mean 4; user messages of 1 to 4
            // blocks; 20 s mean think time; answers of 50 to 400 tokens.
            Kind::Chat => (
                1 + (rng.exp(3.0) as u64).min(15),
                1..=4,
                1..=3,
                20_000.0,
                50,
                400,
            ),
            // 6 to 16 short turns, 3 s apart on average; short outputs.
            Kind::Agent => (rng.range(6, 16), 1..=2, 1..=1, 3_000.0, 20, 80),
        };
        let mut ids = prefix.clone();
        ids.extend(fresh(rng.range(*first_user.start(), *first_user.end())));
        let mut at = t;
        for turn in 0..turns {
            if turn > 0 {
                at += rng.exp(think_ms);
                ids.extend(fresh(rng.range(*turn_blocks.start(), *turn_blocks.end())));
            }
            // A partial last block, as real prompts have.
            let input = ids.len() as u64 * p.block_tokens - rng.range(0, p.block_tokens - 1);
            let output = rng.range(out_lo, out_hi);
            lines.push(Line {
                at_ms: at,
                input,
                output,
                ids: ids.clone(),
                system_blocks: prefix.len(),
            });
            // The answer becomes part of the next turn's prompt.
            ids.extend(fresh(output.div_ceil(p.block_tokens)));
        }
    }
    lines.sort_by(|a, b| a.at_ms.total_cmp(&b.at_ms));
    lines.truncate(p.requests);
    let mut out = String::new();
    for l in &lines {
        out.push_str(&format!(
            "{{\"timestamp\": {}, \"input_length\": {}, \"output_length\": {}, \"hash_ids\": {:?}, \"system_blocks\": {}}}\n",
            l.at_ms.round() as u64,
            l.input,
            l.output,
            l.ids,
            l.system_blocks
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::trace;

    fn params(kind: Kind, seed: u64) -> Params {
        Params {
            kind,
            seed,
            requests: 400,
            session_rate: 1.0,
            block_tokens: 512,
        }
    }

    #[test]
    fn same_seed_same_trace_and_it_parses() {
        for kind in [Kind::Chat, Kind::Agent] {
            let a = generate(&params(kind, 7));
            assert_eq!(a, generate(&params(kind, 7)));
            assert_ne!(a, generate(&params(kind, 8)));
            let reqs = trace::load(&a, 512).expect("parses");
            assert_eq!(reqs.len(), 400);
            assert!(reqs.windows(2).all(|w| w[0].arrival_ms <= w[1].arrival_ms));
        }
    }

    #[test]
    fn chat_shares_one_system_prompt_and_agent_several_tool_prefixes() {
        let chat = trace::load(&generate(&params(Kind::Chat, 1)), 512).unwrap();
        let first: std::collections::HashSet<u64> = chat.iter().map(|r| r.blocks[0]).collect();
        assert_eq!(
            first.len(),
            1,
            "every chat request opens with the system prompt"
        );
        assert!(chat.iter().all(|r| r.system_blocks == 8));
        let agent = trace::load(&generate(&params(Kind::Agent, 1)), 512).unwrap();
        let first: std::collections::HashSet<u64> = agent.iter().map(|r| r.blocks[0]).collect();
        assert!(
            first.len() > 1 && first.len() <= 6,
            "{} tool prefixes",
            first.len()
        );
        // Long shared prefixes make most prompt tokens cacheable.
        assert!(trace::infinite_cache_hit_rate(&agent, 512) > 0.8);
        assert!(trace::infinite_cache_hit_rate(&chat, 512) > 0.5);
    }
}
