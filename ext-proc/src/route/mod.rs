//! The decision, one typed step at a time:
//! `RouteKey → stage → Candidates → fleet → ReplicaChoice → Decision`.
//! It reads a snapshot and never writes.

pub mod eligible;
pub mod experiment;
pub mod fallback;
pub mod fleet;
pub mod key;

pub mod rendezvous;
pub mod replica;
pub mod stage;

#[cfg(test)]
mod per_fleet_tests;

use crate::state::Snapshot;
use crate::tenancy::identity::Unidentified;
use crate::topology::{AdapterId, FleetId, NonEmpty, Pick, ReplicaId, StageId};
use key::RouteKey;

/// Where a request goes.
#[derive(Debug)]
pub struct Decision {
    pub stage: StageId,
    pub fleet: FleetId,
    /// The fleet's replicas: the chosen one, then retry fallbacks.
    pub replicas: NonEmpty<ReplicaId>,
    /// Prompt tokens the chosen replica is predicted to hold.
    pub cached_tokens: u64,
    /// Prompt tokens it will have to prefill.
    pub uncached_tokens: u64,
    /// Prefill tokens already waiting on it.
    pub queued_tokens: u64,
    /// Why this replica (`replica::ReplicaChoice::pick`).
    pub pick: Pick,
    pub arm: experiment::Arm,
    /// A shadow fleet to mirror the request to.
    pub shadow: Option<FleetId>,
    /// The request's sampling key, when it had one (not a request-id hash).
    pub sampling_key: Option<u64>,
    /// How loaded the stage's eligible fleets are (admission reads it).
    pub stage_load: StageLoad,
    /// The LoRA adapter asked for, and what loading it on the chosen
    /// replica costs (prefill tokens; 0 when it holds it).
    pub adapter: Option<(AdapterId, f64)>,
    /// Set when the stage is a fallback of the one the client named.
    pub fallback: Option<fallback::Fallen>,
    /// Where Envoy retries it on a failure before the first byte (the
    /// stage's `upstream` fallback).
    pub upstream: Option<fallback::Upstream>,
}

/// The eligible fleets' load, as the decision saw it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StageLoad {
    /// Every eligible fleet is saturated (`state::saturation`: utilisation
    /// at or above 1).
    pub saturated: bool,
    /// The least prefill queued on any ready replica of the stage, tokens.
    pub min_queued: u64,
    /// Ready replicas over the eligible fleets.
    pub ready: u32,
}

impl StageLoad {
    fn of(c: &eligible::Candidates) -> StageLoad {
        StageLoad {
            saturated: c.fleets.iter().all(|f| f.utilisation >= 1.0),
            min_queued: c.fleets.iter().map(|f| f.min_queued).min().unwrap_or(0),
            ready: c.fleets.iter().map(|f| f.ready.len() as u32).sum(),
        }
    }
}

/// Why a request cannot be routed; each becomes a JSON error for the client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reject {
    NoModel,
    UnknownModel(String),
    NoReadyReplica {
        stage: String,
        residency: String,
    },
    ResidencyUnsatisfiable {
        stage: String,
        requested: String,
        stage_residency: String,
    },
    PolicyRefused {
        stage: String,
    },
    /// The tenant would pass one of its limits (`code` names it).
    TenantLimit {
        stage: String,
        tenant: String,
        code: &'static str,
        /// The limit as the message states it.
        limit: String,
        retry_after_s: u64,
    },
    /// The configured identity source names no tenant for it.
    Unidentified(Unidentified),
    /// The replica chosen could not be given the request's adapter in time.
    AdapterUnavailable {
        stage: String,
        adapter: String,
        why: String,
    },
    /// The packed replica chosen could not load the request's model in time.
    ModelUnavailable {
        stage: String,
        model: String,
        why: String,
    },
}

impl Reject {
    pub fn status(&self) -> u16 {
        match self {
            Reject::Unidentified(_) => 401,
            Reject::NoModel | Reject::UnknownModel(_) => 404,
            Reject::TenantLimit { .. } => 429,
            _ => 503,
        }
    }

    /// The stage the request reached, when it reached one.
    pub fn stage(&self) -> Option<&str> {
        match self {
            Reject::NoModel | Reject::UnknownModel(_) | Reject::Unidentified(_) => None,
            Reject::NoReadyReplica { stage, .. }
            | Reject::ResidencyUnsatisfiable { stage, .. }
            | Reject::PolicyRefused { stage }
            | Reject::AdapterUnavailable { stage, .. }
            | Reject::ModelUnavailable { stage, .. }
            | Reject::TenantLimit { stage, .. } => Some(stage),
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            Reject::NoModel => "model_required",
            Reject::UnknownModel(_) => "model_not_found",
            Reject::NoReadyReplica { .. } => "no_ready_replica",
            Reject::ResidencyUnsatisfiable { .. } => "residency_unsatisfiable",
            Reject::PolicyRefused { .. } => "no_acceptable_fleet",
            Reject::AdapterUnavailable { .. } => "adapter_unavailable",
            Reject::ModelUnavailable { .. } => "model_unavailable",
            Reject::TenantLimit { code, .. } => code,
            Reject::Unidentified(u) => u.code(),
        }
    }

