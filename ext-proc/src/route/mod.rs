//! The decision, one typed step at a time:
//! `RouteKey → stage → Candidates → fleet → ReplicaChoice → Decision`.
//! It reads a snapshot and never writes.

pub mod eligible;
pub mod fleet;
pub mod key;
pub mod mutation;
pub mod rendezvous;
pub mod replica;
pub mod stage;

use crate::state::Snapshot;
use key::RouteKey;

/// Where a request goes.
#[derive(Debug)]
pub struct Decision {
    pub stage: usize,
    pub fleet: usize,
    /// Replica indices in the fleet: the chosen one, then retry fallbacks.
    pub replicas: Vec<usize>,
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
}

impl Reject {
    pub fn status(&self) -> u16 {
        match self {
            Reject::NoModel | Reject::UnknownModel(_) => 404,
            _ => 503,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            Reject::NoModel => "model_required",
            Reject::UnknownModel(_) => "model_not_found",
            Reject::NoReadyReplica { .. } => "no_ready_replica",
            Reject::ResidencyUnsatisfiable { .. } => "residency_unsatisfiable",
            Reject::PolicyRefused { .. } => "no_acceptable_fleet",
        }
    }

    pub fn message(&self) -> String {
        match self {
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
        }
    }
}

pub fn decide(snap: &Snapshot, key: &RouteKey<'_>) -> Result<Decision, Reject> {
    let topo = &snap.topo;
    let (stage_idx, stage) = stage::resolve(topo, key.model)?;
    let candidates = eligible::candidates(snap, stage_idx, stage, key.residency, key.key)?;
    let input = fleet::PolicyInput {
        snap,
        candidates: &candidates,
        key: key.key,
    };
    let chosen = fleet::choose(&stage.policy, &input).ok_or_else(|| Reject::PolicyRefused {
        stage: stage.name.clone(),
    })?;
    let cf = &candidates.fleets[chosen];
    let replicas = replica::choose(cf);
    Ok(Decision {
        stage: stage_idx,
        fleet: cf.fleet,
        replicas: replicas.order,
    })
}
