//! What came back for a routed request, read from Envoy's gRPC access log
//! (`access_log`: one batched stream per Envoy worker, no call per request).

pub mod access_log;
pub mod charge;
pub mod entry;
pub mod envoy_stats;
pub mod forward;
pub mod log_health;
pub use crate::state::usage;

pub use crate::state::observation::Observation;
