//! The per-request flow, free of host calls: which requests are read, which
//! client headers are dropped, and the errors the filter answers itself.

use crate::config::FilterConfig;
use crate::contract::{INTERNAL_PREFIX, OVERRIDE_HOST_HEADER};

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

/// A reply the filter sends without going upstream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalReply {
    pub status: u32,
    pub body: String,
}

impl LocalReply {
    /// An OpenAI-style error body, so clients show the message as they would
    /// any API error.
    pub fn error(status: u32, code: &str, message: &str) -> Self {
        let body = serde_json::json!({
            "error": { "message": message, "type": "invalid_request_error", "code": code }
        });
        LocalReply {
            status,
            body: body.to_string(),
        }
    }

    pub fn too_large(limit: usize) -> Self {
        LocalReply::error(
            413,
            "request_too_large",
            &format!("request body exceeds the {limit}-byte limit of this route"),
        )
    }
}

/// Checks a body size (declared or received so far) against the limit.
pub fn check_size(cfg: &FilterConfig, size: usize) -> Result<(), LocalReply> {
    if size > cfg.max_body_bytes {
        Err(LocalReply::too_large(cfg.max_body_bytes))
    } else {
        Ok(())
    }
}

/// Collects a body that may arrive in any number of chunks, refusing it as soon
/// as it passes the limit. The host copies each newly buffered part into it
/// once (Envoy keeps its own copy until the request moves on), so the limit is
/// enforced as the body grows rather than after it has all arrived.
#[derive(Debug, Default)]
pub struct BodyCollector {
    buf: Vec<u8>,
}

impl BodyCollector {
    pub fn push(&mut self, cfg: &FilterConfig, chunk: &[u8]) -> Result<(), LocalReply> {
        check_size(cfg, self.buf.len() + chunk.len())?;
        self.buf.extend_from_slice(chunk);
        Ok(())
    }

    pub fn body(&self) -> &[u8] {
        &self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extract::extract;
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
        let r = LocalReply::too_large(10);
        let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(r.status, 413);
        assert_eq!(v["error"]["code"], "request_too_large");
    }

    fn body_strategy() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            "[a-z ]{0,300}".prop_map(|t| format!(
                r#"{{"model":"m","messages":[{{"role":"system","content":"sys"}},{{"role":"user","content":"{t}"}}],"stream":true}}"#
            ).into_bytes()),
            "[a-z ]{0,300}".prop_map(|t| format!(r#"{{"model":"m","prompt":"{t}","user":"u"}}"#).into_bytes()),
            proptest::collection::vec(any::<u8>(), 0..300),
        ]
    }

    proptest! {
        /// A body split into any chunks gives the same route headers as in one piece.
        #[test]
        fn chunking_never_changes_the_headers(body in body_strategy(),
                                              cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..12)) {
            let cfg = FilterConfig { block_bytes: 16, ..FilterConfig::default() };
            let mut points: Vec<usize> = cuts.iter().map(|i| i.index(body.len() + 1)).collect();
            points.sort_unstable();
            let mut c = BodyCollector::default();
            let mut start = 0;
            for p in points.into_iter().chain([body.len()]) {
                c.push(&cfg, &body[start..p]).unwrap();
                start = p;
            }
            prop_assert_eq!(extract(c.body(), &cfg).headers(&cfg), extract(&body, &cfg).headers(&cfg));
        }

        #[test]
        fn limit_holds_however_chunked(len in 0usize..200, chunk in 1usize..50) {
            let cfg = FilterConfig { max_body_bytes: 100, ..FilterConfig::default() };
            let body = vec![b'x'; len];
            let mut c = BodyCollector::default();
            let res: Result<(), LocalReply> = body.chunks(chunk).try_for_each(|ch| c.push(&cfg, ch));
            prop_assert_eq!(res.is_err(), len > 100);
        }
    }
}
