//! The routers fleetroute is compared with, as commonly deployed.

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::sim::{SimRouter, View};
use super::trace::TraceRequest;
use crate::engine::cache::PrefixCache;

/// Uniformly random.
pub struct Random(pub u64);

impl SimRouter for Random {
    fn name(&self) -> String {
        "random".into()
    }
    fn route(&mut self, _: f64, _: usize, _: &TraceRequest, v: &View<'_>) -> usize {
        self.0 = xxh3_64_with_seed(&self.0.to_le_bytes(), 7);
        (self.0 % v.inflight.len() as u64) as usize
    }
}

pub struct RoundRobin(pub usize);

impl SimRouter for RoundRobin {
    fn name(&self) -> String {
        "round robin".into()
    }
    fn route(&mut self, _: f64, _: usize, _: &TraceRequest, v: &View<'_>) -> usize {
        self.0 = (self.0 + 1) % v.inflight.len();
        self.0
    }
}

/// Fewest requests in flight.
pub struct LeastLoaded;

impl SimRouter for LeastLoaded {
    fn name(&self) -> String {
        "least loaded".into()
    }
    fn route(&mut self, _: f64, id: usize, _: &TraceRequest, v: &View<'_>) -> usize {
        let n = v.inflight.len();
        // Ties rotate, so an idle fleet is not all sent to replica 0.
        (0..n)
            .map(|k| (k + id) % n)
            .min_by_key(|&r| v.inflight[r])
            .unwrap_or(0)
    }
}

/// Consistent hashing (rendezvous) on the prompt's first block.
pub struct FirstBlockHash;

impl SimRouter for FirstBlockHash {
    fn name(&self) -> String {
        "consistent hash (first block)".into()
    }
    fn route(&mut self, _: f64, id: usize, req: &TraceRequest, v: &View<'_>) -> usize {
        let key = req.blocks.first().copied().unwrap_or(id as u64);
        (0..v.inflight.len())
            .max_by_key(|&r| xxh3_64_with_seed(&key.to_le_bytes(), r as u64))
            .unwrap_or(0)
    }
}

/// SGLang router's cache-aware policy: an approximate prefix tree per worker
/// (modelled as an LRU of the blocks routed to it, of the engine's capacity);
/// the longest match wins when it covers more than 30% of the prompt, else the
/// worker with the smallest tree; when loads are imbalanced (max − min > 64 and
/// max > 1.5 × min) the least loaded worker wins.
pub struct SglangCacheAware {
    trees: Vec<PrefixCache>,
}

impl SglangCacheAware {
    pub fn new(replicas: usize, cache_tokens: u64, block_tokens: u64) -> Self {
        SglangCacheAware {
            trees: (0..replicas)
                .map(|_| PrefixCache::new(cache_tokens as usize, block_tokens as usize))
                .collect(),
        }
    }
}

impl SimRouter for SglangCacheAware {
    fn name(&self) -> String {
        "SGLang cache-aware".into()
    }
    fn route(&mut self, _: f64, _: usize, req: &TraceRequest, v: &View<'_>) -> usize {
        let n = v.inflight.len();
        let max = *v.inflight.iter().max().unwrap_or(&0);
        let min = *v.inflight.iter().min().unwrap_or(&0);
        let imbalanced = max - min > 64 && f64::from(max) > 1.5 * f64::from(min);
        let r = if imbalanced {
            (0..n).min_by_key(|&r| v.inflight[r]).unwrap_or(0)
        } else {
            let (best, matched) = (0..n)
                .map(|r| (r, self.trees[r].lookup(&req.blocks)))
                .max_by_key(|&(r, m)| (m, std::cmp::Reverse(r)))
                .unwrap_or((0, 0));
            let rate = self.trees[best].cached_tokens(matched, req.input_tokens) as f64
                / req.input_tokens.max(1) as f64;
            if rate > 0.3 {
                best
            } else {
                (0..n)
                    .min_by_key(|&r| (self.trees[r].used_blocks(), v.inflight[r]))
                    .unwrap_or(0)
            }
        };
        self.trees[r].insert(&req.blocks);
        r
    }
}

/// Dynamo's KV router cost: blocks to prefill (the prompt's blocks not already
/// cached, from exact KV events, plus prefills queued) plus active decode
/// blocks; the lowest cost wins.
pub struct DynamoCost {
    block_tokens: u64,
    /// Per request: (replica, prefill blocks still pending, total blocks).
    live: Vec<Option<(usize, u64, u64)>>,
    pending_prefill: Vec<u64>,
    active: Vec<u64>,
}

impl DynamoCost {
    pub fn new(replicas: usize, requests: usize, block_tokens: u64) -> Self {
        DynamoCost {
            block_tokens,
            live: vec![None; requests],
            pending_prefill: vec![0; replicas],
            active: vec![0; replicas],
        }
    }
}

impl SimRouter for DynamoCost {
    fn name(&self) -> String {
        "Dynamo KV cost".into()
    }
    fn route(&mut self, _: f64, id: usize, req: &TraceRequest, v: &View<'_>) -> usize {
        let total = (req.input_tokens + req.output_tokens).div_ceil(self.block_tokens);
        let prompt = req.input_tokens.div_ceil(self.block_tokens);
        let (r, new) = (0..v.inflight.len())
            .map(|r| {
                let overlap = v.caches[r].lookup(&req.blocks) as u64;
                let new = prompt.saturating_sub(overlap);
                let cost = (new + self.pending_prefill[r]) + (self.active[r] + total);
                (r, new, cost)
            })
            .min_by_key(|&(r, _, c)| (c, r))
            .map(|(r, n, _)| (r, n))
            .unwrap_or((0, prompt));
        self.pending_prefill[r] += new;
        self.active[r] += total;
        self.live[id] = Some((r, new, total));
        r
    }
    fn first_token(&mut self, _: f64, id: usize) {
        if let Some((r, new, _)) = self.live[id].as_mut() {
            self.pending_prefill[*r] -= *new;
            *new = 0;
        }
    }
    fn finished(&mut self, _: f64, id: usize, _: u64, _: f64) {
        if let Some((r, new, total)) = self.live[id].take() {
            self.pending_prefill[r] -= new;
            self.active[r] -= total;
        }
    }
}
