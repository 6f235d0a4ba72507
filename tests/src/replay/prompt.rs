//! Request bodies from a trace line, for replays over HTTP: each hash id
//! becomes a fixed pseudo-random text block of `block_tokens` tokens, so the
//! same id is the same bytes in every request, and a shared id prefix is a
//! shared prompt prefix.
//!
//! Messages: the system message holds the first `system_blocks` blocks, the
//! first user message the next block, and a second user message the rest
//! (earlier turns and the new one), so every turn of a conversation opens
//! with the same system and first user message, as real chats do.

use serde::Deserialize;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::trace::{DEFAULT_SYSTEM_BLOCKS, content_key};

/// Bytes per token of the generated text (the engine counts 4).
pub const BYTES_PER_TOKEN: u64 = fleetroute_filter::config::BYTES_PER_TOKEN as u64;

#[derive(Deserialize, Clone, Debug)]
pub struct RawLine {
    pub timestamp: f64,
    pub input_length: u64,
    pub output_length: u64,
    pub hash_ids: Vec<u64>,
    #[serde(default)]
    pub system_blocks: Option<usize>,
}

impl RawLine {
    pub fn system_blocks(&self) -> usize {
        self.system_blocks.unwrap_or(DEFAULT_SYSTEM_BLOCKS)
    }
    /// The conversation's key, as the replay models the filter's.
    pub fn content_key(&self) -> u64 {
        content_key(&self.hash_ids, self.system_blocks())
    }
}

/// Reads a trace's lines, sorted by arrival, at most `limit`.
pub fn load_raw(text: &str, limit: usize) -> Result<Vec<RawLine>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        out.push(serde_json::from_str(line).map_err(|e| format!("line {}: {e}", i + 1))?);
    }
    out.sort_by(|a: &RawLine, b: &RawLine| a.timestamp.total_cmp(&b.timestamp));
    out.truncate(limit);
    Ok(out)
}

/// The text of block `id`: lowercase letters and digits only, so JSON needs
/// no escapes and no canonical form changes it.
fn block_text(id: u64, bytes: usize, out: &mut String) {
    const ALPHABET: &[u8; 36] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut i = 0u64;
    while out.len() < bytes {
        let mut h = xxh3_64_with_seed(&id.to_le_bytes(), i);
        for _ in 0..12 {
            if out.len() >= bytes {
                break;
            }
            out.push(ALPHABET[(h % 36) as usize] as char);
            h /= 36;
        }
        i += 1;
    }
}

/// The three message texts (system, first user, rest) of a line, cut to its
/// prompt length; the cut-off part of the last block is unique to the request
/// (`salt`), as a partial block is never shared.
pub fn messages(line: &RawLine, block_tokens: u64, salt: u64) -> [String; 3] {
    let block = (block_tokens * BYTES_PER_TOKEN) as usize;
    let total = (line.input_length * BYTES_PER_TOKEN) as usize;
    let full = total / block;
    let sys = line.system_blocks();
    let mut parts = [String::new(), String::new(), String::new()];
    let mut written = 0;
    for (k, id) in line.hash_ids.iter().enumerate() {
        if written >= total {
            break;
        }
        let part = if k < sys {
            0
        } else if k == sys {
            1
        } else {
            2
        };
        let len = block.min(total - written);
        let mut text = String::with_capacity(block);
        // A full block is its id's text; a partial one is unique.
        let id = if k < full {
            *id
        } else {
            id ^ salt.rotate_left(17) ^ 0x5bd1_e995
        };
        block_text(id, len, &mut text);
        parts[part].push_str(&text);
        written += len;
    }
    parts
}

/// A streamed chat request with usage in the last chunk; no `user`, and a
/// `prompt_cache_key` only when given.
pub fn chat_body(
    model: &str,
    line: &RawLine,
    block_tokens: u64,
    salt: u64,
    prompt_cache_key: Option<&str>,
) -> String {
    let [system, first, rest] = messages(line, block_tokens, salt);
    let mut msgs = vec![serde_json::json!({"role": "system", "content": system})];
    if !first.is_empty() {
        msgs.push(serde_json::json!({"role": "user", "content": first}));
    }
    if !rest.is_empty() {
        msgs.push(serde_json::json!({"role": "user", "content": rest}));
    }
    let mut body = serde_json::json!({
        "model": model,
        "messages": msgs,
        "max_tokens": line.output_length.max(1),
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if let Some(k) = prompt_cache_key {
        body["prompt_cache_key"] = k.into();
    }
    body.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(ids: Vec<u64>, input: u64) -> RawLine {
        RawLine {
            timestamp: 0.0,
            input_length: input,
            output_length: 4,
            hash_ids: ids,
            system_blocks: Some(2),
        }
    }

    #[test]
    fn same_ids_same_bytes_and_partial_blocks_unique() {
        let a = messages(&line(vec![1, 2, 3, 4, 5], 5 * 8), 8, 1);
        let b = messages(&line(vec![1, 2, 3, 4, 9], 4 * 8 + 4), 8, 2);
        assert_eq!(a[0], b[0], "system blocks are shared");
        assert_eq!(a[0].len(), 2 * 8 * 4);
        assert_eq!(a[1], b[1], "first user block is shared");
        assert_eq!(a[1].len(), 8 * 4);
        assert_eq!(a[2].len(), 2 * 8 * 4);
        assert_eq!(b[2].len(), 8 * 4 + 4 * 4);
        assert_eq!(a[2][..32], b[2][..32], "block 4 (id 4) is shared");
        assert_ne!(a[2][32..48], b[2][32..], "ids 5 and 9 differ");
        let c = messages(&line(vec![1, 2, 3, 4, 9], 4 * 8 + 4), 8, 3);
        assert_ne!(b[2][32..], c[2][32..], "partial blocks differ by request");
        assert!(
            a.iter()
                .all(|p| p.bytes().all(|c| c.is_ascii_alphanumeric()))
        );
    }

    #[test]
    fn body_has_streaming_usage_and_optional_cache_key() {
        let l = line(vec![1, 2, 3], 24);
        let v: serde_json::Value = serde_json::from_str(&chat_body("m", &l, 8, 0, None)).unwrap();
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert!(v.get("user").is_none() && v.get("prompt_cache_key").is_none());
        assert_eq!(v["messages"].as_array().unwrap().len(), 2);
        let v: serde_json::Value =
            serde_json::from_str(&chat_body("m", &l, 8, 0, Some("c1"))).unwrap();
        assert_eq!(v["prompt_cache_key"], "c1");
    }
}
