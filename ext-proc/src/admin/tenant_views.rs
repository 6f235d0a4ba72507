//! The API's views of the tenant accountant: limits in effect and what each
//! tenant used on this instance. Reads never start tracking a tenant.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;

use super::api::{TenantUsage, TenantView, TenantsView};
use crate::config::BudgetPeriod;
use crate::state::Shared;
use crate::tenancy::ledger::{Limit, OTHER, TenantState};

fn usd(micro: u64) -> f64 {
    micro as f64 / 1e6
}

fn view(shared: &Shared, t: &TenantState) -> TenantView {
    let ledger = shared.tenants.ledger();
    let clock = ledger.clock();
    let limits = (**t.limits()).clone();
    let reserved = t.reserved_micro_usd.load(Relaxed);
    let budget_left_usd = limits.budget.map(|b| {
        let spent = t.spent_micro_usd(clock, b.per) + reserved;
        (b.usd - usd(spent)).max(0.0)
    });
    let usage = TenantUsage {
        requests_in_flight: t.requests.load(Relaxed),
        tokens_in_flight: t.tokens.load(Relaxed),
        tokens_last_minute: t.minute_used(clock.now_ms()),
        spent_usd_today: usd(t.spent_micro_usd(clock, BudgetPeriod::Day)),
        spent_usd_this_month: usd(t.spent_micro_usd(clock, BudgetPeriod::Month)),
        reserved_usd: usd(reserved),
        budget_left_usd,
        admitted: t.admitted.load(Relaxed),
        committed: t.committed.load(Relaxed),
        expired: t.expired.load(Relaxed),
        dropped: t.dropped.load(Relaxed),
        late_commits: t.late_commits.load(Relaxed),
        tokens_charged: t.charged_tokens.load(Relaxed),
        usd_charged: usd(t.charged_micro_usd.load(Relaxed)),
        refused: Limit::ALL
            .iter()
            .map(|&l| (l.as_str().to_string(), t.refused(l)))
            .collect::<BTreeMap<_, _>>(),
    };
    TenantView {
        name: t.id.to_string(),
        named: shared.snapshot().config.tenants.named.contains_key(&*t.id),
        tracked: &*t.id != OTHER,
        limits,
        usage,
    }
}

/// One tenant by id (`other` for the untracked ones' shared counters).
pub fn tenant(shared: &Shared, name: &str) -> Option<TenantView> {
    let t = shared.tenants.ledger().find(name)?;
    Some(view(shared, &t))
}

/// The `limit` tenants with the most tokens charged, then by name.
pub fn tenants(shared: &Shared, limit: usize) -> TenantsView {
    let ledger = shared.tenants.ledger();
    let mut all = ledger.tenants();
    let tracked = all.len();
    let key = |t: &TenantState| std::cmp::Reverse(t.charged_tokens.load(Relaxed));
    all.sort_by(|a, b| key(a).cmp(&key(b)).then_with(|| a.id.cmp(&b.id)));
    all.truncate(limit);
    let mut tenants: Vec<TenantView> = all.iter().map(|t| view(shared, t)).collect();
    let other = ledger.other();
    // The untracked tenants' shared counters, once they have any.
    if other.admitted.load(Relaxed) > 0 || Limit::ALL.iter().any(|&l| other.refused(l) > 0) {
        tenants.push(view(shared, &other));
    }
    TenantsView { tracked, tenants }
}
