//! The rules, as pure functions of one request's prediction and the stage's
//! queues (time is passed in):
//!
//! 1. **Saturated stage** (every eligible fleet saturated): sheddable
//!    requests are refused; standard ones too while critical requests are
//!    held.
//! 2. **A class without an objective** is never held. It is routed unless a
//!    higher class is held, or its replica would pass the headroom the
//!    classes above keep (see `predict::headroom_limit`); then refused.
//! 3. **A class with an objective** is routed at once when nothing of its
//!    class or above is held, its replica has a free slot, and its
//!    predicted time to first token meets the objective and the headroom of
//!    the classes above. Otherwise it is held — unless waiting cannot meet
//!    the objective either (the best replica's queue plus the work held
//!    ahead of it already pass it), then it is refused at once.
//! 4. **A held request** leaves when it is the queue's head and rule 3's
//!    test passes with the time it waited counted against its objective;
//!    it is refused when its deadline passes (its objective less its own
//!    prefill, at most `admission.max_wait_ms`), or as soon as waiting can
//!    no longer meet it.

use std::time::{Duration, Instant};

use super::predict::{Prediction, effective_objective, headroom_limit};
use super::queue::StageQueue;
use crate::config::{Priority, StageAdmission};
use crate::route::StageLoad;

/// Longest `retry-after` a refusal names.
pub(super) const MAX_RETRY_AFTER_S: u32 = 60;

/// Why a request was refused; each is a 429 `overloaded` with this reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Every eligible fleet is saturated and this class is shed.
    Saturated,
    /// The capacity left is kept for a higher class.
    Reserved,
    /// Its class queue is full (or a lighter tenant took its place).
    QueueFull,
    /// Even waiting cannot meet its objective.
    Objective,
    /// It was held until its objective could no longer be met.
    TimedOut,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Saturated => "saturated",
            Reason::Reserved => "reserved",
            Reason::QueueFull => "queue_full",
            Reason::Objective => "objective",
            Reason::TimedOut => "timed_out",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Refusal {
    pub class: Priority,
    pub reason: Reason,
    pub retry_after_s: u32,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Verdict {
    Admit,
    /// Hold until `deadline`, judged against `objective_ms` from arrival.
    Hold {
        deadline: Instant,
        objective_ms: f64,
    },
    Refuse(Refusal),
}

/// One request at one moment.
#[derive(Clone, Copy, Debug)]
pub struct Ask<'a> {
    pub cfg: &'a StageAdmission,
    pub max_wait_ms: u64,
    pub class: Priority,
    pub pred: Prediction,
    pub load: StageLoad,
    /// The chosen replica has `capacity.max_inflight` requests in flight:
    /// a new one would wait in the engine for a slot.
    pub chosen_full: bool,
    /// The objective this request is held to (its class's, see
    /// `predict::effective_objective`); none when its class has none.
    pub objective_ms: Option<f64>,
    /// Classes (by rank) that sent the stage a request lately: only they
    /// keep headroom in the classes below.
    pub active: [bool; 3],
}

impl Ask<'_> {
    fn refuse(&self, reason: Reason, excess_ms: f64) -> Refusal {
        let wait_s = if excess_ms.is_finite() && excess_ms > 0.0 {
            (excess_ms / 1000.0).ceil() as u32
        } else {
            0
        };
        Refusal {
            class: self.class,
            reason,
            retry_after_s: self.cfg.retry_after_s.max(wait_s).min(MAX_RETRY_AFTER_S),
        }
    }

    fn limit(&self, waited_ms: f64) -> Option<f64> {
        limit(
            self.cfg,
            self.class,
            self.active,
            self.objective_ms,
            waited_ms,
            self.pred.own_ms,
        )
    }

    fn fits(&self, waited_ms: f64) -> bool {
        fits(self.limit(waited_ms), &self.pred, self.chosen_full)
    }
}

/// The objective a request of class `c` with prediction `pred` is held to.
pub fn objective(cfg: &StageAdmission, c: Priority, pred: &Prediction) -> Option<f64> {
    cfg.ttft_ms
        .get(c)
        .map(|o| effective_objective(o, pred.own_ms))
}

