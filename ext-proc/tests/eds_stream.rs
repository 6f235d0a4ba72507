//! fleetroute's EDS service in process, served on a loopback port as `serve`
//! does. No Envoy: each test plays Envoy's side of the state-of-the-world
//! protocol (the real Envoy is in `tests/tests/eds.rs`). The writer is driven
//! by hand, so every membership change is one the test makes.
#![allow(clippy::unwrap_used)] // test code says what it expects

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::config::core::v3::address::Address as AddressKind;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::envoy::service::endpoint::v3::endpoint_discovery_service_client::EndpointDiscoveryServiceClient;
use envoy_types::pb::google::rpc::Status as RpcStatus;
use fleetroute::config::RouterConfig;
use fleetroute::eds::Service;
use fleetroute::eds::resources::TYPE_URL;
use fleetroute::metrics::EdsRequest;
use fleetroute::state::{Change, Event, Shared, Writer};
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

const CONFIG: &str = r#"
fleets:
  - name: pool
    region: us
    endpoints: ["127.0.0.1:1", "127.0.0.1:2"]
  - name: spare
    region: us
    endpoints: ["127.0.0.1:9"]
stages:
  - name: chat
    models: [m1]
    fleets: [pool, spare]
    routing: { policy: priority, order: [pool, spare] }
"#;

struct Rig {
    shared: Arc<Shared>,
    writer: Writer,
    addr: SocketAddr,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn rig(max_streams: usize) -> Rig {
    let cfg = RouterConfig::parse_valid(CONFIG).expect("config");
    let (shared, writer) = Writer::new(&cfg);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    let services = Service::with_limit(shared.clone(), max_streams);
    let server = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(services.ads)
            .add_service(services.eds)
            .serve_with_incoming(incoming)
            .await
            .expect("gRPC server");
    });
    Rig {
        shared,
        writer,
        addr,
        server,
    }
}

/// One EDS stream, Envoy's side.
struct Envoy {
    tx: mpsc::Sender<DiscoveryRequest>,
    rx: Streaming<DiscoveryResponse>,
}

fn request(names: &[&str], version: &str, nonce: &str) -> DiscoveryRequest {
    DiscoveryRequest {
        version_info: version.into(),
        node: Some(Node {
            id: "test-envoy".into(),
            cluster: "test".into(),
            ..Default::default()
        }),
        resource_names: names.iter().map(|s| s.to_string()).collect(),
        type_url: TYPE_URL.into(),
        response_nonce: nonce.into(),
        ..Default::default()
    }
}

impl Rig {
    async fn connect(&self, names: &[&str]) -> Result<Envoy, tonic::Status> {
        let mut client = EndpointDiscoveryServiceClient::connect(format!("http://{}", self.addr))
            .await
            .expect("connect");
        let (tx, rx) = mpsc::channel(8);
        tx.send(request(names, "", "")).await.unwrap();
        let rx = client
            .stream_endpoints(ReceiverStream::new(rx))
            .await?
            .into_inner();
        Ok(Envoy { tx, rx })
    }

    /// The same over ADS (what the rendered bootstrap uses).
    async fn connect_ads(&self, names: &[&str]) -> Envoy {
        let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{}", self.addr))
            .await
            .expect("connect");
        let (tx, rx) = mpsc::channel(8);
        tx.send(request(names, "", "")).await.unwrap();
        let rx = client
            .stream_aggregated_resources(ReceiverStream::new(rx))
            .await
            .expect("an ADS stream")
            .into_inner();
        Envoy { tx, rx }
    }

    /// Installs the config with `pool`'s endpoints replaced.
    fn set_pool(&mut self, endpoints: &str) {
        let text = CONFIG.replace(r#"["127.0.0.1:1", "127.0.0.1:2"]"#, endpoints);
        let cfg = RouterConfig::parse_valid(&text).expect("edited config");
        self.writer.apply(
            Event::Change {
                change: Box::new(Change::Reload {
                    config: Box::new(cfg),
                    source: "test".into(),
                }),
                reply: None,
            },
            Instant::now(),
        );
        // Replicas that left are withdrawn at the first tick a tick after
        // they started leaving, once idle (none here has a request in flight).
        self.writer.tick(Instant::now() + fleetroute::state::TICK);
    }

    fn requests(&self, result: EdsRequest) -> u64 {
        self.shared.metrics.control.eds_requests.get(result)
    }
}

impl Envoy {
    async fn next(&mut self) -> DiscoveryResponse {
        tokio::time::timeout(Duration::from_secs(10), self.rx.message())
            .await
            .expect("a response in time")
            .expect("the stream is up")
            .expect("a response, not the end")
    }

