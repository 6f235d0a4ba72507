//! The route headers the filter wrote, read without JSON and without copying
//! anything but the block hashes.

use std::borrow::Cow;

use envoy_types::pb::envoy::config::core::v3::HeaderMap;
use fleetroute_filter::contract::{self, KeySource};
use xxhash_rust::xxh3::xxh3_64;

pub use crate::state::decision_log::{MAX_REQUEST_ID, truncate_id};

/// Most blocks ext-proc reads from one request.
pub use fleetroute_filter::contract::MAX_BLOCKS;

#[derive(Debug, Default)]
pub struct RouteKey<'a> {
    /// The client's `x-request-id`, truncated to [`MAX_REQUEST_ID`] bytes.
    pub request_id: &'a str,
    pub model: Option<&'a str>,
    /// The sampling key; a hash of the request id when the filter found none,
    /// so such requests spread instead of piling onto one replica.
    pub key: u64,
    pub key_source: Option<KeySource>,
    pub residency: Option<&'a str>,
    pub blocks: Vec<u64>,
    /// Of `blocks`, how many come before the first user message (the
    /// filter's `x-fleetroute-opening-blocks`): shared by every conversation
    /// of an application, so no sign of where one lives.
    pub opening_blocks: u16,
    /// The chat already holds a reply (the filter's `x-fleetroute-continues`):
    /// it continues a conversation, so it is never placed as a new one.
    pub continues: bool,
    pub block_tokens: u32,
    pub prompt_tokens: u32,
    /// The request's `max_tokens`, when it set one (bounds its load lease
    /// and its tenant's reservation).
    pub max_tokens: Option<u32>,
    /// The tenant: as the filter's trusted header named it, until the
    /// configured identity source sets it (`tenancy::identity`); truncated
    /// like the request id; empty when none.
    pub tenant: Cow<'a, str>,
    /// SHA-256 (hex) of the client's bearer token, when the filter hashed it.
    pub key_hash: Option<&'a str>,
    /// `GET /v1/models`: answered with the model list, not routed.
    pub list_models: bool,
    /// The LoRA adapter `model` names, once [`crate::route::stage::adapter`]
    /// resolved it (its blocks are then the adapter's).
    pub adapter: Option<crate::topology::AdapterId>,
    /// On a fallback: the stage the client named, whose residency bounds
    /// the fallback's fleets too.
    pub within: Option<crate::topology::StageId>,
}

/// A header's value as Envoy sends it.
pub fn value(h: &envoy_types::pb::envoy::config::core::v3::HeaderValue) -> &str {
    // Envoy sends values in raw_value; `value` is only a fallback for peers
    // that do not.
    if h.raw_value.is_empty() {
        &h.value
    } else {
        std::str::from_utf8(&h.raw_value).unwrap_or("")
    }
}

