//! The routing stream (ext_proc) and the observing stream (access log) in
//! process, served on a loopback port exactly as `serve` does. No Envoy: each
//! test plays Envoy's side, including what a broken Envoy or anyone who can
//! reach the port could send.
#![allow(clippy::unwrap_used)] // test code says what it expects

mod grpc;

use grpc::{Rig, headers, wait_until};

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::envoy::data::accesslog::v3::{AccessLogCommon, HttpAccessLogEntry};
use envoy_types::pb::envoy::service::accesslog::v3::StreamAccessLogsMessage;
use envoy_types::pb::envoy::service::accesslog::v3::access_log_service_client::AccessLogServiceClient;
use envoy_types::pb::envoy::service::accesslog::v3::stream_access_logs_message::{
    HttpAccessLogEntries, LogEntries,
};
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse,
};
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use fleetroute::metrics::Entry;
use fleetroute_filter::contract::{self, RouteTag};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const CONFIG: &str = r#"
fleets:
  - name: pool
    region: us
    endpoints: ["127.0.0.1:1", "127.0.0.1:2"]
stages:
  - name: chat
    models: [m1]
    fleets: [pool]
"#;

async fn rig() -> Rig {
    rig_with(CONFIG).await
}

async fn rig_with(config: &str) -> Rig {
    Rig::start(config).await
}

/// What these tests count on the rig.
trait Counts {
    fn held(&self) -> u64;
    fn inflight(&self) -> u32;
    fn logged(&self, result: Entry) -> u64;
    async fn logs(
        &self,
    ) -> (
        mpsc::Sender<StreamAccessLogsMessage>,
        tokio::task::JoinHandle<Result<(), tonic::Status>>,
    );
}

impl Counts for Rig {
    fn held(&self) -> u64 {
        self.shared.leases.run_pending();
        self.shared.leases.held()
    }

    fn inflight(&self) -> u32 {
        let snap = self.shared.snapshot();
        snap.topo.fleets[0]
            .replicas
            .values()
            .map(|r| r.load.inflight())
            .sum()
    }

    fn logged(&self, result: Entry) -> u64 {
        self.shared.metrics.access_log.entries.get(result)
    }

    /// Opens an access log stream; the task ends with the service's answer.
    async fn logs(
        &self,
    ) -> (
        mpsc::Sender<StreamAccessLogsMessage>,
        tokio::task::JoinHandle<Result<(), tonic::Status>>,
    ) {
        let (tx, rx) = mpsc::channel(8);
        let mut client = AccessLogServiceClient::new(self.channel().await);
        let call = tokio::spawn(async move {
            client
                .stream_access_logs(ReceiverStream::new(rx))
                .await
                .map(|_| ())
        });
        (tx, call)
    }
}

async fn next(replies: &mut tonic::Streaming<ProcessingResponse>) -> Option<ProcessingResponse> {
    tokio::time::timeout(Duration::from_secs(10), replies.message())
        .await
        .expect("a reply or the stream's end in time")
        .ok()
        .flatten()
}

fn inference(id: &str) -> ProcessingRequest {
    headers(&[
        (":path", "/v1/chat/completions"),
        ("x-request-id", id),
        (contract::MODEL, "m1"),
    ])
}

/// The route tag a routing reply carries in its dynamic metadata (what Envoy
/// copies into the request's access log entry).
fn route_tag(reply: &ProcessingResponse) -> Option<String> {
    let meta = reply.dynamic_metadata.as_ref()?;
    let Some(Kind::StructValue(ns)) = &meta.fields.get(contract::ROUTE_NAMESPACE)?.kind else {
        return None;
    };
    let Some(Kind::StringValue(tag)) = &ns.fields.get(contract::ROUTE_KEY)?.kind else {
        return None;
    };
    Some(tag.clone())
}

fn nonce(tag: &str) -> u64 {
    RouteTag::decode(tag).expect("a route tag").nonce
}

