//! The wire contract between the Wasm filter and ext-proc.
//!
//! This module is the only place that names the internal headers or defines how
//! their values are written; both halves compile it, so they cannot drift apart.
//! Every internal header starts with [`INTERNAL_PREFIX`]. The filter removes any
//! client-supplied copy before anything reads it, and the Envoy route removes them
//! all again before the request goes upstream.

/// Most prefix blocks a request carries (the filter's `max_blocks` limit).
pub const MAX_BLOCKS: usize = 4096;

/// Prefix shared by every internal header. Client-facing inputs never use it.
pub const INTERNAL_PREFIX: &str = "x-fleetroute-";

/// Header the override-host load-balancing policy understands (the Gateway API
/// Inference Extension convention). fleetroute sets it only as dynamic metadata;
/// the filter strips a client's copy so it can never steer a request.
pub const OVERRIDE_HOST_HEADER: &str = "x-gateway-destination-endpoint";
/// Dynamic-metadata namespace the override-host policy reads.
pub const OVERRIDE_HOST_NAMESPACE: &str = "envoy.lb";

// Written by the filter, read by ext-proc.
pub const MODEL: &str = "x-fleetroute-model";
pub const KEY: &str = "x-fleetroute-key";
pub const KEY_SOURCE: &str = "x-fleetroute-key-source";
pub const RESIDENCY: &str = "x-fleetroute-residency";
/// The tenant a trusted header named (the filter's `tenant_header`, set only
/// when the router config trusts a gateway in front to write it).
pub const TENANT: &str = "x-fleetroute-tenant";
/// SHA-256 (hex) of the client's bearer token, when the filter is told to
/// hash it (`api_key_hash`): ext-proc maps it to a tenant. The token itself
/// never leaves the filter.
pub const KEY_HASH: &str = "x-fleetroute-key-hash";
pub const BLOCKS: &str = "x-fleetroute-blocks";
pub const BLOCK_TOKENS: &str = "x-fleetroute-block-tokens";
pub const PROMPT_TOKENS: &str = "x-fleetroute-prompt-tokens";
pub const MAX_TOKENS: &str = "x-fleetroute-max-tokens";
pub const STREAM: &str = "x-fleetroute-stream";
/// Full blocks before the first user message (system prompt, tool
/// definitions): the part of a prompt that every conversation of an
/// application may share, so holding only those is no sign of a
/// conversation's home. Absent when there are none.
pub const OPENING_BLOCKS: &str = "x-fleetroute-opening-blocks";
/// `1` when the chat already holds a reply (an `assistant` or `tool`
/// message): the request continues a conversation whose earlier turns went
/// somewhere, even if its text past the opening is still too short to show
/// where. Absent otherwise (a new chat, or a completions prompt).
pub const CONTINUES: &str = "x-fleetroute-continues";
/// What the request asks of the router itself rather than of a model: set to
/// [`ENDPOINT_MODELS`] on `GET /v1/models`, which ext-proc answers.
pub const ENDPOINT: &str = "x-fleetroute-endpoint";
pub const ENDPOINT_MODELS: &str = "models";

// Written by ext-proc.
/// The route's `cluster_header`: the fleet (Envoy cluster) chosen.
pub const CLUSTER: &str = "x-fleetroute-cluster";
/// Reserved: the decision tag now travels as dynamic metadata
/// ([`ROUTE_NAMESPACE`]); a client copy is still stripped.
pub const ROUTE: &str = "x-fleetroute-route";
/// The route's mirror `cluster_header`: a shadow fleet, when one is sampled.
pub const SHADOW: &str = "x-fleetroute-shadow";
/// The name the chosen fleet serves the requested model under, set only when
/// it differs from the request's: the filter's rename root (placed after
/// ext_proc) writes it into the body and the client's name back into the
/// response, and removes the header.
pub const SERVED_MODEL: &str = "x-fleetroute-served-model";
/// `1` when ext-proc asks to see the response headers at the first body
/// byte: engines send their headers before prefill, the first token with the
/// first body byte. The rename root (after ext_proc) holds the headers until
/// that byte and removes this header, so the ext_proc filter reports the
/// moment the replica's prefill ended.
pub const FIRST_BYTE: &str = "x-fleetroute-first-byte";
/// Set when fleetroute routed the request to a fallback of the stage it
/// named: `<stage>; reason=<condition>`. The rename root removes it from the
/// request, shows it to the client on the response (replacing any copy an
/// engine wrote) and leaves the response's `model` as the fallback wrote it.
pub const FALLBACK: &str = "x-fleetroute-fallback";
/// On a request routed to a `retry/` cluster: `<stage>|<model>`, the
/// `upstream` fallback a retry goes to and its model's name on the replica
/// fleetroute listed second. Read by the upstream root, which removes it
/// (so the route does not: it removes before upstream filters run); the
/// rename root then trusts the response's `x-fleetroute-fallback`.
pub const UPSTREAM_FALLBACK: &str = "x-fleetroute-upstream-fallback";

