//! `tenant get [NAME]` and `tenant set NAME ...`: tables from the API's
//! typed tenant views, and the flags of a change.

use comfy_table::{Table, presets::NOTHING};

use crate::admin::api::{TenantView, TenantsView};
use crate::config::{Budget, BudgetPeriod, Priority, TenantPatch};

fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_style(NOTHING)
        .set_header(header.iter().map(|h| h.to_string()));
    t
}

fn n(v: Option<u64>) -> String {
    v.map_or("-".into(), |v| v.to_string())
}

fn usd(v: f64) -> String {
    format!("{v:.4}")
}

fn budget(v: &TenantView) -> String {
    v.limits
        .budget
        .map_or("-".into(), |b| format!("{} USD/{}", b.usd, b.per.as_str()))
}

/// `tenant get`: one row per tenant, the heaviest first.
pub fn render_tenants(all: &TenantsView) -> String {
    let mut t = table(&[
        "TENANT",
        "IN FLIGHT",
        "TOKENS/MIN",
        "TPM LIMIT",
        "TOKENS",
        "USD",
        "BUDGET",
        "BUDGET LEFT",
        "REFUSED",
        "PRIORITY",
    ]);
    for v in &all.tenants {
        let u = &v.usage;
        t.add_row(vec![
            v.name.clone(),
            u.requests_in_flight.to_string(),
            u.tokens_last_minute.to_string(),
            n(v.limits.tokens_per_minute),
            u.tokens_charged.to_string(),
            usd(u.usd_charged),
            budget(v),
            u.budget_left_usd.map_or("-".into(), usd),
            u.refused.values().sum::<u64>().to_string(),
            v.limits.priority.as_str().to_string(),
        ]);
    }
    format!("{} tenants tracked\n{t}\n", all.tracked)
}

/// `tenant get NAME`: its limits, what it uses now, and what it was charged.
pub fn render_tenant(v: &TenantView) -> String {
    let u = &v.usage;
    let entry = if v.named {
        "named entry"
    } else {
        "default limits"
    };
    let mut limits = table(&["LIMIT", "VALUE", "USED NOW"]);
    limits.add_row(vec![
        "max_requests_in_flight".into(),
        n(v.limits.max_requests_in_flight),
        u.requests_in_flight.to_string(),
    ]);
    limits.add_row(vec![
        "max_tokens_in_flight".into(),
        n(v.limits.max_tokens_in_flight),
        u.tokens_in_flight.to_string(),
    ]);
    limits.add_row(vec![
        "tokens_per_minute".into(),
        n(v.limits.tokens_per_minute),
        u.tokens_last_minute.to_string(),
    ]);
    let spent = match v.limits.budget.map(|b| b.per) {
        Some(BudgetPeriod::Day) => u.spent_usd_today,
        _ => u.spent_usd_this_month,
    };
    limits.add_row(vec![
        "budget".into(),
        budget(v),
        usd(spent + u.reserved_usd),
    ]);
    let mut charged = table(&[
        "ADMITTED",
        "COMMITTED",
        "EXPIRED",
        "DROPPED",
        "TOKENS",
        "USD",
        "BUDGET LEFT",
    ]);
    charged.add_row(vec![
        u.admitted.to_string(),
        u.committed.to_string(),
        u.expired.to_string(),
        u.dropped.to_string(),
        u.tokens_charged.to_string(),
        usd(u.usd_charged),
        u.budget_left_usd.map_or("-".into(), usd),
    ]);
    let mut refused = table(&["REFUSED BY", "REQUESTS"]);
    for (limit, count) in &u.refused {
        refused.add_row(vec![limit.clone(), count.to_string()]);
    }
    format!(
        "tenant {}  ({entry})  priority {}\n{limits}\n\n{charged}\n\n{refused}\n",
        v.name,
        v.limits.priority.as_str()
    )
}

/// A flag's value: a setting, or `none` (unlimited).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Setting<T>(pub Option<T>);

/// `N`, or `none` for unlimited.
pub fn limit_arg(s: &str) -> Result<Setting<u64>, String> {
    match s {
        "none" => Ok(Setting(None)),
        s => s
            .parse()
            .map(|v| Setting(Some(v)))
            .map_err(|_| format!("'{s}': expected a whole number or none")),
    }
}

/// `USD/day`, `USD/month`, or `none`.
pub fn budget_arg(s: &str) -> Result<Setting<Budget>, String> {
    if s == "none" {
        return Ok(Setting(None));
    }
    let (usd, per) = s
        .split_once('/')
        .ok_or_else(|| format!("'{s}': expected USD/day, USD/month or none"))?;
    let per = match per {
        "day" => BudgetPeriod::Day,
        "month" => BudgetPeriod::Month,
        p => return Err(format!("'{p}': the period is day or month")),
    };
    let usd = usd
        .trim_start_matches('$')
        .parse()
        .map_err(|_| format!("'{usd}': the budget is a number of USD"))?;
    Ok(Setting(Some(Budget { usd, per })))
}

