//! Model name → stage.

use super::Reject;
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
