//! Simulated engines and the end-to-end harness that runs fleetroute behind a
//! real Envoy in front of them.

pub mod engine;
pub mod harness;
pub mod replay;
