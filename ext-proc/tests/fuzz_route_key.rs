//! Properties of ext-proc's reading of the route headers (`RouteKey`) over
//! arbitrary header maps: any names, non-UTF-8 raw values, huge values and
//! duplicates. Also the contract end to end: what the filter writes for any
//! request is what ext-proc reads back.
#![allow(clippy::unwrap_used)] // test code says what it expects

mod common;

use common::cases;
use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
use fleetroute::route::key::{MAX_BLOCKS, RouteKey};
use fleetroute_filter::config::FilterConfig;
use fleetroute_filter::contract::{self, KeySource};
use fleetroute_filter::extract::extract;
use proptest::prelude::*;
use xxhash_rust::xxh3::xxh3_64;

fn name() -> impl Strategy<Value = String> {
    let mut known: Vec<&'static str> = contract::REQUEST_HEADERS.to_vec();
    known.push("x-request-id");
    prop_oneof![
        4 => prop::sample::select(known).prop_map(str::to_string),
        1 => "x-fleetroute-[a-z-]{0,10}",
        1 => any::<String>(),
    ]
}

fn raw() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        "[0-9a-f]{16}".prop_map(String::into_bytes),
        "[0-9]{1,12}".prop_map(String::into_bytes),
        "prompt_cache_key|user|content".prop_map(String::into_bytes),
        prop::collection::vec("[0-9a-fA-F]{16}", 0..20).prop_map(|v| v.concat().into_bytes()),
        prop::collection::vec(any::<u8>(), 0..64),
        // Huge: many more blocks than are ever read.
        (1usize..6000).prop_map(|n| "0123456789abcdef".repeat(n).into_bytes()),
        (1usize..200_000).prop_map(|n| vec![b'a'; n]),
    ]
}

/// A header as Envoy (raw_value) or another peer (value) sends it.
fn header() -> impl Strategy<Value = HeaderValue> {
    (name(), raw(), any::<bool>()).prop_map(|(key, raw, as_raw)| {
        if as_raw {
            HeaderValue {
                key,
                value: String::new(),
                raw_value: raw,
            }
        } else {
            HeaderValue {
                key,
                value: String::from_utf8_lossy(&raw).into_owned(),
                raw_value: Vec::new(),
            }
        }
    })
}

/// The value the reader sees: raw_value when set (empty unless UTF-8), else value.
fn seen(h: &HeaderValue) -> &str {
    if h.raw_value.is_empty() {
        &h.value
    } else {
        std::str::from_utf8(&h.raw_value).unwrap_or("")
    }
}

/// The last value of a header: a later duplicate overrides an earlier one.
fn last<'a>(map: &'a HeaderMap, name: &str) -> Option<&'a str> {
    map.headers.iter().rev().find(|h| h.key == name).map(seen)
}

proptest! {
    #![proptest_config(cases(256, 1))]

    /// Any header map: never panics, bounded, and every field is the last
    /// copy of its header decoded by the contract's rules.
    #[test]
    fn arbitrary_headers(headers in prop::collection::vec(header(), 0..16)) {
        let map = HeaderMap { headers };
        let k = RouteKey::from_headers(&map);
        prop_assert!(k.blocks.len() <= MAX_BLOCKS);
        let rid = last(&map, "x-request-id").unwrap_or("");
        prop_assert!(rid.starts_with(k.request_id), "request id not taken from its header");
        // The tenant: the last copy, cut like the request id (bounded).
        let tenant = last(&map, contract::TENANT).unwrap_or("");
        prop_assert!(tenant.starts_with(&*k.tenant) && k.tenant.len() <= 128);
        prop_assert_eq!(k.tenant.len(), fleetroute::route::key::truncate_id(tenant).len());

        let model = last(&map, contract::MODEL).filter(|m| !m.is_empty());
        prop_assert_eq!(k.model, model);
        let residency = last(&map, contract::RESIDENCY).filter(|r| !r.is_empty());
        prop_assert_eq!(k.residency, residency);
        let number = |name| last(&map, name).and_then(|v| v.parse::<u32>().ok()).unwrap_or(0);
        prop_assert_eq!(k.prompt_tokens, number(contract::PROMPT_TOKENS));
        prop_assert_eq!(k.block_tokens, number(contract::BLOCK_TOKENS));

        match last(&map, contract::KEY).and_then(|v| contract::decode_u64(v.as_bytes())) {
            Some(key) => {
                prop_assert_eq!(k.key, key);
                prop_assert_eq!(k.key_source, last(&map, contract::KEY_SOURCE).and_then(KeySource::parse));
            }
            None => {
                // No sampling key: requests spread by their id.
                prop_assert_eq!(k.key, xxh3_64(k.request_id.as_bytes()));
                prop_assert_eq!(k.key_source, None);
            }
        }

        let mut want = Vec::new();
        let decoded = contract::decode_blocks(last(&map, contract::BLOCKS).unwrap_or("").as_bytes(), MAX_BLOCKS, &mut want);
        if !decoded || k.block_tokens == 0 {
            want.clear();
        }
        prop_assert_eq!(&k.blocks, &want);
    }

    /// What the filter writes for a request, ext-proc reads back unchanged.
    #[test]
    fn filter_to_ext_proc(model in "[a-zA-Z0-9/._-]{1,40}", prompt in "[a-z ]{0,2000}",
                          user in proptest::option::of("[a-z0-9]{1,12}"),
                          max_blocks in 1usize..64, rid in "[0-9a-f-]{0,36}") {
        let cfg = FilterConfig { block_bytes: 16, max_blocks, ..FilterConfig::default() };
        let mut body = serde_json::json!({"model": model, "messages": [{"role": "user", "content": prompt}]});
        if let Some(u) = &user {
            body["user"] = serde_json::json!(u);
        }
        let ex = extract(&serde_json::to_vec(&body).unwrap(), &cfg);
        let mut headers: Vec<HeaderValue> = ex.headers(&cfg).into_iter()
            .map(|(n, v)| HeaderValue { key: n.to_string(), value: String::new(), raw_value: v.into_bytes() })
            .collect();
        headers.push(HeaderValue { key: "x-request-id".into(), value: String::new(), raw_value: rid.into_bytes() });
        let map = HeaderMap { headers };
        let k = RouteKey::from_headers(&map);
        prop_assert_eq!(k.model, ex.model.as_deref());
        let (key, source) = ex.key.expect("a user message always gives a key");
        prop_assert_eq!((k.key, k.key_source), (key, Some(source)));
        prop_assert_eq!(&k.blocks, &ex.blocks);
        prop_assert_eq!(k.block_tokens as usize, cfg.block_tokens());
        prop_assert_eq!(u64::from(k.prompt_tokens), ex.prompt_tokens);
    }
}
