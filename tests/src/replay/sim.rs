//! A discrete-event simulation of replicas running the simulated engine's
//! model: a prefix cache of finite capacity, a batch of `max_batch` slots, one
//! prefill lane (FIFO), then decode at a fixed rate per token.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::sim_replica::Replica;
pub use super::sim_replica::ReplicaAdapters;
use super::trace::TraceRequest;
use crate::engine::adapters::bump;
use crate::engine::cache::PrefixCache;
use crate::engine::latency::LatencyModel;
use crate::engine::lora::{LoraModel, LoraSlots};

/// What a router sees of the replicas: requests it has in flight on each.
pub struct View<'a> {
    pub inflight: &'a [u32],
    /// Exact engine caches (routers that receive KV events, like Dynamo's).
    pub caches: &'a [PrefixCache],
    /// Per replica, the adapters of its running and waiting requests (as
    /// vLLM's `vllm:lora_requests_info` reports them); empty without LoRA.
    pub adapters: &'a [ReplicaAdapters],
}

/// What a router with admission makes of an arriving request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admitted {
    To(usize),
    /// Answered 429: never served.
    Refused,
    /// Held by the router; `release` says later what became of it.
    Held,
}

/// A routing policy under test.
pub trait SimRouter {
    fn name(&self) -> String;
    /// Picks a replica for request `id` arriving at `now_ms`.
    fn route(&mut self, now_ms: f64, id: usize, req: &TraceRequest, view: &View<'_>) -> usize;
    /// The same, for routers that may also refuse or hold a request.
    fn arrive(&mut self, now_ms: f64, id: usize, req: &TraceRequest, view: &View<'_>) -> Admitted {
        Admitted::To(self.route(now_ms, id, req, view))
    }
    /// Held requests that leave now: to a replica, or refused (`None`).
    /// Called after every event and every [`POLL_MS`].
    fn release(
        &mut self,
        _now_ms: f64,
        _reqs: &[TraceRequest],
        _view: &View<'_>,
    ) -> Vec<(usize, Option<usize>)> {
        Vec::new()
    }
    /// The first token of `id` came back.
    fn first_token(&mut self, _now_ms: f64, _id: usize) {}
    /// `id` finished; the engine reported `cached_tokens`.
    fn finished(&mut self, _now_ms: f64, _id: usize, _cached_tokens: u64, _ttft_ms: f64) {}
    /// Called every 250 ms of simulated time.
    fn tick(&mut self, _now_ms: f64) {}
    /// Loads the router starts ahead of demand (placement), after a tick:
    /// (replica, model).
    fn placements(&mut self, _now_ms: f64) -> Vec<(usize, String)> {
        Vec::new()
    }
    /// The engines' own figures, as a metrics scrape reads them (every
    /// `SimConfig::scrape_ms`, when set).
    fn scrape(&mut self, _now_ms: f64, _engines: &[EngineFigures]) {}
}

/// What one replica's metrics endpoint reports.
#[derive(Clone, Debug, Default)]
pub struct EngineFigures {
    pub running: u32,
    pub waiting: u32,
    /// The adapters its requests use, as `vllm:lora_requests_info` says
    /// (replicas holding adapters only).
    pub lora: Option<fleetroute::engine::LoraState>,
    /// What its GPU holds, most recently used first: a packed replica's
    /// loaded models, as its model list (`GET /models`) says.
    pub held: Vec<String>,
}

#[derive(Clone, Copy, Debug)]
pub struct SimConfig {
    pub replicas: usize,
    pub cache_tokens: u64,
    /// The KV-cache capacity routers are told (`kv_cache_tokens`), which
    /// operators often set above what engines keep; `cache_tokens` if unset.
    pub router_cache_tokens: Option<u64>,
    pub block_tokens: u64,
    pub latency: LatencyModel,
    /// Requests a replica queues before refusing more.
    pub max_queue: usize,
    /// Arrival times are divided by this.
    pub speedup: f64,
    /// How often routers read the engines' figures (none: never).
    pub scrape_ms: Option<f64>,
    /// Adapter slots of every replica (adapter workloads).
    pub lora: Option<LoraModel>,
}

/// How often held requests are looked at, as fleetroute's queue head polls.
pub const POLL_MS: f64 = 20.0;

/// One request's fate.
#[derive(Clone, Copy, Debug, Default)]
pub struct RequestOutcome {
    /// Arrival to first token; NaN when it was never served.
    pub ttft_ms: f64,
    /// Refused by the router's admission (429).
    pub refused: bool,
    /// Refused by a replica whose queue was full.
    pub rejected: bool,
    /// Held by the router before being routed or refused.
    pub held: bool,
    /// Time held, ms.
    pub waited_ms: f64,
    /// Its own prefill on the replica that served it (uncached tokens at
    /// the lane's rate), ms: a first token can come no sooner.
    pub prefill_ms: f64,
}

#[derive(Clone, Debug, Default)]
pub struct Outcome {
    pub ttft_ms: Vec<f64>,
    /// Parallel to the trace's requests.
    pub requests: Vec<RequestOutcome>,
    pub cached_tokens: u64,
    pub prompt_tokens: u64,
    pub rejected: u64,
    /// Requests served per replica.
    pub per_replica: Vec<u64>,
    /// Prompt tokens prefilled (uncached) per replica.
    pub prefill_per_replica: Vec<u64>,
    /// Adapter loads onto a GPU: from host memory, and from disk.
    pub host_loads: u64,
    pub disk_loads: u64,
    /// Requests that waited for their adapter or model to load.
    pub cold_requests: u64,
}

#[derive(PartialEq)]
struct Ev {
    at: f64,
    seq: u64,
    kind: Kind,
}

#[derive(PartialEq)]
enum Kind {
    Arrive(usize),
    PrefillDone(usize, usize),
    /// An overlapped load on a replica ended.
    Loaded(usize),
    Finish(usize, usize),
    Tick,
    Scrape,
    Poll,
}

impl Eq for Ev {}
impl PartialOrd for Ev {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Ev {
    // Earliest first (BinaryHeap is a max-heap).
    fn cmp(&self, other: &Self) -> Ordering {
        other.at.total_cmp(&self.at).then(other.seq.cmp(&self.seq))
    }
}

pub fn run(cfg: &SimConfig, reqs: &[TraceRequest], router: &mut dyn SimRouter) -> Outcome {
    let n = cfg.replicas;
    let mut caches: Vec<PrefixCache> = (0..n)
        .map(|_| PrefixCache::new(cfg.cache_tokens as usize, cfg.block_tokens as usize))
        .collect();
    let mut reps: Vec<Replica> = (0..n)
        .map(|_| Replica::new(cfg.lora.map(LoraSlots::new)))
        .collect();
    let mut adapters: Vec<ReplicaAdapters> = (0..n)
        .map(|_| ReplicaAdapters {
            max_loras: cfg.lora.map_or(0, |l| l.max_loras),
            ..Default::default()
        })
        .collect();
    let mut inflight = vec![0u32; n];
    let mut out = Outcome {
        per_replica: vec![0; n],
        prefill_per_replica: vec![0; n],
        requests: vec![
            RequestOutcome {
                ttft_ms: f64::NAN,
                ..Default::default()
            };
            reqs.len()
        ],
        ..Default::default()
    };
    let mut cached_of = vec![0u64; reqs.len()];
    let mut arrival = vec![0f64; reqs.len()];
    let mut ttft_of = vec![0f64; reqs.len()];
    let mut heap = BinaryHeap::new();
    let mut seq = 0u64;
    let mut push = |heap: &mut BinaryHeap<Ev>, at: f64, kind: Kind| {
        seq += 1;
        heap.push(Ev { at, seq, kind });
    };
    for (i, r) in reqs.iter().enumerate() {
        arrival[i] = r.arrival_ms / cfg.speedup;
        push(&mut heap, arrival[i], Kind::Arrive(i));
    }
    push(&mut heap, 0.0, Kind::Tick);
    if let Some(every) = cfg.scrape_ms {
        push(&mut heap, every, Kind::Scrape);
    }
    push(&mut heap, 0.0, Kind::Poll);
    let mut remaining = reqs.len();

    while let Some(ev) = heap.pop() {
        let now = ev.at;
        let mut start_on = Vec::new();
        // Requests that go to a replica now: (request, replica).
        let mut enqueue = Vec::new();
        match ev.kind {
            Kind::Tick => {
                router.tick(now);
                for (r, model) in router.placements(now) {
                    let mut wake = Vec::new();
                    if let Some(rep) = reps.get_mut(r) {
                        rep.place(&model, &adapters[r], now, &mut wake);
                    }
                    for at in wake {
                        push(&mut heap, at, Kind::Loaded(r));
                    }
                }
                if remaining > 0 {
                    push(&mut heap, now + 250.0, Kind::Tick);
                }
            }
            Kind::Scrape => {
                let figures: Vec<EngineFigures> = reps
                    .iter()
                    .zip(&adapters)
                    .map(|(r, a)| EngineFigures {
                        running: r.running as u32,
                        waiting: r.queue.len() as u32,
                        lora: r.lora.as_ref().map(|_| a.report()),
                        held: r
                            .lora
                            .as_ref()
                            .map_or_else(Vec::new, |l| l.gpu().cloned().collect()),
                    })
                    .collect();
                router.scrape(now, &figures);
                if remaining > 0
                    && let Some(every) = cfg.scrape_ms
                {
                    push(&mut heap, now + every, Kind::Scrape);
                }
            }
            Kind::Poll => {
                if remaining > 0 {
                    push(&mut heap, now + POLL_MS, Kind::Poll);
                }
            }
            Kind::Arrive(i) => {
                let view = View {
                    inflight: &inflight,
                    caches: &caches,
                    adapters: &adapters,
                };
                match router.arrive(now, i, &reqs[i], &view) {
                    Admitted::To(r) => enqueue.push((i, r.min(n - 1))),
                    Admitted::Refused => {
                        out.requests[i].refused = true;
                        remaining -= 1;
                    }
                    Admitted::Held => out.requests[i].held = true,
                }
            }
            Kind::PrefillDone(r, i) => {
                reps[r].lane_busy = false;
                let first = now + cfg.latency.decode_ms(1);
                ttft_of[i] = first - arrival[i];
                out.ttft_ms.push(ttft_of[i]);
                out.requests[i].ttft_ms = ttft_of[i];
                router.first_token(first, i);
                push(
                    &mut heap,
                    now + cfg.latency.decode_ms(reqs[i].output_tokens),
                    Kind::Finish(r, i),
                );
                start_on.push(r);
            }
            Kind::Loaded(r) => start_on.push(r),
            Kind::Finish(r, i) => {
                reps[r].running -= 1;
                if let Some(a) = &reqs[i].adapter {
                    bump(&mut adapters[r].running, a, false);
                }
                inflight[r] -= 1;
                remaining -= 1;
                router.finished(now, i, cached_of[i], ttft_of[i]);
                start_on.push(r);
            }
        }
        let view = View {
            inflight: &inflight,
            caches: &caches,
            adapters: &adapters,
        };
        for (i, r) in router.release(now, reqs, &view) {
            out.requests[i].waited_ms = now - arrival[i];
            match r {
                Some(r) => enqueue.push((i, r.min(n - 1))),
                None => {
                    out.requests[i].refused = true;
                    remaining -= 1;
                }
            }
        }
        for (i, r) in enqueue {
            if reps[r].queue.len() >= cfg.max_queue {
                out.rejected += 1;
                out.requests[i].rejected = true;
                remaining -= 1;
                router.finished(now, i, 0, f64::NAN);
                continue;
            }
            inflight[r] += 1;
            reps[r].queue.push_back(i);
            if let Some(a) = &reqs[i].adapter {
                bump(&mut adapters[r].waiting, a, true);
            }
            start_on.push(r);
        }
        // Start the next prefill when the lane and a batch slot are free.
        let mut wake = Vec::new();
        for &r in &start_on {
            let rep = &mut reps[r];
            if !rep.lane_busy
                && rep.running < cfg.latency.max_batch
                && let Some((i, load_ms)) = rep.next(reqs, &mut adapters[r], now, &mut wake)
            {
                let req = &reqs[i];
                let matched = caches[r].serve(&req.blocks);
                let cached = caches[r].cached_tokens(matched, req.input_tokens);
                cached_of[i] = cached;
                out.cached_tokens += cached;
                out.prompt_tokens += req.input_tokens;
                out.per_replica[r] += 1;
                out.prefill_per_replica[r] += req.input_tokens - cached;
                rep.lane_busy = true;
                rep.running += 1;
                // An adapter's load holds the lane like prefill does.
                let prefill = cfg.latency.prefill_ms(req.input_tokens - cached) + load_ms;
                out.requests[i].prefill_ms = prefill;
                push(&mut heap, now + prefill, Kind::PrefillDone(r, i));
            }
            for at in wake.drain(..) {
                push(&mut heap, at, Kind::Loaded(r));
            }
        }
    }
    for r in &reps {
        if let Some(l) = &r.lora {
            out.host_loads += l.host_loads;
            out.disk_loads += l.disk_loads;
        }
        out.cold_requests += r.cold.len() as u64;
    }
    out
}
