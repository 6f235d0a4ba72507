//! `tenants:`, `tenants_redis:` and `audit:` — per-tenant limits, budget and
//! priority class; sharing per-minute limits between instances; the audit
//! log. Defaults are in `defaults.rs`, checks in `validate/tenants.rs`.
//!
//! ```yaml
//! tenants:
//!   default: { tokens_per_minute: 200000, priority: standard }
//!   named:
//!     acme: { max_requests_in_flight: 64, budget: { usd: 500, per: month }, priority: critical }
//! ```
//!
//! A named entry replaces `default` as a whole (no field-by-field merge), so
//! what applies to a tenant is read in one place. Every limit left out is
//! unlimited: an empty `tenants:` changes nothing.

use schemars::JsonSchema;
use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Longest tenant id tracked as itself (the filter writes a header value of
/// at most this many bytes, or a hash of the key); the request path cuts
/// longer ones like request ids.
pub const MAX_TENANT_ID_LEN: usize = 128;
/// Most named tenants.
pub const MAX_NAMED: usize = 4096;
/// Largest limit or budget: counters hold 40 bits.
pub const MAX_LIMIT: u64 = 1 << 40;
/// The tenant id every untracked tenant counts as (beyond the tracking bound,
/// or sending no tenant at all); reserved, so no named entry may take it.
pub const OTHER_TENANT: &str = "other";

#[derive(Clone, Debug, Default, Deserialize, JsonSchema, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TenantsConfig {
    /// Limits of every tenant not named (and of `other`).
    #[serde(default)]
    pub default: TenantLimits,
    /// Limits per tenant id.
    #[serde(default)]
    pub named: BTreeMap<String, TenantLimits>,
    /// Which tenants get their own metric series.
    #[serde(default)]
    pub metrics: TenantMetricsConfig,
    /// Where a request's tenant comes from (`identity.rs`).
    #[serde(default)]
    pub identity: super::IdentityConfig,
}

#[derive(Clone, Debug, Default, Deserialize, JsonSchema, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TenantLimits {
    /// Requests in flight at once.
    #[serde(default)]
    pub max_requests_in_flight: Option<u64>,
    /// Prompt plus `max_tokens` of the requests in flight.
    #[serde(default)]
    pub max_tokens_in_flight: Option<u64>,
    /// Prompt plus completion tokens in any 60 s.
    #[serde(default)]
    pub tokens_per_minute: Option<u64>,
    /// Spend allowed per period; beyond it requests get 429.
    #[serde(default)]
    pub budget: Option<Budget>,
    /// The admission class (read by priority/SLO admission).
    #[serde(default)]
    pub priority: Priority,
}

#[derive(Clone, Copy, Debug, Deserialize, JsonSchema, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// Spend allowed in a period, USD.
    pub usd: f64,
    /// The period the budget renews over.
    pub per: BudgetPeriod,
}

#[derive(Clone, Copy, Debug, Deserialize, JsonSchema, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum BudgetPeriod {
    /// UTC calendar day.
    Day,
    /// UTC calendar month.
    Month,
}

impl BudgetPeriod {
    pub fn as_str(self) -> &'static str {
        match self {
            BudgetPeriod::Day => "day",
            BudgetPeriod::Month => "month",
        }
    }
}

#[derive(Clone, Copy, Debug, Default, Deserialize, JsonSchema, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    Critical,
    #[default]
    Standard,
    Sheddable,
}

impl Priority {
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Critical => "critical",
            Priority::Standard => "standard",
            Priority::Sheddable => "sheddable",
        }
    }
}

/// Per-tenant metric series are bounded: the `top` tenants by tokens charged
/// plus every `pinned` one get their own; all others count as `other`.
#[derive(Clone, Debug, Deserialize, JsonSchema, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TenantMetricsConfig {
    /// Tenants by tokens charged that get their own series.
    pub top: usize,
    /// Tenants that always have their own series.
    pub pinned: Vec<String>,
}

impl TenantsConfig {
    /// The limits and priority class that apply to `tenant`: its named
    /// entry, else `default` (also for no tenant at all).
    pub fn limits_for(&self, tenant: &str) -> &TenantLimits {
        self.named.get(tenant).unwrap_or(&self.default)
    }

