//! The adapters (or packed models) a replica holds, as the router knows
//! them: those it sent requests for and those the engine reports, most
//! recently used first. An engine keeps the `max_loras` most recently used
//! adapters on the GPU and `max_cpu_loras` in host memory (vLLM's LRU
//! caches), or its `max_models` most recently used models loaded
//! (llama.cpp's router), so the order says where each one is.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use arc_swap::ArcSwapOption;

use super::adapters::AdapterId;
use super::hold::Hold;

/// Where an adapter is on one replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// On the GPU: nothing to load.
    Gpu,
    /// In host memory: a copy onto the GPU.
    Host,
    /// Neither: read from disk.
    Absent,
}

/// Most recently used first; at most `max_cpu_loras` long.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resident(pub Vec<AdapterId>);

impl Resident {
    pub fn place(&self, id: AdapterId, hold: &Hold) -> Place {
        match self.0.iter().position(|&a| a == id) {
            Some(i) if i < hold.ready as usize => Place::Gpu,
            Some(_) => Place::Host,
            None => Place::Absent,
        }
    }

    /// Every GPU slot is taken: a load evicts the least recently used.
    pub fn gpu_full(&self, hold: &Hold) -> bool {
        self.0.len() >= hold.ready as usize
    }

    /// Prefill tokens' worth of time before a request for `id` can start
    /// here: nothing on the GPU; a copy from host memory or a read from
    /// disk; and when that evicts an adapter from a full GPU, its copy back
    /// when next asked for.
    pub fn load_tokens(&self, id: AdapterId, hold: &Hold) -> f64 {
        let ms = match self.place(id, hold) {
            Place::Gpu => return 0.0,
            Place::Host => hold.kept_load_ms,
            Place::Absent => hold.load_ms,
        };
        let evict = if self.gpu_full(hold) {
            hold.evict_ms
        } else {
            0.0
        };
        hold.tokens(ms + evict)
    }

    /// The list after `ids` were used (in this order), bounded by `cap`.
    fn used(&self, ids: &[AdapterId], cap: usize) -> Resident {
        let mut v = Vec::with_capacity((self.0.len() + ids.len()).min(cap));
        for &id in ids.iter().rev() {
            if !v.contains(&id) {
                v.push(id);
            }
        }
        v.extend(self.0.iter().filter(|a| !ids.contains(a)));
        v.truncate(cap);
        Resident(v)
    }
}

/// The adapters a replica's requests use now, as the engine last reported
/// them (vLLM's `vllm:lora_requests_info`) plus those sent to it since.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Active {
    pub running: Vec<AdapterId>,
    pub waiting: Vec<AdapterId>,
    /// GPU slots: the engine's `max_lora`, else the fleet's `max_loras`.
    pub max: usize,
}

impl Active {
    /// Every GPU slot serves running requests of other adapters: a request
    /// for `id` waits for one of them to drain (vLLM starts later requests
    /// first meanwhile, so it may wait long).
    pub fn slots_taken(&self, id: AdapterId) -> bool {
        self.running.len() >= self.max && !self.running.contains(&id) && !self.waiting.contains(&id)
    }
}

/// A replica's [`Resident`] and [`Active`], read by decisions without a lock
/// and replaced when a request commits and when the engine is scraped.
#[derive(Debug, Default)]
pub struct Adapters(
    ArcSwapOption<Resident>,
    ArcSwapOption<Active>,
    /// Bumped when the engine lost what it held: registrations made
    /// before name an older epoch.
    AtomicU64,
);

impl Adapters {
    pub fn get(&self) -> Option<Arc<Resident>> {
        self.0.load_full()
    }

    pub fn active(&self) -> Option<Arc<Active>> {
        self.1.load_full()
    }

    /// What the engine reports its requests use.
    pub fn set_active(&self, a: Active) {
        self.1.store(Some(Arc::new(a)));
    }

    /// A request for `id` was sent here: it counts as waiting until the
    /// next report says otherwise.
    pub fn sent(&self, id: AdapterId) {
        let known = |a: &Active| a.running.contains(&id) || a.waiting.contains(&id);
        if self.1.load().as_deref().is_none_or(known) {
            return;
        }
        self.1.rcu(|cur| {
            let mut a = cur.as_deref().cloned().unwrap_or_default();
            if !known(&a) {
                a.waiting.push(id);
            }
            Some(Arc::new(a))
        });
    }

    /// `ids` were used here, the last most recently. A no-op when they are
    /// already at the front in that order (the common case: a replica's
    /// popular adapter again).
    pub fn used(&self, ids: &[AdapterId], cap: u32) {
        if ids.is_empty() {
            return;
        }
        let at_front = |r: &Resident| r.0.first() == ids.last() && ids.len() == 1;
        if self.0.load().as_deref().is_some_and(at_front) {
            return;
        }
        self.0.rcu(|cur| {
            let base = cur.as_deref().cloned().unwrap_or_default();
            let next = base.used(ids, cap.max(1) as usize);
            if next == base {
                cur.clone()
            } else {
                Some(Arc::new(next))
            }
        });
    }

