//! Checks that need the whole file: names resolve, residency holds, numbers
//! make sense. One function per section, each error with its field path;
//! every error is collected rather than stopping at the first.

mod admission;
mod envoy;
mod fleet;
#[cfg(test)]
mod per_fleet_tests;
mod source;
mod stage;
mod tenants;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt::Display;
use std::ops::RangeInclusive;

use super::{
    AuditConfig, ConfigError, EngineMetricsConfig, HealthCheckConfig, LeaseConfig, PeersConfig,
    RouterConfig, TenantsConfig, TenantsRedisConfig,
};

/// Replicas per fleet; the prefix index keeps one bit per replica.
pub const MAX_REPLICAS_PER_FLEET: usize = crate::state::prefix_index::Matches::SLOTS;
/// Longest window or ejection a config may ask for.
const MAX_SECONDS: u64 = 86_400;

/// Every error of the file, found so far.
struct Errors(Vec<ConfigError>);

impl Errors {
    fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(ConfigError {
            path: path.into(),
            message: message.into(),
        });
    }

    /// `message` at `path` unless `ok`.
    fn ensure(&mut self, ok: bool, path: impl Into<String>, message: impl Into<String>) {
        if !ok {
            self.push(path, message);
        }
    }

    fn at_least<T: PartialOrd + Display>(&mut self, path: impl Into<String>, v: T, lo: T) {
        self.ensure(v >= lo, path, format!("must be at least {lo}"));
    }

    /// `lo..=hi`; NaN is never in range.
    fn in_range<T: PartialOrd + Display>(
        &mut self,
        path: impl Into<String>,
        v: T,
        range: RangeInclusive<T>,
    ) {
        let msg = format!("{v} must be between {} and {}", range.start(), range.end());
        self.ensure(range.contains(&v), path, msg);
    }

    /// A finite number >= 0 (costs, weights, token counts).
    fn non_negative(&mut self, path: impl Into<String>, v: f64) {
        self.ensure(
            v.is_finite() && v >= 0.0,
            path,
            "must be a finite number >= 0",
        );
    }

    /// A finite number > 0 (rates, targets).
    fn positive(&mut self, path: impl Into<String>, v: f64) {
        self.ensure(v.is_finite() && v > 0.0, path, "must be a positive number");
    }

    /// A share in (0, 1].
    fn share(&mut self, path: impl Into<String>, v: f64) {
        self.ensure(
            v > 0.0 && v <= 1.0,
            path,
            "must be more than 0 and at most 1",
        );
    }

    fn url_path(&mut self, path: impl Into<String>, v: &str) {
        self.ensure(
            v.starts_with('/'),
            path,
            format!("'{v}' must start with '/'"),
        );
    }

    fn at_most_a_day(&mut self, path: impl Into<String>, seconds: u64) {
        self.ensure(
            seconds <= MAX_SECONDS,
            path,
            format!("{seconds} is more than a day ({MAX_SECONDS})"),
        );
    }

    /// Fleet and region names are Envoy cluster names and travel in headers;
    /// stage names may also hold '/', e.g. `ds-flash/prod-us`.
    fn name(&mut self, path: impl Into<String>, s: &str, extra: &[u8]) {
        let ok = !s.is_empty()
            && s.len() <= 128
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b) || extra.contains(&b));
        let set = String::from_utf8_lossy(extra);
        self.ensure(
            ok,
            path,
            format!("'{s}' must be 1-128 of [A-Za-z0-9._{set}-]"),
        );
    }
}

/// Every error of the config; empty when it is valid.
pub(super) fn errors(cfg: &RouterConfig) -> Vec<ConfigError> {
    let mut e = Errors(Vec::new());
    health_check(&cfg.health_check, &mut e);
    engine_metrics(&cfg.engine_metrics, &mut e);
    leases(&cfg.leases, &mut e);
    peers(&cfg.peers, &mut e);
    e.ensure(
        cfg.membership.removal_grace_ms <= MAX_SECONDS * 1000,
        "membership.removal_grace_ms",
        format!("must be at most {} (a day)", MAX_SECONDS * 1000),
    );
    // Fleet name -> region, for the stages.
    let mut regions: HashMap<&str, &str> = HashMap::new();
    for (i, f) in cfg.fleets.iter().enumerate() {
        let p = format!("fleets[{i}]");
        if regions.insert(&f.name, &f.region).is_some() {
            e.push(format!("{p}.name"), format!("duplicate fleet '{}'", f.name));
        }
        fleet::fleet(f, &p, &mut e);
    }
    stage::stages(cfg, &regions, &mut e);
    envoy::envoy(&cfg.envoy, &mut e);
    tenants::tenants(&cfg.tenants, &mut e);
    if let Some(r) = &cfg.tenants_redis {
        tenants::redis(r, &mut e);
    }
    tenants::audit(&cfg.audit, &mut e);
    admission::admission(&cfg.admission, &mut e);
    e.0
}

