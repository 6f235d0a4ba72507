//! Leases: the load a decision puts on its replica, held until the access log
//! reports the request's end. The log is lossy (a full buffer, a log stream
//! that is down, a restart), so a lease also ends by itself: after a bound
//! derived from the request (prefill of what is queued plus its own prompt,
//! then `max_tokens` at a slow decode rate; floor and ceiling from the
//! config), and earlier when the engine reports fewer requests than the
//! router holds (`reconcile`). Prefill is a shorter sub-lease: it ends when
//! Envoy reports the response's first body byte on the request's ext_proc
//! stream (`first_byte`), and at its own estimate when that report does not
//! come (the log only arrives at the end).
//!
//! A lease also carries the request's tenant `Charge`: the access log entry
//! that ends the lease commits it with the real usage; a lease that ends any
//! other way expires it (its estimate is charged) and keeps it a while by
//! nonce, so an entry that still arrives corrects the charge (`late_charge`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use moka::Expiry;
use moka::notification::RemovalCause;
use moka::sync::Cache;

use super::Decided;
use crate::config::LeaseConfig;
use crate::metrics::{PrefillEnded, Released, Results};
use crate::tenancy::charge::Charge;
use crate::topology::load::{ReplicaLoad, RequestGuard};

/// Most leases held at once; beyond it the oldest are released early.
const MAX_LEASES: u64 = 1 << 20;
/// Expired charges kept for an access log entry that comes late, and how long.
const MAX_LATE: u64 = 1 << 16;
const LATE_FOR: Duration = Duration::from_secs(600);
/// Shortest prefill sub-lease.
const MIN_PREFILL: Duration = Duration::from_millis(50);
/// ms of time to first token per 1000 tokens assumed before a fleet is measured.
const DEFAULT_PREFILL_MS_PER_K: f64 = 200.0;

#[derive(Debug)]
pub struct Lease {
    pub guard: RequestGuard,
    /// The decision this load belongs to.
    pub decided: Decided,
    pub started: Instant,
    /// How long admission held the request before it was routed: Envoy's
    /// time to first byte counts from the request's arrival, the fleet's
    /// figures from its routing.
    pub held: Duration,
    bound: Duration,
    prefill_bound: Duration,
    /// The tenant's reservation, until the lease ends (taken once).
    charge: Mutex<Option<Charge>>,
}

