//! Per-tenant metric series, brought up to date when `/metrics` is read.
//!
//! Cardinality is bounded: the `tenants.metrics.top` tenants by tokens
//! charged and the `pinned` ones get their own series; every other tenant's
//! increments go to `tenant="other"`. The ledger's counters are cumulative;
//! each export adds what grew since the last one to the series the tenant
//! has now, so every series only grows, and a tenant that leaves the top
//! set has its series removed (its later growth counts as `other`).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

use crate::state::Shared;

use crate::metrics::{Audit, Metrics, Results, SharedCounters, TenantLabel, TenantRefusal, Values};
use crate::tenancy::ledger::{Limit, OTHER, TenantState};

/// What was exported last, per tenant and for the process-wide counters.
#[derive(Debug, Default)]
pub struct TenantSeries {
    last: HashMap<Arc<str>, Last>,
    shown: HashSet<Arc<str>>,
    process: HashMap<&'static str, u64>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Last {
    requests: u64,
    tokens: u64,
    micro_usd: u64,
    refused: [u64; 4],
}

fn label(tenant: &str) -> TenantLabel {
    TenantLabel {
        tenant: tenant.to_string(),
    }
}

/// Adds what `now` grew beyond `*last` (a counter that went down, a late
/// correction, adds nothing until it passes its old value).
fn grow(last: &mut u64, now: u64) -> u64 {
    let d = now.saturating_sub(*last);
    *last = (*last).max(now);
    d
}

/// Brings the per-tenant series up to date (`series`: what was exported
/// last; the `/metrics` handler's own, under a mutex only it takes).
pub fn export(shared: &Shared, series: &Mutex<TenantSeries>) {
    let mut series = series.lock().unwrap_or_else(|e| e.into_inner());
    let ledger = shared.tenants.ledger();
    let m = &shared.metrics;
    let cfg = ledger.config();
    let mut all = ledger.tenants();
    m.tenants.tracked.set(all.len() as i64);

    // The shown set: pinned, then the top by tokens charged.
    let mut shown: HashSet<Arc<str>> = HashSet::new();
    let top = cfg.metrics.top.min(all.len());
    if top > 0 {
        let key = |t: &Arc<TenantState>| std::cmp::Reverse(t.charged_tokens.load(Relaxed));
        all.select_nth_unstable_by_key(top - 1, key);
        shown.extend(all[..top].iter().map(|t| t.id.clone()));
    }
    for p in &cfg.metrics.pinned {
        if let Some(t) = ledger.find(p) {
            shown.insert(t.id.clone());
        }
    }
    for gone in series.shown.difference(&shown) {
        remove(m, gone);
    }

    let mut other_in_flight = 0;
    for t in all.iter().chain(std::iter::once(&ledger.other())) {
        let own = shown.contains(&t.id);
        let name = if own { &*t.id } else { OTHER };
        let last = series.last.entry(t.id.clone()).or_default();
        let l = label(name);
        m.tenants
            .requests
            .get_or_create(&l)
            .inc_by(grow(&mut last.requests, t.admitted.load(Relaxed)));
        m.tenants
            .tokens
            .get_or_create(&l)
            .inc_by(grow(&mut last.tokens, t.charged_tokens.load(Relaxed)));
        let micro = grow(&mut last.micro_usd, t.charged_micro_usd.load(Relaxed));
        m.tenants.spend.get_or_create(&l).inc_by(micro as f64 / 1e6);
        for (i, limit) in Limit::ALL.iter().enumerate() {
            let n = grow(&mut last.refused[i], t.refused(*limit));
            m.tenants
                .refused
                .get_or_create(&TenantRefusal {
                    tenant: name.to_string(),
                    limit: limit.as_str(),
                })
                .inc_by(n);
        }
        let in_flight = t.requests.load(Relaxed) as i64;
        if own {
            m.tenants.in_flight.get_or_create(&l).set(in_flight);
        } else {
            other_in_flight += in_flight;
        }
    }
    m.tenants
        .in_flight
        .get_or_create(&label(OTHER))
        .set(other_in_flight);
    series.shown = shown;

    if let Some(r) = shared.tenants.redis() {
        for (name, v) in [
            (SharedCounters::Refills, &r.refills),
            (SharedCounters::Errors, &r.redis_errors),
            (SharedCounters::FallbackDecisions, &r.fallback_decisions),
            (SharedCounters::CaughtUpTokens, &r.caught_up_tokens),
            (SharedCounters::RestoredTokens, &r.restored_tokens),
        ] {
            process(
                &mut series.process,
                &m.tenants.shared,
                name,
                v.load(Relaxed),
            );
        }
    }
    if let Some(a) = shared.tenants.audit_log() {
        let c = a.counters();
        for (name, v) in [
            (Audit::Written, &c.written),
            (Audit::DroppedFull, &c.dropped_full),
            (Audit::DroppedWrite, &c.dropped_write),
        ] {
            process(&mut series.process, &m.tenants.audit, name, v.load(Relaxed));
        }
    }
}

