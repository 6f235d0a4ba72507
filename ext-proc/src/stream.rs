//! The ext_proc gRPC service. Two kinds of stream arrive: the routing filter's
//! (request headers only; each gets a decision) and the observing filter's
//! (observability mode: request and response headers and body, no replies).

use std::sync::Arc;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessor;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    HttpHeaders, ProcessingRequest, ProcessingResponse, processing_request::Request,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use crate::observe::Observer;
use crate::route::place::place;
use crate::route::{key::RouteKey, mutation};
use crate::state::Shared;

pub struct Service {
    shared: Arc<Shared>,
}

impl Service {
    pub fn new(shared: Arc<Shared>) -> Self {
        Service { shared }
    }
}

/// Decides one request from its headers.
pub fn route_request(shared: &Shared, headers: &HttpHeaders) -> ProcessingResponse {
    let Some(map) = headers.headers.as_ref() else {
        return mutation::pass();
    };
    let mut key = RouteKey::from_headers(map);
    if key.key_source.is_none() && key.request_id.is_empty() {
        key.key = fastrand::u64(..);
    }
    match place(shared, key, fastrand::u64(..)) {
        Ok(p) => {
            // The observing stream claims the load by this nonce, which only
            // fleetroute writes (a client can send any x-request-id).
            shared.hold_load(p.nonce, p.guard);
            mutation::route(&p.snapshot.topo, &p.decision, p.nonce)
        }
        Err(reject) => mutation::reject(&reject),
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
            let mut observer: Option<Observer> = None;
            // A reset stream ends the loop like a clean close; the observer's
            // drop then releases the request's in-flight count.
            while let Ok(Some(msg)) = inbound.message().await {
                if msg.observability_mode {
                    let obs = observer.get_or_insert_with(|| Observer::new(shared.clone()));
                    match &msg.request {
                        Some(Request::RequestHeaders(h)) => {
                            if let Some(map) = &h.headers {
                                obs.on_request_headers(map);
                            }
                        }
                        Some(Request::ResponseHeaders(h)) => {
                            if let Some(map) = &h.headers {
                                obs.on_response_headers(map, h.end_of_stream);
                            }
                        }
                        Some(Request::ResponseBody(b)) => {
                            obs.on_response_body(&b.body, b.end_of_stream)
                        }
                        Some(Request::ResponseTrailers(_)) => obs.finish(false),
                        _ => {}
                    }
                    if obs.is_finished() {
                        // Nothing more will come: end the call now rather than
                        // leave Envoy holding it open until its deferred close.
                        break;
                    }
                    continue;
                }
                let reply = match &msg.request {
                    Some(Request::RequestHeaders(h)) => route_request(&shared, h),
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
