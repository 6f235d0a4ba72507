//! `tenants:`, `tenants_redis:` and `audit:`: limits in range, tenant ids
//! that the filter can write, a Redis URL the client can open.

use super::Errors;
use crate::config::{
    AuditConfig, MAX_LIMIT, MAX_NAMED, MAX_TENANT_ID_LEN, OTHER_TENANT, TenantLimits,
    TenantsConfig, TenantsRedisConfig,
};

/// Most tenants with their own metric series (`top` plus `pinned`).
const MAX_SERIES: usize = 1000;

pub(super) fn tenants(t: &TenantsConfig, e: &mut Errors) {
    limits(&t.default, "tenants.default", e);
    e.ensure(
        t.named.len() <= MAX_NAMED,
        "tenants.named",
        format!("{} entries, at most {MAX_NAMED}", t.named.len()),
    );
    for (id, l) in &t.named {
        let path = format!("tenants.named.{id}");
        if let Err(why) = tenant_id(id) {
            e.push(&path, why);
        }
        limits(l, &path, e);
    }
    let m = &t.metrics;
    e.ensure(
        m.top + m.pinned.len() <= MAX_SERIES,
        "tenants.metrics",
        format!(
            "top ({}) plus pinned ({}) is more than {MAX_SERIES} series",
            m.top,
            m.pinned.len()
        ),
    );
    for (i, id) in m.pinned.iter().enumerate() {
        if let Err(why) = tenant_id(id) {
            e.push(format!("tenants.metrics.pinned[{i}]"), why);
        }
    }
}

/// What a tenant id may be: what the filter writes (a header value of
/// printable ASCII, or a hash), never the reserved `other`.
pub(super) fn tenant_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > MAX_TENANT_ID_LEN {
        Err(format!("tenant id must be 1 to {MAX_TENANT_ID_LEN} bytes"))
    } else if !id.bytes().all(|b| b.is_ascii_graphic()) {
        Err("tenant id must be printable ASCII without spaces".into())
    } else if id == OTHER_TENANT {
        Err(format!("`{id}` is reserved for untracked tenants"))
    } else {
        Ok(())
    }
}

fn limits(l: &TenantLimits, path: &str, e: &mut Errors) {
    for (name, v) in [
        ("max_requests_in_flight", l.max_requests_in_flight),
        ("max_tokens_in_flight", l.max_tokens_in_flight),
        ("tokens_per_minute", l.tokens_per_minute),
    ] {
        match v {
            Some(0) => e.push(
                format!("{path}.{name}"),
                "must be at least 1 (leave it out for unlimited)",
            ),
            Some(v) if v > MAX_LIMIT => e.push(
                format!("{path}.{name}"),
                format!("{v} is above {MAX_LIMIT}"),
            ),
            _ => {}
        }
    }
    if let Some(b) = &l.budget {
        e.ensure(
            b.usd.is_finite() && b.usd >= 0.0 && b.usd * 1e6 < MAX_LIMIT as f64,
            format!("{path}.budget.usd"),
            format!(
                "must be a finite number from 0 to {}",
                MAX_LIMIT / 1_000_000
            ),
        );
    }
}

pub(super) fn redis(r: &TenantsRedisConfig, e: &mut Errors) {
    e.at_least("tenants_redis.instances", r.instances, 1);
    e.share("tenants_redis.slice_fraction", r.slice_fraction);
    e.in_range("tenants_redis.timeout_ms", r.timeout_ms, 1..=10_000);
    e.ensure(
        !r.prefix.is_empty() && r.prefix.len() <= 64 && !r.prefix.contains(char::is_whitespace),
        "tenants_redis.prefix",
        "must be 1 to 64 characters without spaces",
    );
    if let Err(err) = redis::Client::open(r.url.as_str()) {
        e.push("tenants_redis.url", err.to_string());
    }
}

pub(super) fn audit(a: &AuditConfig, e: &mut Errors) {
    e.at_least("audit.max_bytes", a.max_bytes, 4096);
    e.in_range("audit.max_files", a.max_files, 1..=100);
    e.in_range("audit.buffer", a.buffer, 1..=1 << 20);
    if let Some(p) = &a.path {
        e.ensure(
            !p.as_os_str().is_empty(),
            "audit.path",
            "must not be empty (leave it out for no file)",
        );
    }
}
