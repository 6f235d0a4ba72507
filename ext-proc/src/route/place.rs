//! A decision put into effect: decide, start the chosen replica's load
//! accounting, and tell the writer (prefix index, metrics, debug log). The
//! ext_proc stream and the trace replay both route through here.

use std::sync::Arc;

use super::key::RouteKey;
use super::{Decision, Reject, decide};
use crate::state::{Decided, Event, Routed, Shared, Snapshot};
use crate::topology::load::RequestGuard;

pub struct Placed {
    pub snapshot: Arc<Snapshot>,
    pub decision: Decision,
    /// fleetroute's id of this decision: the observer claims the load by it,
    /// and the debug log records it. Only fleetroute writes it.
    pub nonce: u64,
    /// The request's share of the replica's load, until released.
    pub guard: RequestGuard,
}

impl Placed {
    /// The decision's ids, to keep under its nonce with its load.
    pub fn decided(&self) -> Decided {
        Decided {
            generation: self.snapshot.topo.generation,
            stage: self.decision.stage,
            fleet: self.decision.fleet,
            replica: *self.decision.replicas.head(),
        }
    }
}

pub fn place(shared: &Shared, key: RouteKey<'_>, rng: u64) -> Result<Placed, Reject> {
    let snapshot = shared.snapshot_full();
    let decision = match decide(&snapshot, &key, rng) {
        Ok(d) => d,
        Err(reject) => {
            shared.emit(Event::Rejected {
                stage: reject.stage().unwrap_or_default().to_string(),
                reason: reject.code(),
            });
            return Err(reject);
        }
    };
    let topo = &snapshot.topo;
    let replica = &topo.fleets[decision.fleet].replicas[*decision.replicas.head()];
    let guard = replica.load.start(decision.uncached_tokens);
    let nonce = fastrand::u64(..);
    shared.emit(Event::Routed(Box::new(Routed {
        generation: topo.generation,
        decision_id: nonce,
        request_id: key.request_id.to_string(),
        stage: decision.stage,
        fleet: decision.fleet,
        replica: *decision.replicas.head(),
        key_source: key.key_source.map_or("none", |s| s.as_str()),
        arm: decision.arm.as_str(),
        shadow: decision.shadow,
        prompt_tokens: u64::from(key.prompt_tokens),
        blocks: key.blocks,
        block_tokens: key.block_tokens,
        predicted_cached_tokens: decision.cached_tokens,
    })));
    Ok(Placed {
        snapshot,
        decision,
        nonce,
        guard,
    })
}
