//! The requests one stage holds, per class, bounded. The order they leave
//! in: the highest class first; inside a class, the tenant with the fewest
//! recent tokens (`shares`) first, then arrival. A full class queue makes
//! room for a lighter tenant by refusing the heaviest tenant's newest
//! request, so one tenant's flood cannot crowd out another's trickle.
//!
//! The queues sit behind a mutex that only the hold path takes: a request
//! that is admitted at once reads the per-class depth atomics and nothing
//! else.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::Notify;

use super::shares::Shares;
use crate::config::Priority;

/// One held request, as the queue and its own stream see it.
#[derive(Debug)]
pub struct Waiter {
    /// Arrival order (unique per process).
    pub id: u64,
    pub class: Priority,
    /// Hash of the tenant id: its account in `Shares`.
    pub tenant: u64,
    /// Prefill tokens it will add (for the work held ahead of later ones).
    pub work: u64,
    pub arrived: Instant,
    /// Refused once this passes.
    pub deadline: Instant,
    /// The objective it is held to (ms from `arrived`).
    pub objective_ms: f64,
    notify: Notify,
    evicted: AtomicBool,
}

impl Waiter {
    pub fn new(
        id: u64,
        class: Priority,
        tenant: u64,
        work: u64,
        arrived: Instant,
        deadline: Instant,
        objective_ms: f64,
    ) -> Waiter {
        Waiter {
            id,
            class,
            tenant,
            work,
            arrived,
            deadline,
            objective_ms,
            notify: Notify::new(),
            evicted: AtomicBool::new(false),
        }
    }

    /// Woken when it becomes the head, or when it is evicted.
    pub async fn notified(&self) {
        self.notify.notified().await;
    }

    /// A lighter tenant took its place in a full queue.
    pub fn evicted(&self) -> bool {
        self.evicted.load(Relaxed)
    }
}

#[derive(Debug, Default)]
pub struct StageQueue {
    held: Mutex<[VecDeque<Arc<Waiter>>; 3]>,
    depth: [AtomicU32; 3],
    work: [AtomicU64; 3],
}

/// Why a request could not join the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Full;

