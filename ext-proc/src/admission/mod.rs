//! Priority classes and time to first token objectives under overload.
//!
//! Between the decision (`route`) and putting it into effect
//! (`route::place::commit`), admission looks at the request's class
//! (`class`), its predicted time to first token on the chosen replica
//! (`predict`) and what its stage holds (`queue`), and routes it, holds it
//! until a replica can meet its objective, or refuses it with a 429
//! (`judge` has the rules, `reply` the answers). Capacity among the tenants
//! of a class is shared by their recent tokens (`shares`).
//!
//! Cost for a request routed at once in a stage with admission: the
//! prediction, a few atomic loads of the queue depths, one counter and one
//! compare-and-swap per sketch row; no lock. Stages without `admission` skip
//! all of it. Held requests take the stage queue's mutex.
//!
//! State lives per stage and survives snapshots: it is found by the stage's
//! index in the topology generation it was built for, rebuilt (queues and
//! accounts kept by stage name) the first time a request sees a new
//! generation.

pub mod class;
pub mod judge;
pub mod predict;
pub mod queue;
pub mod reply;
pub mod shares;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::config::core::v3::HeaderMap;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use xxhash_rust::xxh3::xxh3_64;

use crate::config::{Priority, StageAdmission};
use crate::metrics::{ADMISSION_VERDICTS, AdmissionVerdict, Metrics, StageClass};
use crate::route::Decision;
use crate::route::eligible::cached_tokens;
use crate::route::key::RouteKey;
use crate::route::replica::FALLBACKS;
use crate::state::Snapshot;
use crate::state::figures::OVERHEAD_TOKENS;
use crate::state::prefix_index::Matches;
use crate::topology::{NonEmpty, ReplicaId, StageId};
use class::BadPriority;
use judge::{Ask, Reason, Refusal, Retry, Verdict};
use predict::Prediction;
use queue::{StageQueue, Waiter};
use shares::Shares;

/// How often the head of a queue asks again whether a replica can take it:
/// capacity frees as leases end, which nothing announces.
pub const POLL: Duration = Duration::from_millis(20);

/// Indices into `ADMISSION_VERDICTS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Counted {
    Admitted,
    AdmittedAfterWait,
    Refused(Reason),
    Cancelled,
}

impl Counted {
    fn index(self) -> usize {
        match self {
            Counted::Admitted => 0,
            Counted::AdmittedAfterWait => 1,
            Counted::Refused(r) => match r {
                Reason::Saturated => 2,
                Reason::Reserved => 3,
                Reason::QueueFull => 4,
                Reason::Objective => 5,
                Reason::TimedOut => 6,
            },
            Counted::Cancelled => 7,
        }
    }
}

/// A stage's queues and tenant accounts: kept across reloads by name.
#[derive(Debug)]
struct Runtime {
    queue: StageQueue,
    shares: Shares,
    /// When each class last sent a request, ms after `Admission::start`
    /// (+1, so 0 is never).
    last_seen: [AtomicU64; 3],
}

impl Runtime {
    fn seen(&self, c: Priority, at_ms: u64) {
        self.last_seen[c.rank()].store(at_ms + 1, Relaxed);
    }

    fn active(&self, at_ms: u64) -> [bool; 3] {
        let window = predict::ACTIVE_FOR.as_millis() as u64;
        std::array::from_fn(|r| {
            let seen = self.last_seen[r].load(Relaxed);
            seen != 0 && at_ms + 1 - seen.min(at_ms + 1) <= window
        })
    }
}

/// Metric handles of one stage, resolved once per topology generation.
struct Counters {
    verdicts: [[Counter; ADMISSION_VERDICTS.len()]; 3],
    depth: [Gauge; 3],
    wait: [Histogram; 3],
}

struct StageState {
    name: String,
    runtime: Arc<Runtime>,
    counters: Counters,
}

impl StageState {
    fn count(&self, c: Priority, what: Counted) {
        self.counters.verdicts[c.rank()][what.index()].inc();
    }

    fn depth_changed(&self, c: Priority) {
        self.counters.depth[c.rank()].set(i64::from(self.runtime.queue.depth(c)));
    }
}

struct Stages {
    generation: u64,
    /// By `StageId`; none for stages without admission.
    by_stage: Vec<Option<Arc<StageState>>>,
}

