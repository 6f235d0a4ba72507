//! With `host_rename` and `host_upstream`, the only code that talks to the
//! proxy-wasm host: it moves headers and body bytes between Envoy and the
//! plain-Rust logic in the rest of the crate. One module, three roots: the
//! request reader (this file) and, by `root_id`, the model rename after
//! ext_proc (`host_rename`) and the retry's rename on the `retry/` clusters
//! (`host_upstream`).

use std::rc::Rc;

use proxy_wasm::hostcalls::{define_metric, increment_metric};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel, MetricType};

use crate::body::{Budget, Hold, read_in_pieces};
use crate::config::FilterConfig;
use crate::contract::{self, ParseStatus};
use crate::extract::extract;
use crate::headers::{Counter, HeaderHost, Next, on_request_headers};
use crate::http::{LocalReply, check_size};
use crate::response::UsageScanner;
use crate::{host_rename, host_upstream};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| Box::new(Root::default()));
}}

/// Counters Envoy shows as `wasmcustom.fleetroute_filter.*`.
struct Metrics {
    parse_ok: u32,
    parse_bad_shape: u32,
    parse_not_json: u32,
    parse_duplicate_key: u32,
    passed_untouched: u32,
    too_large: u32,
    bad_residency: u32,
    reserved_stripped: u32,
    over_budget: u32,
    body_no_memory: u32,
}

impl Metrics {
    fn define() -> Option<Self> {
        let c =
            |n: &str| define_metric(MetricType::Counter, &format!("fleetroute_filter.{n}")).ok();
        Some(Metrics {
            parse_ok: c("parse_ok")?,
            parse_bad_shape: c("parse_bad_shape")?,
            parse_not_json: c("parse_not_json")?,
            parse_duplicate_key: c("parse_duplicate_key")?,
            passed_untouched: c("passed_untouched")?,
            too_large: c("body_too_large")?,
            bad_residency: c("bad_residency")?,
            reserved_stripped: c("reserved_header_stripped")?,
            over_budget: c("over_budget")?,
            body_no_memory: c("body_no_memory")?,
        })
    }

    fn inc(&self, id: u32) {
        let _ = increment_metric(id, 1);
    }
}

/// What every request of this worker's VM shares.
struct Shared {
    cfg: FilterConfig,
    metrics: Metrics,
    budget: Rc<Budget>,
}