/// An access log entry as Envoy writes it for a request carrying `tag`.
fn entry(tag: Option<&str>) -> HttpAccessLogEntry {
    let metadata = tag.map(|t| Metadata {
        filter_metadata: [(
            contract::ROUTE_NAMESPACE.to_string(),
            Struct {
                fields: [(
                    contract::ROUTE_KEY.to_string(),
                    Value {
                        kind: Some(Kind::StringValue(t.to_string())),
                    },
                )]
                .into(),
            },
        )]
        .into(),
        ..Default::default()
    });
    HttpAccessLogEntry {
        common_properties: Some(AccessLogCommon {
            metadata,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn batch(entries: Vec<HttpAccessLogEntry>) -> StreamAccessLogsMessage {
    StreamAccessLogsMessage {
        log_entries: Some(LogEntries::HttpLogs(HttpAccessLogEntries {
            log_entry: entries,
        })),
        ..Default::default()
    }
}

/// Routes one request on a fresh stream; returns its route tag.
async fn route_one(rig: &Rig, id: &str) -> String {
    let (tx, mut replies) = rig.routing().await;
    tx.send(inference(id)).await.expect("send");
    let reply = next(&mut replies).await.expect("a decision");
    route_tag(&reply).expect("a routed reply carries its tag")
}

#[tokio::test]
async fn a_decision_holds_load_until_its_log_entry_claims_the_nonce() {
    let rig = rig().await;
    let tag = route_one(&rig, "req-1").await;
    assert_eq!((rig.held(), rig.inflight()), (1, 1));

    let (logs, call) = rig.logs().await;
    logs.send(batch(vec![entry(Some(&tag))]))
        .await
        .expect("send");
    wait_until("the entry to end the lease", || rig.held() == 0).await;
    assert_eq!((rig.inflight(), rig.logged(Entry::Observed)), (0, 1));

    // Envoy may log a request twice (retries of the log): the second entry
    // finds no lease and releases nothing more.
    logs.send(batch(vec![entry(Some(&tag))]))
        .await
        .expect("send");
    wait_until("the repeat to count as late", || {
        rig.logged(Entry::Late) == 1
    })
    .await;
    assert_eq!(rig.inflight(), 0);
    drop(logs);
    call.await
        .expect("task")
        .expect("a closed log stream ends cleanly");
}

#[tokio::test]
async fn a_nonce_fleetroute_did_not_issue_ends_nothing() {
    let rig = rig().await;
    let tag = route_one(&rig, "req-1").await;
    let mut forged = RouteTag::decode(&tag).expect("tag");
    forged.nonce = forged.nonce.wrapping_add(1);
    let (logs, _call) = rig.logs().await;
    logs.send(batch(vec![entry(Some(&forged.encode())), entry(None)]))
        .await
        .expect("send");
    wait_until("both entries to be read", || {
        rig.logged(Entry::Late) == 1 && rig.logged(Entry::Untagged) == 1
    })
    .await;
    assert_eq!((rig.held(), rig.inflight()), (1, 1), "the real lease stays");
}

#[tokio::test]
async fn a_routing_stream_reset_after_its_decision_keeps_the_load_until_logged() {
    let rig = rig().await;
    // Envoy resets the ext_proc stream once it has the headers reply; the
    // request goes on upstream, so its load must stay counted.
    let (tx, mut replies) = rig.routing().await;
    tx.send(inference("req-1")).await.expect("send");
    let first = route_tag(&next(&mut replies).await.expect("decision")).expect("tag");
    drop(replies);
    drop(tx);
    // The service takes new streams afterwards.
    let second = route_one(&rig, "req-2").await;
    assert_ne!(nonce(&first), nonce(&second));
    assert_eq!(rig.held(), 2);

    let (logs, _call) = rig.logs().await;
    logs.send(batch(vec![entry(Some(&first))]))
        .await
        .expect("send");
    wait_until("the first lease to end", || rig.held() == 1).await;
    logs.send(batch(vec![entry(Some(&second))]))
        .await
        .expect("send");
    wait_until("the second lease to end", || rig.held() == 0).await;
    assert_eq!(rig.inflight(), 0);
}

#[tokio::test]
async fn a_log_stream_reset_mid_way_keeps_what_it_delivered() {
    let rig = rig().await;
    let tags = [
        route_one(&rig, "a").await,
        route_one(&rig, "b").await,
        route_one(&rig, "c").await,
    ];
    let (logs, call) = rig.logs().await;
    logs.send(batch(vec![entry(Some(&tags[0])), entry(Some(&tags[1]))]))
        .await
        .expect("send");
    wait_until("the delivered entries to end their leases", || {
        rig.held() == 1
    })
    .await;
    // Envoy's worker goes away without closing the stream.
    call.abort();
    let _ = call.await;
    drop(logs);
    assert_eq!((rig.held(), rig.inflight()), (1, 1), "c was never logged");
    // Envoy reconnects on a new stream.
    let (logs, _call) = rig.logs().await;
    logs.send(batch(vec![entry(Some(&tags[2]))]))
        .await
        .expect("send");
    wait_until("c's lease to end", || rig.held() == 0).await;
}

#[tokio::test]
async fn malformed_routing_messages_get_no_decision_and_the_stream_goes_on() {
    let rig = rig().await;
    let (tx, mut replies) = rig.routing().await;
    // No request at all: nothing to answer.
    tx.send(ProcessingRequest::default()).await.expect("send");
    // Headers without a header map: let through.
    tx.send(ProcessingRequest {
        request: Some(Request::RequestHeaders(HttpHeaders::default())),
        ..Default::default()
    })
    .await
    .expect("send");
    let reply = next(&mut replies).await.expect("a reply");
    assert!(
        matches!(&reply.response, Some(Response::RequestHeaders(h)) if h.response.as_ref().is_none_or(|c| c.header_mutation.is_none())),
        "{reply:?}"
    );
    assert!(route_tag(&reply).is_none());
    // The wrong phase: a body, where the routing filter asks for headers.
    tx.send(ProcessingRequest {
        request: Some(Request::RequestBody(HttpBody {
            body: b"{\"model\": \"m1\"}".to_vec(),
            end_of_stream: true,
            ..Default::default()
        })),
        ..Default::default()
    })
    .await
    .expect("send");
    let reply = next(&mut replies).await.expect("a reply");
    assert!(
        matches!(reply.response, Some(Response::RequestBody(_))),
        "{reply:?}"
    );
    // Headers that name no model fleetroute serves: a local error reply.
    tx.send(headers(&[(contract::MODEL, "nope")]))
        .await
        .expect("send");
    let reply = next(&mut replies).await.expect("a reply");
    assert!(
        matches!(&reply.response, Some(Response::ImmediateResponse(r)) if r.status.as_ref().is_some_and(|s| s.code >= 400)),
        "{reply:?}"
    );
    assert_eq!(rig.held(), 0, "nothing was routed");
    // Internal headers with garbage values are read as absent, not trusted.
    tx.send(headers(&[
        (contract::MODEL, "m1"),
        (contract::KEY, "not-a-key"),
        (contract::BLOCKS, "\u{0}\u{1}garbage"),
        (contract::PROMPT_TOKENS, "-5"),
    ]))
    .await
    .expect("send");
    let reply = next(&mut replies).await.expect("a reply");
    assert!(route_tag(&reply).is_some(), "{reply:?}");
    assert_eq!(rig.held(), 1);
}

#[tokio::test]
async fn an_observing_stream_ends_with_its_response() {
    let rig = rig().await;
    let (tx, mut replies) = rig.routing().await;
    let observed = |request| ProcessingRequest {
        request: Some(request),
        observability_mode: true,
        ..Default::default()
    };
    tx.send(observed(Request::ResponseHeaders(HttpHeaders::default())))
        .await
        .expect("send");
    tx.send(observed(Request::ResponseBody(HttpBody {
        end_of_stream: true,
        ..Default::default()
    })))
    .await
    .expect("send");
    // No reply in observability mode; the service ends the call itself
    // although the client keeps its side open.
    assert!(next(&mut replies).await.is_none());
    drop(tx);
    assert_eq!(rig.held(), 0);
}

/// Sends raw bytes as gRPC messages on `path`.
mod raw {
    use prost::bytes::{Buf, BufMut, Bytes};
    use tonic::Status;
    use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

    #[derive(Default)]
    pub struct RawCodec;
    pub struct RawEncoder;
    pub struct RawDecoder;

    impl Codec for RawCodec {
        type Encode = Bytes;
        type Decode = Bytes;
        type Encoder = RawEncoder;
        type Decoder = RawDecoder;
        fn encoder(&mut self) -> RawEncoder {
            RawEncoder
        }
        fn decoder(&mut self) -> RawDecoder {
            RawDecoder
        }
    }

    impl Encoder for RawEncoder {
        type Item = Bytes;
        type Error = Status;
        fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
            dst.put(item);
            Ok(())
        }
    }

    impl Decoder for RawDecoder {
        type Item = Bytes;
        type Error = Status;
        fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
            Ok(Some(src.copy_to_bytes(src.remaining())))
        }
    }
}

/// Garbage on `path`: the call must end (error or not), in time.
async fn garbage(rig: &Rig, path: &'static str) {
    let mut grpc = tonic::client::Grpc::new(rig.channel().await);
    grpc.ready().await.expect("ready");
    // Field 1 as a length-delimited field longer than the message: not protobuf.
    let junk = prost::bytes::Bytes::from_static(&[0x0a, 0xff, 0xff, 0xff, 0x0f, 0x00, 0xde, 0xad]);
    let outbound = tokio_stream::iter(vec![junk.clone(), junk]);
    let call = grpc.streaming(
        tonic::Request::new(outbound),
        tonic::codegen::http::uri::PathAndQuery::from_static(path),
        raw::RawCodec,
    );
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        match call.await {
            Err(_) => {}
            Ok(r) => {
                let mut s = r.into_inner();
                while let Ok(Some(_)) = s.message().await {}
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "garbage on {path} held the call open");
}

#[tokio::test]
async fn garbage_on_either_stream_ends_that_stream_only() {
    let rig = rig().await;
    garbage(&rig, "/envoy.service.ext_proc.v3.ExternalProcessor/Process").await;
    garbage(
        &rig,
        "/envoy.service.accesslog.v3.AccessLogService/StreamAccessLogs",
    )
    .await;
    assert_eq!((rig.held(), rig.logged(Entry::Observed)), (0, 0));
    // Both services still answer.
    let tag = route_one(&rig, "after").await;
    let (logs, _call) = rig.logs().await;
    logs.send(batch(vec![entry(Some(&tag))]))
        .await
        .expect("send");
    wait_until("the lease to end", || rig.held() == 0).await;
}

/// Captures the service's trace output.
#[derive(Clone, Default)]
struct Sink(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("sink").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The span sink is the process-wide default subscriber: a scoped one races
/// with the other tests of this binary over tracing's per-callsite interest
/// cache (a callsite first seen with no subscriber may stay disabled).
fn global_sink() -> Sink {
    static SINK: std::sync::OnceLock<Sink> = std::sync::OnceLock::new();
    SINK.get_or_init(|| {
        use tracing_subscriber::layer::SubscriberExt;
        let sink = Sink::default();
        let writer = sink.clone();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_subscriber::EnvFilter::new(
                fleetroute::decision_trace::TARGET.to_string() + "=debug",
            ))
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(false)
                    .with_writer(move || writer.clone()),
            );
        tracing::subscriber::set_global_default(subscriber).expect("first subscriber");
        sink
    })
    .clone()
}

#[tokio::test]
async fn a_routed_request_shows_its_decision_span_when_enabled() {
    let sink = global_sink();
    let rig = rig().await;
    let tag = route_one(&rig, "traced").await;
    let replica = RouteTag::decode(&tag).expect("tag").replica.to_string();
    let out = String::from_utf8(sink.0.lock().expect("sink").clone()).expect("UTF-8");
    // Other tests of this binary may trace decisions too: find this one's.
    let line = out
        .lines()
        .find(|l| l.contains("decided") && l.contains(&format!("replica=\"{replica}\"")))
        .unwrap_or_else(|| panic!("no decision traced: {out}"));
    for want in [
        "stage=\"chat\"".to_string(),
        "policy=\"latency\"".to_string(),
        "fleet=\"pool\"".to_string(),
        "elapsed_us=".to_string(),
    ] {
        assert!(line.contains(&want), "{want} missing: {line}");
    }
}

/// Tenants in the decision: limits refuse with a 429, a charge commits what
/// the access log reports, once.
mod tenants {
    use super::*;
    use envoy_types::pb::envoy::config::core::v3::{
        Address, SocketAddress, address, socket_address,
    };
    use envoy_types::pb::envoy::data::accesslog::v3::HttpResponseProperties;
    use envoy_types::pb::google::protobuf::{Any, BytesValue, UInt32Value};
    use prost::Message;
    use std::sync::atomic::Ordering::Relaxed;

    const TENANTS: &str = r#"
leases: { min_ms: 60000, max_ms: 60000 }
fleets:
  - name: pool
    region: us
    endpoints: ["127.0.0.1:1", "127.0.0.1:2"]
    cost: { usd_per_million_tokens: 2, cached_usd_per_million_tokens: 1 }
stages:
  - name: chat
    models: [m1]
    fleets: [pool]
tenants:
  # These tests play the filter: its tenant header is trusted.
  identity: { source: header, header: x-tenant }
  named:
    acme: { tokens_per_minute: 1000, max_requests_in_flight: 2 }
"#;

    fn request(id: &str, tenant: &str, prompt: u32, max: u32) -> ProcessingRequest {
        let (p, m) = (prompt.to_string(), max.to_string());
        headers(&[
            ("x-request-id", id),
            (contract::MODEL, "m1"),
            (contract::TENANT, tenant),
            (contract::PROMPT_TOKENS, &p),
            (contract::MAX_TOKENS, &m),
        ])
    }

    async fn decide(rig: &Rig, req: ProcessingRequest) -> ProcessingResponse {
        let (tx, mut replies) = rig.routing().await;
        tx.send(req).await.expect("send");
        next(&mut replies).await.expect("a reply")
    }

    /// An entry with the filter's usage tag and an upstream host.
    fn finished(tag: &str, usage: &str, upstream: bool) -> HttpAccessLogEntry {
        let mut e = entry(Some(tag));
        let common = e.common_properties.as_mut().unwrap();
        common.filter_state_objects.insert(
            contract::USAGE_FILTER_STATE.into(),
            Any {
                type_url: "type.googleapis.com/google.protobuf.BytesValue".into(),
                value: BytesValue {
                    value: usage.as_bytes().to_vec(),
                }
                .encode_to_vec(),
            },
        );
        if upstream {
            common.upstream_remote_address = Some(Address {
                address: Some(address::Address::SocketAddress(SocketAddress {
                    address: "127.0.0.1".into(),
                    port_specifier: Some(socket_address::PortSpecifier::PortValue(1)),
                    ..Default::default()
                })),
            });
        }
        e.response = Some(HttpResponseProperties {
            response_code: Some(UInt32Value { value: 200 }),
            ..Default::default()
        });
        e
    }

    #[tokio::test]
    async fn over_a_limit_is_a_429_naming_it_and_nothing_is_held() {
        let rig = rig_with(TENANTS).await;
        let reply = decide(&rig, request("r1", "acme", 600, 500)).await;
        let Some(Response::ImmediateResponse(r)) = &reply.response else {
            panic!("not refused: {reply:?}");
        };
        assert_eq!(r.status.as_ref().map(|s| s.code), Some(429));
        let header = |name: &str| {
            r.headers.as_ref().and_then(|h| {
                h.set_headers.iter().find_map(|o| {
                    let h = o.header.as_ref()?;
                    (h.key == name).then(|| String::from_utf8_lossy(&h.raw_value).into_owned())
                })
            })
        };
        // 1100 tokens can never fit a 1000-per-minute limit: retry in 60 s.
        assert_eq!(header("retry-after").as_deref(), Some("60"));
        let body: serde_json::Value = serde_json::from_slice(&r.body).expect("JSON");
        assert_eq!(body["error"]["code"], "tokens_per_minute");
        assert_eq!(body["error"]["type"], "rate_limit_exceeded");
        assert!(body["error"]["param"].is_null());
        let msg = body["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("'acme'") && msg.contains("1000 tokens per minute"),
            "{msg}"
        );
        assert_eq!(rig.held(), 0, "a refused request holds no load");
        let t = rig.shared.tenants.ledger().tenant("acme");
        assert_eq!(
            t.refused(fleetroute::tenancy::ledger::Limit::TokensPerMinute),
            1
        );
        assert_eq!(
            (t.admitted.load(Relaxed), t.charged_tokens.load(Relaxed)),
            (0, 0)
        );
        // Another tenant (default limits: none) is routed.
        let reply = decide(&rig, request("r2", "beta", 600, 500)).await;
        assert!(route_tag(&reply).is_some(), "{reply:?}");
    }

    #[tokio::test]
    async fn the_entry_commits_real_usage_once_and_a_cut_stream_what_it_streamed() {
        let rig = rig_with(TENANTS).await;
        let ledger = rig.shared.tenants.ledger();
        let a = route_tag(&decide(&rig, request("a", "acme", 100, 200)).await).expect("a");
        let b = route_tag(&decide(&rig, request("b", "acme", 100, 200)).await).expect("b");
        let t = ledger.tenant("acme");
        assert_eq!(t.requests.load(Relaxed), 2);
        assert_eq!(t.tokens.load(Relaxed), 600, "prompt + max_tokens each");
        // A third would pass max_requests_in_flight: 2.
        let reply = decide(&rig, request("c", "acme", 1, 1)).await;
        assert!(matches!(
            reply.response,
            Some(Response::ImmediateResponse(_))
        ));

        let (logs, _call) = rig.logs().await;
        // a: the engine's usage (40 of 100 prompt tokens cached).
        // b: cut mid-stream before any usage: 7 events streamed.
        logs.send(batch(vec![
            finished(&a, "100|20|40|1|21", true),
            finished(&b, "-|-|-|0|7", true),
        ]))
        .await
        .expect("send");
        wait_until("both charges", || t.committed.load(Relaxed) == 2).await;
        assert_eq!(t.charged_tokens.load(Relaxed), 120 + 107);
        // $2/M for 60 uncached + 20 out, $1/M for 40 cached; then 107 at $2/M.
        let want = (80.0 * 2.0 + 40.0) + 107.0 * 2.0;
        assert_eq!(t.charged_micro_usd.load(Relaxed), want as u64);
        assert_eq!((t.requests.load(Relaxed), t.tokens.load(Relaxed)), (0, 0));
        assert_eq!(t.minute_used(ledger.clock().now_ms()), 227);
        // The same entries again (a repeated log batch): nothing more.
        logs.send(batch(vec![
            finished(&a, "100|20|40|1|21", true),
            finished(&b, "-|-|-|0|7", true),
        ]))
        .await
        .expect("send");
        wait_until("the repeats to be read", || rig.logged(Entry::Late) == 2).await;
        assert_eq!(t.charged_tokens.load(Relaxed), 227);
        assert_eq!(t.admitted.load(Relaxed), 2);
    }

    #[tokio::test]
    async fn a_request_that_never_reached_a_replica_is_free() {
        let rig = rig_with(TENANTS).await;
        let tag = route_tag(&decide(&rig, request("a", "acme", 100, 200)).await).expect("a");
        let (logs, _call) = rig.logs().await;
        logs.send(batch(vec![finished(&tag, "-|-|-|0|0", false)]))
            .await
            .expect("send");
        let t = rig.shared.tenants.ledger().tenant("acme");
        wait_until("the commit", || t.committed.load(Relaxed) == 1).await;
        assert_eq!(t.charged_tokens.load(Relaxed), 0);
        assert_eq!(
            t.minute_used(rig.shared.tenants.ledger().clock().now_ms()),
            0
        );
    }

    #[tokio::test]
    async fn a_lease_that_expires_charges_the_estimate_and_a_late_entry_corrects_it() {
        let rig =
            rig_with(&TENANTS.replace("min_ms: 60000, max_ms: 60000", "min_ms: 30, max_ms: 30"))
                .await;
        let tag = route_tag(&decide(&rig, request("a", "acme", 100, 200)).await).expect("a");
        let t = rig.shared.tenants.ledger().tenant("acme");
        wait_until("the lease to expire", || rig.held() == 0).await;
        assert_eq!(
            (t.expired.load(Relaxed), t.charged_tokens.load(Relaxed)),
            (1, 300)
        );
        assert_eq!(t.requests.load(Relaxed), 0, "in-flight capacity is back");
        let (logs, _call) = rig.logs().await;
        logs.send(batch(vec![finished(&tag, "100|5|0|1|6", true)]))
            .await
            .expect("send");
        wait_until("the late commit", || t.late_commits.load(Relaxed) == 1).await;
        assert_eq!(t.charged_tokens.load(Relaxed), 105);
        assert_eq!((t.expired.load(Relaxed), t.committed.load(Relaxed)), (0, 1));
        // Once: the same entry again changes nothing.
        logs.send(batch(vec![finished(&tag, "100|5|0|1|6", true)]))
            .await
            .expect("send");
        wait_until("the repeat", || rig.logged(Entry::Late) == 2).await;
        assert_eq!(t.charged_tokens.load(Relaxed), 105);
    }
}

#[tokio::test]
async fn the_model_list_is_answered_on_the_routing_stream_without_a_decision() {
    let rig = rig().await;
    let (tx, mut replies) = rig.routing().await;
    tx.send(headers(&[
        (":path", "/v1/models"),
        ("x-request-id", "list-1"),
        (contract::ENDPOINT, contract::ENDPOINT_MODELS),
    ]))
    .await
    .expect("send");
    let reply = next(&mut replies).await.expect("an answer");
    let Some(Response::ImmediateResponse(ir)) = reply.response else {
        panic!("not an immediate answer: {reply:?}");
    };
    assert_eq!(ir.status.map(|s| s.code), Some(200));
    let v: serde_json::Value = serde_json::from_slice(&ir.body).expect("JSON");
    let ids: Vec<&str> = v["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, ["m1", "chat"]);
    // Nothing was routed: no load, no lease.
    assert_eq!((rig.held(), rig.inflight()), (0, 0));
    // The same stream still routes the next request.
    tx.send(inference("req-2")).await.expect("send");
    let next_reply = next(&mut replies).await.expect("decision");
    assert!(route_tag(&next_reply).is_some());
}
