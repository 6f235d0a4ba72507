//! `tenants:` — per-tenant limits, budget and priority.
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

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Longest tenant id accepted in the config (the filter writes a header value
/// or a hash of the key; both are short).
pub const MAX_TENANT_ID_LEN: usize = 128;
/// Most named tenants; the ledger tracks at most this many in total.
pub const MAX_NAMED: usize = 4096;
/// Largest limit or budget: counters hold 40 bits.
pub const MAX_LIMIT: u64 = 1 << 40;

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TenantsConfig {
    #[serde(default)]
    pub default: TenantLimits,
    #[serde(default)]
    pub named: BTreeMap<String, TenantLimits>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TenantLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_requests_in_flight: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens_in_flight: Option<u64>,
    /// Prompt plus completion tokens in any 60 s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_minute: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
    #[serde(default)]
    pub priority: Priority,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    pub usd: f64,
    pub per: BudgetPeriod,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum BudgetPeriod {
    /// UTC calendar day.
    Day,
    /// UTC calendar month.
    Month,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    Critical,
    #[default]
    Standard,
    Sheddable,
}

impl TenantsConfig {
    /// The limits that apply to `tenant`.
    pub fn limits_for(&self, tenant: &str) -> &TenantLimits {
        self.named.get(tenant).unwrap_or(&self.default)
    }

    /// Every problem found, each prefixed with its field path.
    pub fn validate(&self) -> Result<(), Vec<String>> {
        let mut errs = Vec::new();
        self.default.validate("tenants.default", &mut errs);
        if self.named.len() > MAX_NAMED {
            errs.push(format!(
                "tenants.named: {} entries, at most {MAX_NAMED}",
                self.named.len()
            ));
        }
        for (id, l) in &self.named {
            let path = format!("tenants.named.{id}");
            if id.is_empty() || id.len() > MAX_TENANT_ID_LEN {
                errs.push(format!(
                    "{path}: tenant id must be 1 to {MAX_TENANT_ID_LEN} bytes"
                ));
            } else if !id.bytes().all(|b| b.is_ascii_graphic()) {
                errs.push(format!(
                    "{path}: tenant id must be printable ASCII without spaces"
                ));
            } else if id == super::ledger::OTHER {
                errs.push(format!("{path}: `{id}` is reserved for untracked tenants"));
            }
            l.validate(&path, &mut errs);
        }
        if errs.is_empty() { Ok(()) } else { Err(errs) }
    }
}

impl TenantLimits {
    fn validate(&self, path: &str, errs: &mut Vec<String>) {
        for (name, v) in [
            ("max_requests_in_flight", self.max_requests_in_flight),
            ("max_tokens_in_flight", self.max_tokens_in_flight),
            ("tokens_per_minute", self.tokens_per_minute),
        ] {
            match v {
                Some(0) => errs.push(format!(
                    "{path}.{name}: must be at least 1 (leave it out for unlimited)"
                )),
                Some(v) if v > MAX_LIMIT => {
                    errs.push(format!("{path}.{name}: {v} is above {MAX_LIMIT}"))
                }
                _ => {}
            }
        }
        if let Some(b) = &self.budget
            && !(b.usd.is_finite() && b.usd >= 0.0 && b.usd * 1e6 < MAX_LIMIT as f64)
        {
            errs.push(format!(
                "{path}.budget.usd: must be a finite number from 0 to {}",
                MAX_LIMIT / 1_000_000
            ));
        }
    }
}