    /// The error's `type`: the router could not route it, or the tenant is
    /// over a limit (`insufficient_quota` for its budget, as OpenAI's API
    /// names a spent quota).
    pub fn kind(&self) -> &'static str {
        match self {
            Reject::TenantLimit { code: "budget", .. } => "insufficient_quota",
            Reject::TenantLimit { .. } => "rate_limit_exceeded",
            Reject::Unidentified(_) => "invalid_request_error",
            _ => "routing_error",
        }
    }

    /// When to retry, for the `retry-after` header.
    pub fn retry_after_s(&self) -> Option<u64> {
        match self {
            Reject::TenantLimit { retry_after_s, .. } => Some(*retry_after_s),
            Reject::AdapterUnavailable { .. } | Reject::ModelUnavailable { .. } => Some(1),
            _ => None,
        }
    }

    pub fn message(&self) -> String {
        match self {
            Reject::Unidentified(u) => u.message().into(),
            Reject::NoModel => {
                "the request names no model and no default stage is configured".into()
            }
            Reject::UnknownModel(m) => format!("model '{m}' is not served here"),
            Reject::NoReadyReplica { stage, residency } => {
                format!("stage '{stage}' has no ready replica within residency [{residency}]")
            }
            Reject::ResidencyUnsatisfiable {
                stage,
                requested,
                stage_residency,
            } => format!(
                "residency [{requested}] does not overlap stage '{stage}' residency [{stage_residency}]"
            ),
            Reject::PolicyRefused { stage } => {
                format!(
                    "stage '{stage}' has ready replicas but its routing policy accepts none of them"
                )
            }
            Reject::AdapterUnavailable {
                stage,
                adapter,
                why,
            } => format!("stage '{stage}' could not load adapter '{adapter}' in time: {why}"),
            Reject::ModelUnavailable { stage, model, why } => {
                format!("stage '{stage}' could not load model '{model}' in time: {why}")
            }
            Reject::TenantLimit {
                tenant,
                limit,
                retry_after_s,
                ..
            } => {
                format!("tenant '{tenant}' has reached its {limit}; retry after {retry_after_s} s")
            }
        }
    }
}

/// `rng` is this request's randomness (exploration); pass a seeded value in
/// tests for a deterministic decision.
pub fn decide(snap: &Snapshot, key: &RouteKey<'_>, rng: u64) -> Result<Decision, Reject> {
    let (stage_idx, stage) = stage::resolve(&snap.topo, key.model)?;
    let mut d = decide_stage(snap, key, stage_idx, rng)?;
    if fallback::has(stage, crate::config::Condition::Upstream) {
        d.upstream = fallback::upstream(snap, key, &d, rng);
    }
    Ok(d)
}

/// The decision on a stage already resolved.
pub fn decide_stage(
    snap: &Snapshot,
    key: &RouteKey<'_>,
    stage_idx: StageId,
    rng: u64,
) -> Result<Decision, Reject> {
    let topo = &snap.topo;
    let stage = &topo.stages[stage_idx];
    let candidates = eligible::candidates(snap, stage, key)?;
    let input = fleet::PolicyInput {
        snap,
        stage,
        candidates: &candidates,
        key,
        rng,
    };
    let chosen = fleet::choose(&stage.policy, &input).ok_or_else(|| Reject::PolicyRefused {
        stage: stage.name.clone(),
    })?;
    let (chosen, arm) = experiment::ab(stage, &candidates, chosen, key.key);
    let cf = &candidates.fleets[chosen];
    let choice = replica::choose(&topo.fleets[cf.fleet], cf, key, &stage.replica_choice);
    Ok(Decision {
        stage: stage_idx,
        fleet: cf.fleet,
        replicas: choice.order,
        cached_tokens: choice.cached_tokens,
        uncached_tokens: u64::from(key.prompt_tokens).saturating_sub(choice.cached_tokens),
        // An adapter's load holds this request back like prefill queued
        // ahead: its latency, and the replica's speed judged from it, count it.
        queued_tokens: choice.queued_tokens + choice.adapter_tokens as u64,
        pick: choice.pick,
        arm,
        shadow: experiment::shadow(stage, snap, key, cf.fleet),
        sampling_key: key.conversation(),
        stage_load: StageLoad::of(&candidates),
        adapter: key
            .adapter
            .filter(|_| topo.fleets[cf.fleet].hold.is_some())
            .map(|a| (a, choice.adapter_tokens)),
        fallback: None,
        upstream: None,
    })
}

#[cfg(test)]
mod adapter_tests;
#[cfg(test)]
mod membership_tests;
#[cfg(test)]
mod packing_tests;
#[cfg(test)]
mod share_tests;
