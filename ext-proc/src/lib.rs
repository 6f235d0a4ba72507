//! fleetroute's ext_proc service: holds fleet health, load and prefix state,
//! and tells Envoy which fleet (cluster) and replica (host) serves each request.

// House rules for the router's own code (tests may read the clock and set up
// at length): the clock and randomness only through `clock`, no function
// over 100 lines.
#![cfg_attr(not(test), deny(clippy::disallowed_methods))]
#![deny(clippy::too_many_lines)]

pub mod admin;
pub mod admission;
pub mod bootstrap;
pub mod cli;
pub mod clock;
pub mod config;
pub mod decision_trace;
pub mod eds;
pub mod engine;
pub mod envoy_bounds;
pub mod fail_open;
pub mod listen;
pub mod membership;
pub mod metrics;
pub mod observe;
pub mod peer_auth;
pub mod peers;
pub mod placement;
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
