//! The filter's second root (`root_id: fleetroute_rename`), placed after the
//! ext_proc filter: for a request whose fleet serves the model under another
//! name (ext-proc's `x-fleetroute-served-model`), writes that name into the
//! body and the client's name back into the response. Every other request
//! costs one header lookup per callback and is never paused. It also holds
//! a routed response's headers until its first body byte when ext-proc asks
//! (`x-fleetroute-first-byte`): the ext_proc filter, before this root on the
//! way back, then reports the first token rather than the engine's early
//! headers. On a fallback (ext-proc's `x-fleetroute-fallback`) it shows the
//! client that header and leaves the response's `model` as the fallback
//! wrote it. Together with `host` the only code that talks to the proxy-wasm
//! host.

use std::rc::Rc;

use proxy_wasm::hostcalls::{define_metric, increment_metric};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, LogLevel, MetricType};

use crate::body::read_for_edit;
use crate::contract;
use crate::http::LocalReply;
use crate::rename::response::{Emit, Format, ModelRewriter};
use crate::rename::{MAX_MODEL_VALUE, request};

/// Counters Envoy shows as `wasmcustom.fleetroute_filter.*`.
struct Metrics {
    renamed: u32,
    untouched: u32,
    no_memory: u32,
    response_renamed: u32,
    response_encoded: u32,
}

impl Metrics {
    fn define() -> Option<Self> {
        let c =
            |n: &str| define_metric(MetricType::Counter, &format!("fleetroute_filter.{n}")).ok();
        Some(Metrics {
            renamed: c("model_renamed")?,
            untouched: c("model_rename_untouched")?,
            no_memory: c("model_rename_no_memory")?,
            response_renamed: c("model_response_renamed")?,
            response_encoded: c("model_response_encoded")?,
        })
    }

    fn inc(&self, id: u32) {
        let _ = increment_metric(id, 1);
    }
}

pub struct Shared {
    metrics: Metrics,
}

/// The root's configuration must be empty (or `{}`): the names come per
/// request, from ext-proc.
pub fn configure(raw: &[u8]) -> Option<Rc<Shared>> {
    if !configure_empty(raw, "rename") {
        return None;
    }
    let Some(metrics) = Metrics::define() else {
        log_critical("fleetroute rename: cannot define metrics");
        return None;
    };
    Some(Rc::new(Shared { metrics }))
}

/// Whether a root that takes no configuration got none (else it says so).
pub fn configure_empty(raw: &[u8], root: &str) -> bool {
    let text = String::from_utf8_lossy(raw);
    let t = text.trim();
    let empty = t.is_empty() || t.replace(char::is_whitespace, "") == "{}";
    if !empty {
        log_critical(&format!(
            "fleetroute {root}: the configuration must be empty or {{}}, found: {t}"
        ));
    }
    empty
}

fn log_critical(msg: &str) {
    proxy_wasm::hostcalls::log(LogLevel::Critical, msg).ok();
}

pub fn context(shared: Rc<Shared>) -> Box<dyn HttpContext> {
    Box::new(Rename {
        shared,
        served: None,
        client: None,
        buffered: 0,
        renamed: false,
        response: None,
        first_byte: false,
        fallback: None,
        may_retry_elsewhere: false,
    })
}

struct Rename {
    shared: Rc<Shared>,
    /// The chosen fleet's name for the model, until the body is renamed.
    served: Option<String>,
    /// The name the client asked for.
    client: Option<String>,
    buffered: usize,
    /// The request went upstream under the served name.
    renamed: bool,
    response: Option<ModelRewriter>,
    /// ext-proc asked for the response headers at the first body byte.
    first_byte: bool,
    /// ext-proc's `x-fleetroute-fallback`, for the client.
    fallback: Option<String>,
    /// Routed to a `retry/` cluster, whose upstream root writes the
    /// response's `x-fleetroute-fallback` when a retry went to the fallback.
    may_retry_elsewhere: bool,
}

