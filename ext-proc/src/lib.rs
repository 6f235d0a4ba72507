//! fleetroute's ext_proc service: holds fleet health, load and prefix state,
//! and tells Envoy which fleet (cluster) and replica (host) serves each request.

pub mod admin;
pub mod admission;
pub mod bootstrap;
pub mod cli;
pub mod config;
pub mod decision_trace;
pub mod eds;
pub mod envoy_bounds;
pub mod fail_open;
pub mod listen;
pub mod membership;
pub mod metrics;
pub mod observe;
pub mod peer_auth;
pub mod peers;
pub mod redis_link;
pub mod reference;
pub mod reload;
pub mod request;
pub mod route;
pub mod serve;
pub mod shutdown;
pub mod state;
pub mod stream;
pub mod stream_limit;
pub mod tenancy;
pub mod topology;
