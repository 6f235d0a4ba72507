//! The gRPC side: one task per stream reads Envoy's requests and the served
//! set's changes, and writes what `protocol::Stream` says to send. The same
//! streams are served as ADS (`AggregatedDiscoveryService`, what the rendered
//! bootstrap uses: one stream per Envoy) and as plain EDS
//! (`EndpointDiscoveryService`: one stream per cluster, as Envoy 1.40 opens
//! them for an `api_config_source`).
//!
//! Bounds: at most `MAX_STREAMS` streams at once, a quarter of them from one
//! peer address (more are refused with RESOURCE_EXHAUSTED; Envoy retries
//! with backoff); a stream that sends no request within
//! `stream_limit::FIRST_MESSAGE` is ended; a request of at most
//! `MAX_REQUEST_BYTES` with at most `protocol::MAX_NAMES` names; at most
//! `QUEUED` responses waiting for Envoy to read, and a stream that cannot
//! take one for `SEND_TIMEOUT` is ended (Envoy reconnects and gets the full
//! set on its new stream). Responses share the served set's encoded
//! assignments, so a stream holds little more than its names.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::envoy::service::endpoint::v3::endpoint_discovery_service_server::{
    EndpointDiscoveryService, EndpointDiscoveryServiceServer,
};
use futures::Stream as FuturesStream;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request as GrpcRequest, Response, Status, Streaming};

use super::protocol::{Refused, Request, Stream};
use super::resources::{self, Resources};
use crate::metrics::EdsRequest;
use crate::shutdown::Phase;
use crate::state::Shared;
use crate::stream_limit::{FIRST_MESSAGE, StreamLimit};

/// Streams served at once: one per Envoy over ADS (the rendered bootstrap),
/// one per cluster over plain EDS.
pub const MAX_STREAMS: usize = 1024;
/// A request's encoded size (its cluster names, mostly).
pub const MAX_REQUEST_BYTES: usize = 1 << 20;
const QUEUED: usize = 2;
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Service {
    shared: Arc<Shared>,
    resources: watch::Receiver<Arc<Resources>>,
    streams: Arc<StreamLimit>,
}

/// The two gRPC services over one `Service` (one stream bound for both).
pub struct Servers {
    pub ads: AggregatedDiscoveryServiceServer<Service>,
    pub eds: EndpointDiscoveryServiceServer<Service>,
}

impl Service {
    /// Starts the served set's publisher and serves it.
    pub fn start(shared: Arc<Shared>) -> Servers {
        Self::bounded(shared, MAX_STREAMS, MAX_STREAMS / 4)
    }

    /// The same with another bound on streams, all of which one peer may
    /// take (tests).
    pub fn with_limit(shared: Arc<Shared>, max_streams: usize) -> Servers {
        Self::bounded(shared, max_streams, max_streams)
    }

    fn bounded(shared: Arc<Shared>, max_streams: usize, per_peer: usize) -> Servers {
        let resources = resources::publish(shared.clone());
        let service = Arc::new(Service {
            shared,
            resources,
            streams: StreamLimit::new("EDS", max_streams, per_peer),
        });
        Servers {
            ads: AggregatedDiscoveryServiceServer::from_arc(service.clone())
                .max_decoding_message_size(MAX_REQUEST_BYTES),
            eds: EndpointDiscoveryServiceServer::from_arc(service)
                .max_decoding_message_size(MAX_REQUEST_BYTES),
        }
    }

    /// Takes a place for a new stream and serves it on a task.
    fn open(
        &self,
        request: GrpcRequest<Streaming<DiscoveryRequest>>,
        kind: Kind,
    ) -> Result<Out, Status> {
        let peer = request.remote_addr().map(|a| a.ip());
        let permit = self.streams.take(peer).inspect_err(|_| {
            count(&self.shared, EdsRequest::Refused);
        })?;
        let inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(QUEUED);
        let shared = self.shared.clone();
        let resources = self.resources.clone();
        tokio::spawn(async move {
            let _permit = permit;
            shared.metrics.control.eds_streams.inc();
            serve_stream(&shared, inbound, resources, tx, kind).await;
            shared.metrics.control.eds_streams.dec();
        });
        Ok(Box::pin(ReceiverStream::new(rx)))
    }
}

/// Which service a stream came in on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Aggregated: Envoy may ask for other types on it too (a bootstrap whose
    /// CDS or LDS also points here); those are not served, and ignored.
    Ads,
    /// Endpoints only: anything else ends the stream.
    Eds,
}

fn count(shared: &Shared, result: EdsRequest) {
    shared.metrics.control.eds_requests.inc(result);
}

/// Who is asking, for the log (bounded).
fn node(req: &DiscoveryRequest) -> String {
    req.node.as_ref().map_or_else(String::new, |n| {
        let mut id: String = n.id.chars().take(128).collect();
        if !n.cluster.is_empty() {
            id.push('/');
            id.extend(n.cluster.chars().take(128));
        }
        id
    })
}

