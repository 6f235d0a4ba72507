//! The admin HTTP API (loopback by default): readiness, Prometheus metrics,
//! a view of each stage and of each tenant, and changes (split, host bounds,
//! drain, experiments, tenant limits, reload). Reads are open; every change needs the bearer token fleetroute
//! was started with, and is logged with what changed.
//!
//! `api` is the contract the CLI shares; `server` the routes; `views` reads
//! the router's state into the API's views; `auth` and `errors` the rest.

pub mod api;
mod auth;
mod errors;
mod server;
mod tenant_metrics;
mod tenant_views;
#[cfg(test)]
mod tests;
mod views;

pub use crate::state::readiness::not_ready;
pub use auth::{admin_token, bearer};
pub use errors::ApiError;
pub use server::{AdminState, CHANGE_TIMEOUT, router};
