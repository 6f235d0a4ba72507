//! The tenant: a configured client header, else a hash of the bearer token.
//! The token itself never leaves this function.

use xxhash_rust::xxh3::xxh3_64;

const MAX_TENANT_LEN: usize = 128;

pub fn tenant(tenant_header: Option<&str>, authorization: Option<&str>) -> Option<String> {
    if let Some(t) = tenant_header.map(str::trim).filter(|t| !t.is_empty()) {
        let plain = t.len() <= MAX_TENANT_LEN
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.:@".contains(&b));
        // Anything else is hashed, so the header value is always safe to forward.
        return Some(if plain {
            t.to_string()
        } else {
            format!("h-{:016x}", xxh3_64(t.as_bytes()))
        });
    }
    let token = authorization?.trim();
    let token = token
        .strip_prefix("Bearer ")
        .or_else(|| token.strip_prefix("bearer "))?
        .trim();
    (!token.is_empty()).then(|| format!("tok-{:016x}", xxh3_64(token.as_bytes())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_wins_and_token_is_never_forwarded() {
        assert_eq!(
            tenant(Some("acme"), Some("Bearer sk-secret")).as_deref(),
            Some("acme")
        );
        let t = tenant(None, Some("Bearer sk-secret")).unwrap();
        assert!(t.starts_with("tok-") && !t.contains("secret"), "{t}");
        assert_eq!(tenant(None, Some("Bearer sk-secret")), Some(t));
        assert_ne!(
            tenant(None, Some("Bearer sk-other")),
            tenant(None, Some("Bearer sk-secret"))
        );
        assert_eq!(tenant(None, Some("Basic abc")), None);
        assert_eq!(tenant(None, None), None);
    }

    #[test]
    fn unsafe_header_values_are_hashed() {
        let t = tenant(Some("a|b\u{7f}"), None).unwrap();
        assert!(t.starts_with("h-"));
    }
}
