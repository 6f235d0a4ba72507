//! A held request's place in its stage's queue.

use std::sync::Arc;
use std::time::Instant;

use super::*;
use crate::config::Priority;

/// A held request's place in its stage's queue. Dropping it takes the
/// request out at once (a client that went away leaves no trace but the
/// `cancelled` count).
pub struct Ticket {
    pub(super) stage: Arc<StageState>,
    pub(super) waiter: Arc<Waiter>,
    pub(super) retry_after_s: u32,
    pub(super) done: bool,
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("waiter", &self.waiter)
            .finish_non_exhaustive()
    }
}

impl Ticket {
    pub fn stage_name(&self) -> &str {
        &self.stage.name
    }

    pub fn class(&self) -> Priority {
        self.waiter.class
    }

    pub fn deadline(&self) -> Instant {
        self.waiter.deadline
    }

    pub fn arrived(&self) -> Instant {
        self.waiter.arrived
    }

    /// A lighter tenant took its place: it must be refused.
    pub fn evicted(&self) -> bool {
        self.waiter.evicted()
    }

    /// Whether it is the next request its stage would release.
    pub fn is_head(&self, now: Instant) -> bool {
        let rt = &self.stage.runtime;
        rt.queue
            .head(&rt.shares, now)
            .is_some_and(|h| h.id == self.waiter.id)
    }

    /// Until it may be its turn: for the head, the next poll (or a wake);
    /// for the others, until they become the head or are evicted.
    pub async fn turn(&self) {
        let now = crate::clock::now();
        if self.is_head(now) {
            tokio::select! {
                _ = self.waiter.notified() => {}
                _ = tokio::time::sleep(POLL) => {}
            }
        } else {
            let rt = &self.stage.runtime;
            rt.queue.wake_head(&rt.shares, now);
            self.waiter.notified().await;
        }
    }

    /// Its deadline passed (or it was evicted): the refusal to send.
    pub fn refuse(mut self, now: Instant) -> Refusal {
        let reason = if self.evicted() {
            Reason::QueueFull
        } else {
            Reason::TimedOut
        };
        self.end(Counted::Refused(reason), now);
        Refusal {
            class: self.waiter.class,
            reason,
            retry_after_s: self.retry_after_s,
        }
    }

    pub(super) fn end(&mut self, how: Counted, now: Instant) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let st = &self.stage;
        let rt = &st.runtime;
        rt.queue.remove(self.waiter.id, &rt.shares, now);
        let c = self.waiter.class;
        st.depth_changed(c);
        st.count(c, how);
        let waited = now.saturating_duration_since(self.waiter.arrived);
        st.counters.wait[c.rank()].observe(waited.as_secs_f64());
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.end(Counted::Cancelled, crate::clock::now());
    }
}
