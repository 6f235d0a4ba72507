//! Only Envoy talks to fleetroute: with `grpc.token_file`, a process that is
//! not Envoy (no token, or another one) gets UNAUTHENTICATED on every gRPC
//! service (routing, access log, ADS, health) and changes nothing; the real
//! Envoy, given the token by `fleetroute bootstrap`, routes, reports and
//! receives its endpoints as before. And fleetroute refuses to serve gRPC
//! beyond loopback without a peer check.
#![cfg(feature = "e2e")] // needs Envoy and the built binaries: scripts/test.sh

use std::process::Command;

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue, Node};
use envoy_types::pb::envoy::data::accesslog::v3::HttpAccessLogEntry;
use envoy_types::pb::envoy::service::accesslog::v3::StreamAccessLogsMessage;
use envoy_types::pb::envoy::service::accesslog::v3::access_log_service_client::AccessLogServiceClient;
use envoy_types::pb::envoy::service::accesslog::v3::stream_access_logs_message::{
    HttpAccessLogEntries, Identifier, LogEntries,
};
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request;
use envoy_types::pb::envoy::service::ext_proc::v3::{HttpHeaders, ProcessingRequest};
use fleetroute_tests::harness::client::{blocking_get, chat_body, metric_sum, post};
use fleetroute_tests::harness::scenario::{FAST_ENGINES, chat_url};
use fleetroute_tests::harness::{Lab, LabSpec};
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;

const ENGINE: &str = env!("CARGO_BIN_EXE_fleetroute-engine");
const TOKEN: &str = "e2e-grpc-token-0123456789abcdef";

const ROUTER: &str = r#"
health_check: { interval_ms: 500, timeout_ms: 500, healthy_threshold: 1, unhealthy_threshold: 3 }
grpc: { token_file: "TOKEN_FILE" }
fleets:
  - name: pool
    region: us
    endpoints: ["{r1}", "{r2}"]
stages:
  - name: chat
    models: [m1]
    fleets: [pool]
"#;

/// What a peer without the right token sends, with `token` (if any) as its
/// authorization.
struct Forger {
    channel: Channel,
    token: Option<String>,
}

impl Forger {
    fn req<T>(&self, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        if let Some(t) = &self.token {
            let v: MetadataValue<_> = format!("Bearer {t}").parse().unwrap();
            r.metadata_mut().insert("authorization", v);
        }
        r
    }

