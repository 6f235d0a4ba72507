//! The local accountant: reserves an estimate when a request is admitted,
//! charges the real usage when it ends.
//!
//! Hot path: one map read (papaya, lock-free), a few atomic adds, and a
//! lease insert only for an estimate with its own `ttl` (the router's
//! reservations ride with the decision's load lease instead). A reservation is a value: `commit` consumes it, dropping it
//! releases it, and a lease with a TTL ends it when neither happens (a lost
//! end). Each reservation ends exactly once (a state flag swapped once):
//! - commit: the estimate is released and the real usage charged;
//! - drop: the estimate is released and nothing is charged (never sent);
//! - lease expiry: in-flight capacity is freed and the *estimate* is charged
//!   (the request may have run); a commit arriving later corrects the charge
//!   to the real usage, so nothing is charged twice and nothing is free.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use arc_swap::ArcSwap;
use moka::sync::Cache;

use super::allowance::SharedState;
use super::clock::Clock;
use super::config::TenantsConfig;

pub use super::limits::{Estimate, Limit, Refusal, Usage};
pub use super::reservation::Reservation;
use super::reservation::{Books, EXPIRED, Held, LIVE, LeaseBound};
pub use super::tenant::TenantState;

/// The bucket every tenant beyond `MAX_TENANTS` shares (with `default` limits).
pub const OTHER: &str = crate::config::OTHER_TENANT;
/// Most tenants tracked one by one.
pub const MAX_TENANTS: usize = 65_536;
/// Most reservations held at once; beyond it the oldest are expired early.
const MAX_LEASES: u64 = 1 << 20;
/// Longest tenant id tracked as itself; longer ones count as `other`.
const MAX_ID_LEN: usize = crate::config::MAX_TENANT_ID_LEN;
/// What a refusal of an in-flight limit advises: in-flight capacity frees
/// as requests end, which the ledger cannot predict.
const IN_FLIGHT_RETRY: Duration = Duration::from_secs(1);

pub(super) struct Inner {
    pub(super) cfg: ArcSwap<TenantsConfig>,
    pub(super) tenants: papaya::HashMap<Arc<str>, Arc<TenantState>>,
    pub(super) other: Arc<TenantState>,
    pub(super) books: Arc<Books>,
    pub(super) next_id: AtomicU64,
    pub(super) max_tenants: usize,
}

/// Cheap to clone; every clone is the same ledger.
#[derive(Clone)]
pub struct Ledger {
    inner: Arc<Inner>,
}

impl Ledger {
    pub fn new(cfg: TenantsConfig, clock: Clock) -> Self {
        Self::build(cfg, clock, None, MAX_TENANTS)
    }

    pub(crate) fn build(
        cfg: TenantsConfig,
        clock: Clock,
        shared: Option<Arc<SharedState>>,
        max_tenants: usize,
    ) -> Self {
        let on = shared.is_some();
        let tenants = papaya::HashMap::new();
        {
            let pin = tenants.pin();
            for (id, l) in &cfg.named {
                let id: Arc<str> = id.as_str().into();
                pin.insert(id.clone(), Arc::new(TenantState::new(&id, l, on)));
            }
        }
        let other = Arc::new(TenantState::new(OTHER, &cfg.default, on));
        let leases = Cache::builder()
            .max_capacity(MAX_LEASES)
            .expire_after(LeaseBound)
            .eviction_listener(|_, h: Arc<Held>, _| {
                h.end(EXPIRED);
            })
            .build();
        Ledger {
            inner: Arc::new(Inner {
                cfg: ArcSwap::from_pointee(cfg),
                tenants,
                other,
                books: Arc::new(Books {
                    leases,
                    clock,
                    shared,
                }),
                next_id: AtomicU64::new(0),
                max_tenants,
            }),
        }
    }

    pub fn clock(&self) -> &Clock {
        &self.inner.books.clock
    }

    /// The config the limits come from now.
    pub fn config(&self) -> Arc<TenantsConfig> {
        self.inner.cfg.load_full()
    }

    /// New limits for every tenant, from now on: counters and reservations
    /// held stay (a reservation ends against the counters it was made on).
    /// Tenants named for the first time are tracked from now.
    pub fn reconfigure(&self, cfg: &TenantsConfig) {
        let i = &self.inner;
        if **i.cfg.load() == *cfg {
            return;
        }
        i.cfg.store(Arc::new(cfg.clone()));
        let on = i.books.shared.is_some();
        let pin = i.tenants.pin();
        for (id, l) in &cfg.named {
            if pin.get(id.as_str()).is_none() {
                let id: Arc<str> = id.as_str().into();
                pin.get_or_insert(id.clone(), Arc::new(TenantState::new(&id, l, on)));
            }
        }
        for t in pin.values() {
            let l = cfg.limits_for(&t.id);
            if **t.limits.load() != *l {
                t.limits.store(Arc::new(l.clone()));
            }
        }
        i.other.limits.store(Arc::new(cfg.default.clone()));
    }

    /// The tenant's counters: tracked by id up to `MAX_TENANTS`, `other` after.
    pub fn tenant(&self, id: &str) -> Arc<TenantState> {
        let i = &self.inner;
        let pin = i.tenants.pin();
        if let Some(t) = pin.get(id) {
            return t.clone();
        }
        // A client calling itself `other` is counted with the untracked ones.
        if id.is_empty() || id == OTHER || id.len() > MAX_ID_LEN || pin.len() >= i.max_tenants {
            return i.other.clone();
        }
        let cfg = i.cfg.load();
        let l = cfg.limits_for(id);
        let fresh = Arc::new(TenantState::new(id, l, i.books.shared.is_some()));
        pin.get_or_insert(id.into(), fresh).clone()
    }