/// The predicted time to first token a replica taking this request may
/// reach: its objective (less the time already waited) and the headroom of
/// the active classes above; none when neither applies. The headroom never
/// bars an idle replica (a prompt whose own prefill passes it still runs
/// where nothing is queued).
pub fn limit(
    cfg: &StageAdmission,
    c: Priority,
    active: [bool; 3],
    objective_ms: Option<f64>,
    waited_ms: f64,
    own_ms: f64,
) -> Option<f64> {
    let own = objective_ms.map(|o| o - waited_ms);
    let headroom = headroom_limit(cfg, c, active).map(|h| h.max(own_ms));
    match (own, headroom) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Whether a replica with prediction `pred` can take the request now. A
/// replica at its `max_inflight` can when nothing bounds the request.
pub fn fits(limit: Option<f64>, pred: &Prediction, full: bool) -> bool {
    match limit {
        None => true,
        Some(l) => !full && pred.ttft_ms <= l,
    }
}

/// A request as it arrives.
pub fn arrive(ask: &Ask<'_>, queue: &StageQueue, now: Instant) -> Verdict {
    let c = ask.class;
    if ask.load.saturated
        && (c == Priority::Sheddable
            || (c == Priority::Standard && queue.depth(Priority::Critical) > 0))
    {
        return Verdict::Refuse(ask.refuse(Reason::Saturated, 0.0));
    }
    let Some(objective) = ask.objective_ms else {
        // Never held: routed, or refused if it would take what a higher
        // class needs.
        return if queue.held_above(c) == 0 && ask.fits(0.0) {
            Verdict::Admit
        } else {
            let excess = ask.limit(0.0).map_or(0.0, |l| ask.pred.ttft_ms - l);
            Verdict::Refuse(ask.refuse(Reason::Reserved, excess))
        };
    };
    let nothing_ahead = queue.held_above(c) == 0 && queue.depth(c) == 0;
    if nothing_ahead && !ask.chosen_full && ask.fits(0.0) {
        return Verdict::Admit;
    }
    // Held, it waits for the best replica to drain and for the work held
    // ahead of it, which the stage's replicas share.
    let ahead_ms = ask.pred.ms_for(queue.work_at_or_above(c)) / f64::from(ask.load.ready.max(1));
    let if_held = ask.pred.best_ms + ahead_ms;
    if if_held > objective {
        return Verdict::Refuse(ask.refuse(Reason::Objective, if_held - objective));
    }
    let budget = (objective - ask.pred.own_ms)
        .min(ask.max_wait_ms as f64)
        .max(0.0);
    Verdict::Hold {
        deadline: now + Duration::from_secs_f64(budget / 1000.0),
        objective_ms: objective,
    }
}

/// What becomes of a held request at the head of its queue now.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Retry {
    Release,
    Wait,
    Refuse(Refusal),
}

/// A held request at the head, `waited_ms` after it arrived (its
/// `objective_ms` is the one it was held to).
pub fn retry(ask: &Ask<'_>, waited_ms: f64) -> Retry {
    let Some(objective_ms) = ask.objective_ms else {
        return Retry::Release;
    };
    if !ask.chosen_full && ask.fits(waited_ms) {
        return Retry::Release;
    }
    // The best replica drains no faster than time passes: once its queue
    // alone passes what is left of the objective, waiting cannot help.
    let if_held = waited_ms + ask.pred.best_ms;
    if if_held > objective_ms {
        return Retry::Refuse(ask.refuse(Reason::Objective, if_held - objective_ms));
    }
    Retry::Wait
}

/// The refusal of a request whose hold ran out, or whose place a lighter
/// tenant took.
pub fn refusal(cfg: &StageAdmission, class: Priority, reason: Reason) -> Refusal {
    Refusal {
        class,
        reason,
        retry_after_s: cfg.retry_after_s.min(MAX_RETRY_AFTER_S),
    }
}
