//! A replica's LoRA adapter slots, as vLLM keeps them: `max_loras` on the
//! GPU and `max_cpu_loras` in host memory, each an LRU. A request whose
//! adapter is not on the GPU waits for it to be copied there (from host
//! memory, or first read from disk), evicting the least recently used
//! adapter that no running request uses; when every GPU slot serves a
//! running request, it waits for one to finish (vLLM's scheduler then
//! starts other requests first). Shared by the engine and the replay.
//!
//! Load times are parameters. The defaults follow published figures:
//! ServerlessLLM reports 370 ms to load a LoRA adapter from disk with the
//! usual loaders (84 ms with its own); a copy of a rank-16 adapter of an
//! 8B model (~40 MB) over PCIe takes a few ms, and vLLM's slot set-up adds
//! to it, so 25 ms from host memory is used.

use std::collections::VecDeque;
use std::hash::Hash;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoraModel {
    pub max_loras: usize,
    pub max_cpu_loras: usize,
    pub gpu_load_ms: f64,
    pub disk_load_ms: f64,
    /// A load runs beside the replica's other work (a packed replica's
    /// model, loaded by a process of its own) rather than in its prefill
    /// lane (vLLM's adapter loads, made in its scheduler step).
    pub overlapped: bool,
}

impl Default for LoraModel {
    fn default() -> Self {
        LoraModel {
            max_loras: 8,
            max_cpu_loras: 32,
            gpu_load_ms: 25.0,
            disk_load_ms: 370.0,
            overlapped: false,
        }
    }
}

/// Where a load came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Load {
    /// Already on the GPU.
    None,
    Host,
    Disk,
}

#[derive(Clone, Debug)]
pub struct LoraSlots<K> {
    pub model: LoraModel,
    /// Most recently used first.
    gpu: VecDeque<K>,
    /// Most recently used first; those on the GPU included.
    host: VecDeque<K>,
    /// Loads from host memory and from disk so far.
    pub host_loads: u64,
    pub disk_loads: u64,
}

impl<K: Clone + Eq + Hash> LoraSlots<K> {
    pub fn new(model: LoraModel) -> Self {
        LoraSlots {
            model,
            gpu: VecDeque::new(),
            host: VecDeque::new(),
            host_loads: 0,
            disk_loads: 0,
        }
    }

    pub fn on_gpu(&self, a: &K) -> bool {
        self.gpu.contains(a)
    }

    /// The adapters on the GPU, most recently used first.
    pub fn gpu(&self) -> impl Iterator<Item = &K> {
        self.gpu.iter()
    }

    /// Puts `a` on the GPU for a request about to start; `pinned` says which
    /// adapters running requests use (never evicted). `None`: every slot is
    /// pinned, the request must wait. Else the load made and its time, ms.
    pub fn acquire(&mut self, a: &K, pinned: impl Fn(&K) -> bool) -> Option<(Load, f64)> {
        if let Some(i) = self.gpu.iter().position(|x| x == a) {
            let k = self.gpu.remove(i).expect("present");
            self.gpu.push_front(k);
            touch(&mut self.host, a, self.model.max_cpu_loras);
            return Some((Load::None, 0.0));
        }
        if self.gpu.len() >= self.model.max_loras.max(1) {
            let victim = self.gpu.iter().rposition(|x| !pinned(x))?;
            self.gpu.remove(victim);
        }
        let (load, ms) = if self.host.contains(a) {
            self.host_loads += 1;
            (Load::Host, self.model.gpu_load_ms)
        } else {
            self.disk_loads += 1;
            (Load::Disk, self.model.disk_load_ms + self.model.gpu_load_ms)
        };
        self.gpu.push_front(a.clone());
        touch(&mut self.host, a, self.model.max_cpu_loras);
        Some((load, ms))
    }

    /// Drops `a` (vLLM's unload): from the GPU and host memory.
    pub fn unload(&mut self, a: &K) {
        self.gpu.retain(|x| x != a);
        self.host.retain(|x| x != a);
    }
}

fn touch<K: Clone + Eq>(lru: &mut VecDeque<K>, a: &K, cap: usize) {
    lru.retain(|x| x != a);
    lru.push_front(a.clone());
    lru.truncate(cap.max(1));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_on_the_gpu_and_in_host_memory_and_pinned_slots_wait() {
        let m = LoraModel {
            max_loras: 2,
            max_cpu_loras: 3,
            gpu_load_ms: 10.0,
            disk_load_ms: 100.0,
            overlapped: false,
        };
        let mut s = LoraSlots::new(m);
        let free = |_: &&str| false;
        assert_eq!(s.acquire(&"a", free), Some((Load::Disk, 110.0)));
        assert_eq!(s.acquire(&"b", free), Some((Load::Disk, 110.0)));
        assert_eq!(s.acquire(&"a", free), Some((Load::None, 0.0)));
        // c evicts b (least recently used on the GPU); b stays in host memory.
        assert_eq!(s.acquire(&"c", free), Some((Load::Disk, 110.0)));
        assert!(!s.on_gpu(&"b"));
        assert_eq!(s.acquire(&"b", free), Some((Load::Host, 10.0)));
        // Both GPU slots serve running requests: d must wait.
        assert_eq!(s.acquire(&"d", |_| true), None);
        // Host memory holds three: d's load pushes out the oldest (a).
        assert_eq!(s.acquire(&"d", free), Some((Load::Disk, 110.0)));
        assert_eq!(s.acquire(&"a", free), Some((Load::Disk, 110.0)));
        assert_eq!((s.host_loads, s.disk_loads), (1, 5));
    }
}
