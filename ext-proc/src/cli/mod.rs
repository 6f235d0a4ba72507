//! The command line beyond `serve`: the operator commands that talk to a
//! running fleetroute's admin API (`endpoint get`, `metrics`, `split set`,
//! `fleet scale`, `replica drain`, `experiment set|clear`, `tenant get|set`,
//! `reload`; tables
//! for people, `--json` for scripts) and the local ones (`check-config`,
//! `bootstrap`).

pub mod client;
pub mod commands;
pub mod local;
pub mod render;
pub mod tenants;

pub use client::Client;
pub use commands::{Target, View, fleet_percent};
pub use render::{render_endpoint, render_metrics};
