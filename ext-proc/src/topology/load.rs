//! Per-replica load: requests in flight and prompt tokens waiting for prefill,
//! both counted by the router, and the queue and KV-cache figures the engine
//! itself reports. Atomics, so the decision path reads them without a lock and
//! every request updates them.
//!
//! With several instances, each counts its own requests (its leases) and
//! the peer link stores the sum of the other instances' latest fresh
//! figures next to them (`set_peers`, `state::peer_load`). What the decision
//! reads (`inflight`, `pending_prefill`, `prefilling`) is both; what this
//! instance reports, reconciles and exports as metrics is its own
//! (`own_*`), so nothing is counted twice when the figures travel.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};

use arc_swap::ArcSwapOption;

use crate::engine::{EngineReport, LoraState, Signal};

/// `engine_kv_usage` of an engine that reports no KV usage.
const KV_UNKNOWN: u32 = u32::MAX;

/// Fixed-point scale of [`ReplicaLoad::recent`]: decay keeps fractions of a
/// request without a float in an atomic.
const RECENT_UNIT: u64 = 1 << 10;

#[derive(Debug, Default)]
pub struct ReplicaLoad {
    inflight: AtomicU32,
    /// Uncached prompt tokens of routed requests that have not produced their
    /// first byte yet: the replica's prefill queue as the router sees it.
    pending_prefill: AtomicU64,
    /// Routed requests that have not produced their first byte yet.
    prefilling: AtomicU32,
    /// Requests this instance routed here lately, in 1/[`RECENT_UNIT`]s: one
    /// unit per request, decayed by the state writer (see `decay_recent`).
    recent: AtomicU64,
    /// From the engine's metrics endpoint; 0 until first scraped.
    engine_running: AtomicU32,
    engine_waiting: AtomicU32,
    /// KV-cache usage in parts per 10 000; [`KV_UNKNOWN`] where the engine
    /// exports none (llama.cpp, TGI).
    engine_kv_usage: AtomicU32,
    /// The engine's own prefix-cache counters (prompt tokens found, looked
    /// up), as last scraped.
    engine_prefix_hits: AtomicU64,
    engine_prefix_queries: AtomicU64,
    /// The LoRA adapters the engine reports (vLLM), as last scraped.
    engine_lora: ArcSwapOption<LoraState>,
    /// The other instances' requests in flight, prefill tokens and requests
    /// not yet answering here, summed; only the peer link writes them.
    peer_inflight: AtomicU32,
    peer_pending_prefill: AtomicU64,
    peer_prefilling: AtomicU32,
    /// Envoy has reported a first body byte from this replica: prefill
    /// shares here end at the first token, not at their estimate.
    first_byte_reported: AtomicBool,
    /// The adapters it holds, most recently used first (routed requests and
    /// the engine's reports together). Boxed: only adapter requests read
    /// it, and inline it would spread the fields every decision reads over
    /// more cache lines.
    pub adapters: Box<super::resident::Adapters>,
}

/// One replica's load as one instance counts it, or as peers sum it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadFigures {
    pub inflight: u32,
    pub prefilling: u32,
    pub pending_prefill: u64,
}

impl LoadFigures {
    pub fn is_zero(&self) -> bool {
        *self == LoadFigures::default()
    }

    pub fn add(&mut self, o: &LoadFigures) {
        self.inflight = self.inflight.saturating_add(o.inflight);
        self.prefilling = self.prefilling.saturating_add(o.prefilling);
        self.pending_prefill = self.pending_prefill.saturating_add(o.pending_prefill);
    }
}

impl ReplicaLoad {
    /// Requests in flight: this instance's and its peers'.
    pub fn inflight(&self) -> u32 {
        self.own_inflight()
            .saturating_add(self.peer_inflight.load(Relaxed))
    }

    /// Prefill tokens queued: this instance's and its peers'.
    pub fn pending_prefill(&self) -> u64 {
        self.own_pending_prefill()
            .saturating_add(self.peer_pending_prefill.load(Relaxed))
    }

    /// Requests not yet answering: this instance's and its peers'.
    pub fn prefilling(&self) -> u32 {
        self.prefilling
            .load(Relaxed)
            .saturating_add(self.peer_prefilling.load(Relaxed))
    }

    /// Requests in flight under this instance's own leases.
    pub fn own_inflight(&self) -> u32 {
        self.inflight.load(Relaxed)
    }

    pub fn own_pending_prefill(&self) -> u64 {
        self.pending_prefill.load(Relaxed)
    }