#[derive(Default)]
struct Root {
    shared: Option<Rc<Shared>>,
    /// Set instead when this root is the rename root.
    rename: Option<Rc<host_rename::Shared>>,
    /// This root is the upstream root (`host_upstream`).
    upstream: bool,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let raw = self.get_plugin_configuration().unwrap_or_default();
        let root_id = self
            .get_property(vec!["plugin_root_id"])
            .unwrap_or_default();
        if root_id == contract::RENAME_ROOT_ID.as_bytes() {
            self.rename = host_rename::configure(&raw);
            return self.rename.is_some();
        }
        if root_id == contract::UPSTREAM_ROOT_ID.as_bytes() {
            // Like the rename root's: everything comes per request.
            self.upstream = true;
            return host_rename::configure_empty(&raw, "upstream");
        }
        let cfg = match FilterConfig::parse(&raw) {
            Ok(cfg) => cfg,
            Err(e) => {
                // Returning false stops the filter from starting: Envoy refuses the config.
                proxy_wasm::hostcalls::log(
                    LogLevel::Critical,
                    &format!("fleetroute filter: invalid configuration: {e}"),
                )
                .ok();
                return false;
            }
        };
        let Some(metrics) = Metrics::define() else {
            proxy_wasm::hostcalls::log(
                LogLevel::Critical,
                "fleetroute filter: cannot define metrics",
            )
            .ok();
            return false;
        };
        let budget = Budget::new(cfg.max_buffered_bytes_per_worker);
        self.shared = Some(Rc::new(Shared {
            cfg,
            metrics,
            budget,
        }));
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        if let Some(r) = &self.rename {
            return Some(host_rename::context(r.clone()));
        }
        if self.upstream {
            return Some(host_upstream::context());
        }
        let shared = self.shared.clone()?;
        Some(Box::new(Request {
            shared,
            hold: None,
            buffered: 0,
            response: UsageScanner::default(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Request {
    shared: Rc<Shared>,
    /// `Some` while the body is paused in Envoy: its bytes count against the
    /// worker's budget until the body is passed on or the request ends
    /// (dropping the context, which the host does on a reset too).
    hold: Option<Hold>,
    /// Body bytes Envoy has buffered so far.
    buffered: usize,
    /// Reads usage off the response as it streams past (never buffered).
    response: UsageScanner,
}

impl Request {
    fn reply(&mut self, r: LocalReply) -> Action {
        let retry_after = r.retry_after_s.map(|s| s.to_string());
        let mut headers = vec![("content-type", "application/json")];
        if let Some(s) = retry_after.as_deref() {
            headers.push(("retry-after", s));
        }
        self.send_http_response(r.status, headers, Some(r.body.as_bytes()));
        Action::Pause
    }

    /// Reads the whole buffered body once and writes the route headers.
    fn finish_body(&mut self) -> Action {
        if self.hold.is_none() {
            return Action::Continue;
        }
        let shared = self.shared.clone();
        let (cfg, m) = (&shared.cfg, &shared.metrics);
        let body = read_in_pieces(self.buffered, |at, len| self.get_http_request_body(at, len));
        let Ok(body) = body else {
            m.inc(m.body_no_memory);
            return self.reply(LocalReply::overloaded(
                "the router cannot take this request body now; retry shortly",
            ));
        };
        let ex = extract(&body, cfg);
        drop(body);
        m.inc(match ex.status {
            ParseStatus::Ok => m.parse_ok,
            ParseStatus::BadShape => m.parse_bad_shape,
            ParseStatus::NotJson => m.parse_not_json,
            ParseStatus::DuplicateKey => m.parse_duplicate_key,
        });
        if let Some(refusal) = LocalReply::unreadable(ex.status) {
            return self.reply(refusal);
        }
        for (name, value) in ex.headers(cfg) {
            self.set_http_request_header(name, Some(&value));
        }
        // Passed on: Envoy streams it upstream and no longer holds it for us.
        self.hold = None;
        Action::Continue
    }
}

impl HeaderHost for Request {
    fn header_names(&self) -> Vec<String> {
        let headers = self.get_http_request_headers_bytes();
        headers.into_iter().map(|(name, _)| name).collect()
    }

    fn header(&self, name: &str) -> Option<String> {
        let v = self.get_http_request_header_bytes(name)?;
        String::from_utf8(v).ok()
    }

    fn set_header(&mut self, name: &str, value: Option<&str>) {
        self.set_http_request_header(name, value);
    }

    fn send_reply(&mut self, reply: &LocalReply) {
        let _ = self.reply(reply.clone());
    }

    fn count(&mut self, counter: Counter) {
        let m = &self.shared.metrics;
        m.inc(match counter {
            Counter::ReservedStripped => m.reserved_stripped,
            Counter::BadResidency => m.bad_residency,
            Counter::PassedUntouched => m.passed_untouched,
            Counter::TooLarge => m.too_large,
        });
    }
}

impl Context for Request {
    fn on_done(&mut self) -> bool {
        // The stream is over (reset included): give the budget back now.
        self.hold = None;
        true
    }
}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _n: usize, end_of_stream: bool) -> Action {
        let shared = self.shared.clone();
        match on_request_headers(self, &shared.cfg, end_of_stream) {
            Next::Continue => Action::Continue,
            // Envoy buffers the body while this filter pauses; it is read at its end.
            Next::ReadBody => {
                self.hold = Some(Hold::new(shared.budget.clone()));
                Action::Pause
            }
            Next::Replied => Action::Pause,
        }
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let Some(hold) = self.hold.as_mut() else {
            return Action::Continue;
        };
        self.buffered = body_size;
        let shared = self.shared.clone();
        let (cfg, m) = (&shared.cfg, &shared.metrics);
        // Checked on every chunk, so a body without content-length (or lying
        // about it) is refused as soon as it passes the limit.
        if let Err(r) = check_size(cfg, body_size) {
            m.inc(m.too_large);
            return self.reply(r);
        }
        if hold.grow_to(body_size as u64).is_err() {
            m.inc(m.over_budget);
            return self.reply(LocalReply::overloaded(
                "the router holds as many request bodies as it may; retry shortly",
            ));
        }
        if !end_of_stream {
            return Action::Pause;
        }
        self.finish_body()
    }

    fn on_http_request_trailers(&mut self, _n: usize) -> Action {
        self.finish_body()
    }

    fn on_http_response_headers(&mut self, _n: usize, _end_of_stream: bool) -> Action {
        // Internal: never shown to a client, whoever set it.
        self.set_http_response_header(contract::UPSTREAM_HOST, None);
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, _end_of_stream: bool) -> Action {
        // Not paused, so Envoy hands over each chunk once and keeps nothing.
        if body_size > 0
            && let Some(chunk) = self.get_http_response_body(0, body_size)
            && self.response.push(&chunk)
        {
            // Filter state `wasm.fleetroute.usage`, read from Envoy's access log.
            let tag = self.response.tag.encode();
            self.set_property(vec![contract::USAGE_PROPERTY], Some(tag.as_bytes()));
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        self.hold = None;
    }
}
