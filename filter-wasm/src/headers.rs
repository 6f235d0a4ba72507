//! The request header phase: strips reserved headers, writes residency and
//! tenant, refuses what is too large and decides whether the body is read.
//! It reaches Envoy only through [`HeaderHost`], so it runs natively in tests
//! against a fake host; `host` implements the trait over proxy-wasm.

use crate::config::FilterConfig;
use crate::contract;
use crate::extract::{model, tenant};
use crate::http::{LocalReply, check_size, is_models_list, is_reserved_header, wants_body};

/// Counters the header phase moves (`wasmcustom.fleetroute_filter.*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    ReservedStripped,
    BadResidency,
    PassedUntouched,
    TooLarge,
}

/// The host calls the header phase makes.
pub trait HeaderHost {
    /// Names of the request headers, as received.
    fn header_names(&self) -> Vec<String>;
    /// A request header as text; `None` when absent or not UTF-8.
    fn header(&self, name: &str) -> Option<String>;
    /// Sets (`Some`) or removes (`None`) a request header.
    fn set_header(&mut self, name: &str, value: Option<&str>);
    /// Answers the request locally; Envoy sends nothing upstream.
    fn send_reply(&mut self, reply: &LocalReply);
    fn count(&mut self, counter: Counter);
}

/// What the filter does after the headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Pass the request on; the body (if any) is not read.
    Continue,
    /// Hold the body in Envoy and read it at its end.
    ReadBody,
    /// A local reply was sent.
    Replied,
}

/// Runs the header phase for one request.
pub fn on_request_headers(
    host: &mut impl HeaderHost,
    cfg: &FilterConfig,
    end_of_stream: bool,
) -> Next {
    // Only fleetroute writes its own headers: a client's copies go first.
    for name in host.header_names() {
        if is_reserved_header(&name) {
            host.set_header(&name, None);
            host.count(Counter::ReservedStripped);
        }
    }
    if let Some(value) = cfg.residency_header.as_deref().and_then(|h| host.header(h)) {
        match model::residency(&value) {
            Ok(r) => host.set_header(contract::RESIDENCY, Some(&r)),
            Err(why) => {
                host.count(Counter::BadResidency);
                return reply(host, &LocalReply::error(400, "invalid_residency", &why.0));
            }
        }
    }
    let tenant_value = cfg.tenant_header.as_deref().and_then(|h| host.header(h));
    if let Some(t) = tenant::tenant(tenant_value.as_deref()) {
        host.set_header(contract::TENANT, Some(&t));
    }
    if cfg.api_key_hash
        && let Some(h) = tenant::key_hash(host.header("authorization").as_deref())
    {
        host.set_header(contract::KEY_HASH, Some(&h));
    }
    let method = host.header(":method").unwrap_or_default();
    let path = host.header(":path").unwrap_or_default();
    if is_models_list(cfg, &method, &path) {
        // ext-proc answers it from its model list (Envoy's route, when it is down).
        host.set_header(contract::ENDPOINT, Some(contract::ENDPOINT_MODELS));
    }
    if end_of_stream || !wants_body(cfg, &method, &path) {
        host.count(Counter::PassedUntouched);
        return Next::Continue;
    }
    let declared = host
        .header("content-length")
        .and_then(|v| v.trim().parse::<usize>().ok());
    if let Err(r) = check_size(cfg, declared.unwrap_or(0)) {
        host.count(Counter::TooLarge);
        return reply(host, &r);
    }
    Next::ReadBody
}

