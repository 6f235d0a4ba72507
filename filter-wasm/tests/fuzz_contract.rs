//! Properties of the wire contract's encoders and decoders: round trips, and
//! arbitrary input to every decoder (ext-proc reads these from headers).
#![allow(clippy::unwrap_used)] // test code says what it expects

mod common;

use common::cases;
use fleetroute_filter::contract::{self, KeySource, RouteTag};
use proptest::prelude::*;

fn is_hex(b: u8) -> bool {
    b.is_ascii_hexdigit()
}

/// Route tag fields as they could arrive: numbers with signs and zeros,
/// hex of any case and width, separators in odd places.
fn tag_text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        prop::collection::vec(
            "[a-z/.-]{0,8}|[+-]?[0-9]{0,22}|[0-9a-fA-F]{14,18}|\\|{0,2}",
            0..12
        )
        .prop_map(|p| p.join("|")),
    ]
}

proptest! {
    #![proptest_config(cases(512, 1))]

    #[test]
    fn u64_round_trips(v in any::<u64>()) {
        let s = contract::encode_u64(v);
        prop_assert_eq!(s.len(), 16);
        prop_assert_eq!(contract::decode_u64(s.as_bytes()), Some(v));
        prop_assert_eq!(contract::decode_u64(s.to_uppercase().as_bytes()), Some(v));
    }

    /// Exactly 16 hex digits decode; anything else does not.
    #[test]
    fn decode_u64_arbitrary(s in prop_oneof![
        prop::collection::vec(any::<u8>(), 0..40),
        "[0-9a-fA-F]{14,18}".prop_map(String::into_bytes),
    ]) {
        let got = contract::decode_u64(&s);
        prop_assert_eq!(got.is_some(), s.len() == 16 && s.iter().all(|&b| is_hex(b)));
        if let Some(v) = got {
            prop_assert_eq!(contract::encode_u64(v), String::from_utf8(s).unwrap().to_lowercase());
        }
    }

    /// Any input: at most `max` blocks; success re-encodes to the input's
    /// first `max` blocks; failure leaves nothing behind.
    #[test]
    fn decode_blocks_arbitrary(s in prop_oneof![
        prop::collection::vec(any::<u8>(), 0..200),
        prop::collection::vec("[0-9a-f]{16}|[0-9a-fA-F]{15,17}", 0..20).prop_map(|v| v.concat().into_bytes()),
    ], max in 0usize..16, stale in prop::collection::vec(any::<u64>(), 0..4)) {
        let mut out = stale;
        let ok = contract::decode_blocks(&s, max, &mut out);
        prop_assert!(out.len() <= max);
        if ok {
            prop_assert!(s.len() % 16 == 0);
            let n = (s.len() / 16).min(max);
            prop_assert_eq!(out.len(), n);
            let head = String::from_utf8(s[..16 * n].to_vec()).unwrap().to_lowercase();
            prop_assert_eq!(contract::encode_blocks(&out), head);
        } else {
            prop_assert!(out.is_empty());
        }
    }

    #[test]
    fn blocks_round_trip(blocks in prop::collection::vec(any::<u64>(), 0..600), max in 0usize..700) {
        let mut out = Vec::new();
        prop_assert!(contract::decode_blocks(contract::encode_blocks(&blocks).as_bytes(), max, &mut out));
        prop_assert_eq!(&out[..], &blocks[..blocks.len().min(max)]);
    }

    /// Every tag round trips, whatever its text fields hold (but the separator).
    #[test]
    fn route_tag_round_trips(stage in "[^|]{0,30}", fleet in "[^|]{0,30}", replica in "[^|]{0,30}",
                             c in any::<u64>(), u in any::<u64>(), q in any::<u64>(),
                             arm in "[^|]{0,10}", nonce in any::<u64>(), key in any::<u64>()) {
        let tag = RouteTag { stage: &stage, fleet: &fleet, replica: &replica,
                             predicted_cached_tokens: c, uncached_tokens: u, queued_tokens: q,
                             arm: &arm, nonce, key };
        let s = tag.encode();
        prop_assert_eq!(RouteTag::decode(&s), Some(tag));
    }

    /// Any text: a tag that decodes has exactly nine fields, and decoding
    /// its encoding gives the same tag (the encoding is canonical).
    #[test]
    fn route_tag_arbitrary(s in tag_text()) {
        if let Some(tag) = RouteTag::decode(&s) {
            prop_assert_eq!(s.split('|').count(), 9);
            let again = tag.encode();
            prop_assert_eq!(RouteTag::decode(&again), Some(tag));
            prop_assert!(again.len() <= s.len());
        }
    }

    #[test]
    fn key_source_parses_only_its_names(s in prop_oneof![any::<String>(), "prompt_cache_key|user|content|User|content "]) {
        match KeySource::parse(&s) {
            Some(k) => prop_assert_eq!(k.as_str(), s.as_str()),
            None => prop_assert!(!["prompt_cache_key", "user", "content"].contains(&s.as_str())),
        }
    }
}
