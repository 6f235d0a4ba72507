//! fleetroute's own request path in the simulation: the real decision
//! (`request::place::decide_on`), class and tenant admission and the commit
//! (`request::admit` and `request::release`, what the ext_proc stream runs),
//! the real writer (prefix index, figures, outliers) and real load guards,
//! driven by the simulated clock. The lease and the reply are not run: a
//! lease's bound runs on the wall clock (moka's expiry), which the
//! simulation does not have, so the simulation ends a request's load at its
//! simulated end and first token itself.

use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::HeaderMap;
use fleetroute::admission::{Admission, Ticket};
use fleetroute::config::ValidConfig;
use fleetroute::observe::Observation;
use fleetroute::observe::usage::{PromptDetails, Usage};
use fleetroute::request::place::{Placed, decide_on};
use fleetroute::request::{self, Admitted as Outcome};
use fleetroute::route::key::RouteKey;
use fleetroute::state::load::RequestGuard;
use fleetroute::state::peer::PeerUpdate;
use fleetroute::state::{Decided, Event, Shared, Writer};
use fleetroute::topology::{AdapterId, FleetId, ReplicaId};
use fleetroute_filter::contract::KeySource;

pub use super::fleetroute_config::{config, config_with};
use super::sim::{Admitted, SimRouter, View};
use super::trace::TraceRequest;

pub struct Fleetroute {
    shared: Arc<Shared>,
    writer: Writer,
    start: Instant,
    block_tokens: u32,
    live: Vec<Option<Live>>,
    rng: u64,
    label: String,
    /// The real admission, on the simulated clock.
    admission: Admission,
    /// Requests it holds, by trace index, in arrival order.
    held: Vec<(usize, Ticket)>,
    /// Placement ahead of demand (packed fleets with `packing.placement`).
    placement: fleetroute::placement::Placement,
    next_placement_ms: f64,
}

struct Live {
    placed: Placement,
    routed_at: f64,
    req: TraceRequest,
}

impl Fleetroute {
    pub fn new(cfg: &ValidConfig, requests: usize, block_tokens: u64, label: &str) -> Self {
        let (shared, mut writer) = Writer::new(cfg);
        let start = Instant::now();
        let generation = shared.snapshot().topo.generation;
        for replica in 0..cfg.fleets[0].endpoints.len() {
            writer.apply(
                Event::Health {
                    generation,
                    fleet: FleetId(0),
                    replica: ReplicaId(replica),
                    ok: true,
                },
                start,
            );
        }
        writer.drain(start);
        Fleetroute {
            shared,
            writer,
            start,
            block_tokens: block_tokens as u32,
            live: (0..requests).map(|_| None).collect(),
            rng: 0x853c_49e6_748f_ea9b,
            label: label.to_string(),
            admission: Admission::new(start),
            held: Vec::new(),
            placement: Default::default(),
            next_placement_ms: 0.0,
        }
    }

    /// fleetroute's `/metrics` text after a run.
    pub fn metrics(&self) -> String {
        self.shared.metrics.render()
    }