    /// This instance's own figures, as it reports them to its peers.
    pub fn own(&self) -> LoadFigures {
        LoadFigures {
            inflight: self.inflight.load(Relaxed),
            prefilling: self.prefilling.load(Relaxed),
            pending_prefill: self.pending_prefill.load(Relaxed),
        }
    }

    /// The peers' summed figures last stored.
    pub fn peers(&self) -> LoadFigures {
        LoadFigures {
            inflight: self.peer_inflight.load(Relaxed),
            prefilling: self.peer_prefilling.load(Relaxed),
            pending_prefill: self.peer_pending_prefill.load(Relaxed),
        }
    }

    /// Replaces the peers' sum (the peer link, once per round).
    pub fn set_peers(&self, f: &LoadFigures) {
        self.peer_inflight.store(f.inflight, Relaxed);
        self.peer_prefilling.store(f.prefilling, Relaxed);
        self.peer_pending_prefill.store(f.pending_prefill, Relaxed);
    }

    /// Whether this replica's prefill queue ends requests at their first
    /// token (Envoy reports first bytes from it), rather than at estimates.
    pub fn first_byte_reported(&self) -> bool {
        self.first_byte_reported.load(Relaxed)
    }

    /// Requests this instance routed here lately: each counts 1 when routed
    /// and fades by half every half-life the writer applies.
    pub fn recent(&self) -> f64 {
        self.recent.load(Relaxed) as f64 / RECENT_UNIT as f64
    }

    /// Multiplies the recent count by `keep` (in 0..=1); the state writer's
    /// tick, so the count is a moving window without a clock on the
    /// decision path.
    pub fn decay_recent(&self, keep: f64) {
        let keep = (keep.clamp(0.0, 1.0) * RECENT_UNIT as f64) as u64;
        // Requests routed meanwhile are added by the CAS retry, not lost.
        let _ = self.recent.fetch_update(Relaxed, Relaxed, |v| {
            Some(((u128::from(v) * u128::from(keep)) / u128::from(RECENT_UNIT)) as u64)
        });
    }

    pub fn engine_waiting(&self) -> u32 {
        self.engine_waiting.load(Relaxed)
    }

    pub fn engine_running(&self) -> u32 {
        self.engine_running.load(Relaxed)
    }

    /// KV-cache usage as the engine reports it; 0 where it reports none.
    pub fn kv_usage(&self) -> f64 {
        self.engine_kv_usage().unwrap_or(0.0)
    }

    /// KV-cache usage; `None` where the engine reports none.
    pub fn engine_kv_usage(&self) -> Option<f64> {
        match self.engine_kv_usage.load(Relaxed) {
            KV_UNKNOWN => None,
            v => Some(f64::from(v) / 10_000.0),
        }
    }

    pub fn set_engine(&self, running: u32, waiting: u32, kv_usage: Option<f64>) {
        self.engine_running.store(running, Relaxed);
        self.engine_waiting.store(waiting, Relaxed);
        let kv = kv_usage.map_or(KV_UNKNOWN, |v| (v.clamp(0.0, 1.0) * 10_000.0) as u32);
        self.engine_kv_usage.store(kv, Relaxed);
    }

    /// Everything one scrape found: what it lacks keeps its last value.
    pub fn set_report(&self, r: &EngineReport) {
        if let (Some(running), Some(waiting)) = (r.running, r.waiting) {
            // `None` is "not exported" unless the scrape found it missing.
            let kv = match r.missing.contains(Signal::KvUsage) {
                true => self.engine_kv_usage(),
                false => r.kv_usage,
            };
            self.set_engine(running as u32, waiting as u32, kv);
        }
        if let Some((hits, queries)) = r.prefix_cache {
            self.engine_prefix_hits.store(hits as u64, Relaxed);
            self.engine_prefix_queries.store(queries as u64, Relaxed);
        }
        if r.lora.is_some() {
            self.engine_lora.store(r.lora.clone().map(Arc::new));
        }
    }

