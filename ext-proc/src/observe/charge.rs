//! The tenant's charge for a finished request, from its access log entry:
//! the engine's usage when it reported one, else what the filter saw stream
//! past; then its audit record. Runs on the access log's stream, never on
//! the request path.

use envoy_types::pb::envoy::data::accesslog::v3::{HttpAccessLogEntry, ResponseFlags};
use fleetroute_filter::contract::{self, UsageTag};

use super::Observation;
use crate::state::Shared;
use crate::tenancy::audit::AuditRecord;
use crate::tenancy::charge::{Charge, Outcome};
use crate::tenancy::clock::{Clock, rfc3339_ms};
use crate::tenancy::ledger::Usage;

/// What the entry says about charging.
pub fn outcome(entry: &HttpAccessLogEntry, obs: &Observation, tag: Option<&UsageTag>) -> Outcome {
    let common = entry.common_properties.as_ref();
    let never_connected = common
        .and_then(|c| c.response_flags.as_ref())
        .is_some_and(no_upstream);
    let reached = common.is_some_and(|c| c.upstream_remote_address.is_some()) && !never_connected;
    Outcome {
        usage: obs.usage.map(|u| Usage {
            prompt: u.prompt_tokens,
            cached: u.cached_tokens().unwrap_or(0),
            completion: u.completion_tokens,
        }),
        streamed: tag.map_or(0, |t| t.streamed),
        reached_replica: reached,
    }
}

/// Envoy never got the request to a replica: it cost no engine anything.
fn no_upstream(f: &ResponseFlags) -> bool {
    f.upstream_connection_failure
        || f.no_healthy_upstream
        || f.no_route_found
        || f.upstream_overflow
        || f.no_cluster_found
        || f.overload_manager
}

/// Commits `charge` with what the request used and writes its audit record.
pub fn settle(shared: &Shared, entry: &HttpAccessLogEntry, obs: &Observation, mut charge: Charge) {
    let tag = usage_tag(entry);
    let o = outcome(entry, obs, tag.as_ref());
    // Envoy retried it on the `upstream` fallback: that fleet's price.
    let mut audit = charge.audit.take();
    if let Some((addr, price)) = charge.on_retry.take()
        && obs.served_by.as_deref() == Some(&*addr)
    {
        charge.price = price;
        if let Some(a) = audit.as_mut() {
            a.reason = "fallback_upstream";
        }
    }
    let tenant = audit
        .as_ref()
        .map(|_| charge.reservation.tenant().to_string());
    let (usage, cost) = charge.commit(&o);
    let (Some(ctx), Some(tenant)) = (audit, tenant) else {
        return;
    };
    let ms = |d: std::time::Duration| d.as_millis() as u64;
    shared.tenants.audit(AuditRecord {
        time: rfc3339_ms(if ctx.admitted_ms > 0 {
            ctx.admitted_ms
        } else {
            Clock::real().now_ms()
        }),
        request_id: ctx.request_id.into(),
        tenant,
        model_requested: ctx.model.to_string(),
        model_served: ctx.model_served.unwrap_or(ctx.model).into(),
        stage: obs.stage.clone(),
        fleet: obs.fleet.clone(),
        replica: obs.served_by.clone().unwrap_or_else(|| obs.replica.clone()),
        policy: ctx.policy.into(),
        reason: ctx.reason.into(),
        admission: "admitted".into(),
        status: obs.status.unwrap_or(0),
        prompt_tokens: usage.prompt,
        cached_tokens: usage.cached,
        completion_tokens: usage.completion,
        cost_usd: cost,
        ttft_ms: obs.time_to_first_byte.map(ms),
        duration_ms: ms(obs.total),
    });
}

fn usage_tag(entry: &HttpAccessLogEntry) -> Option<UsageTag> {
    entry
        .common_properties
        .as_ref()?
        .filter_state_objects
        .get(contract::USAGE_FILTER_STATE)
        .and_then(super::entry::usage_tag)
}
