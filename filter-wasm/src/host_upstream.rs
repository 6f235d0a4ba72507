//! The filter's third root (`root_id: fleetroute_upstream`): an upstream
//! filter on the clusters that pair a fleet with its stage's `upstream`
//! fallback (`retry/<fleet>/<fleet>`), so it runs once per attempt. The first
//! attempt goes as decided. A retry (Envoy's `x-envoy-attempt-count` of 2 or
//! more) goes to the fallback's replica, the next host in fleetroute's list:
//! its body names the fallback's model, and its response tells the client
//! `x-fleetroute-fallback: <stage>; reason=upstream`. Any copy of that header
//! an engine writes is dropped here, so the rename root can trust what
//! reaches it on these clusters.

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;

use crate::body::read_for_edit;
use crate::contract;
use crate::rename::{MAX_MODEL_VALUE, request};

const ATTEMPT_COUNT: &str = "x-envoy-attempt-count";

pub fn context() -> Box<dyn HttpContext> {
    Box::new(Upstream {
        fallback: None,
        buffered: 0,
    })
}

struct Upstream {
    /// On a retry: the fallback stage and its model's name on the replica.
    fallback: Option<(String, String)>,
    buffered: usize,
}

impl Upstream {
    fn rename_body(&mut self) -> Action {
        let Some((_, model)) = &self.fallback else {
            return Action::Continue;
        };
        let body = read_for_edit(self.buffered, MAX_MODEL_VALUE * 2 + 2, |at, len| {
            self.get_http_request_body(at, len)
        });
        // Without memory for the copy the retry goes as it is: the engine
        // answers a model it does not serve with its own error.
        let Ok(mut body) = body else {
            return Action::Continue;
        };
        if let Ok(len) = request::rename(&mut body, model) {
            self.set_http_request_body(0, self.buffered, &body);
            if self.get_http_request_header("content-length").is_some() {
                self.set_http_request_header("content-length", Some(&len.to_string()));
            }
        }
        Action::Continue
    }
}

impl Context for Upstream {}

impl HttpContext for Upstream {
    fn on_http_request_headers(&mut self, _n: usize, end_of_stream: bool) -> Action {
        let Some(value) = self.get_http_request_header(contract::UPSTREAM_FALLBACK) else {
            return Action::Continue;
        };
        // Envoy's (the bootstrap turns it on for these routes; it sets it
        // anew for each attempt); the engine has no use for it.
        let retry = self
            .get_http_request_header(ATTEMPT_COUNT)
            .and_then(|n| n.trim().parse::<u32>().ok())
            .is_some_and(|n| n >= 2);
        self.set_http_request_header(ATTEMPT_COUNT, None);
        if !retry {
            // Every attempt edits the same headers: removed now, the retry
            // would not find it. The first replica sees it (a stage and a
            // model name, nothing a client wrote: the first root drops a
            // client's copy).
            return Action::Continue;
        }
        self.set_http_request_header(contract::UPSTREAM_FALLBACK, None);
        let Some((stage, model)) = value.split_once('|') else {
            return Action::Continue;
        };
        self.fallback = Some((stage.to_string(), model.to_string()));
        if end_of_stream {
            return Action::Continue;
        }
        // Held until the body (buffered by the router for retries) is renamed.
        Action::Pause
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.fallback.is_none() {
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

    fn on_http_response_headers(&mut self, _n: usize, _end_of_stream: bool) -> Action {
        let told = self
            .fallback
            .as_ref()
            .map(|(stage, _)| format!("{stage}; reason=upstream"));
        self.set_http_response_header(contract::FALLBACK, told.as_deref());
        Action::Continue
    }
}
