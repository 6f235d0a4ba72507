//! Where a request goes when its stage cannot take it: the stage's
//! `fallbacks` for the condition, in order, each decided like the stage
//! itself but never outside the residency of the stage the client named.
//! Pure: the request path (`request::fallback`) tries them.

use super::key::RouteKey;
use super::{Decision, Reject};
use crate::config::Condition;
use crate::state::Snapshot;
pub use crate::topology::Fallen;
use crate::topology::{FleetId, ReplicaId, Stage, StageId, Topology};

/// Where Envoy retries a request whose replica fails before its first
/// byte: the `upstream` fallback's replica, decided with the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Upstream {
    pub stage: StageId,
    pub fleet: FleetId,
    pub replica: ReplicaId,
}

/// The first `upstream` fallback of the decision's stage that has a replica
/// for this request (inside both residencies), if any.
pub fn upstream(snap: &Snapshot, key: &RouteKey<'_>, d: &Decision, rng: u64) -> Option<Upstream> {
    let topo = &snap.topo;
    for to in for_reason(&topo.stages[d.stage], Condition::Upstream) {
        let fkey = rekey(topo, key, d.stage, to)?;
        if let Ok(u) = super::decide_stage(snap, &fkey, to, rng) {
            return Some(Upstream {
                stage: to,
                fleet: u.fleet,
                replica: *u.replicas.head(),
            });
        }
    }
    None
}

/// `stage`'s fallbacks for `reason`, in order.
pub fn for_reason(stage: &Stage, reason: Condition) -> impl Iterator<Item = StageId> + '_ {
    stage
        .fallbacks
        .iter()
        .filter(move |(_, on)| on.contains(&reason))
        .map(|(to, _)| *to)
}

/// Whether `stage` has any fallback for `reason`.
pub fn has(stage: &Stage, reason: Condition) -> bool {
    for_reason(stage, reason).next().is_some()
}

/// The prompt is longer than the stage's model takes.
pub fn over_context(stage: &Stage, key: &RouteKey<'_>) -> bool {
    stage.context_tokens.is_some_and(|c| key.prompt_tokens > c)
}

/// The condition a refusal of the stage's own decision is, if any.
pub fn condition_of(reject: &Reject) -> Option<Condition> {
    match reject {
        Reject::NoReadyReplica { .. } | Reject::PolicyRefused { .. } => Some(Condition::Unhealthy),
        _ => None,
    }
}

/// The request's key as fallback `to` reads it: its residency bounded by
/// `from`'s, and its blocks as `to`'s replicas hold them. `None` for a
/// request that names one of `from`'s adapters: the adapter exists only on
/// its own model.
pub fn rekey<'a>(
    topo: &Topology,
    key: &RouteKey<'a>,
    from: StageId,
    to: StageId,
) -> Option<RouteKey<'a>> {
    let (was, next) = (&topo.stages[from], &topo.stages[to]);
    if key.adapter.is_some_and(|a| was.is_adapter(a)) {
        return None;
    }
    // A packed model's blocks are its own: the fallback starts without
    // prefix affinity rather than with another model's.
    let blocks = match (key.adapter, next.packed) {
        (Some(_), _) => Vec::new(),
        (None, Some(id)) => key.blocks.iter().map(|&b| id.block(b)).collect(),
        (None, None) => key.blocks.clone(),
    };
    Some(RouteKey {
        request_id: key.request_id,
        model: key.model,
        key: key.key,
        key_source: key.key_source,
        residency: key.residency,
        blocks,
        opening_blocks: key.opening_blocks,
        continues: key.continues,
        block_tokens: key.block_tokens,
        prompt_tokens: key.prompt_tokens,
        max_tokens: key.max_tokens,
        tenant: key.tenant.clone(),
        key_hash: key.key_hash,
        list_models: false,
        adapter: next.packed,
        within: Some(from),
    })
}

/// The decision on fallback `to`, for a key from [`rekey`].
pub fn decide(
    snap: &Snapshot,
    key: &RouteKey<'_>,
    to: StageId,
    fallen: Fallen,
    rng: u64,
) -> Result<Decision, Reject> {
    let mut d = super::decide_stage(snap, key, to, rng)?;
    d.fallback = Some(fallen);
    Ok(d)
}
