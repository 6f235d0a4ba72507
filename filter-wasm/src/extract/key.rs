//! The sampling key: what makes routing deterministic per conversation.
//!
//! `prompt_cache_key`, else `user`, else the content that every turn of one
//! conversation repeats: the first system and first user message (chat), or the
//! first block of the prompt (completions).

use xxhash_rust::xxh3::xxh3_64;

use super::request::{Messages, Request};
use crate::contract::KeySource;

/// Domain-separated so a `user` equal to some `prompt_cache_key` is another key.
fn tagged(source: KeySource, bytes: &[u8]) -> u64 {
    let mut buf = Vec::with_capacity(bytes.len() + 20);
    buf.extend_from_slice(source.as_str().as_bytes());
    buf.push(0);
    buf.extend_from_slice(bytes);
    xxh3_64(&buf)
}

pub fn sampling_key(
    req: &Request<'_>,
    canonical: &[u8],
    block_bytes: usize,
) -> Option<(u64, KeySource)> {
    if let Some(k) = req.prompt_cache_key.as_deref().filter(|k| !k.is_empty()) {
        return Some((
            tagged(KeySource::PromptCacheKey, k.as_bytes()),
            KeySource::PromptCacheKey,
        ));
    }
    if let Some(u) = req.user.as_deref().filter(|u| !u.is_empty()) {
        return Some((tagged(KeySource::User, u.as_bytes()), KeySource::User));
    }
    let content = match &req.messages {
        Some(messages) => conversation_opening(messages),
        None => canonical.get(..block_bytes).unwrap_or(canonical).to_vec(),
    };
    (!content.is_empty()).then(|| (tagged(KeySource::Content, &content), KeySource::Content))
}

/// The first system message and the first user message, in canonical form.
fn conversation_opening(messages: &Messages) -> Vec<u8> {
    let mut out = Vec::new();
    for range in [&messages.first_system, &messages.first_user]
        .into_iter()
        .flatten()
    {
        out.extend_from_slice(messages.text.get(range.clone()).unwrap_or_default());
    }
    out
}