type Out = Pin<Box<dyn FuturesStream<Item = Result<DiscoveryResponse, Status>> + Send>>;
type DeltaOut = Pin<Box<dyn FuturesStream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl EndpointDiscoveryService for Service {
    type StreamEndpointsStream = Out;
    type DeltaEndpointsStream = DeltaOut;

    async fn stream_endpoints(
        &self,
        request: GrpcRequest<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Out>, Status> {
        self.open(request, Kind::Eds).map(Response::new)
    }

    async fn delta_endpoints(
        &self,
        _request: GrpcRequest<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<DeltaOut>, Status> {
        Err(Status::unimplemented(
            "fleetroute serves state-of-the-world EDS (StreamEndpoints): set api_type GRPC, not DELTA_GRPC",
        ))
    }

    /// One-shot fetch (for tooling): the current assignments of the names.
    async fn fetch_endpoints(
        &self,
        request: GrpcRequest<DiscoveryRequest>,
    ) -> Result<Response<DiscoveryResponse>, Status> {
        let mut stream = Stream::default();
        let req = request.into_inner();
        stream
            .on_request(&req)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let res = self.resources.borrow().clone();
        let resp = stream.response(&res).unwrap_or_else(|| DiscoveryResponse {
            version_info: res.version.clone(),
            type_url: resources::TYPE_URL.to_string(),
            ..Default::default()
        });
        Ok(Response::new(resp))
    }
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Service {
    type StreamAggregatedResourcesStream = Out;
    type DeltaAggregatedResourcesStream = DeltaOut;

    async fn stream_aggregated_resources(
        &self,
        request: GrpcRequest<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Out>, Status> {
        self.open(request, Kind::Ads).map(Response::new)
    }

    async fn delta_aggregated_resources(
        &self,
        _request: GrpcRequest<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<DeltaOut>, Status> {
        Err(Status::unimplemented(
            "fleetroute serves state-of-the-world ADS (StreamAggregatedResources): set api_type GRPC, not DELTA_GRPC",
        ))
    }
}

async fn serve_stream(
    shared: &Shared,
    mut inbound: Streaming<DiscoveryRequest>,
    mut resources: watch::Receiver<Arc<Resources>>,
    tx: mpsc::Sender<Result<DiscoveryResponse, Status>>,
    kind: Kind,
) {
    let mut stream = Stream::default();
    let mut who = String::new();
    let mut started = false;
    let mut warned = false;
    let silent = tokio::time::sleep(FIRST_MESSAGE);
    tokio::pin!(silent);
    let closing = shared.shutdown.reached(Phase::Closing);
    tokio::pin!(closing);
    loop {
        let current = tokio::select! {
            // Stopping: Envoy gets its endpoints from another instance, or
            // from this one restarted.
            () = &mut closing => break,
            () = &mut silent, if !started => {
                count(shared, EdsRequest::Silent);
                tracing::warn!("EDS stream ended: no request within {FIRST_MESSAGE:?}");
                break;
            }
            msg = inbound.message() => {
                let req = match msg {
                    Ok(Some(req)) => req,
                    // Envoy closed or reset the stream; it reconnects by itself.
                    Ok(None) | Err(_) => break,
                };
                if !started {
                    who = node(&req);
                    tracing::info!(node = %who, clusters = req.resource_names.len(), "EDS stream opened");
                    started = true;
                }
                match stream.on_request(&req) {
                    Ok(Request::Nack(why)) => {
                        count(shared, EdsRequest::Nack);
                        tracing::warn!(node = %who, nonce = %req.response_nonce, "Envoy refused endpoints (it keeps the ones it had): {why}");
                    }
                    Ok(Request::Ack) => count(shared, EdsRequest::Ack),
                    Ok(Request::Subscribe) => count(shared, EdsRequest::Subscribe),
                    Ok(Request::Stale) => count(shared, EdsRequest::Stale),
                    Err(Refused::WrongType(t)) if kind == Kind::Ads => {
                        count(shared, EdsRequest::Unsupported);
                        if !std::mem::replace(&mut warned, true) {
                            tracing::warn!(node = %who, "ADS request for {t} ignored: fleetroute serves only endpoints (point only eds_config at it)");
                        }
                        continue;
                    }
                    Err(e) => {
                        count(shared, EdsRequest::Invalid);
                        tracing::warn!(node = %who, "EDS stream ended: {e}");
                        let _ = tx.try_send(Err(Status::invalid_argument(e.to_string())));
                        break;
                    }
                }
                resources.borrow_and_update().clone()
            }
            changed = resources.changed(), if started => {
                if changed.is_err() {
                    break;
                }
                resources.borrow_and_update().clone()
            }
        };
        if let Some(resp) = stream.response(&current) {
            match tokio::time::timeout(SEND_TIMEOUT, tx.send(Ok(resp))).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => break,
                Err(_) => {
                    tracing::warn!(node = %who, "EDS stream ended: Envoy read no response for {SEND_TIMEOUT:?}");
                    break;
                }
            }
        }
    }
    if started {
        tracing::info!(node = %who, "EDS stream closed");
    }
}
