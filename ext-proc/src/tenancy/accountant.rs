//! The accountant the router runs: the ledger (shared through Redis when
//! `tenants_redis` is set), whose limits follow the config, and the audit
//! log. One per process, owned by the router's shared state.

use std::io;
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use super::allowance::SharedState;
use super::audit::{AuditLog, AuditRecord};
use super::clock::Clock;
use super::config::{AuditConfig, TenantsConfig, TenantsRedisConfig};
use super::ledger::{Estimate, Ledger, Refusal, Reservation};
use super::shared::Shared;

/// How often the Redis upkeep task retries after an outage.
const UPKEEP: Duration = Duration::from_secs(1);

pub struct Accountant {
    ledger: Ledger,
    redis: Option<Arc<Shared>>,
    audit: OnceLock<AuditLog>,
}

impl std::fmt::Debug for Accountant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Accountant")
            .field("redis", &self.redis.is_some())
            .field("audit", &self.audit.get().is_some())
            .finish()
    }
}

impl Accountant {
    /// `instance` names this instance's claims in Redis.
    pub fn new(
        tenants: &TenantsConfig,
        redis: Option<&TenantsRedisConfig>,
        instance: &str,
    ) -> Accountant {
        Self::with_clock(tenants, redis, Clock::real(), instance)
    }

    pub fn with_clock(
        tenants: &TenantsConfig,
        redis: Option<&TenantsRedisConfig>,
        clock: Clock,
        instance: &str,
    ) -> Accountant {
        let shared = redis.and_then(|r| {
            Shared::new(tenants.clone(), r.clone(), clock.clone(), instance)
                .inspect_err(|e| {
                    tracing::error!(error = %e, "tenants_redis: cannot use Redis; limits are per instance")
                })
                .ok()
        });
        let ledger = match &shared {
            Some(s) => s.ledger().clone(),
            None => Ledger::new(tenants.clone(), clock),
        };
        Accountant {
            ledger,
            redis: shared,
            audit: OnceLock::new(),
        }
    }

    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// Redis sharing's counters, when it is on.
    pub fn redis(&self) -> Option<&SharedState> {
        self.redis.as_deref().map(Shared::state)
    }

    /// Reserves `est` for one request of `tenant`: the local ledger, and at
    /// most one Redis round trip when a shared allowance runs out. A refusal
    /// is counted against the tenant once.
    pub async fn admit(&self, tenant: &str, est: &Estimate) -> Result<Reservation, Refusal> {
        let r = match &self.redis {
            None => self.ledger.admit(tenant, est),
            Some(s) => s.admit(tenant, est).await,
        };
        if let Err(refusal) = &r {
            self.ledger.tenant(tenant).count_refusal(refusal.limit);
        }
        r
    }

    /// New limits from a reloaded or edited config.
    pub fn reconfigure(&self, tenants: &TenantsConfig) {
        self.ledger.reconfigure(tenants);
    }

    /// Starts the audit writer when the config asks for one (once; a later
    /// change of `audit:` needs a restart). The handle joins the writer.
    pub fn start_audit(&self, cfg: &AuditConfig) -> io::Result<Option<JoinHandle<()>>> {
        if !cfg.enabled() || self.audit.get().is_some() {
            return Ok(None);
        }
        let (log, writer) = AuditLog::start(cfg.clone())?;
        let _ = self.audit.set(log);
        Ok(Some(writer))
    }

    /// Whether records are written (builders skip their work otherwise).
    pub fn auditing(&self) -> bool {
        self.audit.get().is_some()
    }

    /// Queues a record; never blocks (a full queue drops and counts it).
    pub fn audit(&self, record: AuditRecord) {
        if let Some(a) = self.audit.get() {
            a.record(record);
        }
    }

    pub fn audit_log(&self) -> Option<&AuditLog> {
        self.audit.get()
    }

    /// With Redis: retries after an outage and reports the spend made on
    /// fallback shares (needs a tokio runtime).
    pub fn spawn_upkeep(&self) -> Option<tokio::task::JoinHandle<()>> {
        self.redis.as_ref().map(|s| s.spawn_upkeep(UPKEEP))
    }
}