impl<'a> RouteKey<'a> {
    pub fn from_headers(map: &'a HeaderMap) -> RouteKey<'a> {
        let mut k = RouteKey::default();
        let mut key = None;
        let mut blocks: &[u8] = &[];
        for h in &map.headers {
            let name = h.key.as_str();
            if !name.starts_with(contract::INTERNAL_PREFIX) {
                if name == "x-request-id" {
                    k.request_id = truncate_id(value(h));
                }
                continue;
            }
            let v = value(h);
            match name {
                contract::MODEL => k.model = Some(v).filter(|m| !m.is_empty()),
                contract::KEY => key = contract::decode_u64(v.as_bytes()),
                contract::KEY_SOURCE => k.key_source = KeySource::parse(v),
                contract::RESIDENCY => k.residency = Some(v).filter(|r| !r.is_empty()),
                contract::BLOCKS => blocks = v.as_bytes(),
                contract::BLOCK_TOKENS => k.block_tokens = v.parse().unwrap_or(0),
                contract::PROMPT_TOKENS => k.prompt_tokens = v.parse().unwrap_or(0),
                contract::MAX_TOKENS => k.max_tokens = v.parse().ok(),
                contract::OPENING_BLOCKS => k.opening_blocks = v.parse().unwrap_or(0),
                contract::CONTINUES => k.continues = v == "1",
                contract::TENANT => k.tenant = Cow::Borrowed(truncate_id(v)),
                contract::KEY_HASH => k.key_hash = Some(v).filter(|h| h.len() == 64),
                contract::ENDPOINT => k.list_models = v == contract::ENDPOINT_MODELS,
                _ => {}
            }
        }
        if !contract::decode_blocks(blocks, MAX_BLOCKS, &mut k.blocks) || k.block_tokens == 0 {
            k.blocks.clear();
        }
        // Never more than the blocks read, whatever the header said.
        k.opening_blocks = k
            .opening_blocks
            .min(u16::try_from(k.blocks.len()).unwrap_or(u16::MAX));
        match key {
            Some(key) => k.key = key,
            None => {
                k.key = xxh3_64(k.request_id.as_bytes());
                k.key_source = None;
            }
        }
        k
    }

    /// A request with neither a sampling key nor an id would all hash to
    /// one key (and one replica): give it `rng` instead, so such requests
    /// spread. With [`RouteKey::from_headers`] this is the whole fallback.
    pub fn spread_anonymous(&mut self, rng: u64) {
        if self.key_source.is_none() && self.request_id.is_empty() {
            self.key = rng;
        }
    }

    /// The conversation's own key, when the client brought one: a fallback
    /// key (an id's hash, or random) never comes back, so it stands for no
    /// conversation (no failed-conversation lookup, not logged as a key).
    pub fn conversation(&self) -> Option<u64> {
        self.key_source.map(|_| self.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::core::v3::HeaderValue;

    #[test]
    fn client_request_ids_are_cut_on_a_character_boundary() {
        assert_eq!(truncate_id("abc"), "abc");
        let long = "a".repeat(50_000);
        assert_eq!(truncate_id(&long).len(), MAX_REQUEST_ID);
        // A 2-byte character straddling the limit is dropped whole.
        let straddle = format!("{}é", "a".repeat(MAX_REQUEST_ID - 1));
        assert_eq!(truncate_id(&straddle).len(), MAX_REQUEST_ID - 1);
        let map = HeaderMap {
            headers: vec![HeaderValue {
                key: "x-request-id".into(),
                raw_value: long.into_bytes(),
                ..Default::default()
            }],
        };
        let k = RouteKey::from_headers(&map);
        assert_eq!(k.request_id.len(), MAX_REQUEST_ID);
        assert_eq!(k.key, xxh3_64(&[b'a'; MAX_REQUEST_ID]));
    }

    #[test]
    fn the_tenant_is_read_and_bounded() {
        let header = |v: String| HeaderMap {
            headers: vec![HeaderValue {
                key: contract::TENANT.into(),
                raw_value: v.into_bytes(),
                ..Default::default()
            }],
        };
        let map = header("acme".into());
        assert_eq!(RouteKey::from_headers(&map).tenant, "acme");
        let map = header("t".repeat(10_000));
        assert_eq!(RouteKey::from_headers(&map).tenant.len(), MAX_REQUEST_ID);
        assert_eq!(RouteKey::from_headers(&HeaderMap::default()).tenant, "");
    }

    #[test]
    fn only_the_filters_mark_says_a_chat_continues() {
        let map = |v: Option<&str>| HeaderMap {
            headers: v
                .into_iter()
                .map(|v| HeaderValue {
                    key: contract::CONTINUES.into(),
                    raw_value: v.as_bytes().to_vec(),
                    ..Default::default()
                })
                .collect(),
        };
        for (v, want) in [
            (Some("1"), true),
            (Some("0"), false),
            (Some("yes"), false),
            (None, false),
        ] {
            assert_eq!(RouteKey::from_headers(&map(v)).continues, want, "{v:?}");
        }
    }

    #[test]
    fn opening_blocks_never_exceed_the_blocks_read() {
        let map = |opening: &str, blocks: &[u64]| HeaderMap {
            headers: [
                (contract::BLOCKS, contract::encode_blocks(blocks)),
                (contract::BLOCK_TOKENS, "256".to_string()),
                (contract::OPENING_BLOCKS, opening.to_string()),
            ]
            .into_iter()
            .map(|(k, v)| HeaderValue {
                key: k.into(),
                raw_value: v.into_bytes(),
                ..Default::default()
            })
            .collect(),
        };
        let cases: &[(&str, &[u64], u16)] = &[
            ("2", &[1, 2, 3], 2),
            ("9", &[1, 2, 3], 3),
            // Not a block count the filter could write: no opening.
            ("99999999", &[1], 0),
            ("-1", &[1, 2], 0),
            ("x", &[1, 2], 0),
            ("2", &[], 0),
        ];
        for (opening, blocks, want) in cases {
            let m = map(opening, blocks);
            assert_eq!(
                RouteKey::from_headers(&m).opening_blocks,
                *want,
                "{opening} over {blocks:?}"
            );
        }
    }
}