    /// The tenant's counters when it is tracked (`other` for its own id);
    /// never starts tracking one (for readers such as the admin API).
    pub fn find(&self, id: &str) -> Option<Arc<TenantState>> {
        if id == OTHER {
            return Some(self.inner.other.clone());
        }
        self.inner.tenants.pin().get(id).cloned()
    }

    /// Every tenant tracked by id (not `other`).
    pub fn tenants(&self) -> Vec<Arc<TenantState>> {
        self.inner.tenants.pin().values().cloned().collect()
    }

    pub fn other(&self) -> Arc<TenantState> {
        self.inner.other.clone()
    }

    /// Reserves `est` for one request of `tenant`, or names the limit it
    /// would pass and when to retry. Refusals are not counted here (a
    /// shared ledger may retry after a refill): the caller counts the one
    /// it answers with (`TenantState::count_refusal`).
    pub fn admit(&self, tenant: &str, est: &Estimate) -> Result<Reservation, Refusal> {
        let t = self.tenant(tenant);
        let inner = &self.inner;
        let now = inner.books.clock.now_ms();
        let tokens = est.tokens();
        let cost = est.micro_usd();
        let l = t.limits();
        let refuse = |limit, retry_after, refill| {
            Err(Refusal {
                limit,
                retry_after,
                refill,
            })
        };

        // Add first, check after, undo on refusal: concurrent admissions can
        // only refuse spuriously, never pass a limit together.
        let n = t.requests.fetch_add(1, Relaxed) + 1;
        if l.max_requests_in_flight.is_some_and(|m| n > m) {
            t.requests.fetch_sub(1, Relaxed);
            return refuse(Limit::MaxRequestsInFlight, IN_FLIGHT_RETRY, false);
        }
        let k = t.tokens.fetch_add(tokens, Relaxed) + tokens;
        if l.max_tokens_in_flight.is_some_and(|m| k > m) {
            t.tokens.fetch_sub(tokens, Relaxed);
            t.requests.fetch_sub(1, Relaxed);
            return refuse(Limit::MaxTokensInFlight, IN_FLIGHT_RETRY, false);
        }
        let undo_flight = || {
            t.tokens.fetch_sub(tokens, Relaxed);
            t.requests.fetch_sub(1, Relaxed);
        };

        // The local window counts every reservation (what this instance
        // served in the last minute); with Redis the limit is the allowance.
        let window_epoch = t.minute.add(now, tokens);
        let mut allowance_minute = None;
        if let Some(limit) = l.tokens_per_minute {
            match (&t.allowance, inner.books.shared.as_deref()) {
                (Some(a), Some(shared)) => {
                    match a.take(shared, &inner.books.clock, limit, tokens) {
                        Ok(minute) => allowance_minute = Some(minute),
                        Err(retry) => {
                            t.minute.sub(window_epoch, tokens);
                            undo_flight();
                            let refill = !shared.degraded() && tokens <= limit;
                            return refuse(Limit::TokensPerMinute, retry, refill);
                        }
                    }
                }
                _ => {
                    if t.minute.used(now) > limit {
                        t.minute.sub(window_epoch, tokens);
                        undo_flight();
                        let ms = t
                            .minute
                            .retry_after_ms(now, tokens, limit)
                            .unwrap_or(60_000);
                        return refuse(Limit::TokensPerMinute, Duration::from_millis(ms), false);
                    }
                }
            }
        }
        let unreserve_minute = || {
            t.minute.sub(window_epoch, tokens);
            if let (Some(a), Some(m)) = (&t.allowance, allowance_minute) {
                a.give_back(m, tokens);
            }
        };

        let r = t.reserved_micro_usd.fetch_add(cost, Relaxed) + cost;
        if let Some(b) = &l.budget
            && t.spent_micro_usd(&inner.books.clock, b.per)
                .saturating_add(r)
                > (b.usd * 1e6) as u64
        {
            t.reserved_micro_usd.fetch_sub(cost, Relaxed);
            unreserve_minute();
            undo_flight();
            let wait = inner.books.clock.until_next_period(b.per);
            return refuse(Limit::Budget, wait, false);
        }

        t.admitted.fetch_add(1, Relaxed);
        let id = inner.next_id.fetch_add(1, Relaxed);
        let held = Arc::new(Held {
            tenant: t.clone(),
            tokens,
            micro_usd: cost,
            window_epoch,
            allowance_minute,
            ttl: est.ttl.unwrap_or(Duration::MAX),
            state: AtomicU8::new(LIVE),
            clock: inner.books.clock.clone(),
        });
        if est.ttl.is_some() {
            inner.books.leases.insert(id, held.clone());
        }
        Ok(Reservation {
            id,
            held,
            books: self.inner.books.clone(),
            leased: est.ttl.is_some(),
        })
    }

    /// Charges what the request really used and ends its reservation.
    pub fn commit(&self, r: Reservation, usage: Usage, cost_usd: f64) {
        r.commit(usage, cost_usd);
    }

    /// Runs lease expiry now (a periodic task calls it; expiry otherwise
    /// happens lazily on later inserts).
    pub fn sweep(&self) {
        self.inner.books.leases.run_pending_tasks();
    }

    /// Reservations held in the ledger's own lease cache now.
    pub fn held(&self) -> u64 {
        self.sweep();
        self.inner.books.leases.entry_count()
    }

    /// Ends `r` as a lost end would (lease expiry), keeping the value so a
    /// late commit can still correct the charge.
    #[cfg(test)]
    pub(crate) fn expire_now(&self, r: &Reservation) {
        r.expire();
    }
}
