//! The tenant config types, as the router config defines them
//! (`config::tenants`): re-exported for the accountant's own users.

pub use crate::config::{
    AuditConfig, Budget, BudgetPeriod, MAX_LIMIT, MAX_NAMED, MAX_TENANT_ID_LEN, Priority,
    TenantLimits, TenantMetricsConfig, TenantsConfig, TenantsRedisConfig,
};
