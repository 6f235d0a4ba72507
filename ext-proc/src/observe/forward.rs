//! Access log entries of another instance's decisions. Envoy keeps one log
//! stream per worker to any instance of its cluster, so an entry can reach
//! an instance that did not decide its request: that one does not hold the
//! lease (its nonce means nothing there), and the deciding instance would
//! otherwise carry the request's load until the lease's bound. The entry is
//! trimmed to what `entry::read_entry` reads and sent to its owner
//! over the peer link (`peers`); the owner reads it as its own.

use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::envoy::data::accesslog::v3::{
    AccessLogCommon, HttpAccessLogEntry, HttpResponseProperties,
};
use envoy_types::pb::google::protobuf::value::Kind;
use fleetroute_filter::contract;
use prost::Message;

/// The instance that decided the entry's request, when the tag names one.
pub fn owner(entry: &HttpAccessLogEntry) -> Option<&str> {
    let v = entry
        .common_properties
        .as_ref()?
        .metadata
        .as_ref()?
        .filter_metadata
        .get(contract::ROUTE_NAMESPACE)?
        .fields
        .get(contract::INSTANCE_KEY)?;
    match &v.kind {
        Some(Kind::StringValue(s)) => Some(s),
        _ => None,
    }
}

/// The entry with only what the owner reads: the fleetroute metadata,
/// the served host, response code and flags, durations, custom tags, the
/// usage filter state and the content type (a few hundred bytes).
pub fn trimmed(entry: &HttpAccessLogEntry) -> HttpAccessLogEntry {
    let c = entry.common_properties.as_ref();
    let metadata = c
        .and_then(|c| c.metadata.as_ref())
        .and_then(|m| m.filter_metadata.get(contract::ROUTE_NAMESPACE))
        .map(|ns| Metadata {
            filter_metadata: [(contract::ROUTE_NAMESPACE.to_string(), ns.clone())].into(),
            ..Default::default()
        });
    let common = c.map(|c| AccessLogCommon {
        metadata,
        upstream_remote_address: c.upstream_remote_address.clone(),
        response_flags: c.response_flags,
        duration: c.duration,
        time_to_last_downstream_tx_byte: c.time_to_last_downstream_tx_byte,
        custom_tags: c.custom_tags.clone(),
        filter_state_objects: c
            .filter_state_objects
            .iter()
            .filter(|(k, _)| k.as_str() == contract::USAGE_FILTER_STATE)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        ..Default::default()
    });
    let response = entry.response.as_ref().map(|r| HttpResponseProperties {
        response_code: r.response_code,
        response_headers: r
            .response_headers
            .iter()
            .filter(|(k, _)| k.as_str() == "content-type")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        ..Default::default()
    });
    HttpAccessLogEntry {
        common_properties: common,
        response,
        ..Default::default()
    }
}

/// Encodes an entry for its owner.
pub fn encode(entry: &HttpAccessLogEntry) -> Vec<u8> {
    trimmed(entry).encode_to_vec()
}
