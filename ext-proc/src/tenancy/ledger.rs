//! The local accountant: reserves an estimate when a request is admitted,
//! charges the real usage when it ends.
//!
//! Hot path: one map read (papaya, lock-free), a few atomic adds, one lease
//! insert. A reservation is a value: `commit` consumes it, dropping it
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

use moka::Expiry;
use moka::sync::Cache;

use super::clock::Clock;
use super::config::{TenantLimits, TenantsConfig};
use super::shared::{Allowance, SharedState};
use super::window::{Epoched, MinuteWindow};

/// The bucket every tenant beyond `MAX_TENANTS` shares (with `default` limits).
pub const OTHER: &str = crate::config::OTHER_TENANT;
/// Most tenants tracked one by one.
pub const MAX_TENANTS: usize = 65_536;
/// Most reservations held at once; beyond it the oldest are expired early.
const MAX_LEASES: u64 = 1 << 20;
/// Longest tenant id tracked as itself; longer ones count as `other`.
const MAX_ID_LEN: usize = 128;
/// What a refusal of an in-flight limit advises: in-flight capacity frees
/// as requests end, which the ledger cannot predict.
const IN_FLIGHT_RETRY: Duration = Duration::from_secs(1);

/// What one request may use, known at admission.
#[derive(Clone, Copy, Debug)]
pub struct Estimate {
    pub prompt_tokens: u64,
    pub max_tokens: u64,
    /// Price of the chosen fleet, USD per token (prompt and completion alike
    /// for the estimate; the commit is priced by the caller).
    pub usd_per_token: f64,
    /// Lease bound: the reservation ends by itself after this.
    pub ttl: Duration,
}

impl Estimate {
    pub fn tokens(&self) -> u64 {
        self.prompt_tokens.saturating_add(self.max_tokens)
    }
    fn micro_usd(&self) -> u64 {
        micro(self.tokens() as f64 * self.usd_per_token)
    }
}

/// What a request really used, reported when it ends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// All prompt tokens, cached ones included.
    pub prompt: u64,
    pub cached: u64,
    pub completion: u64,
}

impl Usage {
    /// Tokens charged against the limits: prompt plus completion.
    pub fn tokens(&self) -> u64 {
        self.prompt.saturating_add(self.completion)
    }
}

fn micro(usd: f64) -> u64 {
    if usd.is_finite() && usd > 0.0 {
        (usd * 1e6).round().min(1e15) as u64
    } else {
        0
    }
}

/// The limit a refusal names (also its name in the 429 body and metrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    MaxRequestsInFlight,
    MaxTokensInFlight,
    TokensPerMinute,
    Budget,
}

impl Limit {
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::MaxRequestsInFlight => "max_requests_in_flight",
            Limit::MaxTokensInFlight => "max_tokens_in_flight",
            Limit::TokensPerMinute => "tokens_per_minute",
            Limit::Budget => "budget",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Refusal {
    pub limit: Limit,
    pub retry_after: Duration,
    /// The shared per-minute allowance ran out and a refill from Redis may
    /// admit it (see `shared::Shared::admit`).
    pub refill: bool,
}

/// A tenant's counters. Cumulative `charged_*` are what was charged since
/// start (for metrics and proofs); the rest are current.
#[derive(Debug)]
pub struct TenantState {
    pub id: Arc<str>,
    pub limits: TenantLimits,
    pub requests: AtomicU64,
    pub tokens: AtomicU64,
    pub minute: MinuteWindow,
    /// Spend in the current budget period, micro-USD.
    pub spend: Epoched,
    /// Estimated cost of reservations held, micro-USD.
    pub reserved_micro_usd: AtomicU64,
    pub charged_tokens: AtomicU64,
    pub charged_micro_usd: AtomicU64,
    /// Present when per-minute tokens are shared through Redis.
    pub allowance: Option<Allowance>,
}

impl TenantState {
    fn new(id: &str, limits: &TenantLimits, shared: bool) -> Self {
        TenantState {
            id: id.into(),
            limits: limits.clone(),
            requests: AtomicU64::new(0),
            tokens: AtomicU64::new(0),
            minute: MinuteWindow::default(),
            spend: Epoched::default(),
            reserved_micro_usd: AtomicU64::new(0),
            charged_tokens: AtomicU64::new(0),
            charged_micro_usd: AtomicU64::new(0),
            allowance: (shared && limits.tokens_per_minute.is_some()).then(Allowance::default),
        }
    }