/// `root_id` of the filter's second root, which renames the model; the
/// first root (any other id) reads the request.
pub const RENAME_ROOT_ID: &str = "fleetroute_rename";
/// `root_id` of the third root, an upstream filter on the `retry/` clusters:
/// it renames a retry's model for the `upstream` fallback.
pub const UPSTREAM_ROOT_ID: &str = "fleetroute_upstream";
/// Prefix of the clusters that pair a fleet with an `upstream` fallback's
/// fleet: `retry/<fleet>/<fleet>`.
pub const RETRY_CLUSTER_PREFIX: &str = "retry/";

// Reserved response header, stripped by the filter before the client.
/// Response header: how long the request waited for its LoRA adapter to
/// be registered on its replica, ms (only when it waited).
pub const COLD_START: &str = "x-fleetroute-cold-start";
pub const UPSTREAM_HOST: &str = "x-fleetroute-upstream-host";

/// Every request header the contract defines. The Envoy route removes all of
/// them before upstream (`request_headers_to_remove`) except [`SHADOW`], which
/// its mirror policy reads after that removal (it only ever names a fleet),
/// and [`UPSTREAM_FALLBACK`], which the upstream root reads and removes.
pub const REQUEST_HEADERS: &[&str] = &[
    MODEL,
    KEY,
    KEY_SOURCE,
    RESIDENCY,
    TENANT,
    KEY_HASH,
    BLOCKS,
    BLOCK_TOKENS,
    PROMPT_TOKENS,
    MAX_TOKENS,
    STREAM,
    OPENING_BLOCKS,
    CONTINUES,
    ENDPOINT,
    CLUSTER,
    ROUTE,
    SHADOW,
    SERVED_MODEL,
    FIRST_BYTE,
    FALLBACK,
    UPSTREAM_FALLBACK,
];

/// Where the sampling key came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeySource {
    PromptCacheKey,
    User,
    Content,
}

impl KeySource {
    pub fn as_str(self) -> &'static str {
        match self {
            KeySource::PromptCacheKey => "prompt_cache_key",
            KeySource::User => "user",
            KeySource::Content => "content",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "prompt_cache_key" => Some(KeySource::PromptCacheKey),
            "user" => Some(KeySource::User),
            "content" => Some(KeySource::Content),
            _ => None,
        }
    }
}

/// How far the filter got with a request body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParseStatus {
    /// A JSON object of the expected shape: every field was extracted.
    Ok,
    /// Valid JSON, but not the expected shape; only the model (if any) was taken.
    BadShape,
    /// Not JSON (or not UTF-8): nothing was extracted; the filter refuses it.
    NotJson,
    /// A key the filter reads appears twice in one object: engines read the
    /// last, a streaming reader may read the first, so the filter refuses it
    /// rather than route on one reading and serve the other.
    DuplicateKey,
}

impl ParseStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ParseStatus::Ok => "ok",
            ParseStatus::BadShape => "bad_shape",
            ParseStatus::NotJson => "not_json",
            ParseStatus::DuplicateKey => "duplicate_key",
        }
    }
}

/// A 64-bit hash as a fixed-width header value.
pub fn encode_u64(v: u64) -> String {
    format!("{v:016x}")
}

pub fn decode_u64(s: &[u8]) -> Option<u64> {
    if s.len() != 16 {
        return None;
    }
    let mut v = 0u64;
    for &c in s {
        v = (v << 4) | u64::from(hex_digit(c)?);
    }
    Some(v)
}

