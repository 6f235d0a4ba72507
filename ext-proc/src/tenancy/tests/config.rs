use crate::tenancy::config::{BudgetPeriod, Priority, TenantsConfig};

#[test]
fn parses_defaults_and_named_entries() {
    let c: TenantsConfig = yaml_serde::from_str(
        "default: { tokens_per_minute: 1000 }\nnamed:\n  acme: { max_requests_in_flight: 4, budget: { usd: 12.5, per: month }, priority: critical }\n",
    )
    .unwrap();
    c.validate().unwrap();
    assert_eq!(c.limits_for("nobody").tokens_per_minute, Some(1000));
    assert_eq!(c.limits_for("nobody").priority, Priority::Standard);
    let acme = c.limits_for("acme");
    // A named entry replaces the default as a whole.
    assert_eq!(acme.tokens_per_minute, None);
    assert_eq!(acme.max_requests_in_flight, Some(4));
    assert_eq!(acme.budget.unwrap().per, BudgetPeriod::Month);
    assert_eq!(acme.priority, Priority::Critical);
    // Empty: unlimited.
    let e: TenantsConfig = yaml_serde::from_str("{}").unwrap();
    assert_eq!(e.default.tokens_per_minute, None);
    assert!(e.default.budget.is_none());
}

#[test]
fn rejects_unknown_fields() {
    let e = yaml_serde::from_str::<TenantsConfig>("default: { tokens_per_min: 5 }").unwrap_err();
    assert!(e.to_string().contains("tokens_per_min"), "{e}");
}

#[test]
fn validate_names_each_field_path() {
    let c: TenantsConfig = yaml_serde::from_str(
        "default: { max_tokens_in_flight: 0 }\nnamed:\n  other: {}\n  \"a b\": {}\n  acme: { budget: { usd: -1, per: day } }\n",
    )
    .unwrap();
    let errs = c.validate().unwrap_err();
    let has = |p: &str| errs.iter().any(|e| e.starts_with(p));
    assert!(has("tenants.default.max_tokens_in_flight:"), "{errs:?}");
    assert!(has("tenants.named.other:"), "{errs:?}");
    assert!(has("tenants.named.a b:"), "{errs:?}");
    assert!(has("tenants.named.acme.budget.usd:"), "{errs:?}");
    assert_eq!(errs.len(), 4, "{errs:?}");
}