    /// Tokens counted in the per-minute window now (local window only).
    pub fn minute_used(&self, now_ms: u64) -> u64 {
        self.minute.used(now_ms)
    }
}

const LIVE: u8 = 0;
const ENDED: u8 = 1;
const EXPIRED: u8 = 2;

#[derive(Debug)]
struct Held {
    tenant: Arc<TenantState>,
    tokens: u64,
    micro_usd: u64,
    /// Minute bucket (local window) or minute (shared allowance).
    epoch: u64,
    ttl: Duration,
    state: AtomicU8,
    clock: Clock,
}

struct LeaseBound;
impl Expiry<u64, Arc<Held>> for LeaseBound {
    fn expire_after_create(
        &self,
        _: &u64,
        h: &Arc<Held>,
        _: std::time::Instant,
    ) -> Option<Duration> {
        Some(h.ttl)
    }
}

struct Inner {
    cfg: TenantsConfig,
    tenants: papaya::HashMap<Arc<str>, Arc<TenantState>>,
    other: Arc<TenantState>,
    leases: Cache<u64, Arc<Held>>,
    next_id: AtomicU64,
    clock: Clock,
    shared: Option<Arc<SharedState>>,
    max_tenants: usize,
}

/// Cheap to clone; every clone is the same ledger.
#[derive(Clone)]
pub struct Ledger {
    inner: Arc<Inner>,
}

/// An admitted request's hold on its tenant's limits. Consume it with
/// `Ledger::commit`; dropping it releases the hold without a charge.
#[must_use = "dropping a reservation releases it at once"]
pub struct Reservation {
    id: u64,
    held: Arc<Held>,
    ledger: Arc<Inner>,
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation")
            .field("tenant", &self.held.tenant.id)
            .field("tokens", &self.held.tokens)
            .finish()
    }
}

impl Reservation {
    pub fn tenant(&self) -> &str {
        &self.held.tenant.id
    }
    pub fn tokens(&self) -> u64 {
        self.held.tokens
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        // Also after a commit or an expiry run by hand: the lease goes.
        self.held.end(ENDED);
        self.ledger.leases.invalidate(&self.id);
    }
}

impl Held {
    /// Ends a live hold once: frees in-flight capacity; an expiry also
    /// charges the estimate. False when it had already ended.
    fn end(&self, how: u8) -> bool {
        if self
            .state
            .compare_exchange(LIVE, how, Relaxed, Relaxed)
            .is_err()
        {
            return false;
        }
        let t = &self.tenant;
        t.requests.fetch_sub(1, Relaxed);
        t.tokens.fetch_sub(self.tokens, Relaxed);
        t.reserved_micro_usd.fetch_sub(self.micro_usd, Relaxed);
        if how == EXPIRED {
            // Kept in the per-minute count; charged to the budget.
            t.charge_spend(&self.clock, self.micro_usd);
            t.charged_tokens.fetch_add(self.tokens, Relaxed);
        } else {
            t.unreserve_minute(self.epoch, self.tokens);
        }
        true
    }
}

impl TenantState {
    fn charge_spend(&self, clock: &Clock, micro_usd: u64) {
        if let Some(b) = &self.limits.budget {
            self.spend.add(clock.period(b.per), micro_usd);
        }
        self.charged_micro_usd.fetch_add(micro_usd, Relaxed);
    }

    fn unreserve_minute(&self, epoch: u64, tokens: u64) {
        if self.limits.tokens_per_minute.is_none() {
            return;
        }
        match &self.allowance {
            Some(a) => a.give_back(epoch, tokens),
            None => self.minute.sub(epoch, tokens),
        }
    }