/// Block hashes as one header value: 16 hex digits each, no separator, so a
/// reader can decode them without allocating per block.
pub fn encode_blocks(blocks: &[u64]) -> String {
    let mut out = String::with_capacity(blocks.len() * 16);
    for b in blocks {
        use std::fmt::Write;
        let _ = write!(out, "{b:016x}");
    }
    out
}

/// Decodes into `out` (cleared first), at most `max` blocks. A malformed value
/// yields no blocks at all rather than a wrong prefix.
pub fn decode_blocks(s: &[u8], max: usize, out: &mut Vec<u64>) -> bool {
    out.clear();
    if !s.len().is_multiple_of(16) {
        return false;
    }
    for chunk in s.chunks_exact(16).take(max) {
        match decode_u64(chunk) {
            Some(v) => out.push(v),
            None => {
                out.clear();
                return false;
            }
        }
    }
    true
}

fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// The decision as ext-proc reads it back from Envoy's access log entry:
/// `<stage>|<fleet>|<replica addr>|<predicted cached tokens>|<uncached tokens>|<queued tokens>|<arm>|<nonce>|<key>`
/// (queued: prefill tokens already waiting on the replica when it was chosen;
/// arm: `none`, `control` or `variant` of the stage's A/B test; nonce: the
/// decision's id, 16 hex digits, which ends the decision's load lease;
/// key: the sampling key, 16 hex digits, zero when the request had none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteTag<'a> {
    pub stage: &'a str,
    pub fleet: &'a str,
    pub replica: &'a str,
    pub predicted_cached_tokens: u64,
    pub uncached_tokens: u64,
    pub queued_tokens: u64,
    pub arm: &'a str,
    pub nonce: u64,
    /// The request's sampling key, 0 when it had none: a conversation the
    /// replica fails is steered away from it on its next turn.
    pub key: u64,
}

impl<'a> RouteTag<'a> {
    pub fn encode(&self) -> String {
        format!(
            "{}|{}|{}|{}|{}|{}|{}|{:016x}|{:016x}",
            self.stage,
            self.fleet,
            self.replica,
            self.predicted_cached_tokens,
            self.uncached_tokens,
            self.queued_tokens,
            self.arm,
            self.nonce,
            self.key
        )
    }

    pub fn decode(s: &'a str) -> Option<Self> {
        let mut it = s.split('|');
        let tag = RouteTag {
            stage: it.next()?,
            fleet: it.next()?,
            replica: it.next()?,
            predicted_cached_tokens: it.next()?.parse().ok()?,
            uncached_tokens: it.next()?.parse().ok()?,
            queued_tokens: it.next()?.parse().ok()?,
            arm: it.next()?,
            nonce: decode_u64(it.next()?.as_bytes())?,
            key: decode_u64(it.next()?.as_bytes())?,
        };
        it.next().is_none().then_some(tag)
    }
}

/// Filter state the Wasm filter writes on the response path, read by ext-proc
/// from Envoy's access log entry.
pub const USAGE_PROPERTY: &str = "fleetroute.usage";
/// The same object as Envoy names it (`wasm.` + the property name).
pub const USAGE_FILTER_STATE: &str = "wasm.fleetroute.usage";
/// Dynamic metadata namespace and key under which ext-proc leaves the
/// [`RouteTag`] for the access log (clients cannot write dynamic metadata).
pub const ROUTE_NAMESPACE: &str = "fleetroute";
pub const ROUTE_KEY: &str = "route";
/// Next to the tag, in the same namespace: the fleetroute instance that
/// decided (its lease lives there; another instance forwards the entry).
pub const INSTANCE_KEY: &str = "instance";

/// What the response said about itself:
/// `<prompt>|<completion>|<cached>|<done>|<streamed>` (`-` for a figure the
/// response did not carry; done: `1` once an SSE stream reached
/// `data: [DONE]`; streamed: SSE data events that passed, `[DONE]` not
/// counted, so a stream cut before its usage is charged what it streamed).
/// A tag without `streamed` (an older filter) reads as 0 streamed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsageTag {
    /// (prompt, completion, cached) tokens; cached is `None` when the engine
    /// does not report it (unknown, not zero).
    pub usage: Option<(u64, u64, Option<u64>)>,
    pub done: bool,
    pub streamed: u64,
}

