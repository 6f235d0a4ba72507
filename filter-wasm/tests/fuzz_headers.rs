//! Properties of the filter's client-header parsing: residency, tenant and
//! the reserved-name check, over arbitrary (and arbitrarily long) values.
#![allow(clippy::unwrap_used)] // test code says what it expects

mod common;

use common::cases;
use fleetroute_filter::contract::{self, INTERNAL_PREFIX, OVERRIDE_HOST_HEADER};
use fleetroute_filter::extract::{model, tenant};
use fleetroute_filter::http::is_reserved_header;
use proptest::prelude::*;

fn region_ok(r: &str) -> bool {
    !r.is_empty()
        && r.len() <= 64
        && r.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// Header values as a client could send them: near-valid lists, any text,
/// very long values.
fn header_value() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::collection::vec("[a-z0-9_-]{0,70}|[ ,]{0,3}|[A-Z]{1,3}|.{0,3}", 0..8)
            .prop_map(|parts| parts.join(",")),
        any::<String>(),
        ("[a-z]{1,8}", 1usize..20_000).prop_map(|(s, n)| s.repeat(n)),
    ]
}

proptest! {
    #![proptest_config(cases(512, 1))]

    /// A residency is accepted exactly when every listed region is a valid
    /// region name; the accepted value is normalised, no longer than the
    /// input and a fixed point.
    #[test]
    fn residency(value in header_value()) {
        let regions: Vec<&str> = contract::split_regions(&value).collect();
        let valid = !regions.is_empty() && regions.iter().all(|r| region_ok(r));
        match model::residency(&value) {
            Ok(r) => {
                prop_assert!(valid, "{:?} accepted as {:?}", value, r);
                prop_assert_eq!(&r, &regions.join(","));
                prop_assert!(r.len() <= value.len());
                prop_assert_eq!(model::residency(&r), Ok(r.clone()));
            }
            Err(model::BadResidency(msg)) => {
                prop_assert!(!valid, "{:?} refused: {}", value, msg);
                // The reason quotes at most one region of at most the input.
                prop_assert!(msg.len() <= value.len() + 100);
            }
        }
    }

    /// Regions never come out empty, padded or holding a separator.
    #[test]
    fn split_regions(value in header_value()) {
        for r in contract::split_regions(&value) {
            prop_assert!(!r.is_empty() && !r.contains(',') && r.trim() == r);
        }
    }

    /// A tenant is always a short header-safe value, the same for the same
    /// input, and only a trusted header names one.
    #[test]
    fn tenant_is_safe(header in proptest::option::of(header_value())) {
        let t = tenant::tenant(header.as_deref());
        prop_assert_eq!(&t, &tenant::tenant(header.as_deref()));
        if let Some(t) = &t {
            prop_assert!(!t.is_empty() && t.len() <= 128);
            prop_assert!(t.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:@".contains(&b)), "{:?}", t);
        }
        let has_header = header.as_deref().is_some_and(|h| !h.trim().is_empty());
        prop_assert_eq!(t.is_some(), has_header);
        // A plain header value passes unchanged.
        if let Some(h) = header.as_deref().map(str::trim).filter(|h| !h.is_empty() && h.len() <= 128
            && h.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:@".contains(&b))) {
            prop_assert_eq!(t.as_deref(), Some(h));
        }
    }

    /// A key's hash is 64 hex digits, never holds the token, is the same for
    /// the same token whatever the scheme's case, and only for a bearer token.
    #[test]
    fn key_hash_is_safe(token in "sk-[A-Za-z0-9]{8,40}", scheme in "Bearer |bearer |BEARER |Basic |") {
        let h = tenant::key_hash(Some(&format!("{scheme}{token}")));
        prop_assert_eq!(h.is_some(), scheme.eq_ignore_ascii_case("bearer "));
        if let Some(h) = h {
            prop_assert_eq!(h.len(), 64);
            prop_assert!(h.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
            prop_assert!(!h.contains(&token));
            prop_assert_eq!(Some(h), tenant::key_hash(Some(&format!("Bearer {token}"))));
        }
    }

    /// Different tokens give different hashes (no accidental sharing).
    #[test]
    fn hashes_of_tokens_differ(a in "[A-Za-z0-9]{8,40}", b in "[A-Za-z0-9]{8,40}") {
        prop_assume!(a != b);
        let ta = tenant::key_hash(Some(&format!("Bearer {a}")));
        let tb = tenant::key_hash(Some(&format!("Bearer {b}")));
        prop_assert_ne!(ta, tb);
    }

    /// Reserved exactly when the name starts with the internal prefix or is
    /// the host override, in any letter case; never panics on any name.
    #[test]
    fn reserved_header(name in prop_oneof![
        any::<String>(),
        "[xX]-[fF][lL][eE][eE][tT][rR][oO][uU][tT][eE]-?.{0,12}",
        "[xX]-[gG][aA][tT][eE][wW][aA][yY]-destination-endpoint.{0,2}",
    ]) {
        let lower = name.to_ascii_lowercase();
        let want = lower.starts_with(INTERNAL_PREFIX) || lower == OVERRIDE_HOST_HEADER;
        prop_assert_eq!(is_reserved_header(&name), want, "{:?}", name);
    }

    /// Every contract header is reserved in any letter case.
    #[test]
    fn contract_headers_are_reserved(i in any::<prop::sample::Index>(), mask in any::<u64>()) {
        let h = contract::REQUEST_HEADERS[i.index(contract::REQUEST_HEADERS.len())];
        let mixed: String = h.chars().enumerate()
            .map(|(j, c)| if mask >> (j % 64) & 1 == 1 { c.to_ascii_uppercase() } else { c })
            .collect();
        prop_assert!(is_reserved_header(&mixed));
    }

    /// A model name is kept exactly when it can be a header value unchanged.
    #[test]
    fn model_names(name in prop_oneof![any::<String>(), "[ -~]{0,300}"]) {
        match model::model(&name) {
            Some(m) => {
                prop_assert_eq!(&m, &name);
                prop_assert!(m.len() <= 256 && m.bytes().all(|b| b.is_ascii_graphic() && b != b'|'));
            }
            None => prop_assert!(name.is_empty() || name.len() > 256
                || name.bytes().any(|b| !b.is_ascii_graphic() || b == b'|')),
        }
    }
}
