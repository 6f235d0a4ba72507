//! The only file that talks to the proxy-wasm host: it moves headers and body
//! bytes between Envoy and the plain-Rust logic in the rest of the crate.

use std::rc::Rc;

use proxy_wasm::hostcalls::{define_metric, increment_metric};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel, MetricType};

use crate::config::FilterConfig;
use crate::contract::{self, ParseStatus};
use crate::extract::{extract, model, tenant};
use crate::http::{BodyCollector, LocalReply, check_size, is_reserved_header, wants_body};
use crate::response::UsageScanner;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| Box::new(Root::default()));
}}

/// Counters Envoy shows as `wasmcustom.fleetroute_filter.*`.
struct Metrics {
    parse_ok: u32,
    parse_bad_shape: u32,
    parse_not_json: u32,
    passed_untouched: u32,
    too_large: u32,
    bad_residency: u32,
    reserved_stripped: u32,
}

impl Metrics {
    fn define() -> Option<Self> {
        let c =
            |n: &str| define_metric(MetricType::Counter, &format!("fleetroute_filter.{n}")).ok();
        Some(Metrics {
            parse_ok: c("parse_ok")?,
            parse_bad_shape: c("parse_bad_shape")?,
            parse_not_json: c("parse_not_json")?,
            passed_untouched: c("passed_untouched")?,
            too_large: c("body_too_large")?,
            bad_residency: c("bad_residency")?,
            reserved_stripped: c("reserved_header_stripped")?,
        })
    }

    fn inc(&self, id: u32) {
        let _ = increment_metric(id, 1);
    }
}

#[derive(Default)]
struct Root {
    shared: Option<Rc<(FilterConfig, Metrics)>>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let raw = self.get_plugin_configuration().unwrap_or_default();
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
        self.shared = Some(Rc::new((cfg, metrics)));
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        let shared = self.shared.clone()?;
        Some(Box::new(Request {
            shared,
            body: None,
            seen: 0,
            response: UsageScanner::default(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Request {
    shared: Rc<(FilterConfig, Metrics)>,
    /// `Some` while the body is being read.
    body: Option<BodyCollector>,
    seen: usize,
    /// Reads usage off the response as it streams past (never buffered).
    response: UsageScanner,
}

impl Request {
    fn reply(&self, r: LocalReply) -> Action {
        self.send_http_response(
            r.status,
            vec![("content-type", "application/json")],
            Some(r.body.as_bytes()),
        );
        Action::Pause
    }

    fn header(&self, name: &str) -> Option<String> {
        let v = self.get_http_request_header_bytes(name)?;
        String::from_utf8(v).ok()
    }

    fn finish_body(&mut self) {
        let Some(body) = self.body.take() else { return };
        let (cfg, m) = &*self.shared;
        let ex = extract(body.body(), cfg);
        m.inc(match ex.status {
            ParseStatus::Ok => m.parse_ok,
            ParseStatus::BadShape => m.parse_bad_shape,
            ParseStatus::NotJson => m.parse_not_json,
        });
        for (name, value) in ex.headers(cfg) {
            self.set_http_request_header(name, Some(&value));
        }
    }
}

impl Context for Request {}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _n: usize, end_of_stream: bool) -> Action {
        let shared = self.shared.clone();
        let (cfg, m) = &*shared;
        for (name, _) in self.get_http_request_headers_bytes() {
            if is_reserved_header(&name) {
                self.set_http_request_header(&name, None);
                m.inc(m.reserved_stripped);
            }
        }
        if let Some(value) = cfg.residency_header.as_deref().and_then(|h| self.header(h)) {
            match model::residency(&value) {
                Ok(r) => self.set_http_request_header(contract::RESIDENCY, Some(&r)),
                Err(why) => {
                    m.inc(m.bad_residency);
                    return self.reply(LocalReply::error(400, "invalid_residency", &why));
                }
            }
        }
        let tenant_value = cfg.tenant_header.as_deref().and_then(|h| self.header(h));
        if let Some(t) = tenant::tenant(
            tenant_value.as_deref(),
            self.header("authorization").as_deref(),
        ) {
            self.set_http_request_header(contract::TENANT, Some(&t));
        }
        let method = self.header(":method").unwrap_or_default();
        let path = self.header(":path").unwrap_or_default();
        if end_of_stream || !wants_body(cfg, &method, &path) {
            m.inc(m.passed_untouched);
            return Action::Continue;
        }
        let declared = self
            .header("content-length")
            .and_then(|v| v.trim().parse::<usize>().ok());
        if let Err(r) = check_size(cfg, declared.unwrap_or(0)) {
            m.inc(m.too_large);
            return self.reply(r);
        }
        self.body = Some(BodyCollector::default());
        Action::Pause
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let Some(mut body) = self.body.take() else {
            return Action::Continue;
        };
        // Envoy keeps the paused body buffered; read only what is new.
        if body_size > self.seen {
            let chunk = self
                .get_http_request_body(self.seen, body_size - self.seen)
                .unwrap_or_default();
            self.seen = body_size;
            if let Err(r) = body.push(&self.shared.0, &chunk) {
                self.shared.1.inc(self.shared.1.too_large);
                return self.reply(r);
            }
        }
        self.body = Some(body);
        if !end_of_stream {
            return Action::Pause;
        }
        self.finish_body();
        Action::Continue
    }

    fn on_http_request_trailers(&mut self, _n: usize) -> Action {
        self.finish_body();
        Action::Continue
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
}
