//! fleetroute serves Envoy's endpoints (EDS) for every cluster its bootstrap
//! renders, from the same snapshot it routes on, so Envoy's members and
//! fleetroute's agree by construction: the fleet clusters list exactly the
//! topology's replicas (a draining or leaving one included, as DRAINING,
//! until the topology drops it), the stages' fail-open clusters their
//! fleets' replicas by locality.
//!
//! Variant: state-of-the-world over ADS (`AggregatedDiscoveryService.
//! StreamAggregatedResources`, endpoints only), because for Envoy 1.40 it is
//! the most robust fit:
//! - One stream per Envoy. With a plain EDS `api_config_source` Envoy 1.40
//!   opens one stream per cluster (measured: three clusters, three streams),
//!   so a fleetroute restart would resync each cluster on its own backoff;
//!   over ADS every cluster's members come back in the first response of one
//!   stream, and a change that touches a fleet and its stages' fail-open
//!   clusters arrives as one response.
//! - State of the world is Envoy's oldest and most exercised xDS path (what
//!   service meshes ran on for years); for endpoints it already lets the
//!   server send only the clusters that changed, which is delta's main gain,
//!   while delta adds per-resource subscription bookkeeping on both sides
//!   that a few dozen small assignments do not need.
//! - ADS's ordering across types buys nothing here (clusters, listeners and
//!   routes stay static in the bootstrap), and costs only `dynamic_resources.
//!   ads_config` in it. Plain EDS (`EndpointDiscoveryService.StreamEndpoints`)
//!   is served too, from the same streams' code, for a bootstrap that points
//!   clusters at fleetroute with an `api_config_source` (one stream each).
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
//!
//! The topology is served as it is: a fleet without members is served empty,
//! and Envoy drops its hosts. A dynamic fleet (DNS, Kubernetes) whose source
//! has not answered since fleetroute started is not empty but unknown: it is
//! held back (with its stages' fail-open clusters), not sent at all, so a
//! fleetroute restarted while DNS is down does not empty Envoy's clusters;
//! Envoy keeps its last endpoints until the source's first answer.

pub mod assignment;
pub mod protocol;
pub mod resources;
pub mod service;

pub use service::Service;