    /// [`ReplicaLoad::set_report`], and the adapters it runs (of a fleet
    /// holding adapters) as what its GPU holds and its requests use.
    pub fn apply_report(&self, r: &EngineReport, hold: Option<&super::Hold>) {
        self.set_report(r);
        if let (Some(l), Some(cfg)) = (&r.lora, hold.filter(|h| !h.is_models())) {
            // The engine writes these lists: no more are read than a
            // replica can hold in host memory.
            let cap = cfg.kept as usize;
            let ids = |v: &[String]| {
                v.iter()
                    .take(cap)
                    .map(|a| super::AdapterId::of(a))
                    .collect::<Vec<_>>()
            };
            let (running, waiting) = (ids(&l.running), ids(&l.waiting));
            // What it runs is on its GPU, whoever sent it.
            let on_gpu: Vec<_> = waiting.iter().chain(&running).copied().collect();
            self.adapters.used(&on_gpu, cfg.kept);
            self.adapters.set_active(super::resident::Active {
                running,
                waiting,
                max: l.max.map_or(cfg.ready as usize, |m| m as usize),
            });
        }
    }

    /// The engine's prefix-cache counters: tokens found, tokens looked up.
    pub fn engine_prefix_cache(&self) -> (u64, u64) {
        (
            self.engine_prefix_hits.load(Relaxed),
            self.engine_prefix_queries.load(Relaxed),
        )
    }

    pub fn engine_lora(&self) -> Option<Arc<LoraState>> {
        self.engine_lora.load_full()
    }

    /// Counts one request, with `prefill_tokens` to prefill, until the guard is
    /// dropped, however the request ends: completed, reset, or abandoned.
    pub fn start(self: &Arc<Self>, prefill_tokens: u64) -> RequestGuard {
        self.inflight.fetch_add(1, Relaxed);
        self.recent.fetch_add(RECENT_UNIT, Relaxed);
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

    /// Envoy reported the request's first body byte: prefill is over, and
    /// the replica's queue is known to end at first tokens.
    pub fn first_byte(&self) {
        self.load.first_byte_reported.store(true, Relaxed);
        self.prefill_done();
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
    fn a_scrape_keeps_what_it_lacks_and_unknown_stays_unknown() {
        let load = ReplicaLoad::default();
        let mut r = EngineReport {
            running: Some(3.0),
            waiting: Some(1.0),
            kv_usage: Some(0.5),
            ..EngineReport::default()
        };
        load.set_report(&r);
        assert_eq!(load.engine_kv_usage(), Some(0.5));
        // The dialect names KV usage and this body lacked it: the last value.
        r.kv_usage = None;
        r.missing.insert(Signal::KvUsage);
        r.running = Some(4.0);
        load.set_report(&r);
        assert_eq!(
            (load.engine_running(), load.engine_kv_usage()),
            (4, Some(0.5))
        );
        // The engine exports none (llama.cpp): unknown, read as 0.
        r.missing = Default::default();
        load.set_report(&r);
        assert_eq!((load.engine_kv_usage(), load.kv_usage()), (None, 0.0));
        // Running or waiting lacking: nothing of the load moves.
        load.set_report(&EngineReport {
            running: None,
            waiting: Some(9.0),
            ..EngineReport::default()
        });
        assert_eq!((load.engine_running(), load.engine_waiting()), (4, 1));
    }

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

    #[test]
    fn the_recent_count_adds_one_per_request_and_decays() {
        let load = Arc::new(ReplicaLoad::default());
        let guards: Vec<_> = (0..4).map(|_| load.start(0)).collect();
        assert_eq!(load.recent(), 4.0);
        drop(guards);
        assert_eq!(load.recent(), 4.0, "ending a request does not forget it");
        load.decay_recent(0.5);
        assert_eq!(load.recent(), 2.0);
        load.decay_recent(0.25);
        assert_eq!(load.recent(), 0.5);
        load.decay_recent(0.0);
        assert_eq!(load.recent(), 0.0);
    }

    #[test]
    fn the_decision_reads_own_and_peers_and_reports_own_only() {
        let load = Arc::new(ReplicaLoad::default());
        let g = load.start(100);
        load.set_peers(&LoadFigures {
            inflight: 3,
            prefilling: 2,
            pending_prefill: 900,
        });
        assert_eq!(
            (load.inflight(), load.pending_prefill(), load.prefilling()),
            (4, 1000, 3)
        );
        let own = LoadFigures {
            inflight: 1,
            prefilling: 1,
            pending_prefill: 100,
        };
        assert_eq!(load.own(), own);
        assert_eq!((load.own_inflight(), load.own_pending_prefill()), (1, 100));
        drop(g);
        load.set_peers(&LoadFigures::default());
        assert_eq!((load.inflight(), load.pending_prefill()), (0, 0));
        // Sums saturate rather than wrap.
        let mut f = LoadFigures {
            inflight: u32::MAX,
            ..Default::default()
        };
        f.add(&own);
        assert_eq!(f.inflight, u32::MAX);
    }
}
