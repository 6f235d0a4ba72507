//! A decision as Envoy needs it: the cluster header for the route, the host
//! list for the override-host policy, and the tag the access log carries back.
//! Or a rejection as an immediate JSON response.

use std::collections::HashMap;

use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption};
use envoy_types::pb::envoy::service::ext_proc::v3::{
    BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, ImmediateResponse,
    ProcessingResponse, TrailersResponse, processing_request::Request,
    processing_response::Response,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use fleetroute_filter::contract::{self, RouteTag};

use super::{Decision, Reject};
use crate::topology::Topology;

fn header(key: &str, value: String) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.to_string(),
            raw_value: value.into_bytes(),
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
/// instance, so the access log entry finds its way back to it.
pub fn route(topo: &Topology, d: &Decision, nonce: u64, instance: &str) -> ProcessingResponse {
    let fleet = &topo.fleets[d.fleet];
    let hosts: Vec<&str> = d
        .replicas
        .iter()
        .map(|&r| fleet.replicas[r].addr.as_str())
        .collect();
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
    let mut set_headers = vec![header(contract::CLUSTER, fleet.name.clone())];
    if let Some(s) = d.shadow {
        // The route mirrors to the cluster this header names.
        set_headers.push(header(contract::SHADOW, topo.fleets[s].name.clone()));
    }
    ProcessingResponse {
        response: Some(Response::RequestHeaders(HeadersResponse {
            response: Some(CommonResponse {
                header_mutation: Some(HeaderMutation {
                    set_headers,
                    remove_headers: Vec::new(),
                }),
                // The route's cluster_header changed: Envoy must match again.
                clear_route_cache: true,
                ..Default::default()
            }),
        })),
        dynamic_metadata: Some(metadata),
        ..Default::default()
    }
}

/// The reply that ends the request with a JSON error.
pub fn reject(r: &Reject) -> ProcessingResponse {
    // OpenAI's error shape: clients and SDKs read `error.code` and the status.
    let body = serde_json::json!({
        "error": { "message": r.message(), "type": r.kind(), "param": null, "code": r.code() }
    });
    let mut set_headers = vec![header("content-type", "application/json".into())];
    if let Some(s) = r.retry_after_s() {
        set_headers.push(header("retry-after", s.to_string()));
    }
    ProcessingResponse {
        response: Some(Response::ImmediateResponse(ImmediateResponse {
            status: Some(HttpStatus {
                code: i32::from(r.status()),
            }),
            headers: Some(HeaderMutation {
                set_headers,
                remove_headers: Vec::new(),
            }),
            body: body.to_string().into_bytes(),
            details: format!("fleetroute_{}", r.code()),
            ..Default::default()
        })),
        ..Default::default()
    }
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