fn reply(host: &mut impl HeaderHost, r: &LocalReply) -> Next {
    host.send_reply(r);
    Next::Replied
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Envoy's side of the calls: a header list, replies and counters.
    #[derive(Default)]
    struct FakeHost {
        headers: Vec<(String, String)>,
        replies: Vec<LocalReply>,
        counted: Vec<Counter>,
    }

    impl FakeHost {
        fn request(method: &str, path: &str, extra: &[(&str, &str)]) -> Self {
            let mut h = FakeHost::default();
            h.headers.push((":method".into(), method.into()));
            h.headers.push((":path".into(), path.into()));
            for (k, v) in extra {
                h.headers.push(((*k).into(), (*v).into()));
            }
            h
        }

        fn get(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
        }
    }

    impl HeaderHost for FakeHost {
        fn header_names(&self) -> Vec<String> {
            self.headers.iter().map(|(k, _)| k.clone()).collect()
        }
        fn header(&self, name: &str) -> Option<String> {
            self.get(name).map(str::to_string)
        }
        fn set_header(&mut self, name: &str, value: Option<&str>) {
            self.headers.retain(|(k, _)| !k.eq_ignore_ascii_case(name));
            if let Some(v) = value {
                self.headers.push((name.into(), v.into()));
            }
        }
        fn send_reply(&mut self, reply: &LocalReply) {
            self.replies.push(reply.clone());
        }
        fn count(&mut self, counter: Counter) {
            self.counted.push(counter);
        }
    }

    const CHAT: &str = "/v1/chat/completions";

    #[test]
    fn a_clients_reserved_headers_are_stripped_whatever_their_case() {
        let mut h = FakeHost::request(
            "POST",
            CHAT,
            &[
                ("X-Fleetroute-Cluster", "evil"),
                ("x-fleetroute-key", "1"),
                ("x-gateway-destination-endpoint", "10.0.0.1:80"),
                ("x-keep", "yes"),
                ("content-length", "10"),
            ],
        );
        assert_eq!(
            on_request_headers(&mut h, &FilterConfig::default(), false),
            Next::ReadBody
        );
        assert_eq!(h.get("x-fleetroute-cluster"), None);
        assert_eq!(h.get("x-fleetroute-key"), None);
        assert_eq!(h.get("x-gateway-destination-endpoint"), None);
        assert_eq!(h.get("x-keep"), Some("yes"));
        let stripped = h
            .counted
            .iter()
            .filter(|c| **c == Counter::ReservedStripped)
            .count();
        assert_eq!(stripped, 3);
        assert!(h.replies.is_empty());
    }

    #[test]
    fn residency_is_normalised_or_refused_with_a_400() {
        let mut h = FakeHost::request("POST", CHAT, &[("x-residency", " eu , us ")]);
        on_request_headers(&mut h, &FilterConfig::default(), false);
        let written = h.get(contract::RESIDENCY).map(str::to_string);
        assert_eq!(written, model::residency(" eu , us ").ok());
        assert!(written.is_some());

        let mut h = FakeHost::request("POST", CHAT, &[("x-residency", " , ")]);
        assert_eq!(
            on_request_headers(&mut h, &FilterConfig::default(), false),
            Next::Replied
        );
        assert_eq!(h.replies.len(), 1);
        assert_eq!(h.replies[0].status, 400);
        assert!(
            h.replies[0].body.contains("invalid_residency"),
            "{}",
            h.replies[0].body
        );
        assert_eq!(h.counted, vec![Counter::BadResidency]);
        assert_eq!(h.get(contract::RESIDENCY), None);
    }

    #[test]
    fn a_client_cannot_forge_the_residency_fleetroute_writes() {
        // Without a residency header configured, a forged internal one is
        // still stripped and nothing is written in its place.
        let cfg = FilterConfig {
            residency_header: None,
            ..FilterConfig::default()
        };
        let mut h = FakeHost::request(
            "POST",
            CHAT,
            &[(contract::RESIDENCY, "us"), ("x-residency", "eu")],
        );
        on_request_headers(&mut h, &cfg, false);
        assert_eq!(h.get(contract::RESIDENCY), None);
    }

    #[test]
    fn only_a_trusted_header_names_a_tenant_and_only_a_hash_of_the_key_leaves() {
        let cfg = FilterConfig {
            tenant_header: Some("x-tenant".into()),
            ..FilterConfig::default()
        };
        let mut h = FakeHost::request("POST", CHAT, &[("x-tenant", "acme")]);
        on_request_headers(&mut h, &cfg, false);
        assert_eq!(h.get(contract::TENANT), Some("acme"));

        // Not configured as trusted: a client's header names no one, and a
        // token names no one either unless its hash is asked for.
        let mut h = FakeHost::request(
            "POST",
            CHAT,
            &[("x-tenant", "acme"), ("authorization", "Bearer sk-secret")],
        );
        on_request_headers(&mut h, &FilterConfig::default(), false);
        assert_eq!(h.get(contract::TENANT), None);
        assert_eq!(h.get(contract::KEY_HASH), None);

        let hashing = FilterConfig {
            api_key_hash: true,
            ..FilterConfig::default()
        };
        let mut h = FakeHost::request("POST", CHAT, &[("authorization", "Bearer sk-secret")]);
        on_request_headers(&mut h, &hashing, false);
        let k = h
            .get(contract::KEY_HASH)
            .expect("the key's hash")
            .to_string();
        assert!(!k.contains("sk-secret"), "the token leaked: {k}");
        assert_eq!(Some(k), tenant::key_hash(Some("Bearer sk-secret")));
        assert_eq!(h.get(contract::TENANT), None);
        // A client's copy of either header never survives.
        let mut h = FakeHost::request(
            "POST",
            CHAT,
            &[(contract::KEY_HASH, "forged"), (contract::TENANT, "forged")],
        );
        on_request_headers(&mut h, &hashing, false);
        assert_eq!(h.get(contract::KEY_HASH), None);
        assert_eq!(h.get(contract::TENANT), None);
    }

    #[test]
    fn a_declared_size_over_the_limit_is_refused_before_any_body() {
        let cfg = FilterConfig {
            max_body_bytes: 100,
            ..FilterConfig::default()
        };
        let mut h = FakeHost::request("POST", CHAT, &[("content-length", "101")]);
        assert_eq!(on_request_headers(&mut h, &cfg, false), Next::Replied);
        assert_eq!(h.replies, vec![LocalReply::too_large()]);
        assert_eq!(h.counted, vec![Counter::TooLarge]);

        let mut h = FakeHost::request("POST", CHAT, &[("content-length", "100")]);
        assert_eq!(on_request_headers(&mut h, &cfg, false), Next::ReadBody);
        // A garbled length is checked on the body chunks instead.
        let mut h = FakeHost::request("POST", CHAT, &[("content-length", "lots")]);
        assert_eq!(on_request_headers(&mut h, &cfg, false), Next::ReadBody);
        assert!(h.replies.is_empty());
    }

    #[test]
    fn only_configured_posts_with_a_body_are_read() {
        let cfg = FilterConfig::default();
        for (method, path, eos) in [
            ("GET", CHAT, false),
            ("POST", "/v1/embeddings", false),
            ("POST", CHAT, true),
        ] {
            let mut h = FakeHost::request(method, path, &[("content-length", "5")]);
            assert_eq!(
                on_request_headers(&mut h, &cfg, eos),
                Next::Continue,
                "{method} {path} {eos}"
            );
            assert_eq!(h.counted, vec![Counter::PassedUntouched]);
        }
        let mut h = FakeHost::request("POST", "/v1/chat/completions?x=1", &[]);
        assert_eq!(on_request_headers(&mut h, &cfg, false), Next::ReadBody);
    }

    #[test]
    fn only_a_get_of_the_model_list_is_marked_for_ext_proc() {
        let cfg = FilterConfig::default();
        for (method, path, marked) in [
            ("GET", "/v1/models", true),
            ("GET", "/v1/models?limit=5", true),
            ("POST", "/v1/models", false),
            ("GET", "/v1/models/m1", false),
            ("GET", "/v1/modelsx", false),
        ] {
            let mut h = FakeHost::request(method, path, &[(contract::ENDPOINT, "forged")]);
            on_request_headers(&mut h, &cfg, true);
            let want = marked.then_some(contract::ENDPOINT_MODELS);
            assert_eq!(h.get(contract::ENDPOINT), want, "{method} {path}");
        }
        let off = FilterConfig {
            models_path: None,
            ..FilterConfig::default()
        };
        let mut h = FakeHost::request("GET", "/v1/models", &[]);
        on_request_headers(&mut h, &off, true);
        assert_eq!(h.get(contract::ENDPOINT), None);
    }

    #[test]
    fn missing_pseudo_headers_pass_untouched() {
        let mut h = FakeHost::default();
        assert_eq!(
            on_request_headers(&mut h, &FilterConfig::default(), false),
            Next::Continue
        );
        assert!(h.replies.is_empty());
    }
}
