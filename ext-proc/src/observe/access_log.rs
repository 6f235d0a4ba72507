//! Envoy's gRPC access log service: every finished request arrives as one
//! entry in a batch, on one long-lived stream per Envoy worker. An entry
//! carries the decision (route tag in dynamic metadata), the served host,
//! status and reset flags, time to the first upstream body byte (custom tag)
//! and the token usage the Wasm filter read off the response (filter state).
//! Entries are unordered across workers: they are matched by decision nonce.

use std::sync::Arc;

use envoy_types::pb::envoy::data::accesslog::v3::HttpAccessLogEntry;
use envoy_types::pb::envoy::service::accesslog::v3::access_log_service_server::AccessLogService;
use envoy_types::pb::envoy::service::accesslog::v3::stream_access_logs_message::LogEntries;
use envoy_types::pb::envoy::service::accesslog::v3::{
    StreamAccessLogsMessage, StreamAccessLogsResponse,
};
use prost::Message;
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

use super::entry::read_entry;
use crate::metrics::{Entry, Forwarded};
use crate::peers::PeerLink;
use crate::shutdown::Phase;
use crate::state::{Event, Shared};
use crate::stream_limit::{FIRST_MESSAGE, StreamLimit};

/// Access log streams at once (one per Envoy worker), and from one peer
/// address (an Envoy with as many workers as it may have).
pub const MAX_STREAMS: usize = 4096;
pub const MAX_STREAMS_PER_PEER: usize = 1024;

pub struct LogService {
    shared: Arc<Shared>,
    /// Where entries of other instances' decisions go (none: applied here).
    peers: Option<PeerLink>,
    streams: Arc<StreamLimit>,
}

impl LogService {
    pub fn new(shared: Arc<Shared>) -> Self {
        LogService {
            shared,
            peers: None,
            streams: StreamLimit::new("access log", MAX_STREAMS, MAX_STREAMS_PER_PEER),
        }
    }

    /// Forwards entries of other instances' decisions to them.
    pub fn with_peers(shared: Arc<Shared>, peers: PeerLink) -> Self {
        LogService {
            peers: Some(peers),
            ..Self::new(shared)
        }
    }
}

#[tonic::async_trait]
impl AccessLogService for LogService {
    async fn stream_access_logs(
        &self,
        request: tonic::Request<Streaming<StreamAccessLogsMessage>>,
    ) -> Result<tonic::Response<StreamAccessLogsResponse>, Status> {
        let _place = self.streams.take(request.remote_addr().map(|a| a.ip()))?;
        let mut inbound = request.into_inner();
        // Envoy opens a stream to send its first batch: one that stays
        // silent is not Envoy.
        let mut next = match tokio::time::timeout(FIRST_MESSAGE, inbound.message()).await {
            Ok(Ok(Some(msg))) => Some(msg),
            _ => return Ok(tonic::Response::new(StreamAccessLogsResponse {})),
        };
        // Ends when Envoy closes or resets the stream (it reconnects by
        // itself), or when this instance stops.
        let closing = self.shared.shutdown.reached(Phase::Closing);
        tokio::pin!(closing);
        while let Some(msg) = match next.take() {
            Some(m) => Some(m),
            None => tokio::select! {
                m = inbound.message() => m.ok().flatten(),
                () = &mut closing => None,
            },
        } {
            if let Some(LogEntries::HttpLogs(batch)) = msg.log_entries {
                for entry in &batch.log_entry {
                    observe(&self.shared, self.peers.as_ref(), entry);
                }
            }
        }
        Ok(tonic::Response::new(StreamAccessLogsResponse {}))
    }
}

/// An entry as Envoy sent it: another instance's decision goes to that
/// instance when there is a peer link; without one (or for an entry that
/// names no instance) it is read here.
pub fn observe(shared: &Shared, peers: Option<&PeerLink>, entry: &HttpAccessLogEntry) {
    if let Some(owner) = super::forward::owner(entry)
        && owner != shared.instance
    {
        count(shared, Entry::Foreign);
        match peers {
            Some(link) => link.forward(owner, super::forward::encode(entry)),
            // Alone: its outcome still counts here, by names; its owner's
            // lease ends by its bound or by reconciliation.
            None => {
                if let Some((_, obs)) = read_entry(entry) {
                    shared.emit(Event::Observed(Box::new(obs)));
                }
            }
        }
        return;
    }
    observe_own(shared, entry);
}

fn count(shared: &Shared, result: Entry) {
    shared.metrics.access_log.entries.inc(result);
}

/// Ends the entry's lease (this instance's decision), commits its tenant's
/// charge and hands its outcome to the writer.
pub fn observe_own(shared: &Shared, entry: &HttpAccessLogEntry) {
    let result = match read_entry(entry) {
        None => Entry::Untagged,
        Some((nonce, mut obs)) => {
            let lease = shared.leases.end(nonce);
            if let Some(l) = &lease {
                // The fleet's time to first token starts when it got the
                // request, not while admission held it.
                obs.time_to_first_byte = obs.time_to_first_byte.map(|t| t.saturating_sub(l.held));
            }
            obs.decided = lease.as_ref().map(|l| l.decided);
            let ended = obs.decided.is_some();
            // The lease's own charge, or one its expiry left for a late entry.
            let charge = match &lease {
                Some(l) => l.take_charge(),
                None => shared.leases.late_charge(nonce),
            };
            if let Some(c) = charge {
                super::charge::settle(shared, entry, &obs, c);
            }
            shared.emit(Event::Observed(Box::new(obs)));
            if ended { Entry::Observed } else { Entry::Late }
        }
    };
    count(shared, result);
}

/// Reads the entries other instances forwarded to this one, as if Envoy
/// had sent them here; ends when the link stops.
pub async fn receive(shared: Arc<Shared>, mut rx: mpsc::Receiver<Vec<u8>>) {
    while let Some(bytes) = rx.recv().await {
        let m = &shared.metrics;
        match HttpAccessLogEntry::decode(bytes.as_slice()) {
            // An entry that names another owner is not this one's to end.
            Ok(e) if super::forward::owner(&e) == Some(shared.instance.as_str()) => {
                m.peers.forwards.add(Forwarded::Received, 1);
                observe_own(&shared, &e);
            }
            _ => m.peers.forwards.add(Forwarded::Bad, 1),
        }
    }
}