    /// Every problem found, each prefixed with its field path (the same
    /// checks the router config runs on its `tenants:` section).
    pub fn validate(&self) -> Result<(), Vec<String>> {
        let errs = super::validate::tenants_errors(self);
        if errs.is_empty() {
            Ok(())
        } else {
            Err(errs.iter().map(ToString::to_string).collect())
        }
    }
}

/// `tenants_redis:` — per-minute limits shared by several instances.
#[derive(Clone, Debug, Deserialize, JsonSchema, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TenantsRedisConfig {
    /// `redis://127.0.0.1:6379/`
    pub url: String,
    /// Instances sharing the counters: the fallback share is limit ÷ this.
    pub instances: u64,
    /// Key prefix.
    #[serde(default = "super::defaults::redis_prefix")]
    pub prefix: String,
    /// Share of a tenant's per-minute limit claimed per round trip (also
    /// never less than the request at hand).
    #[serde(default = "super::defaults::redis_slice_fraction")]
    pub slice_fraction: f64,
    /// Bound on one Redis round trip before the instance falls back.
    #[serde(default = "super::defaults::redis_timeout_ms")]
    pub timeout_ms: u64,
}

/// `audit:` — one JSON line per request.
#[derive(Clone, Debug, Deserialize, JsonSchema, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// File to write; rotated at `max_bytes`. Unset: no file.
    pub path: Option<PathBuf>,
    /// Also write every record to standard output.
    pub stdout: bool,
    /// Size at which the file is rotated.
    pub max_bytes: u64,
    /// Files kept, the live one included.
    pub max_files: u32,
    /// Records buffered between the request path and the writer.
    pub buffer: usize,
}

impl AuditConfig {
    /// Whether any record is written at all.
    pub fn enabled(&self) -> bool {
        self.path.is_some() || self.stdout
    }

    pub fn validate(&self) -> Result<(), Vec<String>> {
        let errs = super::validate::audit_errors(self);
        if errs.is_empty() {
            Ok(())
        } else {
            Err(errs.iter().map(ToString::to_string).collect())
        }
    }
}

impl TenantsRedisConfig {
    pub fn validate(&self) -> Result<(), Vec<String>> {
        let errs = super::validate::redis_errors(self);
        if errs.is_empty() {
            Ok(())
        } else {
            Err(errs.iter().map(ToString::to_string).collect())
        }
    }
}

/// A change to one tenant's limits (the admin API's `POST /v1/tenant`): a
/// field left out stays, `null` removes the limit (unlimited), a value sets
/// it. Applied to the tenant's named entry, or to a copy of `default` for a
/// tenant that has none yet.
#[derive(Clone, Debug, Default, Deserialize, JsonSchema, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TenantPatch {
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub max_requests_in_flight: Option<Option<u64>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub max_tokens_in_flight: Option<Option<u64>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub tokens_per_minute: Option<Option<u64>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub budget: Option<Option<Budget>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<Priority>,
}

/// A field that is present (`null` included) is `Some`.
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

impl TenantPatch {
    pub fn is_empty(&self) -> bool {
        *self == TenantPatch::default()
    }

    pub fn apply(&self, l: &mut TenantLimits) {
        fn set<T: Copy>(field: &mut Option<T>, v: Option<Option<T>>) {
            if let Some(v) = v {
                *field = v;
            }
        }
        set(&mut l.max_requests_in_flight, self.max_requests_in_flight);
        set(&mut l.max_tokens_in_flight, self.max_tokens_in_flight);
        set(&mut l.tokens_per_minute, self.tokens_per_minute);
        set(&mut l.budget, self.budget);
        if let Some(p) = self.priority {
            l.priority = p;
        }
    }
}

impl std::fmt::Display for TenantLimits {
    /// One line an operator reads: every limit, `-` for unlimited.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
        let budget = self.budget.map_or("-".to_string(), |b| {
            format!("{} USD/{}", b.usd, b.per.as_str())
        });
        write!(
            f,
            "max_requests_in_flight {}, max_tokens_in_flight {}, tokens_per_minute {}, budget {}, priority {}",
            n(self.max_requests_in_flight),
            n(self.max_tokens_in_flight),
            n(self.tokens_per_minute),
            budget,
            self.priority.as_str()
        )
    }
}
