//! Reading one access log entry: the decision it belongs to (route tag in
//! dynamic metadata), the served host, status and reset flags, time to the
//! first upstream body byte (custom tag) and the token usage the Wasm filter
//! read off the response (filter state). Pure: no state is touched here.

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::{Address, address, socket_address};
use envoy_types::pb::envoy::data::accesslog::v3::{HttpAccessLogEntry, ResponseFlags};
use envoy_types::pb::google::protobuf::{Any, BytesValue, StringValue, value::Kind};
use fleetroute_filter::contract::{self, RouteTag, UsageTag};
use prost::Message;

use super::Observation;
use super::usage::{PromptDetails, Usage};
use crate::route::experiment::Arm;

/// The custom tag (`custom_tags` in the bootstrap) with the time from the
/// request's start to the first upstream body byte, in microseconds.
pub const TTFB_TAG: &str = "ttfb_us";

/// The decision nonce and the outcome of one entry; `None` for requests
/// fleetroute did not route (fail-open, rejected, not an inference call).
pub fn read_entry(entry: &HttpAccessLogEntry) -> Option<(u64, Observation)> {
    let common = entry.common_properties.as_ref()?;
    let tag = common
        .metadata
        .as_ref()?
        .filter_metadata
        .get(contract::ROUTE_NAMESPACE)?
        .fields
        .get(contract::ROUTE_KEY)?;
    let Some(Kind::StringValue(tag)) = &tag.kind else {
        return None;
    };
    let tag = RouteTag::decode(tag)?;
    let response = entry.response.as_ref();
    let status = response
        .and_then(|r| r.response_code)
        .map(|c| c.value)
        .filter(|&c| c > 0)
        .and_then(|c| u16::try_from(c).ok());
    let stream = response
        .and_then(|r| r.response_headers.get("content-type"))
        .is_some_and(|c| c.starts_with("text/event-stream"));
    let usage = common
        .filter_state_objects
        .get(contract::USAGE_FILTER_STATE)
        .and_then(usage_tag);
    let done = usage.is_some_and(|u| u.done);
    let reset = common.response_flags.as_ref().is_some_and(cut_short);
    let client_left = common.response_flags.as_ref().is_some_and(client_left);
    let ok_status = status.is_some_and(|s| (200..300).contains(&s));
    let duration = |d: &Option<envoy_types::pb::google::protobuf::Duration>| {
        d.as_ref()
            .filter(|d| d.seconds >= 0 && d.nanos >= 0)
            .map(|d| Duration::new(d.seconds as u64, d.nanos as u32))
            .unwrap_or_default()
    };
    let total = match &common.duration {
        Some(_) => duration(&common.duration),
        None => duration(&common.time_to_last_downstream_tx_byte),
    };
    let obs = Observation {
        stage: tag.stage.to_string(),
        fleet: tag.fleet.to_string(),
        replica: tag.replica.to_string(),
        served_by: common.upstream_remote_address.as_ref().and_then(host_port),
        status,
        time_to_first_byte: common
            .custom_tags
            .get(TTFB_TAG)
            .and_then(|v| v.parse::<u64>().ok())
            .map(Duration::from_micros),
        total,
        usage: usage.and_then(|u| u.usage).map(|(p, c, k)| Usage {
            prompt_tokens: p,
            completion_tokens: c,
            prompt_tokens_details: k.map(|cached_tokens| PromptDetails { cached_tokens }),
        }),
        predicted_cached_tokens: tag.predicted_cached_tokens,
        uncached_tokens: tag.uncached_tokens,
        queued_tokens: tag.queued_tokens,
        arm: Arm::parse(tag.arm),
        stream,
        // A response that started and then broke: reset, or an SSE stream
        // that never reached [DONE]. An error status is its own outcome. A
        // client that went away is not the replica's failure: counting it
        // would let any client eject a replica by hanging up.
        ended_early: ok_status && !client_left && (reset || (stream && !done)),
        key: Some(tag.key).filter(|&k| k != 0),
        decided: None,
    };
    Some((tag.nonce, obs))
}

/// The response was cut short by a reset or a timeout on the upstream side.
fn cut_short(f: &ResponseFlags) -> bool {
    f.upstream_remote_reset
        || f.upstream_connection_termination
        || f.local_reset
        || f.upstream_request_timeout
        || f.stream_idle_timeout
        || f.upstream_max_stream_duration_reached
        || f.duration_timeout
}

/// The client reset or closed its side before the response ended.
fn client_left(f: &ResponseFlags) -> bool {
    f.downstream_connection_termination || f.downstream_remote_reset
}

fn host_port(a: &Address) -> Option<String> {
    let Some(address::Address::SocketAddress(s)) = &a.address else {
        return None;
    };
    let Some(socket_address::PortSpecifier::PortValue(port)) = s.port_specifier else {
        return None;
    };
    Some(format!("{}:{port}", s.address))
}