impl Rename {
    fn rename_body(&mut self) -> Action {
        let Some(served) = self.served.take() else {
            return Action::Continue;
        };
        let m = &self.shared.metrics;
        // Room for the longest name the response side would rewrite.
        let body = read_for_edit(self.buffered, MAX_MODEL_VALUE * 2 + 2, |at, len| {
            self.get_http_request_body(at, len)
        });
        let Ok(mut body) = body else {
            m.inc(m.no_memory);
            let r = LocalReply::overloaded(
                "the router cannot take this request body now; retry shortly",
            );
            let retry = r.retry_after_s.unwrap_or(1).to_string();
            self.send_http_response(
                r.status,
                vec![
                    ("content-type", "application/json"),
                    ("retry-after", &retry),
                ],
                Some(r.body.as_bytes()),
            );
            return Action::Pause;
        };
        match request::rename(&mut body, &served) {
            Ok(len) => {
                self.set_http_request_body(0, self.buffered, &body);
                if self.get_http_request_header("content-length").is_some() {
                    self.set_http_request_header("content-length", Some(&len.to_string()));
                }
                self.renamed = true;
                m.inc(m.renamed);
            }
            // The fleet gets the body as the client sent it.
            Err(_) => m.inc(m.untouched),
        }
        Action::Continue
    }

    /// Sets up the response's rewrite for a renamed request.
    fn prepare_rename(&mut self) {
        // A fallback's answer keeps the model that wrote it.
        if !self.renamed || self.fallback.is_some() {
            return;
        }
        let Some(client) = self.client.as_deref() else {
            return;
        };
        let m = &self.shared.metrics;
        let encoded = self
            .get_http_response_header("content-encoding")
            .is_some_and(|e| !e.trim().eq_ignore_ascii_case("identity"));
        if encoded {
            m.inc(m.response_encoded);
            return;
        }
        let format = self
            .get_http_response_header("content-type")
            .and_then(|ct| Format::of(&ct));
        if let Some(f) = format {
            self.response = Some(ModelRewriter::new(f, client));
            // The body's length may change.
            self.set_http_response_header("content-length", None);
        }
    }
}

impl Context for Rename {}

impl HttpContext for Rename {
    fn on_http_request_headers(&mut self, _n: usize, end_of_stream: bool) -> Action {
        if self.get_http_request_header(contract::FIRST_BYTE).is_some() {
            // Only ext-proc sets it (the first root strips a client's copy).
            self.set_http_request_header(contract::FIRST_BYTE, None);
            self.first_byte = true;
        }
        if let Some(f) = self.get_http_request_header(contract::FALLBACK) {
            self.set_http_request_header(contract::FALLBACK, None);
            self.fallback = Some(f);
        }
        // Left in place: the upstream root reads it.
        self.may_retry_elsewhere = self
            .get_http_request_header(contract::UPSTREAM_FALLBACK)
            .is_some();
        let Some(served) = self.get_http_request_header(contract::SERVED_MODEL) else {
            return Action::Continue;
        };
        // Internal: it never goes upstream (the route removes it too).
        self.set_http_request_header(contract::SERVED_MODEL, None);
        self.client = self.get_http_request_header(contract::MODEL);
        if end_of_stream || self.client.is_none() {
            return Action::Continue;
        }
        // The response is rewritten as it passes, so it must come uncompressed.
        self.set_http_request_header("accept-encoding", None);
        self.served = Some(served);
        // Held until the body (already buffered by the first root) is renamed.
        Action::Pause
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.served.is_none() {
            return Action::Continue;
        }
        self.buffered = body_size;
        if !end_of_stream {
            return Action::Pause;
        }
        self.rename_body()
    }

    fn on_http_request_trailers(&mut self, _n: usize) -> Action {
        self.rename_body()
    }

    fn on_http_response_headers(&mut self, _n: usize, end_of_stream: bool) -> Action {
        if self.may_retry_elsewhere {
            // Only the upstream root's, which drops any engine's copy.
            if self.fallback.is_none() {
                self.fallback = self.get_http_response_header(contract::FALLBACK);
            }
        } else {
            // Only fleetroute's decision tells it; an engine's copy is dropped.
            self.set_http_response_header(contract::FALLBACK, self.fallback.as_deref());
        }
        self.prepare_rename();
        if self.first_byte && !end_of_stream {
            // Envoy hands this root the body while the headers wait; the
            // first chunk's `Continue` sends both on.
            return Action::Pause;
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.response.is_none() {
            return Action::Continue;
        }
        let chunk = if body_size == 0 {
            Vec::new()
        } else {
            self.get_http_response_body(0, body_size)
                .unwrap_or_default()
        };
        let emit = match self.response.as_mut() {
            Some(r) => r.push(&chunk, end_of_stream),
            None => Emit::Same,
        };
        if let Emit::Bytes(out) = emit {
            self.set_http_response_body(0, body_size, &out);
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        if self.response.as_ref().is_some_and(|r| r.renamed > 0) {
            let m = &self.shared.metrics;
            m.inc(m.response_renamed);
        }
    }
}
