//! LoRA adapters on one simulated replica, as vLLM serves them: adapters
//! are known by name (given at start, or loaded at run time through
//! `/v1/load_lora_adapter` and dropped through `/v1/unload_lora_adapter`), a
//! request names one in `model`, waits while every GPU slot serves other
//! adapters' running requests, and pays the adapter's load (host memory or
//! disk, `lora::LoraSlots`) in its prefill. `vllm:lora_requests_info`
//! reports the adapters running and waiting under vLLM's labels.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::lora::{Load, LoraModel, LoraSlots};

/// How a replica serves adapters.
#[derive(Clone, Debug, PartialEq)]
pub struct AdapterSettings {
    pub model: LoraModel,
    /// Adapters known from the start (vLLM's `--lora-modules`).
    pub preloaded: Vec<String>,
    /// `/v1/load_lora_adapter` and `/v1/unload_lora_adapter` answer
    /// (vLLM's `VLLM_ALLOW_RUNTIME_LORA_UPDATING`).
    pub runtime: bool,
}

/// Most adapters one replica registers (runtime loads past it are refused).
pub const MAX_REGISTERED: usize = 4096;

pub struct Adapters {
    pub settings: AdapterSettings,
    state: Mutex<State>,
    /// Signalled when a running request's adapter is released.
    freed: Notify,
}

struct State {
    registered: HashSet<String>,
    slots: LoraSlots<String>,
    running: HashMap<String, u32>,
    waiting: HashMap<String, u32>,
}

/// Holds a running request's adapter on the GPU until dropped.
pub struct InUse {
    adapters: Arc<Adapters>,
    name: String,
}

impl Drop for InUse {
    fn drop(&mut self) {
        self.adapters
            .with(|s| bump(&mut s.running, &self.name, false));
        self.adapters.freed.notify_waiters();
    }
}

/// Counts a request as waiting for its adapter until dropped.
struct Waiting<'a>(&'a Adapters, &'a str);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.with(|s| bump(&mut s.waiting, self.1, false));
    }
}

/// What `/metrics` reports.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct AdapterFigures {
    pub max_loras: usize,
    pub running: Vec<String>,
    pub waiting: Vec<String>,
    pub host_loads: u64,
    pub disk_loads: u64,
    pub on_gpu: Vec<String>,
}

