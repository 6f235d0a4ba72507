//! The admin API's contract: paths, request bodies, views and the error body,
//! shared by the server (which writes them) and the CLI (which reads them).
//! Nothing here depends on how the router keeps its state.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::config::{
    Bounds, ExperimentConfig, MAX_LIMIT, RoutingConfig, TenantLimits, TenantPatch, check_tenant_id,
};

pub const READY: &str = "/ready";
pub const METRICS: &str = "/metrics";
pub const DECISIONS: &str = "/debug/decisions";
pub const SNAPSHOT: &str = "/debug/snapshot";
pub const STAGES: &str = "/v1/stages";
/// `GET /v1/stage?name=STAGE`.
pub const STAGE: &str = "/v1/stage";
pub const SPLIT: &str = "/v1/split";
pub const SCALE: &str = "/v1/scale";
pub const DRAIN: &str = "/v1/drain";
pub const EXPERIMENT: &str = "/v1/experiment";
pub const RELOAD: &str = "/v1/reload";
pub const TENANTS: &str = "/v1/tenants";
/// `GET /v1/tenant?name=TENANT`; `POST` changes its limits.
pub const TENANT: &str = "/v1/tenant";
/// Most tenants one `GET /v1/tenants` answers with.
pub const MAX_TENANTS_LISTED: usize = 1000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    /// Not probed yet.
    Unknown,
    Healthy,
    Unhealthy,
}

/// The one word an operator sees for a replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReplicaState {
    Ready,
    /// Healthy, not yet through warmup.
    Warming,
    /// Ejected as an outlier.
    Ejected,
    Draining,
    /// No longer listed by its fleet's source (or the config): no new
    /// requests; removed once idle or after `membership.removal_grace_ms`.
    Leaving,
    Unhealthy,
    /// Not probed yet.
    Unknown,
}