    pub fn at(&self, ms: f64) -> Instant {
        self.start + Duration::from_secs_f64(ms.max(0.0) / 1000.0)
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Sends this instance's prefix changes to the returned receiver too.
    pub fn share_updates(&mut self) -> tokio::sync::mpsc::Receiver<PeerUpdate> {
        self.writer.share_updates()
    }

    /// Hands `ev` to the writer and applies it at simulated time `now`.
    pub fn apply(&mut self, now: f64, ev: Event) {
        self.shared.emit(ev);
        let t = self.at(now);
        self.writer.drain(t);
    }

    fn next_rng(&mut self) -> u64 {
        self.rng = self
            .rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.rng
    }

    fn key<'a>(&self, req: &'a TraceRequest) -> RouteKey<'a> {
        let mut key = RouteKey {
            // An adapter is the request's `model`, as clients name it.
            model: Some(req.adapter.as_deref().unwrap_or("trace")),
            // The filter's content-derived key: system prompt plus first
            // user message, the same for every turn of a conversation.
            key: req.content_key,
            key_source: Some(KeySource::Content),
            blocks: req.blocks.clone(),
            // The filter counts the system message's full blocks.
            opening_blocks: req.system_blocks.min(req.blocks.len()) as u16,
            block_tokens: self.block_tokens,
            prompt_tokens: req.input_tokens as u32,
            tenant: req.tenant.as_str().into(),
            ..Default::default()
        };
        fleetroute::route::stage::adapter(&self.shared.snapshot().topo, &mut key);
        key
    }

    /// The real decision for `req` at `now`, its load counted (no admission).
    pub fn place(&mut self, now: f64, req: &TraceRequest) -> Placement {
        match self.admit(now, req) {
            Outcome::Placed(placed, _) => self.placement(now, placed, 0.0),
            _ => panic!("placed with admission or tenant limits"),
        }
    }

    /// The request path for `req` at `now`: the decision, class admission,
    /// the tenant's limits and the commit. No tenant limits are set in the
    /// replay, so the tenant step never waits on Redis.
    fn admit<'a>(&mut self, now: f64, req: &'a TraceRequest) -> Outcome<'a> {
        let rng = self.next_rng();
        let key = self.key(req);
        let (snap, decision) = decide_on(&self.shared, &key, rng).unwrap_or_else(|e| {
            let snap = self.shared.snapshot_full();
            panic!(
                "a ready replica: {e:?} at {now}: {:?}",
                snap.replicas[0].values().collect::<Vec<_>>()
            )
        });
        let t = self.at(now);
        let headers = HeaderMap::default();
        let admitted = request::admit(
            &self.shared,
            &self.admission,
            snap,
            decision,
            key,
            &headers,
            t,
        );
        futures::executor::block_on(admitted)
    }

    /// A decision put into effect at `now`, after `held_ms` held.
    fn placement(&mut self, now: f64, placed: Placed, held_ms: f64) -> Placement {
        let decided = placed.decided();
        let prefill_ms_per_k = placed.snapshot.fleets[0].figures.latency;
        let (d, guard) = (placed.decision, placed.guard);
        let t = self.at(now);
        self.writer.drain(t);
        Placement {
            replica: d.replicas.head().index(),
            guard,
            decided,
            predicted: d.cached_tokens,
            uncached: d.uncached_tokens,
            queued: d.queued_tokens,
            prefill_ms_per_k,
            held_ms,
        }
    }

    /// An admitted decision put into effect; its replica.
    fn placed(
        &mut self,
        now: f64,
        id: usize,
        req: &TraceRequest,
        placed: Placed,
        held_ms: f64,
    ) -> usize {
        let p = self.placement(now, placed, held_ms);
        let replica = p.replica;
        self.live[id] = Some(Live {
            placed: p,
            routed_at: now,
            req: req.clone(),
        });
        replica
    }

    /// What the access log entry of a finished request tells the writer.
    #[allow(clippy::too_many_arguments)]
    pub fn observation(
        p: &Placement,
        routed_at: f64,
        now: f64,
        req: &TraceRequest,
        cached: u64,
        ttft_ms: f64,
        decided: Option<Decided>,
    ) -> Observation {
        let served = !ttft_ms.is_nan();
        Observation {
            stage: "trace".into(),
            fleet: "pool".into(),
            replica: format!("10.0.0.{}:8000", p.replica + 1),
            served_by: None,
            status: Some(if served { 200 } else { 503 }),
            // Envoy's time to first byte includes the hold; the observer takes it
            // out again, as `observe::access_log` does.
            time_to_first_byte: served
                .then(|| Duration::from_secs_f64((ttft_ms - p.held_ms).max(0.0) / 1000.0)),
            total: Duration::from_secs_f64((now - routed_at).max(0.0) / 1000.0),
            usage: served.then_some(Usage {
                prompt_tokens: req.input_tokens,
                completion_tokens: req.output_tokens,
                prompt_tokens_details: Some(PromptDetails {
                    cached_tokens: cached,
                }),
            }),
            predicted_cached_tokens: p.predicted,
            uncached_tokens: p.uncached,
            queued_tokens: p.queued,
            arm: fleetroute::route::experiment::Arm::None,
            stream: true,
            ended_early: false,
            key: None,
            decided,
        }
    }
}

/// A decision put into effect, as the simulation keeps it.
pub struct Placement {
    pub replica: usize,
    pub guard: RequestGuard,
    pub decided: Decided,
    pub predicted: u64,
    pub uncached: u64,
    pub queued: u64,
    /// The fleet's measured time to first token per 1000 tokens, for the
    /// lease bound.
    pub prefill_ms_per_k: Option<f64>,
    /// Time admission held it, ms.
    pub held_ms: f64,
}

impl SimRouter for Fleetroute {
    /// Only the adapters the engines report (`vllm:lora_requests_info`) and
    /// a packed replica's models:
    /// the replays without adapters route on fleetroute's own counts.
    fn scrape(&mut self, _now: f64, engines: &[super::sim::EngineFigures]) {
        let snap = self.shared.snapshot_full();
        let fleet = &snap.topo.fleets[0];
        for (r, e) in engines.iter().enumerate() {
            // A packed replica's model list, as the scrape reads it.
            if let (Some(h), Some(rep)) = (&fleet.hold, fleet.replicas.get(ReplicaId(r)))
                && h.is_models()
            {
                let ids = |v: &[String]| v.iter().map(|m| AdapterId::of(m)).collect::<Vec<_>>();
                // Models its queued requests wait for: being loaded (the
                // engine lists them `loading` once asked).
                let waiting = e.lora.as_ref().map_or(&[][..], |l| &l.waiting[..]);
                rep.load
                    .adapters
                    .engine_holds(&ids(&e.held), &ids(waiting), h.kept);
                continue;
            }
            if let (Some(l), Some(rep)) = (&e.lora, fleet.replicas.get(ReplicaId(r))) {
                let report = fleetroute::engine::EngineReport {
                    lora: Some(l.clone()),
                    ..Default::default()
                };
                rep.load.apply_report(&report, fleet.hold.as_ref());
            }
        }
    }

