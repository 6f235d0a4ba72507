//! fleetroute's gRPC services in process, served on a loopback port exactly
//! as `serve` does, over a snapshot with every static replica ready; the
//! tests play Envoy's side. The writer is not run (it would probe the
//! replicas): its events queue.
#![allow(dead_code)] // each test file uses its own part

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
use envoy_types::pb::envoy::service::accesslog::v3::access_log_service_server::AccessLogServiceServer;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessorServer;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    HttpHeaders, ProcessingRequest, ProcessingResponse,
};
use fleetroute::config::RouterConfig;
use fleetroute::observe::access_log::LogService;
use fleetroute::state::{Event, Shared, Writer};
use fleetroute::stream::Service;
use fleetroute::topology::FleetId;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

pub struct Rig {
    pub shared: Arc<Shared>,
    _writer: Writer,
    pub addr: SocketAddr,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl Rig {
    /// The routing and observing services for `config`, its audit started.
    pub async fn start(config: &str) -> Rig {
        let cfg = RouterConfig::parse_valid(config).expect("config");
        let (shared, mut w) = Writer::new(&cfg);
        shared.tenants.start_audit(&cfg.audit).expect("audit file");
        let now = Instant::now();
        let topo = shared.snapshot().topo.clone();
        for (f, fleet) in topo.fleets.iter().enumerate() {
            for replica in fleet.replicas.ids() {
                w.apply(
                    Event::Health {
                        generation: topo.generation,
                        fleet: FleetId(f),
                        replica,
                        ok: true,
                    },
                    now,
                );
            }
        }
        w.drain(now);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let server = tokio::spawn({
            let shared = shared.clone();
            async move {
                tonic::transport::Server::builder()
                    .add_service(ExternalProcessorServer::new(Service::new(shared.clone())))
                    .add_service(AccessLogServiceServer::new(LogService::new(shared)))
                    .serve_with_incoming(incoming)
                    .await
                    .expect("gRPC server");
            }
        });
        Rig {
            shared,
            _writer: w,
            addr,
            server,
        }
    }

    pub async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.addr))
            .expect("uri")
            .connect()
            .await
            .expect("connect")
    }

    /// Opens a routing stream: the sender plays Envoy's filter.
    pub async fn routing(
        &self,
    ) -> (
        mpsc::Sender<ProcessingRequest>,
        tonic::Streaming<ProcessingResponse>,
    ) {
        let (tx, rx) = mpsc::channel(8);
        let mut client = ExternalProcessorClient::new(self.channel().await);
        let replies = client
            .process(ReceiverStream::new(rx))
            .await
            .expect("process")
            .into_inner();
        (tx, replies)
    }

    /// A metric's value in the exposition text, 0 when absent.
    pub fn metric(&self, name: &str, labels: &str) -> f64 {
        let text = self.shared.metrics.render();
        let want = format!("{name}{{{labels}}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(want.as_str()))
            .map_or(0.0, |v| v.trim().parse().expect("a number"))
    }
}

/// A request-headers message with these headers.
pub fn headers(pairs: &[(&str, &str)]) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Request::RequestHeaders(HttpHeaders {
            headers: Some(HeaderMap {
                headers: pairs
                    .iter()
                    .map(|(k, v)| HeaderValue {
                        key: (*k).into(),
                        raw_value: v.as_bytes().to_vec(),
                        ..Default::default()
                    })
                    .collect(),
            }),
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// Polls `ok` until it holds, failing after a generous deadline.
pub async fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