    /// What the engine lists as held (a packed replica's models): those it
    /// neither has nor is loading are gone (evicted, or failed to load);
    /// those it has loaded unknown to this instance (another's loads) are
    /// added after the ones known. One it is loading stays only if known
    /// here (this instance's load in flight): another's may yet fail.
    pub fn engine_holds(&self, loaded: &[AdapterId], loading: &[AdapterId], cap: u32) {
        let loaded = &loaded[..loaded.len().min(cap as usize)];
        self.0.rcu(|cur| {
            let base = cur.as_deref().map_or(&[][..], |r| &r.0[..]);
            let mut v: Vec<AdapterId> = base
                .iter()
                .copied()
                .filter(|a| loaded.contains(a) || loading.contains(a))
                .collect();
            v.extend(loaded.iter().filter(|a| !base.contains(a)));
            v.truncate(cap as usize);
            if v == base {
                cur.clone()
            } else {
                Some(Arc::new(Resident(v)))
            }
        });
    }

    /// `id` is not held after all (its load failed).
    pub fn forget(&self, id: AdapterId) {
        self.0.rcu(|cur| {
            let mut r = cur.as_deref().cloned().unwrap_or_default();
            r.0.retain(|&a| a != id);
            Some(Arc::new(r))
        });
    }

    /// The engine lost what it held (restarted, or left).
    pub fn clear(&self) {
        self.0.store(None);
        self.1.store(None);
        self.2.fetch_add(1, Relaxed);
    }

    pub fn epoch(&self) -> u64 {
        self.2.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lora(gpu: u32, cpu: u32) -> Hold {
        Hold::adapters(&crate::config::LoraConfig {
            max_loras: gpu,
            max_cpu_loras: cpu,
            gpu_load_ms: 10.0,
            disk_load_ms: 100.0,
            prefill_tokens_per_sec: 1000.0,
            load_path: None,
            load_timeout_ms: 1000,
        })
    }

    #[test]
    fn most_recent_first_and_bounded_by_host_memory() {
        let l = lora(2, 3);
        let a = Adapters::default();
        let id = |n: &str| AdapterId::of(n);
        for n in ["a", "b", "c", "d"] {
            a.used(&[id(n)], l.kept);
        }
        let r = a.get().unwrap();
        assert_eq!(r.0, vec![id("d"), id("c"), id("b")]);
        assert_eq!(r.place(id("d"), &l), Place::Gpu);
        assert_eq!(r.place(id("c"), &l), Place::Gpu);
        assert_eq!(r.place(id("b"), &l), Place::Host);
        assert_eq!(r.place(id("a"), &l), Place::Absent);
        // Resident < host memory < disk, and a full GPU adds the evicted
        // adapter's copy back.
        assert_eq!(r.load_tokens(id("d"), &l), 0.0);
        assert_eq!(r.load_tokens(id("b"), &l), 20.0);
        assert_eq!(r.load_tokens(id("a"), &l), 110.0);
        let fresh = Resident(vec![id("x")]);
        assert_eq!(fresh.load_tokens(id("a"), &l), 100.0);
        // Using b again brings it back to the GPU.
        a.used(&[id("b")], l.kept);
        assert_eq!(a.get().unwrap().place(id("b"), &l), Place::Gpu);
        assert_eq!(a.get().unwrap().place(id("c"), &l), Place::Host);
    }

    #[test]
    fn an_engine_list_drops_what_it_evicted_and_adds_what_others_loaded() {
        let a = Adapters::default();
        let id = |n: &str| AdapterId::of(n);
        a.used(&[id("x"), id("y"), id("w")], 3);
        // y evicted, w still loading (ours), z loaded by another, v loading
        // by another.
        a.engine_holds(&[id("x"), id("z")], &[id("w"), id("v")], 3);
        assert_eq!(a.get().unwrap().0, vec![id("w"), id("x"), id("z")]);
        a.forget(id("w"));
        assert_eq!(a.get().unwrap().0, vec![id("x"), id("z")]);
        a.engine_holds(&[id("a"), id("b"), id("c"), id("d")], &[], 2);
        assert_eq!(a.get().unwrap().0, vec![id("a"), id("b")]);
    }

    #[test]
    fn an_engine_report_is_read_no_further_than_host_memory_holds() {
        let load = crate::topology::load::ReplicaLoad::default();
        let names: Vec<String> = (0..10_000).map(|i| format!("a{i}")).collect();
        let report = crate::engine::EngineReport {
            lora: Some(crate::engine::LoraState {
                max: Some(2),
                running: names.clone(),
                waiting: names,
            }),
            ..Default::default()
        };
        load.apply_report(&report, Some(&lora(2, 3)));
        let active = load.adapters.active().unwrap();
        assert_eq!(
            (active.running.len(), active.waiting.len(), active.max),
            (3, 3, 2)
        );
        assert_eq!(load.adapters.get().unwrap().0.len(), 3);
    }
}
