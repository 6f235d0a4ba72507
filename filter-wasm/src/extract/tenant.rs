//! Who the client is, as far as the filter can tell: the tenant a trusted
//! header names, and the SHA-256 of the client's bearer token (which
//! ext-proc maps to a tenant). The token itself never leaves this module.

use sha2::{Digest, Sha256};
use xxhash_rust::xxh3::xxh3_64;

const MAX_TENANT_LEN: usize = 128;

/// The tenant a trusted header names: as sent when it is a plain name,
/// else a hash of it, so the value is always safe to forward.
pub fn tenant(tenant_header: Option<&str>) -> Option<String> {
    let t = tenant_header.map(str::trim).filter(|t| !t.is_empty())?;
    let plain = t.len() <= MAX_TENANT_LEN
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:@".contains(&b));
    Some(if plain {
        t.to_string()
    } else {
        format!("h-{:016x}", xxh3_64(t.as_bytes()))
    })
}

/// SHA-256 (lowercase hex) of the credential of `Authorization: Bearer
/// <token>` (the scheme in any case), as `printf %s TOKEN | sha256sum`
/// prints it.
pub fn key_hash(authorization: Option<&str>) -> Option<String> {
    let (scheme, token) = authorization?.trim().split_once([' ', '\t'])?;
    let token = token.trim_matches([' ', '\t']);
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
        return None;
    }
    let digest = Sha256::digest(token.as_bytes());
    Some(digest.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trusted_header_names_the_tenant_and_unsafe_values_are_hashed() {
        assert_eq!(tenant(Some(" acme ")).as_deref(), Some("acme"));
        assert_eq!(tenant(Some("")), None);
        assert_eq!(tenant(None), None);
        assert!(tenant(Some("a|b\u{7f}")).unwrap().starts_with("h-"));
    }

    #[test]
    fn the_key_hash_is_sha256_of_the_token_and_never_the_token() {
        let h = key_hash(Some("Bearer sk-secret")).unwrap();
        assert_eq!(h.len(), 64);
        // printf %s test | sha256sum
        assert_eq!(
            key_hash(Some("Bearer test")).unwrap(),
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
        );
        assert_eq!(
            key_hash(Some("bearer  test ")),
            key_hash(Some("Bearer test"))
        );
        assert!(!h.contains("secret"));
        assert_ne!(key_hash(Some("Bearer sk-other")), Some(h));
        assert_eq!(key_hash(Some("Basic abc")), None);
        assert_eq!(key_hash(Some("Bearer ")), None);
        assert_eq!(key_hash(None), None);
    }
}
