//! A reservation: an admitted request's hold on its tenant's limits, ended
//! exactly once (commit, drop or lease expiry; see `ledger.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
use std::time::Duration;

use moka::Expiry;

use super::allowance::SharedState;
use super::clock::Clock;
use super::limits::Usage;
use super::limits::micro;
use super::tenant::TenantState;
use moka::sync::Cache;

pub(super) const LIVE: u8 = 0;
pub(super) const COMMITTED: u8 = 1;
pub(super) const DROPPED: u8 = 2;
pub(super) const EXPIRED: u8 = 3;

#[derive(Debug)]
pub(super) struct Held {
    pub(super) tenant: Arc<TenantState>,
    pub(super) tokens: u64,
    pub(super) micro_usd: u64,
    /// Bucket of the local per-minute window the estimate went to.
    pub(super) window_epoch: u64,
    /// Minute of the shared allowance the estimate was taken from.
    pub(super) allowance_minute: Option<u64>,
    pub(super) ttl: Duration,
    pub(super) state: AtomicU8,
    pub(super) clock: Clock,
}

pub(super) struct LeaseBound;
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

/// An admitted request's hold on its tenant's limits. Consume it with
/// `commit`; `expire` ends it as a lost end would; dropping a live one
/// releases the hold without a charge.
/// What a reservation needs of its ledger after it is handed out: the
/// leases (to end its own), the clock and the shared counters it charges.
pub(super) struct Books {
    pub(super) leases: Cache<u64, Arc<Held>>,
    pub(super) clock: Clock,
    pub(super) shared: Option<Arc<SharedState>>,
}

#[must_use = "dropping a reservation releases it at once"]
pub struct Reservation {
    pub(super) id: u64,
    pub(super) held: Arc<Held>,
    pub(super) books: Arc<Books>,
    /// In the ledger's own lease cache (an `Estimate` with a `ttl`).
    pub(super) leased: bool,
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
        let inner = &*self.books;
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
            self.books.leases.invalidate(&self.id);
        }
    }
}

impl Held {
    /// Ends a live hold once: frees in-flight capacity; an expiry also
    /// charges the estimate. False when it had already ended.
    pub(super) fn end(&self, how: u8) -> bool {
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
    pub(super) fn unreserve_minute(&self, tokens: u64) {
        let t = &self.tenant;
        t.minute.sub(self.window_epoch, tokens);
        if let (Some(a), Some(m)) = (&t.allowance, self.allowance_minute) {
            a.give_back(m, tokens);
        }
    }

    /// Usage beyond what was reserved, counted from now.
    pub(super) fn charge_minute(&self, shared: Option<&SharedState>, tokens: u64) {
        let t = &self.tenant;
        t.minute.add(self.clock.now_ms(), tokens);
        if let (Some(a), Some(_)) = (&t.allowance, self.allowance_minute) {
            a.spend(shared, &self.clock, tokens);
        }
    }
}
