//! One simulated replica of the replay: its queue, its prefill lane, its
//! batch, and the adapters or models it holds (`engine::lora`'s slots).

use std::collections::{HashMap, HashSet, VecDeque};

use super::trace::TraceRequest;
use crate::engine::adapters::bump;
use crate::engine::lora::LoraSlots;

/// The adapters one replica's requests use, with their request counts.
#[derive(Clone, Debug, Default)]
pub struct ReplicaAdapters {
    pub running: HashMap<String, u32>,
    pub waiting: HashMap<String, u32>,
    pub max_loras: usize,
}

impl ReplicaAdapters {
    /// As vLLM's metric names them.
    pub fn report(&self) -> fleetroute::engine::LoraState {
        let names = |m: &HashMap<String, u32>| {
            let mut v: Vec<String> = m.keys().cloned().collect();
            v.sort();
            v
        };
        fleetroute::engine::LoraState {
            max: Some(self.max_loras as u32),
            running: names(&self.running),
            waiting: names(&self.waiting),
        }
    }
}

pub struct Replica {
    pub queue: VecDeque<usize>,
    pub lane_busy: bool,
    pub running: usize,
    pub lora: Option<LoraSlots<String>>,
    /// Overlapped loads in progress: model and when it is ready.
    pub loading: HashMap<String, f64>,
    /// Requests that waited for their adapter or model to load.
    pub cold: HashSet<usize>,
}

impl Replica {
    pub fn new(lora: Option<LoraSlots<String>>) -> Replica {
        Replica {
            queue: VecDeque::new(),
            lane_busy: false,
            running: 0,
            lora,
            loading: HashMap::new(),
            cold: HashSet::new(),
        }
    }

    /// A router's load ahead of demand (placement): started beside the
    /// lane like an overlapped load, evicting the least recently used model
    /// no running request uses; when it ends, pushed to `wake`.
    pub fn place(&mut self, model: &str, a: &ReplicaAdapters, now: f64, wake: &mut Vec<f64>) {
        let Some(slots) = &mut self.lora else { return };
        let model = model.to_string();
        if self.loading.contains_key(&model) || slots.on_gpu(&model) {
            return;
        }
        let loading = &self.loading;
        let pinned = |x: &String| a.running.contains_key(x) || loading.contains_key(x);
        if let Some((_, ms)) = slots.acquire(&model, pinned)
            && ms > 0.0
        {
            self.loading.insert(model, now + ms);
            wake.push(now + ms);
        }
    }

    /// The first queued request that can start now (one whose adapter can
    /// be put on the GPU, as vLLM's scheduler skips those that cannot),
    /// taken from the queue, with its adapter load time. With overlapped
    /// loads (packed models) a load starts beside the lane instead: its
    /// requests stay queued until `now` passes its end, pushed to `wake`.
    pub fn next(
        &mut self,
        reqs: &[TraceRequest],
        a: &mut ReplicaAdapters,
        now: f64,
        wake: &mut Vec<f64>,
    ) -> Option<(usize, f64)> {
        let Some(slots) = &mut self.lora else {
            return self.queue.pop_front().map(|i| (i, 0.0));
        };
        let overlapped = slots.model.overlapped;
        let loading = &mut self.loading;
        loading.retain(|_, &mut until| until > now);
        let mut load_ms = 0.0;
        let cold = &mut self.cold;
        let at = self.queue.iter().position(|&i| match &reqs[i].adapter {
            None => true,
            Some(ad) if loading.contains_key(ad) => {
                cold.insert(i);
                false
            }
            Some(ad) => {
                let pinned = |x: &String| a.running.contains_key(x) || loading.contains_key(x);
                match slots.acquire(ad, pinned) {
                    Some((_, ms)) if overlapped && ms > 0.0 => {
                        cold.insert(i);
                        loading.insert(ad.clone(), now + ms);
                        wake.push(now + ms);
                        false
                    }
                    Some((_, ms)) => {
                        if ms > 0.0 {
                            cold.insert(i);
                        }
                        load_ms = ms;
                        true
                    }
                    None => false,
                }
            }
        })?;
        let i = self.queue.remove(at).expect("present");
        if let Some(ad) = &reqs[i].adapter {
            bump(&mut a.waiting, ad, false);
            bump(&mut a.running, ad, true);
        }
        let ms = load_ms;
        Some((i, ms))
    }
}