    /// Usage beyond what was reserved, counted from now.
    fn charge_minute(&self, shared: Option<&SharedState>, clock: &Clock, tokens: u64) {
        if self.limits.tokens_per_minute.is_none() {
            return;
        }
        match &self.allowance {
            Some(a) => a.spend(shared, clock, tokens),
            None => {
                self.minute.add(clock.now_ms(), tokens);
            }
        }
    }
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
                cfg,
                tenants,
                other,
                leases,
                next_id: AtomicU64::new(0),
                clock,
                shared,
                max_tenants,
            }),
        }
    }

    pub fn clock(&self) -> &Clock {
        &self.inner.clock
    }

    /// The tenant's counters: tracked by id up to `MAX_TENANTS`, `other` after.
    pub fn tenant(&self, id: &str) -> Arc<TenantState> {
        let i = &self.inner;
        let pin = i.tenants.pin();
        if let Some(t) = pin.get(id) {
            return t.clone();
        }
        if id.is_empty() || id.len() > MAX_ID_LEN || pin.len() >= i.max_tenants {
            return i.other.clone();
        }
        let l = i.cfg.limits_for(id);
        let fresh = Arc::new(TenantState::new(id, l, i.shared.is_some()));
        pin.get_or_insert(id.into(), fresh).clone()
    }

    /// Every tenant tracked by id (not `other`).
    pub fn tenants(&self) -> Vec<Arc<TenantState>> {
        self.inner.tenants.pin().values().cloned().collect()
    }

    pub fn other(&self) -> Arc<TenantState> {
        self.inner.other.clone()
    }

    /// Reserves `est` for one request of `tenant`, or names the limit it
    /// would pass and when to retry.
    pub fn admit(&self, tenant: &str, est: &Estimate) -> Result<Reservation, Refusal> {
        let t = self.tenant(tenant);
        let inner = &self.inner;
        let now = inner.clock.now_ms();
        let tokens = est.tokens();
        let cost = est.micro_usd();
        let l = &t.limits;
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

        let mut epoch = 0;
        if let Some(limit) = l.tokens_per_minute {
            match &t.allowance {
                Some(a) => {
                    let shared = inner.shared.as_deref().expect("allowance implies shared");
                    match a.take(shared, &inner.clock, limit, tokens) {
                        Ok(minute) => epoch = minute,
                        Err(retry) => {
                            undo_flight();
                            let refill = !shared.degraded() && tokens <= limit;
                            return refuse(Limit::TokensPerMinute, retry, refill);
                        }
                    }
                }
                None => {
                    epoch = t.minute.add(now, tokens);
                    if t.minute.used(now) > limit {
                        t.minute.sub(epoch, tokens);
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

        if let Some(b) = &l.budget {
            let r = t.reserved_micro_usd.fetch_add(cost, Relaxed) + cost;
            let period = inner.clock.period(b.per);
            if t.spend.get(period).saturating_add(r) > (b.usd * 1e6) as u64 {
                t.reserved_micro_usd.fetch_sub(cost, Relaxed);
                t.unreserve_minute(epoch, tokens);
                undo_flight();
                let wait = inner.clock.until_next_period(b.per);
                return refuse(Limit::Budget, wait, false);
            }
        } else {
            t.reserved_micro_usd.fetch_add(cost, Relaxed);
        }

        let id = inner.next_id.fetch_add(1, Relaxed);
        let held = Arc::new(Held {
            tenant: t,
            tokens,
            micro_usd: cost,
            epoch,
            ttl: est.ttl,
            state: AtomicU8::new(LIVE),
            clock: inner.clock.clone(),
        });
        inner.leases.insert(id, held.clone());
        Ok(Reservation {
            id,
            held,
            ledger: self.inner.clone(),
        })
    }

    /// Charges what the request really used and ends its reservation.
    pub fn commit(&self, r: Reservation, usage: Usage, cost_usd: f64) {
        let h = &r.held;
        let t = &h.tenant;
        let inner = &self.inner;
        let used = usage.tokens();
        let spent = micro(cost_usd);
        if h.end(ENDED) {
            t.charged_tokens.fetch_add(used, Relaxed);
            t.charge_spend(&inner.clock, spent);
            t.charge_minute(inner.shared.as_deref(), &inner.clock, used);
        } else {
            // Expired first: the estimate was charged; correct it to `usage`.
            if used >= h.tokens {
                let more = used - h.tokens;
                t.charged_tokens.fetch_add(more, Relaxed);
                t.charge_minute(inner.shared.as_deref(), &inner.clock, more);
            } else {
                let less = h.tokens - used;
                t.charged_tokens.fetch_sub(less, Relaxed);
                t.unreserve_minute(h.epoch, less);
            }
            if let Some(b) = &t.limits.budget {
                let p = inner.clock.period(b.per);
                if spent >= h.micro_usd {
                    t.spend.add(p, spent - h.micro_usd);
                } else {
                    t.spend.sub(p, h.micro_usd - spent);
                }
            }
            if spent >= h.micro_usd {
                t.charged_micro_usd.fetch_add(spent - h.micro_usd, Relaxed);
            } else {
                t.charged_micro_usd.fetch_sub(h.micro_usd - spent, Relaxed);
            }
        }
        // `r`'s Drop finds the hold ended and removes the lease.
    }

    /// Runs lease expiry now (a periodic task calls it; expiry otherwise
    /// happens lazily on later inserts).
    pub fn sweep(&self) {
        self.inner.leases.run_pending_tasks();
    }

    /// Reservations held now.
    pub fn held(&self) -> u64 {
        self.sweep();
        self.inner.leases.entry_count()
    }

    /// Ends `r` as a lost end would (lease expiry), keeping the value so a
    /// late commit can still correct the charge.
    #[cfg(test)]
    pub(crate) fn expire_now(&self, r: &Reservation) {
        r.held.end(EXPIRED);
    }
}
