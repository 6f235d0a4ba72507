//! Who may change things: every change carries the bearer token fleetroute
//! was started with; without a token the API is read-only.

use axum::http::{HeaderMap, header};
use subtle::ConstantTimeEq;

use super::errors::ApiError;

/// The token changes must carry, as given at start. An empty (or blank)
/// token is refused: it would match an empty `Bearer` credential.
pub fn admin_token(given: Option<String>) -> Result<Option<String>, String> {
    match given {
        Some(t) if t.trim().is_empty() => Err(
            "the admin token is empty (--admin-token or FLEETROUTE_ADMIN_TOKEN): give a \
             non-empty token, or set neither for a read-only admin API"
                .into(),
        ),
        other => Ok(other),
    }
}

/// The credential of an `Authorization: Bearer <token>` header: the scheme
/// is case-insensitive (RFC 9110), and an empty credential is no credential.
pub fn bearer(value: &str) -> Option<&str> {
    let (scheme, rest) = value.trim_start().split_once([' ', '\t'])?;
    let token = rest.trim_matches([' ', '\t']);
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Changes need `Authorization: Bearer <token>` matching `token`.
pub fn authorize(token: Option<&str>, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(token) = token.filter(|t| !t.is_empty()) else {
        return Err(ApiError::Forbidden(
            "changes are disabled: start fleetroute with --admin-token (or FLEETROUTE_ADMIN_TOKEN)"
                .into(),
        ));
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer);
    // Constant time: the comparison does not reveal how much of a guess matched.
    if given.is_some_and(|g| bool::from(g.as_bytes().ct_eq(token.as_bytes()))) {
        Ok(())
    } else {
        Err(ApiError::Unauthorized(
            "a valid admin token is required for changes".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_or_blank_token_is_refused_at_start() {
        for t in ["", " ", "\t"] {
            let e = admin_token(Some(t.into())).unwrap_err();
            assert!(e.contains("admin token is empty"), "{e}");
        }
        assert_eq!(admin_token(None), Ok(None));
        assert_eq!(admin_token(Some("x".into())), Ok(Some("x".into())));
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive_and_needs_a_credential() {
        for (header, want) in [
            ("Bearer abc", Some("abc")),
            ("bearer abc", Some("abc")),
            ("BEARER  abc ", Some("abc")),
            ("Bearer\tabc", Some("abc")),
            ("Bearer ", None),
            ("Bearer", None),
            ("bearer   ", None),
            ("Basic abc", None),
            ("Bearerabc", None),
            ("", None),
        ] {
            assert_eq!(bearer(header), want, "{header:?}");
        }
    }
}
