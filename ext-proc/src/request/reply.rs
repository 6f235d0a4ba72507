//! Every answer fleetroute gives Envoy for a request. A decision as Envoy
//! needs it: the cluster header for the route, the host list for the
//! override-host policy, the tag the access log carries back, and for some
//! fleets the model's own name and the fleet's own key. Or an immediate JSON
//! response: a rejection, admission's 429 and 400, the model list. Or the
//! timer extension a held request needs (Envoy's ext_proc otherwise gives up
//! on a reply after its `message_timeout`, 200 ms, and with
//! `failure_mode_allow` routes the request past fleetroute).

use std::collections::HashMap;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::ProcessingMode;
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::{
    BodySendMode, HeaderSendMode,
};
use envoy_types::pb::envoy::service::ext_proc::v3::{
    BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, ImmediateResponse,
    ProcessingResponse, TrailersResponse, processing_request::Request,
    processing_response::Response,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use fleetroute_filter::contract::{self, RouteTag};

use crate::admission::class::BadPriority;
use crate::admission::judge::{Reason, Refusal};
use crate::route::{Decision, Reject};
use crate::topology::Topology;

/// Client headers that may carry the client's own credentials: a fleet with
/// its own key never sees them (its key goes in `authorization`).
pub const CLIENT_CREDENTIAL_HEADERS: &[&str] =
    &["proxy-authorization", "x-api-key", "api-key", "cookie"];

/// A header to set, replacing any copy.
pub fn header(key: &str, value: String) -> HeaderValueOption {
    raw_header(key, value.into_bytes())
}

fn raw_header(key: &str, raw_value: Vec<u8>) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.to_string(),
            raw_value,
            ..Default::default()
        }),
        // OVERWRITE_IF_EXISTS_OR_ADD
        append_action: 2,
        ..Default::default()
    }
}

fn string_value(s: String) -> Value {
    Value {
        kind: Some(Kind::StringValue(s)),
    }
}

/// The reply that routes the request; `instance` names this fleetroute
/// instance, so the access log entry finds its way back to it; `requested`
/// is the model the client named.
pub fn route(
    topo: &Topology,
    d: &Decision,
    nonce: u64,
    instance: &str,
    requested: Option<&str>,
) -> ProcessingResponse {
    let fleet = &topo.fleets[d.fleet];
    let mut hosts: Vec<&str> = d
        .replicas
        .iter()
        .map(|&r| fleet.replicas[r].addr.as_str())
        .collect();
    let retry = d.upstream.map(|u| retry_elsewhere(topo, d, u, &mut hosts));
    let tag = RouteTag {
        stage: &topo.stages[d.stage].name,
        fleet: &fleet.name,
        replica: hosts[0],
        predicted_cached_tokens: d.cached_tokens,
        uncached_tokens: d.uncached_tokens,
        queued_tokens: d.queued_tokens,
        arm: d.arm.as_str(),
        nonce,
        key: d.sampling_key.unwrap_or(0),
    };
    let lb = Struct {
        fields: HashMap::from([(
            contract::OVERRIDE_HOST_HEADER.to_string(),
            string_value(hosts.join(",")),
        )]),
    };
    // The tag travels as dynamic metadata, which the access log entry
    // carries and a client cannot write (a header would be stripped before
    // the log is written, and could be forged).
    let route = Struct {
        fields: HashMap::from([
            (contract::ROUTE_KEY.to_string(), string_value(tag.encode())),
            (
                contract::INSTANCE_KEY.to_string(),
                string_value(instance.to_string()),
            ),
        ]),
    };
    let metadata = Struct {
        fields: HashMap::from([
            (
                contract::OVERRIDE_HOST_NAMESPACE.to_string(),
                Value {
                    kind: Some(Kind::StructValue(lb)),
                },
            ),
            (
                contract::ROUTE_NAMESPACE.to_string(),
                Value {
                    kind: Some(Kind::StructValue(route)),
                },
            ),
        ]),
    };
    let (cluster, retry) = match retry {
        Some((cluster, to)) => (cluster, Some(to)),
        None => (fleet.name.clone(), None),
    };
    let mut set_headers = vec![
        header(contract::CLUSTER, cluster),
        // The rename root holds the response headers until the first body
        // byte, so the response headers below arrive with the first token.
        header(contract::FIRST_BYTE, "1".into()),
    ];
    let mut remove_headers = Vec::new();
    if let Some(s) = d.shadow {
        // The route mirrors to the cluster this header names.
        set_headers.push(header(contract::SHADOW, topo.fleets[s].name.clone()));
    }
    let served = served_model(topo, d);
    if let Some(to) = retry {
        set_headers.push(header(contract::UPSTREAM_FALLBACK, to));
    }
    if let Some(f) = &d.fallback {
        // The rename root shows it to the client and leaves the response's
        // `model` as the fallback wrote it.
        set_headers.push(header(contract::FALLBACK, f.header(topo, d.stage)));
    }
    if let (Some(served), Some(asked)) = (served, requested)
        && served != asked
    {
        // The filter's rename root writes it into the body, after this reply.
        set_headers.push(header(contract::SERVED_MODEL, served.to_string()));
    }
    if let Some(key) = &fleet.key {
        // Replaces the client's; Envoy's default mutation rules allow it.
        set_headers.push(raw_header("authorization", key.authorization().to_vec()));
        remove_headers.extend(CLIENT_CREDENTIAL_HEADERS.iter().map(|h| h.to_string()));
    }
    ProcessingResponse {
        response: Some(Response::RequestHeaders(HeadersResponse {
            response: Some(CommonResponse {
                header_mutation: Some(HeaderMutation {
                    set_headers,
                    remove_headers,
                }),
                // The route's cluster_header changed: Envoy must match again.
                clear_route_cache: true,
                ..Default::default()
            }),
        })),
        dynamic_metadata: Some(metadata),
        mode_override: Some(FIRST_BYTE_MODE),
        ..Default::default()
    }
}