/// What admission makes of a decision.
pub enum Judged {
    /// Route it. The decision may name a fallback replica instead of the
    /// chosen one, when only the fallback meets the objective.
    Admit(Decision),
    /// Hold it: try again when the ticket's turn comes.
    Hold(Ticket),
    /// Answer 429 (`reply::refused`) for this stage.
    Refuse { stage: String, refusal: Refusal },
    /// Answer 400 (`reply::bad_priority`): the priority header names no class.
    Invalid(BadPriority),
}

/// What becomes of a held request at one of its turns.
pub enum Retried {
    Release(Decision),
    Wait,
    Refuse(Refusal),
}

pub struct Admission {
    /// The clock's origin for the tenant accounts.
    start: Instant,
    next_id: AtomicU64,
    stages: ArcSwap<Stages>,
    rebuild: Mutex<()>,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission").finish_non_exhaustive()
    }
}

/// Prefill a request adds, in tokens: what it is charged and what it weighs
/// in a queue.
fn work(d: &Decision) -> u64 {
    d.uncached_tokens + OVERHEAD_TOKENS as u64
}

impl Admission {
    /// `start`: the clock's origin (the replay passes its simulated one).
    pub fn new(start: Instant) -> Admission {
        Admission {
            start,
            next_id: AtomicU64::new(1),
            stages: ArcSwap::from_pointee(Stages {
                generation: u64::MAX,
                by_stage: Vec::new(),
            }),
            rebuild: Mutex::new(()),
        }
    }

