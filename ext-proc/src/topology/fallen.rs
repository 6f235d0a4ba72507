//! A decision made on a stage's fallback, as the decision, its record and
//! the client's header name it.

use super::{StageId, Topology};
use crate::config::Condition;

/// The stage the client named, and why it did not serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fallen {
    pub from: StageId,
    pub reason: Condition,
}

impl Fallen {
    /// `x-fleetroute-fallback`'s value: the stage that served and why.
    pub fn header(&self, topo: &Topology, to: StageId) -> String {
        format!("{}; reason={}", topo.stages[to].name, self.reason.as_str())
    }
}
