//! Per-replica load: in-flight requests counted by the router, and the queue
//! and KV-cache figures the engine itself reports. Atomics, so the decision
//! path reads them without a lock and every request can update them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

#[derive(Debug, Default)]
pub struct ReplicaLoad {
    inflight: AtomicU32,
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

    /// Counts one request until the guard is dropped, however the request
    /// ends: completed, reset, or abandoned.
    pub fn start(self: &Arc<Self>) -> InflightGuard {
        self.inflight.fetch_add(1, Relaxed);
        InflightGuard(self.clone())
    }
}

#[derive(Debug)]
pub struct InflightGuard(Arc<ReplicaLoad>);

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_cannot_leak() {
        let load = Arc::new(ReplicaLoad::default());
        let a = load.start();
        let b = load.start();
        assert_eq!(load.inflight(), 2);
        drop(a);
        let handle = std::thread::spawn(move || drop(b));
        handle.join().unwrap();
        assert_eq!(load.inflight(), 0);
    }
}
