//! Priority classes and time to first token objectives under overload.
//!
//! Between the decision (`route`) and putting it into effect
//! (`request::place::admit_and_commit`), admission looks at the request's class
//! (`class`), its predicted time to first token on the chosen replica
//! (`predict`) and what its stage holds (`queue`), and routes it, holds it
//! until a replica can meet its objective, or refuses it with a 429
//! (`judge` has the rules, `request::reply` the answers, `fit` finds another replica
//! for a request its chosen one cannot take, `ticket` is a held request's
//! place). Capacity among the tenants of a class is shared by their recent
//! tokens (`shares`); per-stage state is in `runtime`.
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
mod fit;
pub mod judge;
pub mod predict;
pub mod queue;

mod runtime;
pub mod shares;
mod ticket;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::config::core::v3::HeaderMap;
use xxhash_rust::xxh3::xxh3_64;

use crate::config::{Priority, StageAdmission};
use crate::metrics::Metrics;
use crate::route::Decision;
use crate::route::key::RouteKey;
use crate::state::Snapshot;
use crate::state::figures::OVERHEAD_TOKENS;
use crate::topology::StageId;
use class::BadPriority;
use fit::fit;
use judge::{Ask, Reason, Refusal, Retry, Verdict};
use predict::Prediction;
use queue::{StageQueue, Waiter};
use runtime::{Counted, Runtime, StageState, Stages, counters};
use shares::Shares;
pub use ticket::Ticket;

/// How often the head of a queue asks again whether a replica can take it:
/// capacity frees as leases end, which nothing announces.
pub const POLL: Duration = Duration::from_millis(20);

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

#[cfg(test)]
mod tests;
