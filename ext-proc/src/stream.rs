//! The ext_proc gRPC service: the routing filter's streams, the transport of
//! the request path (`request`). A request's headers get a decision; a
//! routed request's response headers, which the rename root holds until the
//! first body byte, end its replica's prefill share. Outcomes come back
//! through the access log (`observe::access_log`), not through ext_proc.

use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::HeaderMap;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessor;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    ProcessingRequest, ProcessingResponse, processing_request::Request,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use crate::admission::Admission;
use crate::request::{Answer, Held, Reply, attempt, give_up, reply, route_request};
use crate::shutdown::Phase;
use crate::state::Shared;
use crate::stream_limit::FIRST_MESSAGE;

pub struct Service {
    shared: Arc<Shared>,
    admission: Arc<Admission>,
}

impl Service {
    pub fn new(shared: Arc<Shared>) -> Self {
        Service {
            shared,
            admission: Arc::new(Admission::new(crate::clock::now())),
        }
    }
}

/// Waits out a held request: its answer, or `None` when Envoy's stream ended
/// (the client went away); the ticket is then dropped and the request leaves
/// its queue at once.
async fn hold(
    shared: &Shared,
    admission: &Admission,
    held: Held<'_>,
    headers: &HeaderMap,
    inbound: &mut Streaming<ProcessingRequest>,
) -> Option<Reply> {
    let mut held = held;
    loop {
        let deadline = tokio::time::Instant::from_std(held.ticket.deadline());
        tokio::select! {
            biased;
            // Envoy ends the stream when the client resets; any other message
            // here is outside the protocol (nothing else is sent before the
            // request is answered), so the request is given up too.
            _ = inbound.message() => return None,
            // Stopping: answered now rather than held past the grace.
            () = shared.shutdown.reached(Phase::Closing) => {
                return Some(give_up(shared, admission, held, headers, crate::clock::now()).await);
            }
            _ = tokio::time::sleep_until(deadline) => {
                return Some(give_up(shared, admission, held, headers, crate::clock::now()).await);
            }
            _ = held.ticket.turn() => {}
        }
        if held.ticket.evicted() {
            return Some(give_up(shared, admission, held, headers, crate::clock::now()).await);
        }
        if !held.ticket.is_head(crate::clock::now()) {
            continue;
        }
        let Held { ticket, mut key } = held;
        match attempt(shared, admission, &mut key, headers, ticket).await {
            Ok(answer) => return Some(answer),
            Err(ticket) => held = Held { ticket, key },
        }
    }
}

#[tonic::async_trait]
impl ExternalProcessor for Service {
    type ProcessStream = ReceiverStream<Result<ProcessingResponse, Status>>;

    async fn process(
        &self,
        request: tonic::Request<Streaming<ProcessingRequest>>,
    ) -> Result<tonic::Response<Self::ProcessStream>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(4);
        let shared = self.shared.clone();
        let admission = self.admission.clone();
        tokio::spawn(async move {
            // The request this stream routed, whose lease later messages
            // report on.
            let mut routed: Option<u64> = None;
            // How long it waited for its adapter, told to the client.
            let mut cold_start: Option<std::time::Duration> = None;
            // Envoy opens a stream to send a request's headers at once: one
            // that stays silent is not Envoy, and holds no task for long.
            let mut next = match tokio::time::timeout(FIRST_MESSAGE, inbound.message()).await {
                Ok(Ok(Some(msg))) => Some(msg),
                _ => return,
            };
            // A reset stream ends the loop like a clean close.
            while let Some(msg) = match next.take() {
                Some(m) => Some(m),
                None => inbound.message().await.ok().flatten(),
            } {
                // An observing filter from an older bootstrap: outcomes now come
                // from the access log. Envoy ignores replies in this mode; end
                // the call with the response rather than hold it open.
                if msg.observability_mode {
                    let end = match &msg.request {
                        Some(Request::ResponseHeaders(h)) => h.end_of_stream,
                        Some(Request::ResponseBody(b)) => b.end_of_stream,
                        Some(Request::ResponseTrailers(_)) => true,
                        _ => false,
                    };
                    if end {
                        break;
                    }
                    continue;
                }
                let reply = match &msg.request {
                    Some(Request::RequestHeaders(h)) => {
                        let metadata = msg.metadata_context.as_ref();
                        let answer = match route_request(&shared, &admission, h, metadata).await {
                            Answer::Now(r) => r,
                            Answer::Held(held) => {
                                // Without this Envoy gives up after its
                                // message_timeout and fails the request open.
                                let bound = held
                                    .ticket
                                    .deadline()
                                    .saturating_duration_since(crate::clock::now());
                                if tx.send(Ok(reply::extend_timer(bound))).await.is_err() {
                                    break;
                                }
                                // Held only when it had headers.
                                let Some(map) = h.headers.as_ref() else { break };
                                match hold(&shared, &admission, held, map, &mut inbound).await {
                                    Some(r) => r,
                                    None => break,
                                }
                            }
                        };
                        let answer = match &answer.load {
                            // Envoy's timer covers the registration too.
                            Some(p) => {
                                if tx.send(Ok(reply::extend_timer(p.timeout))).await.is_err() {
                                    break;
                                }
                                let (answer, waited) = answer.loaded(&shared).await;
                                cold_start = waited;
                                answer
                            }
                            None => answer,
                        };
                        routed = answer.nonce;
                        answer.response
                    }
                    // The first body byte is on its way to the client: the
                    // replica has finished the prompt.
                    Some(other @ Request::ResponseHeaders(_)) => {
                        if let Some(nonce) = routed.take() {
                            shared.leases.first_byte(nonce);
                        }
                        match cold_start.take() {
                            Some(waited) => reply::cold_start(waited),
                            None => reply::continue_unchanged(other),
                        }
                    }
                    // Nothing else is asked for; anything else is let through
                    // so Envoy never waits on us.
                    Some(other) => reply::continue_unchanged(other),
                    None => continue,
                };
                if tx.send(Ok(reply)).await.is_err() {
                    break;
                }
            }
        });
        Ok(tonic::Response::new(ReceiverStream::new(rx)))
    }
}
