//! Model name → stage.

use super::Reject;
use super::key::RouteKey;
use crate::topology::{Stage, StageId, Topology};

/// The stage a request addresses: by model alias or stage name, else the
/// configured default stage.
pub fn resolve<'t>(
    topo: &'t Topology,
    model: Option<&str>,
) -> Result<(StageId, &'t Stage), Reject> {
    let idx = match model {
        Some(m) => topo
            .by_model
            .get(m)
            .or_else(|| topo.by_stage_name.get(m))
            .copied()
            .or(topo.default_stage)
            .ok_or_else(|| Reject::UnknownModel(m.to_string()))?,
        None => topo.default_stage.ok_or(Reject::NoModel)?,
    };
    Ok((idx, &topo.stages[idx]))
}

/// When the request's `model` is one of its stage's LoRA adapters, or its
/// stage's model is one a packed fleet loads on demand: marks the key with
/// what a replica must hold and moves its block hashes to that one's own
/// (an engine caches an adapter's apart from the base model's, and a packed
/// replica each model's apart). Call once, before deciding.
pub fn adapter(topo: &Topology, key: &mut RouteKey<'_>) {
    let Ok((_, stage)) = resolve(topo, key.model) else {
        return;
    };
    let adapter = key.model.and_then(|m| stage.adapters.id(m));
    if let Some(id) = adapter.or(stage.packed) {
        key.adapter = Some(id);
        for b in &mut key.blocks {
            *b = id.block(*b);
        }
    }
}
