//! The tenant's admission, once the decision has chosen a fleet: the
//! request's estimate (prompt + `max_tokens`, priced on that fleet) is
//! reserved against its tenant's limits, or the request is refused naming
//! the limit it would pass. Requests refused before this point (no model,
//! no ready replica) reserve nothing and are never charged.

use std::time::Duration;

use crate::config::{Condition, TenantLimits};
use crate::route::key::RouteKey;
use crate::route::{Decision, Reject};
use crate::state::figures::usd_per_mtok;
use crate::state::{Shared, Snapshot};
use crate::tenancy::charge::{AuditContext, Charge};
use crate::tenancy::clock::Clock;
use crate::tenancy::ledger::{Estimate, Limit, Refusal};
use crate::tenancy::price::Price;
use crate::topology::{Arm, Policy};

/// Longest model name kept for the audit record (the record cuts at 256).
const MAX_MODEL: usize = 256;

/// What the chosen fleet charges: the cost policy's figure, or before the
/// fleet's first figures (just started) its configured price.
pub fn price(snap: &Snapshot, d: &Decision) -> Price {
    price_of(snap, d.fleet)
}

fn price_of(snap: &Snapshot, fleet: crate::topology::FleetId) -> Price {
    let cost = snap.topo.fleets[fleet].cost.as_ref();
    let per_mtok = snap.fleets[fleet]
        .figures
        .usd_per_mtok
        .or_else(|| cost.and_then(|c| usd_per_mtok(c, 0.0, 0)));
    Price::per_million(per_mtok, cost.and_then(|c| c.cached_usd_per_million_tokens))
}

pub async fn admit(
    shared: &Shared,
    snap: &Snapshot,
    d: &Decision,
    key: &RouteKey<'_>,
) -> Result<Charge, Reject> {
    let price = price(snap, d);
    let prompt = u64::from(key.prompt_tokens);
    let max_tokens = u64::from(
        key.max_tokens
            .unwrap_or(snap.config.leases.default_max_tokens),
    );
    let est = Estimate {
        prompt_tokens: prompt,
        max_tokens,
        cost_usd: price.estimate(prompt, d.cached_tokens, max_tokens),
        // The decision's load lease ends it (see `state::lease`).
        ttl: None,
    };
    match shared.tenants.admit(&key.tenant, &est).await {
        Ok(reservation) => Ok(Charge {
            reservation,
            price,
            prompt_estimate: prompt,
            on_retry: d.upstream.map(|u| {
                let fleet = &snap.topo.fleets[u.fleet];
                (
                    fleet.replicas[u.replica].addr.as_str().into(),
                    price_of(snap, u.fleet),
                )
            }),
            audit: shared
                .tenants
                .auditing()
                .then(|| Box::new(context(snap, d, key))),
        }),
        Err(refusal) => Err(refused(shared, snap, d, key, &refusal)),
    }
}

fn refused(
    shared: &Shared,
    snap: &Snapshot,
    d: &Decision,
    key: &RouteKey<'_>,
    r: &Refusal,
) -> Reject {
    // The id the limits were counted under (`other` for untracked tenants).
    let tenant = shared.tenants.ledger().tenant(&key.tenant).id.to_string();
    Reject::TenantLimit {
        stage: snap.topo.stages[d.stage].name.clone(),
        limit: limit_text(snap.tenant(&tenant), r.limit),
        tenant,
        code: r.limit.as_str(),
        retry_after_s: retry_after_s(r.retry_after),
    }
}

/// Whole seconds, rounded up, at least 1 (`retry-after` is in seconds).
pub fn retry_after_s(d: Duration) -> u64 {
    let s = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    s.max(1)
}

/// The limit as a client reads it in the error message.
fn limit_text(l: &TenantLimits, limit: Limit) -> String {
    let n = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
    match limit {
        Limit::MaxRequestsInFlight => format!(
            "limit of {} requests in flight",
            n(l.max_requests_in_flight)
        ),
        Limit::MaxTokensInFlight => {
            format!("limit of {} tokens in flight", n(l.max_tokens_in_flight))
        }
        Limit::TokensPerMinute => {
            format!("limit of {} tokens per minute", n(l.tokens_per_minute))
        }
        Limit::Budget => match l.budget {
            Some(b) => format!("budget of {} USD per {}", b.usd, b.per.as_str()),
            None => "budget".to_string(),
        },
    }
}

/// The decision's side of the audit record.
pub fn context(snap: &Snapshot, d: &Decision, key: &RouteKey<'_>) -> AuditContext {
    let model = key.model.unwrap_or("");
    AuditContext {
        admitted_ms: Clock::real().now_ms(),
        request_id: key.request_id.into(),
        model: crate::state::decision_log::truncate_to(model, MAX_MODEL).into(),
        model_served: super::reply::served_model(&snap.topo, d)
            .filter(|&s| s != model)
            .map(Into::into),
        policy: snap.topo.stages[d.stage].routing.policy().name(),
        reason: reason(snap, d),
    }
}

/// Why this fleet, in one word of the policy's rule: `fill_order` (the
/// first fleet of a priority order), `spill` (a later one), `weighted_share`,
/// `fastest`, `cheapest`, or `ab_variant` (re-sampled by an A/B test); on a
/// fallback stage, `fallback_<condition>`.
/// Exploration is not told apart from the policy's own choice.
pub fn reason(snap: &Snapshot, d: &Decision) -> &'static str {
    if let Some(f) = d.fallback {
        return match f.reason {
            Condition::Saturated => "fallback_saturated",
            Condition::Unhealthy => "fallback_unhealthy",
            Condition::Context => "fallback_context",
            Condition::Upstream => "fallback_upstream",
        };
    }
    if d.arm == Arm::Variant {
        return "ab_variant";
    }
    match &snap.topo.stages[d.stage].policy {
        Policy::Priority { order } if order.first() == Some(&d.fleet) => "fill_order",
        Policy::Priority { .. } => "spill",
        Policy::Weighted { .. } => "weighted_share",
        Policy::Latency => "fastest",
        Policy::Cost => "cheapest",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_s(Duration::from_millis(10)), 1);
        assert_eq!(retry_after_s(Duration::ZERO), 1);
        assert_eq!(retry_after_s(Duration::from_secs(70)), 70);
        assert_eq!(retry_after_s(Duration::from_millis(70_001)), 71);
    }
}
