//! The ext_proc gRPC service: the routing filter's streams (request headers
//! only; each gets a decision). Outcomes come back through the access log
//! (`observe::access_log`), not through ext_proc.

use std::sync::Arc;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessor;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    HttpHeaders, ProcessingRequest, ProcessingResponse, processing_request::Request,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};
use tracing::Instrument;

use crate::decision_trace::DecisionSpan;
use crate::route::place::place;
use crate::route::{key::RouteKey, mutation};
use crate::state::Shared;
use crate::state::lease::LeaseInput;

pub struct Service {
    shared: Arc<Shared>,
}

impl Service {
    pub fn new(shared: Arc<Shared>) -> Self {
        Service { shared }
    }
}

/// Decides one request from its headers: the fleet and replica, then the
/// tenant's admission on that fleet (a 429 when over a limit).
pub async fn route_request(shared: &Shared, headers: &HttpHeaders) -> ProcessingResponse {
    let Some(map) = headers.headers.as_ref() else {
        return mutation::pass();
    };
    let trace = DecisionSpan::start();
    let mut key = RouteKey::from_headers(map);
    if key.list_models {
        return mutation::model_list(&shared.snapshot().topo);
    }
    let (max_tokens, requested) = (key.max_tokens, key.model);
    key.spread_anonymous(fastrand::u64(..));
    let placed = place(shared, key, fastrand::u64(..))
        .instrument(trace.span().clone())
        .await;
    match placed {
        Ok(p) => {
            trace.routed(&p.snapshot, &p.decision);
            // The access log entry ends the lease (and commits the tenant's
            // charge) by this nonce, which only fleetroute writes (a client
            // can send any x-request-id).
            let d = &p.decision;
            let input = LeaseInput {
                prefill_tokens: d.uncached_tokens + d.queued_tokens,
                max_tokens,
                prefill_ms_per_k: p.snapshot.fleets[d.fleet].figures.latency,
            };
            let decided = p.decided();
            let reply = mutation::route(
                &p.snapshot.topo,
                &p.decision,
                p.nonce,
                &shared.instance,
                requested,
            );
            shared.hold_load(p.nonce, p.guard, decided, &input, Some(p.charge));
            reply
        }
        Err(reject) => {
            trace.rejected(&reject);
            mutation::reject(&reject)
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
        tokio::spawn(async move {
            // A reset stream ends the loop like a clean close.
            while let Ok(Some(msg)) = inbound.message().await {
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
                    Some(Request::RequestHeaders(h)) => route_request(&shared, h).await,
                    // The routing filter asks for request headers only; anything
                    // else is let through so Envoy never waits on us.
                    Some(other) => mutation::continue_unchanged(other),
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