/// A decision Envoy retries on its `upstream` fallback: the cluster that
/// holds both fleets, the host list cut to the chosen replica then the
/// fallback's (one retry, never a third host), and the upstream root's
/// `<stage>|<model>`.
fn retry_elsewhere<'t>(
    topo: &'t Topology,
    d: &Decision,
    u: crate::route::fallback::Upstream,
    hosts: &mut Vec<&'t str>,
) -> (String, String) {
    let (from, to) = (&topo.fleets[d.fleet], &topo.fleets[u.fleet]);
    hosts.truncate(1);
    hosts.push(to.replicas[u.replica].addr.as_str());
    let stage = &topo.stages[u.stage];
    let model = stage.rename(u.fleet, None).unwrap_or(&stage.model);
    (
        crate::config::retry_cluster(&from.name, &to.name),
        format!("{}|{model}", stage.name),
    )
}

/// The model name a decision writes upstream, when not the client's: the
/// fleet's own name, and on a fallback the fallback's model in any case.
pub fn served_model<'t>(topo: &'t Topology, d: &Decision) -> Option<&'t str> {
    let stage = &topo.stages[d.stage];
    let own = stage.rename(d.fleet, d.adapter.map(|a| a.0));
    match d.fallback {
        Some(_) => Some(own.unwrap_or(&stage.model)),
        None => own,
    }
}

/// What a routed request's stream asks of Envoy next: its response headers
/// (sent at the first token, see [`contract::FIRST_BYTE`]), which end the
/// replica's prefill share of the request; nothing else. Envoy applies it
/// only with `allow_mode_override` (the shipped configs list exactly this
/// mode in `allowed_override_modes`); without it the prefill share ends at
/// its estimate.
pub const FIRST_BYTE_MODE: ProcessingMode = ProcessingMode {
    request_header_mode: HeaderSendMode::Skip as i32,
    response_header_mode: HeaderSendMode::Send as i32,
    request_body_mode: BodySendMode::None as i32,
    response_body_mode: BodySendMode::None as i32,
    request_trailer_mode: HeaderSendMode::Skip as i32,
    response_trailer_mode: HeaderSendMode::Skip as i32,
};

/// The answer to `GET /v1/models`: the topology's list, built when the
/// config was loaded (no JSON is made or read per request).
pub fn model_list(topo: &Topology) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::ImmediateResponse(ImmediateResponse {
            status: Some(HttpStatus { code: 200 }),
            headers: Some(HeaderMutation {
                set_headers: vec![header("content-type", "application/json".into())],
                remove_headers: Vec::new(),
            }),
            body: topo.model_list.clone(),
            details: "fleetroute_model_list".into(),
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// The reply that ends the request with a JSON error.
pub fn reject(r: &Reject) -> ProcessingResponse {
    // OpenAI's error shape: clients and SDKs read `error.code` and the status.
    let body = serde_json::json!({
        "error": { "message": r.message(), "type": r.kind(), "param": null, "code": r.code() }
    });
    let mut set_headers = vec![("content-type", "application/json".to_string())];
    if let Some(s) = r.retry_after_s() {
        set_headers.push(("retry-after", s.to_string()));
    }
    if r.status() == 401 {
        set_headers.push(("www-authenticate", "Bearer".into()));
    }
    immediate(
        r.status(),
        set_headers,
        body.to_string(),
        format!("fleetroute_{}", r.code()),
    )
}

/// The reply that lets a request through unchanged (requests ext-proc is not
/// asked to route, e.g. a second message on the routing stream).
pub fn pass() -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::RequestHeaders(HeadersResponse {
            response: Some(CommonResponse::default()),
        })),
        ..Default::default()
    }
}

