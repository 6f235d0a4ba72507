//! Per-replica load: requests in flight and prompt tokens waiting for prefill,
//! both counted by the router, and the queue and KV-cache figures the engine
//! itself reports. Atomics, so the decision path reads them without a lock and
//! every request updates them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};

#[derive(Debug, Default)]
pub struct ReplicaLoad {
    inflight: AtomicU32,
    /// Uncached prompt tokens of routed requests that have not produced their
    /// first byte yet: the replica's prefill queue as the router sees it.
    pending_prefill: AtomicU64,
    /// Routed requests that have not produced their first byte yet.
    prefilling: AtomicU32,
    /// From the engine's metrics endpoint; 0 until first scraped.
    engine_running: AtomicU32,
    engine_waiting: AtomicU32,
    /// KV-cache usage in parts per 10 000.
    engine_kv_usage: AtomicU32,
}

impl ReplicaLoad {
    pub fn inflight(&self) -> u32 {
        self.inflight.load(Relaxed)
    }

    pub fn pending_prefill(&self) -> u64 {
        self.pending_prefill.load(Relaxed)
    }

    pub fn prefilling(&self) -> u32 {
        self.prefilling.load(Relaxed)
    }

    pub fn engine_waiting(&self) -> u32 {
        self.engine_waiting.load(Relaxed)
    }

    pub fn engine_running(&self) -> u32 {
        self.engine_running.load(Relaxed)
    }

    pub fn kv_usage(&self) -> f64 {
        f64::from(self.engine_kv_usage.load(Relaxed)) / 10_000.0
    }

    pub fn set_engine(&self, running: u32, waiting: u32, kv_usage: f64) {
        self.engine_running.store(running, Relaxed);
        self.engine_waiting.store(waiting, Relaxed);
        self.engine_kv_usage
            .store((kv_usage.clamp(0.0, 1.0) * 10_000.0) as u32, Relaxed);
    }

    /// Counts one request, with `prefill_tokens` to prefill, until the guard is
    /// dropped, however the request ends: completed, reset, or abandoned.
    pub fn start(self: &Arc<Self>, prefill_tokens: u64) -> RequestGuard {
        self.inflight.fetch_add(1, Relaxed);
        self.pending_prefill.fetch_add(prefill_tokens, Relaxed);
        self.prefilling.fetch_add(1, Relaxed);
        RequestGuard {
            load: self.clone(),
            prefill: AtomicU64::new(prefill_tokens),
            prefilled: AtomicBool::new(false),
            released: AtomicBool::new(false),
        }
    }
}

/// One request's share of a replica's load. Held by a lease (see `lease`),
/// released explicitly when the request ends, and by `Drop` if nobody did.
#[derive(Debug)]
pub struct RequestGuard {
    load: Arc<ReplicaLoad>,
    prefill: AtomicU64,
    prefilled: AtomicBool,
    released: AtomicBool,
}

impl RequestGuard {
    /// Whether this is a share of `load`.
    pub fn is_on(&self, load: &Arc<ReplicaLoad>) -> bool {
        Arc::ptr_eq(&self.load, load)
    }

    /// The first byte came back: prefill is over. Idempotent.
    pub fn prefill_done(&self) {
        if !self.prefilled.swap(true, Relaxed) {
            let t = self.prefill.swap(0, Relaxed);
            self.load.pending_prefill.fetch_sub(t, Relaxed);
            self.load.prefilling.fetch_sub(1, Relaxed);
        }
    }

    /// The request is over. Idempotent.
    pub fn release(&self) {
        if !self.released.swap(true, Relaxed) {
            self.prefill_done();
            self.load.inflight.fetch_sub(1, Relaxed);
        }
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_cannot_leak() {
        let load = Arc::new(ReplicaLoad::default());
        let a = load.start(100);
        let b = load.start(50);
        assert_eq!((load.inflight(), load.pending_prefill()), (2, 150));
        a.prefill_done();
        a.prefill_done();
        assert_eq!(load.pending_prefill(), 50);
        a.release();
        assert_eq!(load.inflight(), 1);
        drop(a);
        assert_eq!(load.inflight(), 1, "released once only");
        let handle = std::thread::spawn(move || drop(b));
        handle.join().unwrap();
        assert_eq!((load.inflight(), load.pending_prefill()), (0, 0));
    }
}
