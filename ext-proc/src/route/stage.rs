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

/// When the request's `model` is one of its stage's LoRA adapters: marks
/// the key with it and moves its block hashes to the adapter's own (an
/// engine caches them apart from the base model's). Call once, before
/// deciding.
pub fn adapter(topo: &Topology, key: &mut RouteKey<'_>) {
    let Some(model) = key.model else { return };
    let Some(&stage) = topo.by_model.get(model) else {
        return;
    };
    if let Some(id) = topo.stages[stage].adapters.id(model) {
        key.adapter = Some(id);
        for b in &mut key.blocks {
            *b = id.block(*b);
        }
    }
}