impl ReplicaState {
    pub fn as_str(self) -> &'static str {
        match self {
            ReplicaState::Ready => "ready",
            ReplicaState::Warming => "warming",
            ReplicaState::Ejected => "ejected",
            ReplicaState::Draining => "draining",
            ReplicaState::Leaving => "leaving",
            ReplicaState::Unhealthy => "unhealthy",
            ReplicaState::Unknown => "unknown",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReplicaView {
    pub addr: String,
    /// Its slot in the fleet (its bit in the prefix index), stable while it is a member.
    #[serde(default)]
    pub slot: usize,
    /// `pod-name/pod-uid` for a Kubernetes member; absent when the address is the identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
    pub state: ReplicaState,
    pub health: Health,
    pub ready: bool,
    pub warm: bool,
    pub ejected: bool,
    pub draining: bool,
    /// See [`ReplicaState::Leaving`].
    #[serde(default)]
    pub leaving: bool,
    /// This instance's own requests in flight and prefill queued (its leases).
    pub inflight: u32,
    pub queued_tokens: u64,
    /// The other instances' fresh figures (peer link), which the decision
    /// adds to the own ones.
    #[serde(default)]
    pub peer_inflight: u32,
    #[serde(default)]
    pub peer_queued_tokens: u64,
    pub engine_running: u32,
    pub engine_waiting: u32,
    /// `null` where the engine reports none (llama.cpp, TGI).
    pub engine_kv_usage: Option<f64>,
    /// The engine's prefix-cache counters: prompt tokens found, looked up.
    #[serde(default)]
    pub engine_prefix_cache_hits: u64,
    #[serde(default)]
    pub engine_prefix_cache_queries: u64,
    /// LoRA adapters the engine runs and queues (vLLM with `--enable-lora`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_lora: Option<LoraView>,
    /// Adapters it holds as fleetroute knows them, most recent first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapters: Option<Vec<String>>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoraView {
    pub max: Option<u32>,
    pub running: Vec<String>,
    pub waiting: Vec<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FleetView {
    pub name: String,
    pub region: String,
    /// The engine dialect its metrics are read in.
    #[serde(default)]
    pub engine: String,
    /// Signals its engine should export and the last scrape lacked.
    #[serde(default)]
    pub engine_signals_missing: Vec<String>,
    /// Weight in a weighted stage.
    pub weight: Option<f64>,
    pub traffic_share: Option<f64>,
    pub hit_rate_predicted: Option<f64>,
    pub hit_rate_engine: Option<f64>,
    pub ttft_p95_ms: Option<f64>,
    pub latency_ms_per_1k_tokens: Option<f64>,
    pub error_rate: f64,
    pub tokens_per_sec: f64,
    pub cost_usd_per_gpu_hour: Option<f64>,
    pub cost_usd_per_million_tokens: Option<f64>,
    pub utilisation: Option<f64>,
    pub saturated: bool,
    pub desired_replicas: u32,
    pub hosts: Option<Bounds>,
    pub prefix_blocks: usize,
    pub replicas: Vec<ReplicaView>,
}

/// `GET /v1/stage?name=STAGE`; `GET /v1/stages` answers a list of them.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StageView {
    pub name: String,
    pub models: Vec<String>,
    pub residency: Vec<String>,
    pub replicas: Option<Bounds>,
    pub routing: RoutingConfig,
    pub experiment: ExperimentConfig,
    pub fleets: Vec<FleetView>,
}

/// `GET /debug/snapshot`: every fleet, outside any stage.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SnapshotView {
    pub generation: u64,
    pub fleets: Vec<FleetView>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StageQuery {
    pub name: String,
}

/// One tenant: the limits that apply to it and what it used on this
/// instance (counters start with the process).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TenantView {
    pub name: String,
    /// It has its own entry in `tenants.named`; else `default` applies.
    pub named: bool,
    /// Counted under its own id (else it would count as `other`: not seen
    /// yet, or beyond the tracking bound).
    pub tracked: bool,
    pub limits: TenantLimits,
    pub usage: TenantUsage,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TenantUsage {
    pub requests_in_flight: u64,
    /// Prompt + `max_tokens` of the requests in flight.
    pub tokens_in_flight: u64,
    /// Tokens counted in the last 60–70 s on this instance (what
    /// `tokens_per_minute` is checked against without Redis).
    pub tokens_last_minute: u64,
    pub spent_usd_today: f64,
    pub spent_usd_this_month: f64,
    /// Estimated cost of the requests in flight.
    pub reserved_usd: f64,
    /// What is left of the budget in its period (spent and reserved taken).
    pub budget_left_usd: Option<f64>,
    /// Reservations made; each ends as one of committed, expired (a lost
    /// end, charged its estimate) or dropped (never sent, not charged).
    pub admitted: u64,
    pub committed: u64,
    pub expired: u64,
    pub dropped: u64,
    /// Commits that corrected an expiry's estimate.
    pub late_commits: u64,
    /// Prompt + completion tokens charged since start.
    pub tokens_charged: u64,
    pub usd_charged: f64,
    /// Requests refused, by the limit that refused them.
    pub refused: BTreeMap<String, u64>,
}

/// `GET /v1/tenants`: the tenants using the most tokens first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TenantsView {
    /// Tenants counted under their own id on this instance.
    pub tracked: usize,
    pub tenants: Vec<TenantView>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TenantQuery {
    pub name: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct TenantsQuery {
    /// At most this many (default 100, at most [`MAX_TENANTS_LISTED`]).
    pub limit: Option<usize>,
}

/// `POST /v1/tenant`: change a tenant's limits (fields left out stay,
/// `null` makes one unlimited), or `remove` its named entry.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantRequest {
    pub name: String,
    #[serde(default)]
    pub limits: TenantPatch,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub remove: bool,
}

/// `GET /debug/decisions`: newest first.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct DecisionQuery {
    /// The client's `x-request-id`.
    pub id: Option<String>,
    /// fleetroute's decision id.
    pub decision: Option<String>,
    pub limit: Option<usize>,
}

/// `POST /v1/split`: one fleet's weight in a weighted stage.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SplitRequest {
    pub stage: String,
    pub fleet: String,
    pub weight: f64,
}

/// `POST /v1/scale`: a fleet's host bounds.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScaleRequest {
    pub fleet: String,
    pub min: u32,
    pub max: u32,
}

/// `POST /v1/drain`: `drain: false` puts the replica back.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrainRequest {
    /// `ip:port`, in whichever fleets list it.
    pub replica: String,
    #[serde(default = "yes")]
    pub drain: bool,
}

fn yes() -> bool {
    true
}

/// `POST /v1/experiment`: replaces the stage's experiments (`{}` ends them).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExperimentRequest {
    pub stage: String,
    pub experiment: ExperimentConfig,
}