    fn ms(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.start).as_millis() as u64
    }

    /// The request's class: its tenant's, or its priority header's.
    pub fn class(
        &self,
        snap: &Snapshot,
        headers: &HeaderMap,
        tenant: &str,
    ) -> Result<Priority, BadPriority> {
        let cfg = &snap.config.admission;
        let header = cfg
            .priority_header
            .as_deref()
            .and_then(|name| class::header(headers, name));
        class::resolve(cfg, snap.tenant(tenant).priority, header)
    }

    fn state(&self, metrics: &Metrics, snap: &Snapshot, stage: StageId) -> Option<Arc<StageState>> {
        let topo = &snap.topo;
        {
            let s = self.stages.load();
            if s.generation == topo.generation {
                return s.by_stage.get(stage.index()).cloned().flatten();
            }
        }
        let _one = self.rebuild.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.stages.load_full();
        if old.generation != topo.generation {
            let kept: HashMap<&str, Arc<Runtime>> = old
                .by_stage
                .iter()
                .flatten()
                .map(|s| (s.name.as_str(), s.runtime.clone()))
                .collect();
            let by_stage = topo
                .stages
                .iter()
                .map(|s| {
                    s.admission.as_ref()?;
                    let runtime = kept.get(s.name.as_str()).cloned().unwrap_or_else(|| {
                        Arc::new(Runtime {
                            queue: StageQueue::default(),
                            shares: Shares::new(self.start),
                            last_seen: Default::default(),
                        })
                    });
                    Some(Arc::new(StageState {
                        counters: counters(metrics, &s.name),
                        name: s.name.clone(),
                        runtime,
                    }))
                })
                .collect();
            self.stages.store(Arc::new(Stages {
                generation: topo.generation,
                by_stage,
            }));
        }
        self.stages
            .load()
            .by_stage
            .get(stage.index())
            .cloned()
            .flatten()
    }

    /// A request as it arrives, with the decision made for it. Its class
    /// is read only in stages with admission.
    pub fn judge(
        &self,
        metrics: &Metrics,
        snap: &Snapshot,
        headers: &HeaderMap,
        key: &RouteKey<'_>,
        decision: Decision,
        now: Instant,
    ) -> Judged {
        let stage = &snap.topo.stages[decision.stage];
        let Some(cfg) = &stage.admission else {
            return Judged::Admit(decision);
        };
        let class = match self.class(snap, headers, &key.tenant) {
            Ok(c) => c,
            Err(bad) => return Judged::Invalid(bad),
        };
        self.judge_class(metrics, snap, cfg, key, decision, class, now)
    }

    /// [`Admission::judge`] for a request whose class is known (the replay
    /// assigns classes itself).
    #[allow(clippy::too_many_arguments)]
    pub fn judge_class(
        &self,
        metrics: &Metrics,
        snap: &Snapshot,
        cfg: &StageAdmission,
        key: &RouteKey<'_>,
        decision: Decision,
        class: Priority,
        now: Instant,
    ) -> Judged {
        let Some(st) = self.state(metrics, snap, decision.stage) else {
            return Judged::Admit(decision);
        };
        let tenant = xxh3_64(key.tenant.as_bytes());
        let rt = &st.runtime;
        let at = self.ms(now);
        rt.seen(class, at);
        let active = rt.active(at);
        let (ask, decision) = fit(snap, cfg, key, decision, class, None, 0.0, active);
        match judge::arrive(&ask, &rt.queue, now) {
            Verdict::Admit => {
                rt.shares.charge(tenant, work(&decision), now);
                st.count(class, Counted::Admitted);
                Judged::Admit(decision)
            }
            Verdict::Refuse(refusal) => {
                st.count(class, Counted::Refused(refusal.reason));
                Judged::Refuse {
                    stage: st.name.clone(),
                    refusal,
                }
            }
            Verdict::Hold {
                deadline,
                objective_ms,
            } => {
                let id = self.next_id.fetch_add(1, Relaxed);
                let w = Arc::new(Waiter::new(
                    id,
                    class,
                    tenant,
                    work(&decision),
                    now,
                    deadline,
                    objective_ms,
                ));
                match rt
                    .queue
                    .push(w.clone(), cfg.queue.get(class), &rt.shares, now)
                {
                    Err(queue::Full) => {
                        st.count(class, Counted::Refused(Reason::QueueFull));
                        Judged::Refuse {
                            stage: st.name.clone(),
                            refusal: judge::refusal(cfg, class, Reason::QueueFull),
                        }
                    }
                    Ok(_evicted) => {
                        // An evicted request counts itself when it wakes.
                        st.depth_changed(class);
                        Judged::Hold(Ticket {
                            stage: st,
                            waiter: w,
                            retry_after_s: cfg.retry_after_s.min(judge::MAX_RETRY_AFTER_S),
                            done: false,
                        })
                    }
                }
            }
        }
    }

    /// A held request's turn, with a fresh decision for it.
    pub fn retry(
        &self,
        mut ticket: Ticket,
        snap: &Snapshot,
        key: &RouteKey<'_>,
        decision: Decision,
        now: Instant,
    ) -> (Option<Ticket>, Retried) {
        let class = ticket.waiter.class;
        // A reload may have turned admission off for the stage.
        let Some(cfg) = &snap.topo.stages[decision.stage].admission else {
            ticket.end(Counted::AdmittedAfterWait, now);
            return (None, Retried::Release(decision));
        };
        let waited = now
            .saturating_duration_since(ticket.waiter.arrived)
            .as_secs_f64()
            * 1000.0;
        let objective = Some(ticket.waiter.objective_ms);
        let active = ticket.stage.runtime.active(self.ms(now));
        let (ask, decision) = fit(snap, cfg, key, decision, class, objective, waited, active);
        match judge::retry(&ask, waited) {
            Retry::Release => {
                let rt = &ticket.stage.runtime;
                rt.shares.charge(ticket.waiter.tenant, work(&decision), now);
                ticket.end(Counted::AdmittedAfterWait, now);
                (None, Retried::Release(decision))
            }
            Retry::Wait => (Some(ticket), Retried::Wait),
            Retry::Refuse(r) => {
                ticket.end(Counted::Refused(r.reason), now);
                (None, Retried::Refuse(r))
            }
        }
    }
}

fn counters(m: &Metrics, stage: &str) -> Counters {
    let sc = |c: Priority| StageClass {
        stage: stage.to_string(),
        class: c.as_str().into(),
    };
    Counters {
        verdicts: Priority::ALL.map(|c| {
            ADMISSION_VERDICTS.map(|v| {
                m.admission_verdicts
                    .get_or_create(&AdmissionVerdict {
                        stage: stage.to_string(),
                        class: c.as_str().into(),
                        verdict: v.into(),
                    })
                    .clone()
            })
        }),
        depth: Priority::ALL.map(|c| m.admission_queue_depth.get_or_create(&sc(c)).clone()),
        wait: Priority::ALL.map(|c| m.admission_wait.get_or_create(&sc(c)).clone()),
    }
}