impl Adapters {
    pub fn new(settings: AdapterSettings) -> Adapters {
        Adapters {
            state: Mutex::new(State {
                registered: settings.preloaded.iter().cloned().collect(),
                slots: LoraSlots::new(settings.model),
                running: HashMap::new(),
                waiting: HashMap::new(),
            }),
            freed: Notify::new(),
            settings,
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        // No invariant a panicking holder could break half-way.
        f(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The adapters it knows, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.with(|s| s.registered.iter().cloned().collect());
        v.sort();
        v
    }

    pub fn knows(&self, name: &str) -> bool {
        self.with(|s| s.registered.contains(name))
    }

    /// `/v1/load_lora_adapter`: `Err` as vLLM words it.
    pub fn register(&self, name: &str) -> Result<(), String> {
        self.with(|s| {
            if s.registered.contains(name) {
                return Err(format!(
                    "The lora adapter '{name}' has already been loaded."
                ));
            }
            if s.registered.len() >= MAX_REGISTERED {
                return Err(format!("at most {MAX_REGISTERED} adapters"));
            }
            s.registered.insert(name.to_string());
            Ok(())
        })
    }

    /// `/v1/unload_lora_adapter`: false when it was not loaded.
    pub fn unregister(&self, name: &str) -> bool {
        self.with(|s| {
            s.slots.unload(&name.to_string());
            s.registered.remove(name)
        })
    }

    /// Waits until `name` can run (a GPU slot), puts it there; the load
    /// time, ms, and the guard that keeps it until the request ends.
    pub async fn acquire(self: &Arc<Self>, name: &str) -> (f64, InUse) {
        self.with(|s| bump(&mut s.waiting, name, true));
        let _waiting = Waiting(self, name);
        loop {
            let freed = self.freed.notified();
            let got = self.with(|s| {
                let running = &s.running;
                let got = s
                    .slots
                    .acquire(&name.to_string(), |a| running.contains_key(a));
                if got.is_some() {
                    bump(&mut s.running, name, true);
                }
                got
            });
            if let Some((load, ms)) = got {
                let ms = if load == Load::None { 0.0 } else { ms };
                let guard = InUse {
                    adapters: self.clone(),
                    name: name.to_string(),
                };
                return (ms, guard);
            }
            freed.await;
        }
    }

    pub fn figures(&self) -> AdapterFigures {
        self.with(|s| {
            let names = |m: &HashMap<String, u32>| {
                let mut v: Vec<String> = m.keys().cloned().collect();
                v.sort();
                v
            };
            AdapterFigures {
                max_loras: s.slots.model.max_loras,
                running: names(&s.running),
                waiting: names(&s.waiting),
                host_loads: s.slots.host_loads,
                disk_loads: s.slots.disk_loads,
                on_gpu: s.slots.gpu().cloned().collect(),
            }
        })
    }
}

/// Counts one more (`up`) or one fewer request for adapter `a`; an adapter
/// with none is dropped. Shared with the replay's replicas.
pub fn bump(m: &mut HashMap<String, u32>, a: &str, up: bool) {
    if up {
        *m.entry(a.to_string()).or_default() += 1;
    } else if let Some(n) = m.get_mut(a) {
        *n -= 1;
        if *n == 0 {
            m.remove(a);
        }
    }
}

/// `vllm:lora_requests_info` and the loads made, as Prometheus text. The
/// info sample's value is the time it was written, as vLLM's is.
pub fn render(f: &AdapterFigures, now_s: f64) -> String {
    format!(
        "# HELP vllm:lora_requests_info Running stats on lora requests.\n# TYPE vllm:lora_requests_info gauge\n\
         vllm:lora_requests_info{{max_lora=\"{}\",running_lora_adapters=\"{}\",waiting_lora_adapters=\"{}\"}} {now_s}\n\
         # HELP fleetroute_sim_lora_loads_total Adapters put on the GPU, by where from.\n# TYPE fleetroute_sim_lora_loads_total counter\n\
         fleetroute_sim_lora_loads_total{{source=\"host\"}} {}\nfleetroute_sim_lora_loads_total{{source=\"disk\"}} {}\n",
        f.max_loras,
        f.running.join(","),
        f.waiting.join(","),
        f.host_loads,
        f.disk_loads
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_slot() -> Arc<Adapters> {
        Arc::new(Adapters::new(AdapterSettings {
            model: LoraModel {
                max_loras: 1,
                max_cpu_loras: 2,
                gpu_load_ms: 5.0,
                disk_load_ms: 50.0,
                overlapped: false,
            },
            preloaded: vec!["a".into()],
            runtime: true,
        }))
    }

    #[tokio::test]
    async fn a_request_waits_for_a_slot_and_pays_the_load() {
        let ads = one_slot();
        assert!(ads.knows("a") && !ads.knows("b"));
        ads.register("b").unwrap();
        assert!(ads.register("b").is_err());
        let (ms, a) = ads.acquire("a").await;
        assert_eq!(ms, 55.0);
        let f = ads.figures();
        assert_eq!(
            (f.running.clone(), f.disk_loads),
            (vec!["a".to_string()], 1)
        );
        // b waits while a's request runs in the only slot.
        let waiter = tokio::spawn({
            let ads = ads.clone();
            async move { ads.acquire("b").await.0 }
        });
        tokio::task::yield_now().await;
        assert_eq!(ads.figures().waiting, vec!["b".to_string()]);
        assert!(render(&ads.figures(), 1.5).contains(
            "vllm:lora_requests_info{max_lora=\"1\",running_lora_adapters=\"a\",waiting_lora_adapters=\"b\"} 1.5"
        ));
        drop(a);
        assert_eq!(waiter.await.unwrap(), 55.0);
        // a is back from host memory.
        let (ms, _a) = ads.acquire("a").await;
        assert_eq!(ms, 5.0);
        assert!(ads.unregister("b") && !ads.unregister("b"));
    }
}