/// The `tenants:` section's errors on their own (the section's checks are
/// also usable without a whole router config).
pub(super) fn tenants_errors(t: &TenantsConfig) -> Vec<ConfigError> {
    let mut e = Errors(Vec::new());
    tenants::tenants(t, &mut e);
    e.0
}

pub(super) fn redis_errors(r: &TenantsRedisConfig) -> Vec<ConfigError> {
    let mut e = Errors(Vec::new());
    tenants::redis(r, &mut e);
    e.0
}

pub(super) fn audit_errors(a: &AuditConfig) -> Vec<ConfigError> {
    let mut e = Errors(Vec::new());
    tenants::audit(a, &mut e);
    e.0
}

/// Whether `id` is a tenant id a named entry or the admin API may use.
pub fn check_tenant_id(id: &str) -> Result<(), String> {
    tenants::tenant_id(id)
}

/// A client header the config names for ext-proc to read: a lowercase name,
/// never an internal one (the filter strips those before ext-proc sees them).
pub fn client_header_name(h: &str) -> Result<(), String> {
    let lowercase = !h.is_empty()
        && h.len() <= 64
        && h.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if !lowercase {
        Err(format!(
            "'{h}' must be a lowercase HTTP header name of 1-64 bytes"
        ))
    } else if fleetroute_filter::http::is_reserved_header(h) {
        Err(format!(
            "'{h}' is reserved (the filter strips internal headers before ext-proc sees them)"
        ))
    } else {
        Ok(())
    }
}

fn health_check(hc: &HealthCheckConfig, e: &mut Errors) {
    if let Some(p) = &hc.path {
        e.url_path("health_check.path", p);
    }
    e.at_least("health_check.interval_ms", hc.interval_ms, 10);
    e.ensure(
        (1..=hc.interval_ms.max(10)).contains(&hc.timeout_ms),
        "health_check.timeout_ms",
        "must be between 1 and interval_ms",
    );
    e.at_least("health_check.healthy_threshold", hc.healthy_threshold, 1);
    e.at_least(
        "health_check.unhealthy_threshold",
        hc.unhealthy_threshold,
        1,
    );
}

fn engine_metrics(em: &EngineMetricsConfig, e: &mut Errors) {
    e.url_path("engine_metrics.path", &em.path);
    // 0 turns scraping off; then the timeout is unused.
    e.ensure(
        em.interval_ms == 0 || (1..=em.interval_ms).contains(&em.timeout_ms),
        "engine_metrics.timeout_ms",
        "must be between 1 and interval_ms",
    );
}

fn peers(p: &PeersConfig, e: &mut Errors) {
    if let Some(url) = &p.redis_url {
        // The client's own parser; its message never repeats the URL
        // (which may hold a password).
        if let Err(err) = redis::Client::open(url.as_str()) {
            e.push(
                "peers.redis_url",
                format!("not a Redis URL: {:?}", err.kind()),
            );
        }
    }
    e.name("peers.prefix", &p.prefix, b":");
    e.in_range("peers.timeout_ms", p.timeout_ms, 1..=10_000);
    e.in_range("peers.flush_ms", p.flush_ms, 1..=1_000);
    e.in_range("peers.max_pending", p.max_pending, 1..=1_000_000);
    e.in_range("peers.stream_max_len", p.stream_max_len, 16..=1_000_000);
    e.in_range("peers.max_batch_bytes", p.max_batch_bytes, 1024..=1 << 20);
    // A report must outlive the two rounds it takes to arrive.
    e.ensure(
        p.load_stale_ms == 0 || (2 * p.flush_ms..=60_000).contains(&p.load_stale_ms),
        "peers.load_stale_ms",
        "must be 0 (load not shared) or between 2 × flush_ms and 60000",
    );
}

fn leases(ls: &LeaseConfig, e: &mut Errors) {
    e.ensure(
        (1..=ls.max_ms).contains(&ls.min_ms),
        "leases.min_ms",
        "must be between 1 and max_ms",
    );
    e.ensure(
        ls.decode_tokens_per_sec.is_finite() && ls.decode_tokens_per_sec > 0.0,
        "leases.decode_tokens_per_sec",
        "must be above 0",
    );
}