impl Lease {
    /// The request's charge, to commit (once; `None` after).
    pub fn take_charge(&self) -> Option<Charge> {
        self.charge.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// An expired charge waiting for a late entry.
type Late = Arc<Mutex<Option<Charge>>>;

/// A lease that ends without its entry: the charge expires (in-flight
/// capacity back, estimate charged) and waits for a late entry.
fn expire_charge(late: &Cache<u64, Late>, nonce: u64, l: &Lease) {
    if let Some(c) = l.take_charge() {
        c.expire();
        late.insert(nonce, Arc::new(Mutex::new(Some(c))));
    }
}

/// What a lease's bound is computed from.
#[derive(Clone, Copy, Debug, Default)]
pub struct LeaseInput {
    /// Prefill tokens: the request's uncached ones plus those queued ahead.
    pub prefill_tokens: u64,
    pub max_tokens: Option<u32>,
    /// The fleet's measured ms of time to first token per 1000 tokens.
    pub prefill_ms_per_k: Option<f64>,
    /// Time admission held the request before routing it.
    pub held: Duration,
}

/// (whole lease, prefill sub-lease).
pub fn bounds(cfg: &LeaseConfig, i: &LeaseInput) -> (Duration, Duration) {
    let per_k = i
        .prefill_ms_per_k
        .filter(|v| v.is_finite() && *v > 0.0)
        .unwrap_or(DEFAULT_PREFILL_MS_PER_K);
    let prefill_ms = per_k * (i.prefill_tokens as f64 + super::figures::OVERHEAD_TOKENS) / 1000.0;
    let out = f64::from(i.max_tokens.unwrap_or(cfg.default_max_tokens));
    let decode_ms = out / cfg.decode_tokens_per_sec * 1000.0;
    let max = cfg.max_ms as f64;
    // Twice the estimate: a lease that ends early undercounts a live request.
    let whole = (2.0 * (prefill_ms + decode_ms))
        .max(cfg.min_ms as f64)
        .min(max);
    // Never panics: the whole bound may be below the prefill floor.
    let prefill = (2.0 * prefill_ms)
        .max(MIN_PREFILL.as_millis() as f64)
        .min(whole);
    (
        Duration::from_millis(whole as u64),
        Duration::from_millis(prefill as u64),
    )
}

struct WholeBound;
impl Expiry<u64, Arc<Lease>> for WholeBound {
    fn expire_after_create(&self, _: &u64, l: &Arc<Lease>, _: Instant) -> Option<Duration> {
        Some(l.bound)
    }
}

struct PrefillBound;
impl Expiry<u64, Arc<Lease>> for PrefillBound {
    fn expire_after_create(&self, _: &u64, l: &Arc<Lease>, _: Instant) -> Option<Duration> {
        Some(l.prefill_bound)
    }
}

/// Leases by decision nonce (only fleetroute writes nonces: a client cannot
/// end another request's lease).
pub struct Leases {
    whole: Cache<u64, Arc<Lease>>,
    prefill: Cache<u64, Arc<Lease>>,
    late: Cache<u64, Late>,
    released: Results<Released>,
    prefill_ended: Results<PrefillEnded>,
}

impl Leases {
    /// `released` counts leases by how they ended, `prefill_ended` their
    /// prefill shares.
    pub fn new(released: Results<Released>, prefill_ended: Results<PrefillEnded>) -> Self {
        let counted = released.clone();
        let late: Cache<u64, Late> = Cache::builder()
            .max_capacity(MAX_LATE)
            .time_to_live(LATE_FOR)
            .build();
        let expired = late.clone();
        let whole = Cache::builder()
            .max_capacity(MAX_LEASES)
            .expire_after(WholeBound)
            .eviction_listener(move |nonce: Arc<u64>, l: Arc<Lease>, cause| {
                let why = match cause {
                    RemovalCause::Expired => Released::Expired,
                    RemovalCause::Size => Released::Evicted,
                    // Explicit removals (`end`, `reconcile`) count themselves.
                    _ => return,
                };
                l.guard.release();
                expire_charge(&expired, *nonce, &l);
                counted.inc(why);
            })
            .build();
        let estimated = prefill_ended.clone();
        let prefill = Cache::builder()
            .max_capacity(MAX_LEASES)
            .expire_after(PrefillBound)
            .eviction_listener(move |_, l: Arc<Lease>, cause| {
                l.guard.prefill_done();
                if cause == RemovalCause::Expired {
                    estimated.inc(PrefillEnded::Estimate);
                }
            })
            .build();
        Leases {
            whole,
            prefill,
            late,
            released,
            prefill_ended,
        }
    }

    pub fn hold(
        &self,
        nonce: u64,
        guard: RequestGuard,
        decided: Decided,
        cfg: &LeaseConfig,
        input: &LeaseInput,
        charge: Option<Charge>,
    ) {
        let (bound, prefill_bound) = bounds(cfg, input);
        let lease = Arc::new(Lease {
            guard,
            decided,
            started: crate::clock::now(),
            held: input.held,
            bound,
            prefill_bound,
            charge: Mutex::new(charge),
        });
        self.prefill.insert(nonce, lease.clone());
        self.whole.insert(nonce, lease);
    }

    /// The access log reported the request's end: release its load now.
    /// `None` when the lease already ended (by its bound or reconciliation).
    pub fn end(&self, nonce: u64) -> Option<Arc<Lease>> {
        if self.prefill.remove(&nonce).is_some() {
            self.prefill_ended.inc(PrefillEnded::RequestEnd);
        }
        let lease = self.whole.remove(&nonce)?;
        lease.guard.release();
        self.released.inc(Released::Logged);
        Some(lease)
    }

    /// The replica sent the request's first body byte: its prefill is over.
    /// False when the prefill share had already ended (by its estimate, or
    /// with the whole lease).
    pub fn first_byte(&self, nonce: u64) -> bool {
        let Some(lease) = self.prefill.remove(&nonce) else {
            return false;
        };
        lease.guard.first_byte();
        self.prefill_ended.inc(PrefillEnded::FirstByte);
        true
    }

    /// The charge of a lease that ended before its entry arrived (expired,
    /// reconciled or evicted), to commit now: the commit corrects the
    /// estimate charged at expiry. Once per nonce.
    pub fn late_charge(&self, nonce: u64) -> Option<Charge> {
        if !self.late.contains_key(&nonce) {
            // The lease may have just expired without its listener having run.
            self.whole.run_pending_tasks();
        }
        let late = self.late.remove(&nonce)?;
        let mut slot = late.lock().unwrap_or_else(|e| e.into_inner());
        slot.take()
    }

    /// Runs expirations (called on the writer's tick).
    pub fn run_pending(&self) {
        self.whole.run_pending_tasks();
        self.prefill.run_pending_tasks();
        self.late.run_pending_tasks();
    }

    pub fn held(&self) -> u64 {
        self.whole.entry_count()
    }

    /// The engine reports `engine_count` requests (running + waiting) while
    /// the router holds more leases older than `grace` on it: release the
    /// oldest of those beyond the engine's count. Only this instance's own
    /// leases count: the engine's figure includes the peers' requests, and
    /// each instance releasing a share of a joint surplus could release
    /// more than there is.
    pub fn reconcile(&self, load: &Arc<ReplicaLoad>, engine_count: u32, grace: Duration) -> u32 {
        // Cheap check first: the walk below only runs on a surplus.
        if load.own_inflight() <= engine_count {
            return 0;
        }
        let now = crate::clock::now();
        let mut old: Vec<(Instant, u64)> = self
            .whole
            .iter()
            .filter(|(_, l)| l.guard.is_on(load) && now.duration_since(l.started) > grace)
            .map(|(k, l)| (l.started, *k))
            .collect();
        // Young leases may not have reached the engine: only old ones beyond
        // what the engine reports are surplus.
        let surplus = old.len().saturating_sub(engine_count as usize);
        old.sort_unstable();
        let mut released = 0;
        for (_, nonce) in old.into_iter().take(surplus) {
            self.prefill.invalidate(&nonce);
            if let Some(l) = self.whole.remove(&nonce) {
                l.guard.release();
                expire_charge(&self.late, nonce, &l);
                self.released.inc(Released::Reconciled);
                released += 1;
            }
        }
        released
    }
}

#[cfg(test)]
#[path = "lease_tests.rs"]
mod tests;
