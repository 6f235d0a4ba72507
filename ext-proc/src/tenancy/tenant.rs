//! One tenant's counters, read and moved on the hot path with atomics.

use std::sync::Arc;

use arc_swap::ArcSwap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::allowance::Allowance;
use super::clock::Clock;
use super::config::{BudgetPeriod, TenantLimits};
use super::limits::Limit;
use super::window::{Epoched, MinuteWindow};

/// A tenant's counters. Cumulative `charged_*` are what was charged since
/// start (for metrics and proofs); the rest are current. Every counter is
/// kept whatever the limits, so a reload that adds a limit finds the usage
/// that came before it.
#[derive(Debug)]
pub struct TenantState {
    pub id: Arc<str>,
    pub(super) limits: ArcSwap<TenantLimits>,
    pub requests: AtomicU64,
    pub tokens: AtomicU64,
    pub minute: MinuteWindow,
    /// Spend in the current UTC day and month, micro-USD.
    pub(super) spend_day: Epoched,
    pub(super) spend_month: Epoched,
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
    pub(super) refused: [AtomicU64; 4],
    /// Present when per-minute tokens are shared through Redis.
    pub allowance: Option<Allowance>,
}

impl TenantState {
    pub(super) fn new(id: &str, limits: &TenantLimits, shared: bool) -> Self {
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

    pub(super) fn spend(&self, per: BudgetPeriod) -> &Epoched {
        match per {
            BudgetPeriod::Day => &self.spend_day,
            BudgetPeriod::Month => &self.spend_month,
        }
    }

    pub(super) fn add_spend(&self, clock: &Clock, micro_usd: u64) {
        for per in [BudgetPeriod::Day, BudgetPeriod::Month] {
            self.spend(per).add(clock.period(per), micro_usd);
        }
    }

    pub(super) fn sub_spend(&self, clock: &Clock, micro_usd: u64) {
        for per in [BudgetPeriod::Day, BudgetPeriod::Month] {
            self.spend(per).sub(clock.period(per), micro_usd);
        }
    }
}
