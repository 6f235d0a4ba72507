//! fleetroute's Envoy filter: reads an OpenAI-style request body once and writes
//! the route headers ext-proc decides on. Everything but `host` is plain Rust,
//! tested natively; `contract` is shared with ext-proc.

pub mod config;
pub mod contract;
pub mod extract;
pub mod http;
pub mod response;

#[cfg(target_arch = "wasm32")]
mod host;
