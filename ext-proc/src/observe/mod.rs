//! What came back for a routed request, read from ext_proc's observing stream
//! (a second ext_proc filter in observability mode: Envoy sends response
//! headers and body chunks without waiting for replies, so observing adds no
//! round trip and buffers nothing).

pub mod usage;

use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::HeaderMap;
use fleetroute_filter::contract::{self, RouteTag};

use crate::route::experiment::Arm;
use crate::state::load::RequestGuard;
use crate::state::{Event, Shared};
use usage::{JsonBody, SseReader, Usage};

/// One finished request, as the writer learns it.
#[derive(Clone, Debug)]
pub struct Observation {
    pub stage: String,
    pub fleet: String,
    pub replica: String,
    /// The host that actually answered (a retry may differ from `replica`).
    pub served_by: Option<String>,
    pub status: Option<u16>,
    pub time_to_first_byte: Option<Duration>,
    pub total: Duration,
    pub usage: Option<Usage>,
    pub predicted_cached_tokens: u64,
    pub uncached_tokens: u64,
    /// Prefill tokens that were waiting on the replica when it was chosen.
    pub queued_tokens: u64,
    pub arm: Arm,
    pub stream: bool,
    /// The response ended before it was complete (reset, or SSE without [DONE]).
    pub ended_early: bool,
}

/// The decision, read back from the route tag.
struct RouteInfo {
    stage: String,
    fleet: String,
    replica: String,
    predicted: u64,
    uncached: u64,
    queued: u64,
    arm: Arm,
}

pub struct Observer {
    shared: Arc<Shared>,
    started: Instant,
    route: Option<RouteInfo>,
    load: Option<Arc<RequestGuard>>,
    status: Option<u16>,
    served_by: Option<String>,
    first_byte: Option<Duration>,
    sse: Option<SseReader>,
    json: JsonBody,
    finished: bool,
}

fn header<'a>(map: &'a HeaderMap, name: &str) -> Option<&'a str> {
    map.headers
        .iter()
        .find(|h| h.key == name)
        .map(crate::route::key::value)
}

impl Observer {
    pub fn new(shared: Arc<Shared>) -> Self {
        Observer {
            shared,
            started: Instant::now(),
            route: None,
            load: None,
            status: None,
            served_by: None,
            first_byte: None,
            sse: None,
            json: JsonBody::default(),
            finished: false,
        }
    }

    pub fn on_request_headers(&mut self, map: &HeaderMap) {
        let Some(tag) = header(map, contract::ROUTE).and_then(RouteTag::decode) else {
            return;
        };
        self.load = self.shared.claim_load(tag.nonce);
        self.route = Some(tag).map(|t| RouteInfo {
            stage: t.stage.to_string(),
            fleet: t.fleet.to_string(),
            replica: t.replica.to_string(),
            predicted: t.predicted_cached_tokens,
            uncached: t.uncached_tokens,
            queued: t.queued_tokens,
            arm: Arm::parse(t.arm),
        });
    }

    pub fn on_response_headers(&mut self, map: &HeaderMap, end_of_stream: bool) {
        self.status = header(map, ":status").and_then(|s| s.parse().ok());
        self.served_by = header(map, contract::UPSTREAM_HOST)
            .filter(|h| !h.is_empty() && *h != "-")
            .map(str::to_string);
        if header(map, "content-type").is_some_and(|c| c.starts_with("text/event-stream")) {
            self.sse = Some(SseReader::default());
        }
        if end_of_stream {
            self.finish(false);
        }
    }

    pub fn on_response_body(&mut self, chunk: &[u8], end_of_stream: bool) {
        if self.first_byte.is_none() && !chunk.is_empty() {
            self.first_byte = Some(self.started.elapsed());
            if let Some(l) = &self.load {
                l.prefill_done();
            }
        }
        match &mut self.sse {
            Some(r) => r.push(chunk),
            None => self.json.push(chunk),
        }
        if end_of_stream {
            self.finish(false);
        }
    }

    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Called once: at the end of the response, or when the stream goes away
    /// first (`reset`), which releases the in-flight count either way.
    pub fn finish(&mut self, reset: bool) {
        if self.finished {
            return;
        }
        self.finished = true;
        // Others may still hold the guard (the pending map drops its copy
        // lazily): release explicitly.
        if let Some(l) = self.load.take() {
            l.release();
        }
        let Some(RouteInfo {
            arm,
            stage,
            fleet,
            replica,
            predicted,
            uncached,
            queued,
        }) = self.route.take()
        else {
            return;
        };
        let (usage, ended_early) = match &self.sse {
            Some(r) => (r.usage, reset || !r.done),
            None => (self.json.usage(), reset),
        };
        self.shared.emit(Event::Observed(Box::new(Observation {
            stage,
            fleet,
            replica,
            served_by: self.served_by.take(),
            status: self.status,
            time_to_first_byte: self.first_byte,
            total: self.started.elapsed(),
            usage,
            predicted_cached_tokens: predicted,
            uncached_tokens: uncached,
            queued_tokens: queued,
            arm,
            stream: self.sse.is_some(),
            ended_early,
        })));
    }
}

impl Observation {
    /// A complete 2xx response.
    pub fn succeeded(&self) -> bool {
        self.status.is_some_and(|s| (200..300).contains(&s)) && !self.ended_early
    }

    /// Whether the outcome says something about the replica: client errors
    /// (4xx other than 429) do not.
    pub fn counts_against_replica(&self) -> bool {
        match self.status {
            Some(429) | None => true,
            Some(s) => !(400..500).contains(&s),
        }
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.finish(true);
    }
}
