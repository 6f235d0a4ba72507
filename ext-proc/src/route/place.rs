//! A decision put into effect: decide, admit the tenant on the chosen
//! fleet, start the chosen replica's load accounting, and tell the writer
//! (prefix index, metrics, debug log). The ext_proc stream and the trace
//! replay both route through here.

use std::sync::Arc;

use super::key::RouteKey;
use super::{Decision, Reject, admit, decide};
use crate::state::{Decided, Event, Routed, Shared, Snapshot};
use crate::tenancy::audit::AuditRecord;
use crate::tenancy::charge::Charge;
use crate::tenancy::clock::{self, Clock};
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
    let charge = match admit::admit(shared, &snapshot, &decision, &key).await {
        Ok(c) => c,
        Err(reject) => {
            rejected(shared, &snapshot, Some(&decision), &key, &reject);
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
        pick: decision.pick,
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
        charge,
    })
}

fn rejected(
    shared: &Shared,
    snap: &Snapshot,
    d: Option<&Decision>,
    key: &RouteKey<'_>,
    reject: &Reject,
) {
    shared.emit(Event::Rejected {
        stage: reject.stage().unwrap_or_default().to_string(),
        reason: reject.code(),
    });
    refused(shared, snap, d, key, reject);
}

/// The audit record of a request class admission refused (`overloaded`,
/// with its rule as the reason): like any refusal, before a fleet took it.
pub fn audit_overloaded(shared: &Shared, key: &RouteKey<'_>, stage: &str, rule: &str) {
    if !shared.tenants.auditing() {
        return;
    }
    shared.tenants.audit(AuditRecord {
        time: clock::rfc3339_ms(Clock::real().now_ms()),
        request_id: key.request_id.to_string(),
        tenant: shared.tenants.ledger().tenant(&key.tenant).id.to_string(),
        model_requested: key.model.unwrap_or("").to_string(),
        stage: stage.to_string(),
        reason: rule.to_string(),
        admission: "overloaded".to_string(),
        status: 429,
        ..Default::default()
    });
}

/// The audit record of a request fleetroute answered itself.
fn refused(
    shared: &Shared,
    snap: &Snapshot,
    d: Option<&Decision>,
    key: &RouteKey<'_>,
    reject: &Reject,
) {
    if !shared.tenants.auditing() {
        return;
    }
    let topo = &snap.topo;
    let tenant = shared.tenants.ledger().tenant(&key.tenant).id.to_string();
    let (admission, fleet, replica, policy, reason) = match d {
        // Past the decision: the tenant's limit refused it.
        Some(d) => {
            let f = &topo.fleets[d.fleet];
            (
                reject.code().to_string(),
                f.name.clone(),
                f.replicas[*d.replicas.head()].addr.clone(),
                topo.stages[d.stage].routing.policy().name().to_string(),
                admit::reason(snap, d).to_string(),
            )
        }
        None => (
            "not_routed".to_string(),
            String::new(),
            String::new(),
            String::new(),
            reject.code().to_string(),
        ),
    };
    shared.tenants.audit(AuditRecord {
        time: clock::rfc3339_ms(Clock::real().now_ms()),
        request_id: key.request_id.to_string(),
        tenant,
        model_requested: key.model.unwrap_or("").to_string(),
        model_served: String::new(),
        stage: reject.stage().unwrap_or("").to_string(),
        fleet,
        replica,
        policy,
        reason,
        admission,
        status: reject.status(),
        ..Default::default()
    });
}
