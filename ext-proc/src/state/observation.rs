//! One finished request, as the writer learns it (read off Envoy's access
//! log by `observe`).

use std::time::Duration;

use super::Decided;
use super::usage::Usage;
use crate::topology::Arm;

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
    /// The request's sampling key, when it had one.
    pub key: Option<u64>,
    /// The decision's ids, found by its nonce while its lease was held;
    /// `None` for an entry that came after its lease ended.
    pub decided: Option<Decided>,
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