/// "Continue unchanged" for any other message a misconfigured routing filter
/// may send, in the response type Envoy expects for it (a wrong type is a
/// protocol error).
pub fn continue_unchanged(request: &Request) -> ProcessingResponse {
    let headers = || HeadersResponse {
        response: Some(CommonResponse::default()),
    };
    let body = || BodyResponse {
        response: Some(CommonResponse::default()),
    };
    let trailers = TrailersResponse::default;
    let response = match request {
        Request::RequestHeaders(_) => Response::RequestHeaders(headers()),
        Request::ResponseHeaders(_) => Response::ResponseHeaders(headers()),
        Request::RequestBody(_) => Response::RequestBody(body()),
        Request::ResponseBody(_) => Response::ResponseBody(body()),
        Request::RequestTrailers(_) => Response::RequestTrailers(trailers()),
        Request::ResponseTrailers(_) => Response::ResponseTrailers(trailers()),
    };
    ProcessingResponse {
        response: Some(response),
        ..Default::default()
    }
}

/// The response headers as they came, plus `x-fleetroute-cold-start`: how
/// long the request waited for its adapter, ms.
pub fn cold_start(waited: Duration) -> ProcessingResponse {
    let set_headers = vec![header(contract::COLD_START, waited.as_millis().to_string())];
    ProcessingResponse {
        response: Some(Response::ResponseHeaders(HeadersResponse {
            response: Some(CommonResponse {
                header_mutation: Some(HeaderMutation {
                    set_headers,
                    remove_headers: Vec::new(),
                }),
                ..Default::default()
            }),
        })),
        ..Default::default()
    }
}

/// What a held request's hold adds to Envoy's timer: time for the last
/// decision and its reply to travel.
pub const TIMER_MARGIN: Duration = Duration::from_millis(500);

fn immediate(
    status: u16,
    headers: Vec<(&str, String)>,
    body: String,
    details: String,
) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::ImmediateResponse(ImmediateResponse {
            status: Some(HttpStatus {
                code: i32::from(status),
            }),
            headers: Some(HeaderMutation {
                set_headers: headers.into_iter().map(|(k, v)| header(k, v)).collect(),
                remove_headers: Vec::new(),
            }),
            body: body.into_bytes(),
            details,
            ..Default::default()
        })),
        ..Default::default()
    }
}

pub fn message(stage: &str, r: &Refusal) -> String {
    let class = r.class.as_str();
    match r.reason {
        Reason::Saturated => format!(
            "stage '{stage}' is overloaded: every fleet is saturated and {class} requests are shed"
        ),
        Reason::Reserved => {
            format!("stage '{stage}' is overloaded: its capacity is kept for classes above {class}")
        }
        Reason::QueueFull => {
            format!("stage '{stage}' is overloaded: the queue for {class} requests is full")
        }
        Reason::Objective => format!(
            "stage '{stage}' is overloaded: a {class} request cannot get its first token within its objective, even by waiting"
        ),
        Reason::TimedOut => format!(
            "stage '{stage}' is overloaded: a {class} request waited as long as its objective allows"
        ),
    }
}

/// The 429 of a refusal: `{"error": {"code": "overloaded", "reason", "class", ...}}`
/// with `retry-after`.
pub fn refused(stage: &str, r: &Refusal) -> ProcessingResponse {
    let body = serde_json::json!({
        "error": {
            "message": message(stage, r),
            "type": "overloaded_error",
            "code": "overloaded",
            "reason": r.reason.as_str(),
            "class": r.class.as_str(),
        }
    });
    immediate(
        429,
        vec![
            ("content-type", "application/json".into()),
            ("retry-after", r.retry_after_s.to_string()),
        ],
        body.to_string(),
        format!("fleetroute_overloaded_{}", r.reason.as_str()),
    )
}

/// The 400 of a priority header that names no class.
pub fn bad_priority(b: &BadPriority) -> ProcessingResponse {
    let body = serde_json::json!({
        "error": { "message": b.message(), "type": "invalid_request_error", "code": "invalid_priority" }
    });
    immediate(
        400,
        vec![("content-type", "application/json".into())],
        body.to_string(),
        "fleetroute_invalid_priority".into(),
    )
}

/// The message that extends Envoy's timer for a held request to `hold`
/// plus [`TIMER_MARGIN`]. Envoy takes one per message and caps it at the
/// filter's `max_message_timeout` (the bootstrap sets it).
pub fn extend_timer(hold: Duration) -> ProcessingResponse {
    let t = hold + TIMER_MARGIN;
    ProcessingResponse {
        override_message_timeout: Some(envoy_types::pb::google::protobuf::Duration {
            seconds: t.as_secs() as i64,
            nanos: t.subsec_nanos() as i32,
        }),
        ..Default::default()
    }
}
