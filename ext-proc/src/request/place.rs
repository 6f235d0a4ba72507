//! A decision put into effect: decide, admit the tenant on the chosen
//! fleet, start the chosen replica's load accounting, and tell the writer
//! (prefix index, metrics, debug log).

use std::sync::Arc;

use super::audit::rejected;
use super::tenant;
use crate::route::key::RouteKey;
use crate::route::{Decision, Reject, decide};
use crate::state::{Decided, Event, Routed, Shared, Snapshot};
use crate::tenancy::charge::Charge;
use crate::topology::load::RequestGuard;

pub struct Placed {
    pub snapshot: Arc<Snapshot>,
    pub decision: Decision,
    /// fleetroute's id of this decision: the observer claims the load by it,
    /// and the debug log records it. Only fleetroute writes it.
    pub nonce: u64,
    /// The request's share of the replica's load, until released.
    pub guard: RequestGuard,
    /// The tenant's reservation, to ride with the load's lease.
    pub charge: Charge,
    /// The adapter registration or model load to wait for first.
    pub load: Option<Box<crate::state::registrations::Pending>>,
}

impl Placed {
    /// The decision's ids, to keep under its nonce with its load.
    pub fn decided(&self) -> Decided {
        Decided {
            generation: self.snapshot.topo.generation,
            stage: self.decision.stage,
            fleet: self.decision.fleet,
            replica: *self.decision.replicas.head(),
            // Its first token measures what the replica holds and loads
            // (adapters, or a packed replica's models), not its health.
            adapter: self.decision.adapter.is_some(),
        }
    }
}

/// Decides, admits the tenant and starts the load, with no class admission
/// in between (the stream puts `admission` between [`decide_on`] and
/// [`admit_and_commit`]). Waits only when the tenant's shared allowance must
/// be refilled from Redis (one round trip, bounded by
/// `tenants_redis.timeout_ms`).
pub async fn place(shared: &Shared, key: RouteKey<'_>, rng: u64) -> Result<Placed, Reject> {
    let (snapshot, decision) = decide_on(shared, &key, rng)?;
    admit_and_commit(shared, snapshot, decision, key).await
}

/// The decision alone, on the current snapshot: nothing is reserved or
/// counted yet, so class admission may still hold or refuse it. A rejection
/// is counted and audited here.
pub fn decide_on(
    shared: &Shared,
    key: &RouteKey<'_>,
    rng: u64,
) -> Result<(Arc<Snapshot>, Decision), Reject> {
    let snapshot = shared.snapshot_full();
    match decide(&snapshot, key, rng) {
        Ok(d) => Ok((snapshot, d)),
        Err(reject) => {
            rejected(shared, &snapshot, None, key, &reject);
            Err(reject)
        }
    }
}

/// Puts a decision class admission let through into effect: the tenant's
/// estimate is reserved on the chosen fleet (a 429 naming the limit when it
/// would pass one), then the replica's load is counted from now and the
/// writer learns of it.
pub async fn admit_and_commit(
    shared: &Shared,
    snapshot: Arc<Snapshot>,
    decision: Decision,
    key: RouteKey<'_>,
) -> Result<Placed, Reject> {
    let charge = match tenant::admit(shared, &snapshot, &decision, &key).await {
        Ok(c) => c,
        Err(reject) => {
            rejected(shared, &snapshot, Some(&decision), &key, &reject);
            return Err(reject);
        }
    };
    let topo = &snapshot.topo;
    let replica = &topo.fleets[decision.fleet].replicas[*decision.replicas.head()];
    let guard = replica.load.start(decision.uncached_tokens);
    // Before it is marked held: a request decided from now on finds the
    // load in flight and waits for it.
    let load = decision.adapter.and_then(|(id, load)| {
        let at = (decision.stage, decision.fleet, *decision.replicas.head());
        shared
            .registrations
            .needed(topo, at, id, load == 0.0)
            .map(Box::new)
    });
    // Now, not in the writer: the next request for this adapter, however
    // soon, sees it here and does not load it on a second replica.
    if let (Some((id, _)), Some(hold)) = (decision.adapter, &topo.fleets[decision.fleet].hold) {
        replica.load.adapters.used(&[id], hold.kept);
        replica.load.adapters.sent(id);
    }
    let nonce = crate::clock::random_u64();
    shared.emit(Event::Routed(Box::new(Routed {
        generation: topo.generation,
        decision_id: nonce,
        request_id: key.request_id.to_string(),
        stage: decision.stage,
        fleet: decision.fleet,
        replica: *decision.replicas.head(),
        key_source: key.key_source,
        arm: decision.arm,
        pick: decision.pick,
        shadow: decision.shadow,
        prompt_tokens: u64::from(key.prompt_tokens),
        blocks: key.blocks,
        block_tokens: key.block_tokens,
        predicted_cached_tokens: decision.cached_tokens,
        adapter: decision.adapter,
        fallback: decision.fallback,
    })));
    Ok(Placed {
        snapshot,
        decision,
        nonce,
        guard,
        charge,
        load,
    })
}