    /// A routing call for a request with a tenant: the answer's status code.
    async fn route(&self) -> tonic::Code {
        let headers = ProcessingRequest {
            request: Some(Request::RequestHeaders(HttpHeaders {
                headers: Some(HeaderMap {
                    headers: [
                        ("x-fleetroute-model", "m1"),
                        ("x-fleetroute-tenant", "victim"),
                        ("x-request-id", "forged"),
                    ]
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
        };
        let mut c = ExternalProcessorClient::new(self.channel.clone());
        match c.process(self.req(tokio_stream::iter(vec![headers]))).await {
            Ok(resp) => {
                let mut s = resp.into_inner();
                match s.message().await {
                    Ok(_) => tonic::Code::Ok,
                    Err(e) => e.code(),
                }
            }
            Err(e) => e.code(),
        }
    }

    /// An access log batch of 300 invented entries.
    async fn report(&self) -> tonic::Code {
        let entry = HttpAccessLogEntry::default();
        let msg = StreamAccessLogsMessage {
            identifier: Some(Identifier {
                node: Some(Node {
                    id: "forger".into(),
                    ..Default::default()
                }),
                log_name: "fleetroute".into(),
            }),
            log_entries: Some(LogEntries::HttpLogs(HttpAccessLogEntries {
                log_entry: vec![entry; 300],
            })),
        };
        let mut c = AccessLogServiceClient::new(self.channel.clone());
        match c
            .stream_access_logs(self.req(tokio_stream::iter(vec![msg])))
            .await
        {
            Ok(_) => tonic::Code::Ok,
            Err(e) => e.code(),
        }
    }

    /// Asks for every fleet's members.
    async fn members(&self) -> tonic::Code {
        let req = DiscoveryRequest {
            type_url: "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment".into(),
            resource_names: vec!["pool".into()],
            node: Some(Node {
                id: "forger".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut c = AggregatedDiscoveryServiceClient::new(self.channel.clone());
        match c
            .stream_aggregated_resources(self.req(tokio_stream::iter(vec![req])))
            .await
        {
            Ok(resp) => match resp.into_inner().message().await {
                Ok(_) => tonic::Code::Ok,
                Err(e) => e.code(),
            },
            Err(e) => e.code(),
        }
    }

    async fn health(&self) -> tonic::Code {
        let mut c = tonic_health::pb::health_client::HealthClient::new(self.channel.clone());
        match c
            .check(self.req(tonic_health::pb::HealthCheckRequest::default()))
            .await
        {
            Ok(_) => tonic::Code::Ok,
            Err(e) => e.code(),
        }
    }
}

fn refused(lab: &Lab) -> f64 {
    let (_, m) = blocking_get(&format!("{}/metrics", lab.admin)).expect("/metrics");
    metric_sum(&m, "fleetroute_grpc_refused_total", &[])
}

#[test]
fn only_a_peer_with_the_token_is_heard() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("grpc-token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let router = ROUTER.replace("TOKEN_FILE", &token_file.display().to_string());
    let lab = Lab::start(
        ENGINE,
        LabSpec {
            router: &router,
            engine_args: FAST_ENGINES,
            ..Default::default()
        },
    );
    // Envoy carries the token on every service: routed, reported, served.
    for i in 0..6 {
        let r = post(
            &chat_url(&lab),
            chat_body("m1", Some(&format!("u{i}")), "hi", false),
            &[],
        );
        assert_eq!(r.status, 200, "{}", r.body);
        assert!(r.header("x-served-by").is_some());
    }
    lab.wait_settled();
    assert_eq!(refused(&lab), 0.0, "Envoy's own calls were refused");
    let served = lab.envoy_members().expect("Envoy's clusters");
    assert_eq!(served["pool"].len(), 2, "Envoy got its endpoints by ADS");

    let rt = tokio::runtime::Runtime::new().unwrap();
    let channel = rt.block_on(async {
        Channel::from_shared(format!("http://{}", lab.grpc))
            .unwrap()
            .connect()
            .await
            .unwrap()
    });
    let decisions = || {
        blocking_get(&format!("{}/debug/decisions?id=forged", lab.admin))
            .map(|(_, b)| b)
            .unwrap_or_default()
    };
    for token in [None, Some("e2e-grpc-token-0123456789abcdeX".to_string())] {
        let forger = Forger {
            channel: channel.clone(),
            token: token.clone(),
        };
        rt.block_on(async {
            assert_eq!(
                forger.route().await,
                tonic::Code::Unauthenticated,
                "{token:?}"
            );
            assert_eq!(forger.report().await, tonic::Code::Unauthenticated);
            assert_eq!(forger.members().await, tonic::Code::Unauthenticated);
            assert_eq!(forger.health().await, tonic::Code::Unauthenticated);
        });
    }
    assert_eq!(refused(&lab), 8.0);
    assert_eq!(decisions().trim(), "[]", "a forged call was decided");
    // The right token is heard: the same forger, holding it, is Envoy.
    let holder = Forger {
        channel,
        token: Some(TOKEN.into()),
    };
    assert_eq!(rt.block_on(holder.health()), tonic::Code::Ok);
    // Real traffic still flows after the attempts.
    let r = post(
        &chat_url(&lab),
        chat_body("m1", Some("after"), "hi", false),
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
fn beyond_loopback_fleetroute_will_not_serve_unauthenticated_grpc() {
    let dir = tempfile::tempdir().unwrap();
    let router = dir.path().join("router.yaml");
    std::fs::write(
        &router,
        "fleets: [{ name: pool, region: us, endpoints: [\"127.0.0.1:9\"] }]\n\
         stages: [{ name: chat, models: [m1], fleets: [pool] }]\n",
    )
    .unwrap();
    let bin = fleetroute_tests::harness::Binaries::locate(ENGINE).fleetroute;
    // An address of no interface here: had fleetroute tried to bind it, the
    // error would name the bind, not the missing peer check.
    let out = Command::new(&bin)
        .args([
            "serve",
            "--grpc",
            "10.255.255.1:50051",
            "--admin",
            "127.0.0.1:0",
        ])
        .arg("--config")
        .arg(&router)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("grpc.token_file"), "{err}");
    // bootstrap refuses to give Envoy such an address too.
    let out = Command::new(&bin)
        .args([
            "bootstrap",
            "--wasm",
            "/x.wasm",
            "--grpc",
            "10.255.255.1:50051",
        ])
        .arg("--config")
        .arg(&router)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("grpc.token_file"), "{err}");
}