/// The answer to every accepted change: what changed, in words.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    pub applied: String,
}

/// Every refusal, on every path: `{"error": {"code": ..., "message": ...}}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    pub code: ErrorCode,
    pub message: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// 400: the request is malformed or out of range.
    Invalid,
    /// 401: a change without the right token.
    Unauthorized,
    /// 403: changes are disabled (no token configured).
    Forbidden,
    /// 404: no such stage, fleet, replica or path.
    NotFound,
    /// 405: the path exists, not with this method.
    MethodNotAllowed,
    /// 409: well-formed, but the running config cannot take it.
    Conflict,
    /// 503: the state writer has stopped or does not answer.
    Unavailable,
}

impl ErrorCode {
    pub fn status(self) -> u16 {
        match self {
            ErrorCode::Invalid => 400,
            ErrorCode::Unauthorized => 401,
            ErrorCode::Forbidden => 403,
            ErrorCode::NotFound => 404,
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::Conflict => 409,
            ErrorCode::Unavailable => 503,
        }
    }
}

/// Checks of a request's own fields (400), before any name is looked up;
/// the CLI runs them before sending.
pub trait Check {
    fn check(&self) -> Result<(), String>;
}

impl Check for SplitRequest {
    fn check(&self) -> Result<(), String> {
        if self.weight.is_finite() && self.weight >= 0.0 {
            Ok(())
        } else {
            Err(format!("weight {} must be finite and >= 0", self.weight))
        }
    }
}

impl Check for ScaleRequest {
    fn check(&self) -> Result<(), String> {
        if self.min <= self.max {
            Ok(())
        } else {
            Err(format!("min {} is above max {}", self.min, self.max))
        }
    }
}

impl Check for TenantRequest {
    fn check(&self) -> Result<(), String> {
        check_tenant_id(&self.name).map_err(|e| format!("tenant '{}': {e}", self.name))?;
        if self.remove && !self.limits.is_empty() {
            return Err("remove takes no limits".into());
        }
        if !self.remove && self.limits.is_empty() {
            return Err("nothing to change: give a limit, a budget or a priority".into());
        }
        let l = &self.limits;
        for (name, v) in [
            ("max_requests_in_flight", l.max_requests_in_flight),
            ("max_tokens_in_flight", l.max_tokens_in_flight),
            ("tokens_per_minute", l.tokens_per_minute),
        ] {
            if let Some(Some(v)) = v
                && !(1..=MAX_LIMIT).contains(&v)
            {
                return Err(format!(
                    "{name} {v} must be 1 to {MAX_LIMIT} (none for unlimited)"
                ));
            }
        }
        if let Some(Some(b)) = l.budget
            && !(b.usd.is_finite() && b.usd >= 0.0 && b.usd * 1e6 < MAX_LIMIT as f64)
        {
            return Err(format!(
                "budget {} USD must be a finite number from 0 to {}",
                b.usd,
                MAX_LIMIT / 1_000_000
            ));
        }
        Ok(())
    }
}

impl Check for DrainRequest {
    fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

impl Check for ExperimentRequest {
    fn check(&self) -> Result<(), String> {
        let ex = &self.experiment;
        if let Some(ab) = &ex.ab {
            if ab.variants.is_empty() {
                return Err("an A/B test needs at least one variant".into());
            }
            let mut total = 0.0;
            for (i, v) in ab.variants.iter().enumerate() {
                if !(v.percent.is_finite() && v.percent > 0.0 && v.percent <= 100.0) {
                    return Err(format!(
                        "variant '{}': percent {} must be in (0, 100]",
                        v.fleet, v.percent
                    ));
                }
                let earlier = ab.variants[..i].iter().any(|w| w.fleet == v.fleet);
                if v.fleet == ab.control || earlier {
                    return Err(format!("'{}' is already an arm of this test", v.fleet));
                }
                total += v.percent;
            }
            if total > 100.0 {
                return Err(format!("variant percentages sum to {total}, more than 100"));
            }
        }
        match &ex.shadow {
            Some(sh) if !(sh.percent.is_finite() && (0.0..=100.0).contains(&sh.percent)) => Err(
                format!("shadow percent {} must be between 0 and 100", sh.percent),
            ),
            _ => Ok(()),
        }
    }
}