/// Envoy logs a Wasm property as bytes (or a string, by schema).
pub fn usage_tag(any: &Any) -> Option<UsageTag> {
    let text = if any.type_url.ends_with("google.protobuf.BytesValue") {
        String::from_utf8(BytesValue::decode(any.value.as_slice()).ok()?.value).ok()?
    } else if any.type_url.ends_with("google.protobuf.StringValue") {
        StringValue::decode(any.value.as_slice()).ok()?.value
    } else {
        return None;
    };
    UsageTag::decode(&text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::core::v3::{Metadata, SocketAddress};
    use envoy_types::pb::envoy::data::accesslog::v3::{AccessLogCommon, HttpResponseProperties};
    use envoy_types::pb::google::protobuf::{Struct, UInt32Value, Value};
    use std::collections::HashMap;

    fn entry(status: u32, sse: bool, usage: Option<&str>, reset: bool) -> HttpAccessLogEntry {
        let tag = RouteTag {
            stage: "s",
            fleet: "f",
            replica: "127.0.0.1:1",
            predicted_cached_tokens: 3,
            uncached_tokens: 4,
            queued_tokens: 5,
            arm: "control",
            nonce: 42,
            key: 7,
        };
        let route = Struct {
            fields: HashMap::from([(
                contract::ROUTE_KEY.to_string(),
                Value {
                    kind: Some(Kind::StringValue(tag.encode())),
                },
            )]),
        };
        let mut common = AccessLogCommon {
            metadata: Some(Metadata {
                filter_metadata: HashMap::from([(contract::ROUTE_NAMESPACE.to_string(), route)]),
                ..Default::default()
            }),
            upstream_remote_address: Some(Address {
                address: Some(address::Address::SocketAddress(SocketAddress {
                    address: "127.0.0.1".into(),
                    port_specifier: Some(socket_address::PortSpecifier::PortValue(2)),
                    ..Default::default()
                })),
            }),
            custom_tags: HashMap::from([(TTFB_TAG.to_string(), "1500".to_string())]),
            response_flags: Some(ResponseFlags {
                upstream_remote_reset: reset,
                ..Default::default()
            }),
            ..Default::default()
        };
        if let Some(u) = usage {
            common.filter_state_objects.insert(
                contract::USAGE_FILTER_STATE.into(),
                Any {
                    type_url: "type.googleapis.com/google.protobuf.BytesValue".into(),
                    value: BytesValue {
                        value: u.as_bytes().to_vec(),
                    }
                    .encode_to_vec(),
                },
            );
        }
        let mut headers = HashMap::new();
        if sse {
            headers.insert("content-type".into(), "text/event-stream".into());
        }
        HttpAccessLogEntry {
            common_properties: Some(common),
            response: Some(HttpResponseProperties {
                response_code: Some(UInt32Value { value: status }),
                response_headers: headers,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_complete_stream() {
        let (nonce, o) = read_entry(&entry(200, true, Some("40|2|32|1"), false)).unwrap();
        assert_eq!(nonce, 42);
        assert_eq!(o.served_by.as_deref(), Some("127.0.0.1:2"));
        assert_eq!(o.time_to_first_byte, Some(Duration::from_micros(1500)));
        assert_eq!(o.usage.and_then(|u| u.cached_tokens()), Some(32));
        assert_eq!((o.queued_tokens, o.arm), (5, Arm::Control));
        assert!(o.succeeded() && o.stream);
        assert_eq!(o.key, Some(7));
    }

    #[test]
    fn a_client_that_hangs_up_is_not_the_replicas_failure() {
        let mut e = entry(200, true, Some("-|-|-|0"), false);
        let flags = e
            .common_properties
            .as_mut()
            .unwrap()
            .response_flags
            .as_mut();
        flags.unwrap().downstream_remote_reset = true;
        let (_, o) = read_entry(&e).unwrap();
        assert!(
            !o.ended_early,
            "the client left; the replica did nothing wrong"
        );
    }

    #[test]
    fn cut_streams_end_early_and_errors_do_not() {
        let (_, o) = read_entry(&entry(200, true, Some("-|-|-|0"), false)).unwrap();
        assert!(o.ended_early, "no [DONE]");
        let (_, o) = read_entry(&entry(200, false, None, true)).unwrap();
        assert!(o.ended_early, "reset after the headers");
        let (_, o) = read_entry(&entry(503, false, None, true)).unwrap();
        assert!(!o.ended_early && !o.succeeded(), "a 503 is a server error");
        let (_, o) = read_entry(&entry(0, false, None, true)).unwrap();
        assert_eq!(o.status, None);
    }

    #[test]
    fn unknown_cached_tokens_stay_unknown() {
        let (_, o) = read_entry(&entry(200, false, Some("5|1|-|0"), false)).unwrap();
        assert_eq!(o.usage.map(|u| u.cached_tokens()), Some(None));
        assert!(o.succeeded());
    }

    #[test]
    fn untagged_entries_are_skipped() {
        let mut e = entry(200, false, None, false);
        e.common_properties.as_mut().unwrap().metadata = None;
        assert!(read_entry(&e).is_none());
    }
}
