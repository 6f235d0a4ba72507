//! Traces in the Mooncake format: one JSON object a line with `timestamp`
//! (ms), `input_length`, `output_length` and chained `hash_ids` per block.

use serde::Deserialize;
use xxhash_rust::xxh3::xxh3_64;

#[derive(Deserialize)]
struct Line {
    timestamp: f64,
    input_length: u64,
    output_length: u64,
    hash_ids: Vec<u64>,
    /// Leading blocks that are the system prompt (generated traces); the
    /// Mooncake trace has none, and its first block stands in for it.
    #[serde(default)]
    system_blocks: Option<usize>,
    /// What a replica must hold for it: the LoRA adapter asked for
    /// (adapter workloads), or its model on a packed pool (`model`, model
    /// workloads).
    #[serde(default, alias = "model")]
    adapter: Option<String>,
}

#[derive(Clone, Debug)]
pub struct TraceRequest {
    pub arrival_ms: f64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Hashes of the prompt's full blocks (as the filter would send them).
    pub blocks: Vec<u64>,
    /// Leading blocks in the system message; the next block is the first
    /// user message (see `content_key`).
    pub system_blocks: usize,
    /// The filter's content-derived key: a hash of the system prompt and
    /// the first user message, so every turn of a conversation shares it.
    pub content_key: u64,
    /// The tenant that sent it (the overload replay assigns them; empty in
    /// the traces themselves).
    pub tenant: String,
    /// The LoRA adapter it names in `model`, or its model on a packed pool;
    /// none: the base model.
    pub adapter: Option<String>,
}

/// Blocks the prompt builder puts in the system message when a trace does not
/// say: one, then one block of first user message.
pub const DEFAULT_SYSTEM_BLOCKS: usize = 1;

/// The content key of a prompt whose hash ids are `ids`: the system blocks
/// plus one block of first user message (all of it when shorter).
pub fn content_key(ids: &[u64], system_blocks: usize) -> u64 {
    let n = (system_blocks + 1).min(ids.len());
    let mut bytes = Vec::with_capacity(n * 8);
    for id in &ids[..n] {
        bytes.extend_from_slice(&id.to_le_bytes());
    }
    xxh3_64(&bytes)
}

/// Reads a trace. Block ids become uniform 64-bit hashes, as the filter's
/// chained xxh3 values are; only full blocks count, as engines cache only
/// full blocks.
pub fn load(text: &str, block_tokens: u64) -> Result<Vec<TraceRequest>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let l: Line = serde_json::from_str(line).map_err(|e| format!("line {}: {e}", i + 1))?;
        let full = (l.input_length / block_tokens) as usize;
        let system_blocks = l.system_blocks.unwrap_or(DEFAULT_SYSTEM_BLOCKS);
        out.push(TraceRequest {
            system_blocks,
            content_key: content_key(&l.hash_ids, system_blocks),
            tenant: String::new(),
            adapter: l.adapter,
            arrival_ms: l.timestamp,
            input_tokens: l.input_length,
            output_tokens: l.output_length.max(1),
            blocks: l
                .hash_ids
                .iter()
                .take(full)
                .map(|h| xxh3_64(&h.to_le_bytes()))
                .collect(),
        });
    }
    out.sort_by(|a, b| a.arrival_ms.total_cmp(&b.arrival_ms));
    Ok(out)
}

/// The hit rate of an infinite prefix cache: every block seen before is a hit
/// (token-weighted over full blocks, against all prompt tokens).
pub fn infinite_cache_hit_rate(reqs: &[TraceRequest], block_tokens: u64) -> f64 {
    let mut seen = std::collections::HashSet::new();
    let (mut hit, mut total) = (0u64, 0u64);
    for r in reqs {
        total += r.input_tokens;
        let mut prefix = true;
        for b in &r.blocks {
            let new = seen.insert(*b);
            if prefix && !new {
                hit += block_tokens;
            } else {
                prefix = false;
            }
        }
    }
    hit as f64 / total.max(1) as f64
}