pub fn priority_arg(s: &str) -> Result<Priority, String> {
    match s {
        "critical" => Ok(Priority::Critical),
        "standard" => Ok(Priority::Standard),
        "sheddable" => Ok(Priority::Sheddable),
        p => Err(format!("'{p}': critical, standard or sheddable")),
    }
}

/// The flags of `tenant set`, as the API's patch.
#[derive(Clone, Debug, Default)]
pub struct SetFlags {
    pub max_requests: Option<Setting<u64>>,
    pub max_tokens: Option<Setting<u64>>,
    pub tpm: Option<Setting<u64>>,
    pub budget: Option<Setting<Budget>>,
    pub priority: Option<Priority>,
}

impl SetFlags {
    pub fn patch(self) -> TenantPatch {
        let v = |s: Option<Setting<u64>>| s.map(|s| s.0);
        TenantPatch {
            max_requests_in_flight: v(self.max_requests),
            max_tokens_in_flight: v(self.max_tokens),
            tokens_per_minute: v(self.tpm),
            budget: self.budget.map(|s| s.0),
            priority: self.priority,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tenant as the admin API writes it (`GET /v1/tenant`).
    const TENANT: &str = r#"{
        "name": "acme", "named": true, "tracked": true,
        "limits": { "max_requests_in_flight": 64, "max_tokens_in_flight": null,
                    "tokens_per_minute": 100000, "budget": { "usd": 500.0, "per": "month" },
                    "priority": "critical" },
        "usage": { "requests_in_flight": 3, "tokens_in_flight": 9000, "tokens_last_minute": 41000,
                   "spent_usd_today": 1.5, "spent_usd_this_month": 120.25, "reserved_usd": 0.25,
                   "budget_left_usd": 379.5, "admitted": 1000, "committed": 995, "expired": 1,
                   "dropped": 1, "late_commits": 2, "tokens_charged": 2000000, "usd_charged": 120.25,
                   "refused": { "budget": 0, "max_requests_in_flight": 4, "max_tokens_in_flight": 0,
                                "tokens_per_minute": 7 } }
    }"#;

    fn rows(out: &str, first: &str) -> Vec<String> {
        out.lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .filter(|l| l.starts_with(first))
            .collect()
    }

    #[test]
    fn a_tenant_shows_limits_use_and_charges() {
        let v: TenantView = serde_json::from_str(TENANT).expect("the API's tenant view");
        let out = render_tenant(&v);
        assert!(
            out.starts_with("tenant acme  (named entry)  priority critical\n"),
            "{out}"
        );
        assert_eq!(
            rows(&out, "tokens_per_minute "),
            ["tokens_per_minute 100000 41000", "tokens_per_minute 7"],
            "the limit's row, then its refusals"
        );
        assert_eq!(
            rows(&out, "budget "),
            ["budget 500 USD/month 120.5000", "budget 0"]
        );
        assert_eq!(
            rows(&out, "max_tokens_in_flight "),
            ["max_tokens_in_flight - 9000", "max_tokens_in_flight 0"]
        );
        assert_eq!(
            rows(&out, "1000 "),
            ["1000 995 1 1 2000000 120.2500 379.5000"]
        );
        let all = TenantsView {
            tracked: 12,
            tenants: vec![v],
        };
        let out = render_tenants(&all);
        assert!(out.starts_with("12 tenants tracked\n"), "{out}");
        assert_eq!(
            rows(&out, "acme "),
            ["acme 3 41000 100000 2000000 120.2500 500 USD/month 379.5000 11 critical"]
        );
    }

    #[test]
    fn set_flags_parse_or_say_why_not() {
        assert_eq!(limit_arg("none"), Ok(Setting(None)));
        assert_eq!(limit_arg("1000"), Ok(Setting(Some(1000))));
        assert!(limit_arg("-1").is_err());
        assert_eq!(
            budget_arg("500/month"),
            Ok(Setting(Some(Budget {
                usd: 500.0,
                per: BudgetPeriod::Month
            })))
        );
        assert_eq!(budget_arg("none"), Ok(Setting(None)));
        let patch = SetFlags {
            tpm: Some(Setting(None)),
            max_requests: Some(Setting(Some(4))),
            ..Default::default()
        }
        .patch();
        assert_eq!(patch.tokens_per_minute, Some(None), "none: unlimited");
        assert_eq!(patch.max_requests_in_flight, Some(Some(4)));
        assert_eq!(patch.budget, None, "not given: unchanged");
        assert!(budget_arg("500").is_err());
        assert!(budget_arg("5/week").is_err());
        assert!(priority_arg("urgent").is_err());
    }
}