    async fn quiet(&mut self) -> bool {
        tokio::time::timeout(Duration::from_millis(300), self.rx.message())
            .await
            .is_err()
    }

    async fn ack(&self, names: &[&str], r: &DiscoveryResponse) {
        self.tx
            .send(request(names, &r.version_info, &r.nonce))
            .await
            .unwrap();
    }
}

/// (cluster, its member addresses) of a response.
fn clusters(r: &DiscoveryResponse) -> Vec<(String, Vec<String>)> {
    assert_eq!(r.type_url, TYPE_URL);
    r.resources
        .iter()
        .map(|a| {
            assert_eq!(a.type_url, TYPE_URL);
            let c = ClusterLoadAssignment::decode(a.value.as_slice()).expect("an assignment");
            let members = c
                .endpoints
                .iter()
                .flat_map(|g| &g.lb_endpoints)
                .map(|e| match &e.host_identifier {
                    Some(HostIdentifier::Endpoint(ep)) => {
                        match ep.address.as_ref().and_then(|a| a.address.as_ref()) {
                            Some(AddressKind::SocketAddress(sa)) => {
                                format!("{}:{:?}", sa.address, sa.port_specifier.as_ref().unwrap())
                            }
                            other => panic!("{other:?}"),
                        }
                    }
                    other => panic!("{other:?}"),
                })
                .collect();
            (c.cluster_name, members)
        })
        .collect()
}

fn ports(c: &(String, Vec<String>)) -> Vec<String> {
    c.1.iter()
        .map(|m| {
            m.rsplit('(')
                .next()
                .unwrap()
                .trim_end_matches(')')
                .to_string()
        })
        .collect()
}

const NAMES: &[&str] = &["pool", "spare", "fallback/chat", "retired"];

#[tokio::test]
async fn envoy_gets_the_full_set_then_only_what_changed() {
    let mut rig = rig(8).await;
    let mut envoy = rig.connect(NAMES).await.unwrap();
    let r1 = envoy.next().await;
    // Sorted by name.
    let got = clusters(&r1);
    let names: Vec<&str> = got.iter().map(|c| c.0.as_str()).collect();
    assert_eq!(names, ["fallback/chat", "pool", "retired", "spare"]);
    assert_eq!(ports(&got[0]), ["1", "2", "9"], "fail-open holds the stage");
    assert_eq!(ports(&got[1]), ["1", "2"]);
    assert!(got[2].1.is_empty(), "an unknown cluster is answered empty");
    assert_eq!(ports(&got[3]), ["9"]);
    assert!(!r1.nonce.is_empty() && !r1.version_info.is_empty());
    envoy.ack(NAMES, &r1).await;
    assert!(
        envoy.quiet().await,
        "an ACK with nothing new is not answered"
    );

    // pool grows to three: pool and fail-open change, spare does not.
    rig.set_pool(r#"["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]"#);
    let r2 = envoy.next().await;
    let got = clusters(&r2);
    let names: Vec<&str> = got.iter().map(|c| c.0.as_str()).collect();
    assert_eq!(names, ["fallback/chat", "pool"]);
    assert_eq!(ports(&got[1]), ["1", "2", "3"]);
    assert_ne!(r2.version_info, r1.version_info);
    assert_ne!(r2.nonce, r1.nonce);
    envoy.ack(NAMES, &r2).await;

    // A second Envoy (or this one reconnecting) gets everything at once.
    let mut other = rig.connect(NAMES).await.unwrap();
    let r = other.next().await;
    assert_eq!(clusters(&r).len(), 4);
    assert_eq!(r.version_info, r2.version_info, "same set, same version");

    // A config edit that leaves the members alone sends nothing.
    rig.set_pool(r#"["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]"#);
    assert!(envoy.quiet().await, "no member changed, yet a push came");
    assert!(rig.requests(EdsRequest::Ack) >= 2);
}

#[tokio::test]
async fn a_nack_is_counted_and_the_stream_goes_on() {
    let mut rig = rig(8).await;
    let mut envoy = rig.connect(&["pool"]).await.unwrap();
    let r1 = envoy.next().await;
    let mut nack = request(&["pool"], "", &r1.nonce);
    nack.error_detail = Some(RpcStatus {
        code: 3,
        message: "refused for the test".into(),
        ..Default::default()
    });
    envoy.tx.send(nack).await.unwrap();
    assert!(envoy.quiet().await, "the refused content was sent again");
    assert_eq!(rig.requests(EdsRequest::Nack), 1);
    rig.set_pool(r#"["127.0.0.1:5"]"#);
    let r2 = envoy.next().await;
    assert_eq!(ports(&clusters(&r2)[0]), ["5"]);
}

#[tokio::test]
async fn streams_are_bounded_and_a_bad_request_ends_only_its_stream() {
    let rig = rig(2).await;
    let mut a = rig.connect(&["pool"]).await.unwrap();
    let _b = rig.connect(&["pool"]).await.unwrap();
    a.next().await;
    let refused = rig.connect(&["pool"]).await.err().expect("a third stream");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert_eq!(rig.requests(EdsRequest::Refused), 1);
    // The wrong resource type ends that stream with a reason.
    let mut wrong = request(&["pool"], "", "1");
    wrong.type_url = "type.googleapis.com/envoy.config.cluster.v3.Cluster".into();
    a.tx.send(wrong).await.unwrap();
    let end = tokio::time::timeout(Duration::from_secs(10), a.rx.message())
        .await
        .expect("an answer in time");
    let status = end.expect_err("the stream ends with an error");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("ClusterLoadAssignment"),
        "{status:?}"
    );
    // Its place is free again.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut c = loop {
        match rig.connect(&["spare"]).await {
            Ok(c) => break c,
            Err(e) => {
                assert_eq!(e.code(), tonic::Code::ResourceExhausted);
                assert!(Instant::now() < deadline, "the ended stream kept its place");
                tokio::task::yield_now().await;
            }
        }
    };
    assert_eq!(ports(&clusters(&c.next().await)[0]), ["9"]);
    assert_eq!(rig.shared.metrics.control.eds_streams.get(), 2);
}

#[tokio::test]
async fn ads_serves_the_same_and_ignores_other_types() {
    let mut rig = rig(8).await;
    let mut ads = rig.connect_ads(NAMES).await;
    let mut eds = rig.connect(NAMES).await.unwrap();
    let (a, e) = (ads.next().await, eds.next().await);
    assert_eq!(clusters(&a), clusters(&e));
    assert_eq!(a.version_info, e.version_info);
    // A cluster subscription on the aggregated stream is not served, and the
    // stream goes on serving endpoints.
    let mut cds = request(&[], "", "");
    cds.type_url = "type.googleapis.com/envoy.config.cluster.v3.Cluster".into();
    ads.tx.send(cds).await.unwrap();
    assert!(ads.quiet().await);
    assert_eq!(rig.requests(EdsRequest::Unsupported), 1);
    ads.ack(NAMES, &a).await;
    rig.set_pool(r#"["127.0.0.1:7"]"#);
    let r = ads.next().await;
    let pool = clusters(&r).into_iter().find(|c| c.0 == "pool").unwrap();
    assert_eq!(ports(&pool), ["7"]);
}

#[tokio::test]
async fn a_one_shot_fetch_answers_the_current_assignments() {
    let rig = rig(8).await;
    let mut client = EndpointDiscoveryServiceClient::connect(format!("http://{}", rig.addr))
        .await
        .expect("connect");
    let r = client
        .fetch_endpoints(request(&["spare", "nope"], "", ""))
        .await
        .expect("a fetch")
        .into_inner();
    let got = clusters(&r);
    assert_eq!(got.len(), 2);
    assert_eq!(ports(&got[1]), ["9"]);
    assert!(got[0].1.is_empty(), "unknown: empty");
    let mut bad = request(&["spare"], "", "");
    bad.type_url = "nope".into();
    let err = client.fetch_endpoints(bad).await.expect_err("a wrong type");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
}