impl UsageTag {
    pub fn encode(&self) -> String {
        let (d, n) = (u8::from(self.done), self.streamed);
        match self.usage {
            Some((p, c, Some(k))) => format!("{p}|{c}|{k}|{d}|{n}"),
            Some((p, c, None)) => format!("{p}|{c}|-|{d}|{n}"),
            None => format!("-|-|-|{d}|{n}"),
        }
    }

    pub fn decode(s: &str) -> Option<Self> {
        let mut it = s.split('|');
        let (p, c, k, d) = (it.next()?, it.next()?, it.next()?, it.next()?);
        let streamed = match it.next() {
            Some(n) => n.parse().ok()?,
            None => 0,
        };
        if it.next().is_some() {
            return None;
        }
        let done = match d {
            "0" => false,
            "1" => true,
            _ => return None,
        };
        let usage = match (p, c) {
            ("-", "-") => None,
            (p, c) => Some((
                p.parse().ok()?,
                c.parse().ok()?,
                match k {
                    "-" => None,
                    k => Some(k.parse().ok()?),
                },
            )),
        };
        Some(UsageTag {
            usage,
            done,
            streamed,
        })
    }
}

/// Residency header value: comma-separated region names.
pub fn split_regions(s: &str) -> impl Iterator<Item = &str> {
    s.split(',').map(str::trim).filter(|r| !r.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_request_header_has_the_prefix() {
        for h in REQUEST_HEADERS {
            assert!(h.starts_with(INTERNAL_PREFIX), "{h}");
        }
        assert!(UPSTREAM_HOST.starts_with(INTERNAL_PREFIX));
        assert!(!OVERRIDE_HOST_HEADER.starts_with(INTERNAL_PREFIX));
    }

    #[test]
    fn malformed_blocks_decode_to_nothing() {
        let mut out = vec![1, 2];
        assert!(!decode_blocks(b"0123", 8, &mut out));
        assert!(out.is_empty());
        assert!(!decode_blocks(b"000000000000000g", 8, &mut out));
        assert!(out.is_empty());
    }

    #[test]
    fn route_tag_rejects_extra_fields() {
        let ok = "a|b|c|1|2|3|none|00000000000000ff|0000000000000000";
        assert_eq!(RouteTag::decode(ok).map(|t| t.nonce), Some(255));
        assert!(RouteTag::decode(&format!("{ok}|x")).is_none());
        assert!(RouteTag::decode("a|b|c|x|2|3|none|00000000000000ff|0000000000000000").is_none());
        assert!(RouteTag::decode("a|b|c|1|2|3|none|ff|0000000000000000").is_none());
        assert!(RouteTag::decode("a|b|c|1|2|3|none|00000000000000ff").is_none());
    }

    proptest! {
        #[test]
        fn usage_tag_roundtrips(p in any::<u64>(), c in any::<u64>(), k in proptest::option::of(any::<u64>()),
                                some in any::<bool>(), done in any::<bool>(), streamed in any::<u64>()) {
            let t = UsageTag { usage: some.then_some((p, c, k)), done, streamed };
            prop_assert_eq!(UsageTag::decode(&t.encode()), Some(t));
            // An older filter's tag (no streamed count) still reads.
            let old = t.encode();
            let old = &old[..old.rfind('|').unwrap()];
            prop_assert_eq!(UsageTag::decode(old), Some(UsageTag { streamed: 0, ..t }));
        }

        #[test]
        fn blocks_round_trip(blocks in proptest::collection::vec(any::<u64>(), 0..300)) {
            let mut out = Vec::new();
            prop_assert!(decode_blocks(encode_blocks(&blocks).as_bytes(), usize::MAX, &mut out));
            prop_assert_eq!(out, blocks);
        }

        #[test]
        fn route_tag_round_trips(stage in "[a-z/-]{1,20}", fleet in "[a-z-]{1,20}",
                                 replica in "[0-9.:]{1,21}", c in any::<u64>(), u in any::<u64>(), q in any::<u64>(),
                                 arm in "none|control|variant", nonce in any::<u64>(), key in any::<u64>()) {
            let tag = RouteTag { stage: &stage, fleet: &fleet, replica: &replica,
                                 predicted_cached_tokens: c, uncached_tokens: u, queued_tokens: q, arm: &arm, nonce, key };
            let s = tag.encode();
            prop_assert_eq!(RouteTag::decode(&s), Some(tag));
        }
    }
}