    fn name(&self) -> String {
        self.label.clone()
    }

    fn route(&mut self, now: f64, id: usize, req: &TraceRequest, view: &View<'_>) -> usize {
        match self.arrive(now, id, req, view) {
            Admitted::To(r) => r,
            other => panic!("routed with admission: {other:?}"),
        }
    }

    fn arrive(&mut self, now: f64, id: usize, req: &TraceRequest, _: &View<'_>) -> Admitted {
        match self.admit(now, req) {
            Outcome::Placed(p, _) => Admitted::To(self.placed(now, id, req, p, 0.0)),
            Outcome::Held(held) => {
                self.held.push((id, held.ticket));
                Admitted::Held
            }
            Outcome::Overloaded { .. } | Outcome::Rejected(_) => Admitted::Refused,
            Outcome::Invalid(_) => unreachable!("no priority header in the replay"),
        }
    }

    fn release(
        &mut self,
        now: f64,
        reqs: &[TraceRequest],
        _: &View<'_>,
    ) -> Vec<(usize, Option<usize>)> {
        if self.held.is_empty() {
            return Vec::new();
        }
        let t = self.at(now);
        let mut out = Vec::new();
        // Deadlines passed and places lost to lighter tenants.
        let mut kept = Vec::with_capacity(self.held.len());
        for (id, ticket) in std::mem::take(&mut self.held) {
            if ticket.evicted() || t >= ticket.deadline() {
                ticket.refuse(t);
                out.push((id, None));
            } else {
                kept.push((id, ticket));
            }
        }
        self.held = kept;
        // Heads, one after another, until one must wait.
        while let Some(pos) = self.held.iter().position(|(_, tk)| tk.is_head(t)) {
            let (id, ticket) = self.held.remove(pos);
            let rng = self.next_rng();
            let mut key = self.key(&reqs[id]);
            let (snap, decision) = decide_on(&self.shared, &key, rng).unwrap_or_else(|e| {
                let snap = self.shared.snapshot_full();
                panic!(
                    "a ready replica: {e:?} at {now}: {:?}",
                    snap.replicas[0].values().collect::<Vec<_>>()
                )
            });
            let held_ms = t.saturating_duration_since(ticket.arrived()).as_secs_f64() * 1000.0;
            let headers = HeaderMap::default();
            let released = request::release(
                &self.shared,
                &self.admission,
                ticket,
                snap,
                decision,
                &mut key,
                &headers,
                t,
            );
            match futures::executor::block_on(released) {
                Ok(Outcome::Placed(p, _)) => {
                    let r = self.placed(now, id, &reqs[id], p, held_ms);
                    out.push((id, Some(r)));
                }
                Ok(_) => out.push((id, None)),
                Err(ticket) => {
                    self.held.insert(pos, (id, ticket));
                    break;
                }
            }
        }
        out
    }

    fn first_token(&mut self, _: f64, id: usize) {
        if let Some(l) = &self.live[id] {
            l.placed.guard.first_byte();
        }
    }

    fn finished(&mut self, now: f64, id: usize, cached: u64, ttft_ms: f64) {
        let Some(l) = self.live[id].take() else {
            return;
        };
        l.placed.guard.release();
        let obs = Self::observation(
            &l.placed,
            l.routed_at,
            now,
            &l.req,
            cached,
            ttft_ms,
            Some(l.placed.decided),
        );
        self.apply(now, Event::Observed(Box::new(obs)));
    }

    fn tick(&mut self, now: f64) {
        let t = self.at(now);
        self.writer.tick(t);
    }

    /// The placement round when its interval is up: each load marked held
    /// (as the running loop does), and handed to the simulated replica.
    fn placements(&mut self, now: f64) -> Vec<(usize, String)> {
        let snap = self.shared.snapshot_full();
        let fleet = &snap.topo.fleets[0];
        let Some(every) = fleet
            .hold
            .as_ref()
            .and_then(|h| h.placement())
            .map(|p| p.interval_ms)
        else {
            return Vec::new();
        };
        if now < self.next_placement_ms {
            return Vec::new();
        }
        self.next_placement_ms = now + every as f64;
        let planned = self.placement.round(&self.shared, &snap, self.at(now));
        planned
            .into_iter()
            .map(|p| {
                let kept = fleet.hold.as_ref().map_or(1, |h| h.kept);
                fleet.replicas[p.replica].load.adapters.used(&[p.id], kept);
                (p.replica.0, snap.topo.stages[p.stage].model.clone())
            })
            .collect()
    }
}
