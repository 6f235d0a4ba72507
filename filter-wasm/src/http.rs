//! The per-request flow, free of host calls: which requests are read, which
//! client headers are dropped, and the errors the filter answers itself.

use crate::config::FilterConfig;
use crate::contract::{INTERNAL_PREFIX, OVERRIDE_HOST_HEADER, ParseStatus};

/// A header a client may never send: any internal header, and the host override.
pub fn is_reserved_header(name: &str) -> bool {
    // Bytes, not a str slice: a header name need not end a char at the cut.
    let internal = name
        .as_bytes()
        .get(..INTERNAL_PREFIX.len())
        .is_some_and(|p| p.eq_ignore_ascii_case(INTERNAL_PREFIX.as_bytes()));
    internal || name.eq_ignore_ascii_case(OVERRIDE_HOST_HEADER)
}

/// Whether a request's body should be read for routing.
pub fn wants_body(cfg: &FilterConfig, method: &str, path: &str) -> bool {
    let path = path.split(['?', '#']).next().unwrap_or(path);
    method.eq_ignore_ascii_case("POST") && cfg.paths.iter().any(|p| p == path)
}

/// Whether a request asks for the model list (answered by ext-proc).
pub fn is_models_list(cfg: &FilterConfig, method: &str, path: &str) -> bool {
    let path = path.split(['?', '#']).next().unwrap_or(path);
    method.eq_ignore_ascii_case("GET") && cfg.models_path.as_deref() == Some(path)
}

/// A reply the filter sends without going upstream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalReply {
    pub status: u32,
    pub body: String,
    /// Seconds for a `retry-after` header, when retrying soon may succeed.
    pub retry_after_s: Option<u32>,
}

/// The message of every 413 on a fleetroute listener: the filter's and,
/// through the bootstrap's local reply mapper, Envoy's own (the same text is
/// in `envoy-config/envoy.yaml`).
pub const TOO_LARGE_MESSAGE: &str = "request body exceeds the size limit of this route";

impl LocalReply {
    /// An OpenAI-style error body, so clients show the message as they would
    /// any API error.
    pub fn error(status: u32, code: &str, message: &str) -> Self {
        Self::typed(status, "invalid_request_error", code, message)
    }

    fn typed(status: u32, kind: &str, code: &str, message: &str) -> Self {
        let body = serde_json::json!({
            "error": { "message": message, "type": kind, "code": code }
        });
        LocalReply {
            status,
            body: body.to_string(),
            retry_after_s: None,
        }
    }

    /// The body cannot be read as one request: not JSON (engines would
    /// refuse it too, or read it by rules of their own, e.g. Python's `NaN`),
    /// or a key the filter reads given twice (engines keep the last value, so
    /// routing on any one reading could serve another model than the one
    /// routed, priced and charged). `None`: the body is routed.
    pub fn unreadable(status: ParseStatus) -> Option<Self> {
        match status {
            ParseStatus::Ok | ParseStatus::BadShape => None,
            ParseStatus::NotJson => Some(LocalReply::error(
                400,
                "invalid_json",
                "the request body is not a JSON document in UTF-8",
            )),
            ParseStatus::DuplicateKey => Some(LocalReply::error(
                400,
                "duplicate_key",
                "the request body gives a field the router reads (model, messages, prompt, \
                 stream, max_tokens, max_completion_tokens, user, prompt_cache_key, or a \
                 message's role, content, type or text) more than once in one object",
            )),
        }
    }

    pub fn too_large() -> Self {
        LocalReply::error(413, "request_too_large", TOO_LARGE_MESSAGE)
    }

    /// This worker holds as many request bodies as its budget allows, or
    /// cannot reserve memory for this one: retry shortly (another worker or a
    /// moment later has room).
    pub fn overloaded(message: &str) -> Self {
        LocalReply {
            retry_after_s: Some(1),
            ..Self::typed(503, "server_error", "overloaded", message)
        }
    }
}

/// Checks a body size (declared or buffered so far) against the limit.
pub fn check_size(cfg: &FilterConfig, size: usize) -> Result<(), LocalReply> {
    if size > cfg.max_body_bytes {
        Err(LocalReply::too_large())
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reserved_headers() {
        assert!(is_reserved_header("x-fleetroute-cluster"));
        assert!(is_reserved_header("X-FleetRoute-Key"));
        assert!(is_reserved_header("x-gateway-destination-endpoint"));
        assert!(!is_reserved_header("x-residency"));
        assert!(!is_reserved_header("x-fleet"));
        assert!(
            !is_reserved_header("x-fleetrouté-cluster"),
            "no panic on a multi-byte cut"
        );
    }

    #[test]
    fn only_configured_posts_are_read() {
        let cfg = FilterConfig::default();
        assert!(wants_body(&cfg, "POST", "/v1/chat/completions"));
        assert!(wants_body(&cfg, "POST", "/v1/completions?x=1"));
        assert!(!wants_body(&cfg, "GET", "/v1/chat/completions"));
        assert!(!wants_body(&cfg, "POST", "/v1/embeddings"));
    }

    #[test]
    fn errors_are_openai_shaped_json() {
        let r = LocalReply::too_large();
        let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(r.status, 413);
        assert_eq!(v["error"]["code"], "request_too_large");
        assert_eq!(v["error"]["message"], TOO_LARGE_MESSAGE);
        let r = LocalReply::overloaded("busy");
        let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!((r.status, r.retry_after_s), (503, Some(1)));
        assert_eq!(v["error"]["code"], "overloaded");
    }

    proptest! {
        /// However a body arrives, the size Envoy reports after each chunk is
        /// refused exactly when it passes the limit.
        #[test]
        fn limit_holds_however_chunked(len in 0usize..200, chunk in 1usize..50) {
            let cfg = FilterConfig { max_body_bytes: 100, ..FilterConfig::default() };
            let mut buffered = 0;
            let mut refused_at = None;
            while buffered < len {
                buffered = (buffered + chunk).min(len);
                if check_size(&cfg, buffered).is_err() {
                    refused_at = Some(buffered);
                    break;
                }
            }
            prop_assert_eq!(refused_at.is_some(), len > 100);
            if let Some(at) = refused_at {
                prop_assert!(at > 100 && at < 100 + chunk + 1, "refused at the first chunk past the limit");
            }
        }
    }
}