impl StageQueue {
    fn lock(&self) -> MutexGuard<'_, [VecDeque<Arc<Waiter>>; 3]> {
        // A panic while holding it leaves the queues consistent (each change
        // is one push or remove): keep serving.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn depth(&self, c: Priority) -> u32 {
        self.depth[c.rank()].load(Relaxed)
    }

    /// Requests held in classes above `c`.
    pub fn held_above(&self, c: Priority) -> u32 {
        Priority::ALL[..c.rank()]
            .iter()
            .map(|&h| self.depth(h))
            .sum()
    }

    /// Prefill tokens held in `c` and the classes above it.
    pub fn work_at_or_above(&self, c: Priority) -> u64 {
        Priority::ALL[..=c.rank()]
            .iter()
            .map(|h| self.work[h.rank()].load(Relaxed))
            .sum()
    }

    fn counted(&self, w: &Waiter, joined: bool) {
        let (d, t) = (&self.depth[w.class.rank()], &self.work[w.class.rank()]);
        if joined {
            d.fetch_add(1, Relaxed);
            t.fetch_add(w.work, Relaxed);
        } else {
            d.fetch_sub(1, Relaxed);
            t.fetch_sub(w.work, Relaxed);
        }
    }

    /// Adds `w` to its class, which holds at most `limit`. When it is full,
    /// the newest request of the tenant with the most recent tokens leaves
    /// (returned, already told) if that tenant has more than `w`'s; else `w`
    /// is refused.
    pub fn push(
        &self,
        w: Arc<Waiter>,
        limit: u32,
        shares: &Shares,
        now: Instant,
    ) -> Result<Option<Arc<Waiter>>, Full> {
        let mut held = self.lock();
        let q = &mut held[w.class.rank()];
        let mut evicted = None;
        if q.len() >= limit as usize {
            let mine = shares.account(w.tenant, now);
            let heaviest = q
                .iter()
                .enumerate()
                .map(|(i, x)| (shares.account(x.tenant, now), x.id, i))
                .max();
            match heaviest {
                Some((theirs, _, i)) if theirs > mine => {
                    let out = q.remove(i).expect("index from iter");
                    out.evicted.store(true, Relaxed);
                    out.notify.notify_one();
                    self.counted(&out, false);
                    evicted = Some(out);
                }
                _ => return Err(Full),
            }
        }
        self.counted(&w, true);
        q.push_back(w);
        if evicted.is_some()
            && let Some(next) = Self::head_of(&held, shares, now)
        {
            // The evicted one may have been the head.
            next.notify.notify_one();
        }
        Ok(evicted)
    }

    fn head_of(
        held: &[VecDeque<Arc<Waiter>>; 3],
        shares: &Shares,
        now: Instant,
    ) -> Option<Arc<Waiter>> {
        let q = held.iter().find(|q| !q.is_empty())?;
        q.iter()
            .min_by_key(|w| (shares.account(w.tenant, now), w.id))
            .cloned()
    }

    /// The request to try next.
    pub fn head(&self, shares: &Shares, now: Instant) -> Option<Arc<Waiter>> {
        Self::head_of(&self.lock(), shares, now)
    }

    /// Wakes the head. The head can change without anyone leaving (tenant
    /// accounts move): a waiter that finds it is no longer the head hands
    /// the polling on with this.
    pub fn wake_head(&self, shares: &Shares, now: Instant) {
        if let Some(h) = self.head(shares, now) {
            h.notify.notify_one();
        }
    }

    /// Takes `id` out (admitted, refused or gone) and wakes the new head.
    /// False when it was not held (already evicted).
    pub fn remove(&self, id: u64, shares: &Shares, now: Instant) -> bool {
        let mut held = self.lock();
        let mut found = None;
        for q in held.iter_mut() {
            if let Some(i) = q.iter().position(|w| w.id == id) {
                found = q.remove(i);
                break;
            }
        }
        let Some(w) = found else {
            return false;
        };
        self.counted(&w, false);
        if let Some(next) = Self::head_of(&held, shares, now) {
            next.notify.notify_one();
        }
        true
    }

    /// Every held request (the replay walks them for deadlines).
    pub fn held(&self) -> Vec<Arc<Waiter>> {
        self.lock().iter().flatten().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn waiter(id: u64, class: Priority, tenant: u64, t0: Instant) -> Arc<Waiter> {
        Arc::new(Waiter::new(
            id,
            class,
            tenant,
            100,
            t0,
            t0 + Duration::from_secs(1),
            1000.0,
        ))
    }

    #[test]
    fn higher_classes_leave_first_then_lighter_tenants_then_arrival() {
        let t0 = Instant::now();
        let shares = Shares::new(t0);
        shares.charge(1, 10_000, t0); // a heavy standard tenant
        let q = StageQueue::default();
        for (id, class, tenant) in [
            (1, Priority::Standard, 1),
            (2, Priority::Standard, 1),
            (3, Priority::Standard, 2),
            (4, Priority::Critical, 1),
        ] {
            q.push(waiter(id, class, tenant, t0), 8, &shares, t0)
                .unwrap();
        }
        assert_eq!(q.depth(Priority::Standard), 3);
        assert_eq!(q.held_above(Priority::Standard), 1);
        assert_eq!(q.work_at_or_above(Priority::Standard), 400);
        let mut order = Vec::new();
        while let Some(h) = q.head(&shares, t0) {
            order.push(h.id);
            assert!(q.remove(h.id, &shares, t0));
        }
        assert_eq!(order, [4, 3, 1, 2]);
        assert!(!q.remove(4, &shares, t0), "already gone");
        assert_eq!(
            (
                q.depth(Priority::Critical),
                q.work_at_or_above(Priority::Sheddable)
            ),
            (0, 0)
        );
    }

    #[test]
    fn a_full_queue_makes_room_for_a_lighter_tenant_only() {
        let t0 = Instant::now();
        let shares = Shares::new(t0);
        shares.charge(1, 50_000, t0); // flooding
        shares.charge(2, 100, t0); // trickle
        let q = StageQueue::default();
        for id in 1..=3 {
            q.push(waiter(id, Priority::Standard, 1, t0), 3, &shares, t0)
                .unwrap();
        }
        // The flood's next request is refused: nobody heavier to evict.
        assert!(matches!(
            q.push(waiter(4, Priority::Standard, 1, t0), 3, &shares, t0),
            Err(Full)
        ));
        // The trickle evicts the flood's newest and is next out.
        let out = q
            .push(waiter(5, Priority::Standard, 2, t0), 3, &shares, t0)
            .unwrap()
            .expect("one evicted");
        assert_eq!(out.id, 3);
        assert!(out.evicted());
        assert_eq!(q.depth(Priority::Standard), 3);
        assert_eq!(q.head(&shares, t0).unwrap().id, 5);
        // A queue of 0 holds nothing.
        assert!(matches!(
            q.push(waiter(6, Priority::Sheddable, 2, t0), 0, &shares, t0),
            Err(Full)
        ));
    }
}
