//! fleetroute serves Envoy's endpoints (EDS) for every cluster its bootstrap
//! renders, from the same snapshot it routes on, so Envoy's members and
//! fleetroute's agree by construction: the fleet clusters list exactly the
//! topology's replicas (a draining one included, until the topology drops
//! it), the stages' fail-open clusters their fleets' replicas by locality.
//!
//! Variant: state-of-the-world EDS (`EndpointDiscoveryService.StreamEndpoints`),
//! not ADS and not delta, because for Envoy 1.40 it is the most robust fit:
//! - It is Envoy's oldest and most exercised xDS path, and the simplest to
//!   get right on both sides; for EDS the SotW protocol already lets the
//!   server send only the clusters that changed, which is delta's main gain.
//! - Envoy multiplexes every EDS cluster with the same config source onto one
//!   gRPC stream, so one stream per Envoy, as with ADS, without ADS's
//!   `dynamic_resources` in the bootstrap: the EDS config sits on each
//!   cluster and nothing else in the bootstrap changes. ADS's ordering across
//!   resource types buys nothing here: the clusters themselves are static.
//! - Delta adds per-resource subscription bookkeeping on both sides that a
//!   few dozen small assignments do not need, and Envoy's delta EDS has had
//!   more churn across releases.
//!
//! Versions are hashes of content (`resources`): a cluster's changes only
//! when its members, locality weights or health statuses do, so restarts and
//! other router instances with the same membership serve the same versions,
//! and Envoy may use any of them.
//!
//! When fleetroute is down, Envoy keeps the endpoints it last received (no
//! `endpoint_stale_after`), fail-open keeps serving them, and on reconnecting
//! Envoy gets every subscribed cluster in the first response of the new
//! stream.

pub mod assignment;
pub mod protocol;
pub mod resources;
pub mod service;

pub use service::Service;
