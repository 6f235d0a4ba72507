//! What a refused request leaves behind: the writer's count of the
//! rejection and, with an audit log, its record (like every answer).

use super::tenant;
use crate::route::key::RouteKey;
use crate::route::{Decision, Reject};
use crate::state::{Event, Shared, Snapshot};
use crate::tenancy::audit::AuditRecord;
use crate::tenancy::clock::{self, Clock};

/// A rejection: counted by the writer, and audited.
pub(super) fn rejected(
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
                tenant::reason(snap, d).to_string(),
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
