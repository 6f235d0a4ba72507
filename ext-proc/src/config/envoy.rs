//! The `envoy:` section: bounds that `fleetroute bootstrap` writes into the
//! Envoy it renders (timeouts, heap, retries, outlier detection). fleetroute
//! itself never reads them; they live here so one file describes a deployment.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, Deserialize, JsonSchema, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EnvoyConfig {
    pub timeouts: TimeoutsConfig,
    pub overload: OverloadConfig,
    pub retries: RetriesConfig,
    pub outlier: EnvoyOutlierConfig,
}

/// Every wait a client or a replica can impose on Envoy has a bound.
#[derive(Clone, Debug, Deserialize, JsonSchema, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TimeoutsConfig {
    /// From the first byte of the request headers to the last.
    pub request_headers_ms: u64,
    /// From the start of a request until its whole body has been received
    /// and sent on (disarmed once the response starts), so a slow upload
    /// cannot hold a stream and its buffer.
    pub request_ms: u64,
    /// No byte in either direction on a stream for this long ends it.
    pub stream_idle_ms: u64,
    /// A connection with no open stream for this long is closed.
    pub connection_idle_ms: u64,
    /// Streaming requests: no byte from the replica for this long ends the
    /// attempt (a hung replica, or a stall mid-stream). Non-streaming answers
    /// send nothing until they are done, so only `response_ms` bounds them.
    pub upstream_idle_ms: u64,
    /// The whole response, from the end of the request to its last byte.
    pub response_ms: u64,
}

/// Envoy's overload manager: refuse gracefully instead of growing.
#[derive(Clone, Debug, Deserialize, JsonSchema, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct OverloadConfig {
    /// Heap the fixed-heap monitor measures pressure against. From 85% the
    /// streams buffering the most are reset, at 90% Envoy returns freed memory
    /// to the system, at 95% new requests get a 503.
    pub max_heap_bytes: u64,
    /// Downstream connections across all listeners; more are refused.
    pub max_connections: u64,
}

/// Retries on fleet clusters are limited by a budget that grows with load,
/// not by Envoy's fixed default of 3 concurrent retries. Routes retry only
/// failures before a request reached an engine (connect failure, refused
/// stream, reset before the request), which cost the engines nothing, so the
/// defaults are generous: one dead replica of two means half the fleet's
/// requests retry at once, and a retry waiting for its backoff does not count
/// as an active request, so the floor carries small and bursty loads.
#[derive(Clone, Debug, Deserialize, JsonSchema, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RetriesConfig {
    /// Concurrent retries as a percentage of the cluster's active requests.
    pub budget_percent: f64,
    /// Concurrent retries always allowed, however few requests are active.
    pub min_concurrency: u32,
}

/// Envoy's own outlier detection on fleet clusters. It is what keeps the
/// fail-open routes (used while fleetroute is unreachable) off failing hosts,
/// together with Envoy's active health checks from `health_check`.
#[derive(Clone, Debug, Deserialize, JsonSchema, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EnvoyOutlierConfig {
    /// 5xx answers in a row from a replica.
    pub consecutive_5xx: u32,
    /// 502/503/504 answers in a row from a replica.
    pub consecutive_gateway_failure: u32,
    /// Connect failures, resets and timeouts in a row (seen by Envoy itself).
    pub consecutive_local_origin_failure: u32,
    /// How often Envoy sweeps for outliers.
    pub interval_ms: u64,
    /// First ejection time; each ejection of the same host lasts this times its ejection count.
    pub base_ejection_ms: u64,
    /// Never more than this percentage of a fleet ejected at once (at least
    /// one host may always be ejected).
    pub max_ejection_percent: u32,
}