/// The request's prediction on its chosen replica. When that one cannot
/// take it now, the first of the decision's fallbacks that can, else the
/// fleet's ready replica that can with the shortest prediction, takes it
/// instead (its cached prefix read from the prefix index again). Only
/// requests that are not admitted at once pay for this.
#[allow(clippy::too_many_arguments)]
fn fit<'c>(
    snap: &Snapshot,
    cfg: &'c StageAdmission,
    key: &RouteKey<'_>,
    mut d: Decision,
    class: Priority,
    objective: Option<f64>,
    waited_ms: f64,
    active: [bool; 3],
) -> (Ask<'c>, Decision) {
    let stage = &snap.topo.stages[d.stage];
    let fleet = &snap.topo.fleets[d.fleet];
    let latency = snap.fleets[d.fleet].figures.latency;
    let engine_tokens = stage.replica_choice.engine_queue_tokens;
    let head = *d.replicas.head();
    let on = |r: ReplicaId, cached: u64| {
        let load = &fleet.replicas[r].load;
        let (uncached, queued) = if r == head {
            (d.uncached_tokens, d.queued_tokens)
        } else {
            let engine = f64::from(load.engine_waiting()) * engine_tokens;
            (
                u64::from(key.prompt_tokens).saturating_sub(cached),
                load.pending_prefill() + engine as u64,
            )
        };
        let pred = Prediction::new(latency, uncached, queued, d.stage_load.min_queued);
        (
            r,
            pred,
            load.inflight() >= fleet.capacity.max_inflight,
            uncached,
            queued,
        )
    };
    let (_, mut pred, mut full, _, _) = on(head, d.cached_tokens);
    let objective = objective.or_else(|| judge::objective(cfg, class, &pred));
    let limit = |p: &Prediction| judge::limit(cfg, class, active, objective, waited_ms, p.own_ms);
    let fits = |x: &(ReplicaId, Prediction, bool, u64, u64)| judge::fits(limit(&x.1), &x.1, x.2);
    if !judge::fits(limit(&pred), &pred, full) {
        // What the prefix index predicts each replica of the fleet holds.
        let mut matches = Matches::default();
        let depth = if key.blocks.is_empty() {
            0
        } else {
            snap.fleets[d.fleet]
                .prefix
                .matches(&key.blocks, &mut matches)
        };
        let cached = |r: ReplicaId| {
            if depth == 0 {
                0
            } else {
                cached_tokens(matches[r], key)
            }
        };
        // Replicas this conversation failed stay skipped, as in the decision
        // (a bit counts while its slot holds the member that failed).
        let avoid = key
            .conversation()
            .and_then(|k| snap.failed_keys.avoid(k, snap.topo.layout))
            .filter(|a| a.fleet == d.fleet);
        let failed = |r: ReplicaId| {
            avoid.is_some_and(|a| {
                a.mask & (1 << r.index()) != 0 && fleet.replicas[r].since <= a.generation
            })
        };
        let fallback = d.replicas[1..].iter().map(|&r| on(r, cached(r))).find(fits);
        let better = fallback.or_else(|| {
            // Occupied slots only: a member that left leaves its slot free.
            fleet
                .replicas
                .ids()
                .filter(|&r| r != head && snap.replicas[d.fleet][r].ready())
                .filter(|&r| !failed(r))
                .map(|r| on(r, cached(r)))
                .filter(fits)
                .min_by(|a, b| a.1.ttft_ms.total_cmp(&b.1.ttft_ms))
        });
        if let Some((r, p, f, uncached, queued)) = better {
            let mut order: Vec<ReplicaId> =
                d.replicas.iter().copied().filter(|&x| x != r).collect();
            order.insert(0, r);
            order.truncate(1 + FALLBACKS);
            d.replicas = NonEmpty::new(order).expect("the new head");
            d.uncached_tokens = uncached;
            d.cached_tokens = u64::from(key.prompt_tokens) - uncached;
            d.queued_tokens = queued;
            (pred, full) = (p, f);
        }
    }
    let ask = Ask {
        cfg,
        max_wait_ms: snap.config.admission.max_wait_ms,
        class,
        pred,
        load: d.stage_load,
        chosen_full: full,
        objective_ms: objective,
        active,
    };
    (ask, d)
}

/// A held request's place in its stage's queue. Dropping it takes the
/// request out at once (a client that went away leaves no trace but the
/// `cancelled` count).
pub struct Ticket {
    stage: Arc<StageState>,
    waiter: Arc<Waiter>,
    retry_after_s: u32,
    done: bool,
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
        let now = Instant::now();
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

    fn end(&mut self, how: Counted, now: Instant) {
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
        self.end(Counted::Cancelled, Instant::now());
    }
}

#[cfg(test)]
mod tests;
