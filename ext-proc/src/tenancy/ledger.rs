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
use moka::Expiry;
use moka::sync::Cache;

use super::clock::Clock;
use super::config::{BudgetPeriod, TenantLimits, TenantsConfig};
use super::shared::{Allowance, SharedState};
use super::window::{Epoched, MinuteWindow};

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

/// What one request may use, known at admission.
#[derive(Clone, Copy, Debug)]
pub struct Estimate {
    pub prompt_tokens: u64,
    pub max_tokens: u64,
    /// What the estimate costs on the chosen fleet, USD (reserved against
    /// the budget; the commit is priced by the caller).
    pub cost_usd: f64,
    /// Lease bound: the reservation ends by itself after this. `None` when
    /// the caller's own lease ends it (`Reservation::expire`).
    pub ttl: Option<Duration>,
}

impl Estimate {
    pub fn tokens(&self) -> u64 {
        self.prompt_tokens.saturating_add(self.max_tokens)
    }
    fn micro_usd(&self) -> u64 {
        micro(self.cost_usd)
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

pub(crate) fn micro(usd: f64) -> u64 {
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
    pub const ALL: [Limit; 4] = [
        Limit::MaxRequestsInFlight,
        Limit::MaxTokensInFlight,
        Limit::TokensPerMinute,
        Limit::Budget,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Limit::MaxRequestsInFlight => "max_requests_in_flight",
            Limit::MaxTokensInFlight => "max_tokens_in_flight",
            Limit::TokensPerMinute => "tokens_per_minute",
            Limit::Budget => "budget",
        }
    }

    fn index(self) -> usize {
        self as usize
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
/// start (for metrics and proofs); the rest are current. Every counter is
/// kept whatever the limits, so a reload that adds a limit finds the usage
/// that came before it.
#[derive(Debug)]
pub struct TenantState {
    pub id: Arc<str>,
    limits: ArcSwap<TenantLimits>,
    pub requests: AtomicU64,
    pub tokens: AtomicU64,
    pub minute: MinuteWindow,
    /// Spend in the current UTC day and month, micro-USD.
    spend_day: Epoched,
    spend_month: Epoched,
    /// Estimated cost of reservations held, micro-USD.
    pub reserved_micro_usd: AtomicU64,
    pub charged_tokens: AtomicU64,
    pub charged_micro_usd: AtomicU64,
    /// Reservations made; each then ends as exactly one of committed,
    /// expired (a lost end, not corrected by a late commit) or dropped.
    pub admitted: AtomicU64,
    pub committed: AtomicU64,
    pub expired: AtomicU64,
    pub dropped: AtomicU64,
    /// Commits that arrived after their lease had expired (and corrected it).
    pub late_commits: AtomicU64,
    refused: [AtomicU64; 4],
    /// Present when per-minute tokens are shared through Redis.
    pub allowance: Option<Allowance>,
}

impl TenantState {
    fn new(id: &str, limits: &TenantLimits, shared: bool) -> Self {
        TenantState {
            id: id.into(),
            limits: ArcSwap::from_pointee(limits.clone()),
            requests: AtomicU64::new(0),
            tokens: AtomicU64::new(0),
            minute: MinuteWindow::default(),
            spend_day: Epoched::default(),
            spend_month: Epoched::default(),
            reserved_micro_usd: AtomicU64::new(0),
            charged_tokens: AtomicU64::new(0),
            charged_micro_usd: AtomicU64::new(0),
            admitted: AtomicU64::new(0),
            committed: AtomicU64::new(0),
            expired: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            late_commits: AtomicU64::new(0),
            refused: Default::default(),
            allowance: shared.then(Allowance::default),
        }
    }

    /// The limits in effect for this tenant now.
    pub fn limits(&self) -> arc_swap::Guard<Arc<TenantLimits>> {
        self.limits.load()
    }

    /// Tokens counted in the per-minute window now (local window only).
    pub fn minute_used(&self, now_ms: u64) -> u64 {
        self.minute.used(now_ms)
    }

    /// Spend in the current period of `per`, micro-USD.
    pub fn spent_micro_usd(&self, clock: &Clock, per: BudgetPeriod) -> u64 {
        self.spend(per).get(clock.period(per))
    }

    /// Requests refused by `limit` since start.
    pub fn refused(&self, limit: Limit) -> u64 {
        self.refused[limit.index()].load(Relaxed)
    }

    /// Counts a refusal (by the caller, once per request it refuses).
    pub fn count_refusal(&self, limit: Limit) {
        self.refused[limit.index()].fetch_add(1, Relaxed);
    }

    fn spend(&self, per: BudgetPeriod) -> &Epoched {
        match per {
            BudgetPeriod::Day => &self.spend_day,
            BudgetPeriod::Month => &self.spend_month,
        }
    }

    fn add_spend(&self, clock: &Clock, micro_usd: u64) {
        for per in [BudgetPeriod::Day, BudgetPeriod::Month] {
            self.spend(per).add(clock.period(per), micro_usd);
        }
    }

    fn sub_spend(&self, clock: &Clock, micro_usd: u64) {
        for per in [BudgetPeriod::Day, BudgetPeriod::Month] {
            self.spend(per).sub(clock.period(per), micro_usd);
        }
    }
}

const LIVE: u8 = 0;
const COMMITTED: u8 = 1;
const DROPPED: u8 = 2;
const EXPIRED: u8 = 3;

#[derive(Debug)]
struct Held {
    tenant: Arc<TenantState>,
    tokens: u64,
    micro_usd: u64,
    /// Bucket of the local per-minute window the estimate went to.
    window_epoch: u64,
    /// Minute of the shared allowance the estimate was taken from.
    allowance_minute: Option<u64>,
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
    cfg: ArcSwap<TenantsConfig>,
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
/// `commit`; `expire` ends it as a lost end would; dropping a live one
/// releases the hold without a charge.
#[must_use = "dropping a reservation releases it at once"]
pub struct Reservation {
    id: u64,
    held: Arc<Held>,
    ledger: Arc<Inner>,
    /// In the ledger's own lease cache (an `Estimate` with a `ttl`).
    leased: bool,
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
    pub fn state(&self) -> &Arc<TenantState> {
        &self.held.tenant
    }
    pub fn tokens(&self) -> u64 {
        self.held.tokens
    }
    /// The estimate's cost, micro-USD.
    pub fn micro_usd(&self) -> u64 {
        self.held.micro_usd
    }

    /// Ends the reservation as a lost end (lease expiry): in-flight
    /// capacity comes back and the estimate is charged. Keep the value: a
    /// commit that still arrives corrects the charge to the real usage.
    pub fn expire(&self) {
        self.held.end(EXPIRED);
    }

    /// Charges what the request really used and ends the reservation.
    pub fn commit(self, usage: Usage, cost_usd: f64) {
        let h = &self.held;
        let t = &h.tenant;
        let inner = &self.ledger;
        let used = usage.tokens();
        let spent = micro(cost_usd);
        if h.end(COMMITTED) {
            t.committed.fetch_add(1, Relaxed);
            t.charged_tokens.fetch_add(used, Relaxed);
            t.charged_micro_usd.fetch_add(spent, Relaxed);
            t.add_spend(&inner.clock, spent);
            h.charge_minute(inner.shared.as_deref(), used);
            return;
        }
        if h.state.load(Relaxed) != EXPIRED {
            return;
        }
        // Expired first: the estimate was charged; correct it to `usage`.
        // Once: the state moves on from EXPIRED.
        if h.state
            .compare_exchange(EXPIRED, COMMITTED, Relaxed, Relaxed)
            .is_err()
        {
            return;
        }
        t.expired.fetch_sub(1, Relaxed);
        t.committed.fetch_add(1, Relaxed);
        t.late_commits.fetch_add(1, Relaxed);
        if used >= h.tokens {
            let more = used - h.tokens;
            t.charged_tokens.fetch_add(more, Relaxed);
            h.charge_minute(inner.shared.as_deref(), more);
        } else {
            let less = h.tokens - used;
            t.charged_tokens.fetch_sub(less, Relaxed);
            h.unreserve_minute(less);
        }
        if spent >= h.micro_usd {
            let more = spent - h.micro_usd;
            t.add_spend(&inner.clock, more);
            t.charged_micro_usd.fetch_add(more, Relaxed);
        } else {
            let less = h.micro_usd - spent;
            t.sub_spend(&inner.clock, less);
            t.charged_micro_usd.fetch_sub(less, Relaxed);
        }
        // Drop finds the hold ended and removes the lease.
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        // Also after a commit or an expiry: only a live hold is released.
        if self.held.end(DROPPED) {
            self.held.tenant.dropped.fetch_add(1, Relaxed);
        }
        if self.leased {
            self.ledger.leases.invalidate(&self.id);
        }
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
        match how {
            // Kept in the per-minute count; charged to the budget.
            EXPIRED => {
                t.expired.fetch_add(1, Relaxed);
                t.add_spend(&self.clock, self.micro_usd);
                t.charged_micro_usd.fetch_add(self.micro_usd, Relaxed);
                t.charged_tokens.fetch_add(self.tokens, Relaxed);
            }
            _ => self.unreserve_minute(self.tokens),
        }
        true
    }

    /// Takes `tokens` of the estimate back out of the per-minute counts.
    fn unreserve_minute(&self, tokens: u64) {
        let t = &self.tenant;
        t.minute.sub(self.window_epoch, tokens);
        if let (Some(a), Some(m)) = (&t.allowance, self.allowance_minute) {
            a.give_back(m, tokens);
        }
    }

    /// Usage beyond what was reserved, counted from now.
    fn charge_minute(&self, shared: Option<&SharedState>, tokens: u64) {
        let t = &self.tenant;
        t.minute.add(self.clock.now_ms(), tokens);
        if let (Some(a), Some(_)) = (&t.allowance, self.allowance_minute) {
            a.spend(shared, &self.clock, tokens);
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
                cfg: ArcSwap::from_pointee(cfg),
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
        let on = i.shared.is_some();
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
        let fresh = Arc::new(TenantState::new(id, l, i.shared.is_some()));
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
        let now = inner.clock.now_ms();
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
            match (&t.allowance, inner.shared.as_deref()) {
                (Some(a), Some(shared)) => match a.take(shared, &inner.clock, limit, tokens) {
                    Ok(minute) => allowance_minute = Some(minute),
                    Err(retry) => {
                        t.minute.sub(window_epoch, tokens);
                        undo_flight();
                        let refill = !shared.degraded() && tokens <= limit;
                        return refuse(Limit::TokensPerMinute, retry, refill);
                    }
                },
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
            && t.spent_micro_usd(&inner.clock, b.per).saturating_add(r) > (b.usd * 1e6) as u64
        {
            t.reserved_micro_usd.fetch_sub(cost, Relaxed);
            unreserve_minute();
            undo_flight();
            let wait = inner.clock.until_next_period(b.per);
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
            clock: inner.clock.clone(),
        });
        if est.ttl.is_some() {
            inner.leases.insert(id, held.clone());
        }
        Ok(Reservation {
            id,
            held,
            ledger: self.inner.clone(),
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
        self.inner.leases.run_pending_tasks();
    }

    /// Reservations held in the ledger's own lease cache now.
    pub fn held(&self) -> u64 {
        self.sweep();
        self.inner.leases.entry_count()
    }

    /// Ends `r` as a lost end would (lease expiry), keeping the value so a
    /// late commit can still correct the charge.
    #[cfg(test)]
    pub(crate) fn expire_now(&self, r: &Reservation) {
        r.expire();
    }
}