/// A process-wide counter mirrored into `family{result}`.
fn process<E: Values>(
    last: &mut HashMap<&'static str, u64>,
    family: &Results<E>,
    result: E,
    now: u64,
) {
    family.add(result, grow(last.entry(result.as_str()).or_default(), now));
}

fn remove(m: &Metrics, tenant: &str) {
    let l = label(tenant);
    m.tenants.requests.remove(&l);
    m.tenants.tokens.remove(&l);
    m.tenants.spend.remove(&l);
    m.tenants.in_flight.remove(&l);
    for limit in Limit::ALL {
        m.tenants.refused.remove(&TenantRefusal {
            tenant: tenant.to_string(),
            limit: limit.as_str(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RouterConfig;
    use crate::state::Writer;
    use crate::tenancy::ledger::{Estimate, Usage};

    fn charge(shared: &Shared, tenant: &str, tokens: u64) {
        let est = Estimate {
            prompt_tokens: tokens,
            max_tokens: 0,
            cost_usd: 0.0,
            ttl: None,
        };
        let r = shared.tenants.ledger().admit(tenant, &est).unwrap();
        r.commit(
            Usage {
                prompt: tokens,
                cached: 0,
                completion: 0,
            },
            tokens as f64 * 1e-6,
        );
    }

    /// `metric`'s series as (tenant, value), sorted by tenant.
    fn series(text: &str, metric: &str) -> Vec<(String, f64)> {
        let mut out: Vec<(String, f64)> = text
            .lines()
            .filter(|l| l.starts_with(&format!("{metric}{{")))
            .map(|l| {
                let tenant = l
                    .split("tenant=\"")
                    .nth(1)
                    .unwrap()
                    .split('"')
                    .next()
                    .unwrap();
                let v = l.rsplit(' ').next().unwrap().parse().unwrap();
                (tenant.to_string(), v)
            })
            .collect();
        out.sort_by(|x, y| x.0.cmp(&y.0));
        out
    }

    fn owned(pairs: &[(&str, f64)]) -> Vec<(String, f64)> {
        pairs.iter().map(|&(t, v)| (t.to_string(), v)).collect()
    }

    #[test]
    fn the_top_tenants_and_pinned_ones_get_series_the_rest_is_other() {
        let cfg = RouterConfig::parse_valid(
            "fleets: [{ name: f, region: r, endpoints: [\"10.0.0.1:1\"] }]\n\
             stages: [{ name: s, fleets: [f] }]\n\
             tenants: { metrics: { top: 2, pinned: [small] } }\n",
        )
        .unwrap();
        let (shared, _w) = Writer::new(&cfg);
        let last = Mutex::default();
        for (t, n) in [("a", 500), ("b", 400), ("c", 300), ("d", 200), ("small", 1)] {
            charge(&shared, t, n);
        }
        export(&shared, &last);
        let text = shared.metrics.render();
        assert_eq!(
            series(&text, "fleetroute_tenant_tokens_total"),
            owned(&[("a", 500.0), ("b", 400.0), ("other", 500.0), ("small", 1.0)])
        );
        // d grows past a and b: it takes a series, b's goes (its growth
        // from now is other's); every series only grows.
        charge(&shared, "d", 1000);
        charge(&shared, "b", 10);
        export(&shared, &last);
        let text = shared.metrics.render();
        assert_eq!(
            series(&text, "fleetroute_tenant_tokens_total"),
            owned(&[
                ("a", 500.0),
                ("d", 1000.0),
                ("other", 510.0),
                ("small", 1.0)
            ])
        );
        assert_eq!(
            series(&text, "fleetroute_tenant_requests_total").len(),
            4,
            "top 2 + pinned + other"
        );
    }
}
