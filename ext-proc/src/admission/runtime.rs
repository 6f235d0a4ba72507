//! Per-stage admission state, rebuilt when the stage's generation changes:
//! queues, class shares, counters and the metric handles they move.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

use super::*;
use crate::config::Priority;
use crate::metrics::{AdmissionVerdict, Metrics, StageClass, Values, Verdict};

const VERDICTS: usize = 8;

/// Indices into `Verdict::ALL`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Counted {
    Admitted,
    AdmittedAfterWait,
    Refused(Reason),
    Cancelled,
}

impl Counted {
    pub(super) fn index(self) -> usize {
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
pub(super) struct Runtime {
    pub(super) queue: StageQueue,
    pub(super) shares: Shares,
    /// When each class last sent a request, ms after `Admission::start`
    /// (+1, so 0 is never).
    pub(super) last_seen: [AtomicU64; 3],
}

impl Runtime {
    pub(super) fn seen(&self, c: Priority, at_ms: u64) {
        self.last_seen[c.rank()].store(at_ms + 1, Relaxed);
    }

    pub(super) fn active(&self, at_ms: u64) -> [bool; 3] {
        let window = predict::ACTIVE_FOR.as_millis() as u64;
        std::array::from_fn(|r| {
            let seen = self.last_seen[r].load(Relaxed);
            seen != 0 && at_ms + 1 - seen.min(at_ms + 1) <= window
        })
    }
}

/// Metric handles of one stage, resolved once per topology generation.
pub(super) struct Counters {
    pub(super) verdicts: [[Counter; VERDICTS]; 3],
    pub(super) depth: [Gauge; 3],
    pub(super) wait: [Histogram; 3],
}

pub(super) struct StageState {
    pub(super) name: String,
    pub(super) runtime: Arc<Runtime>,
    pub(super) counters: Counters,
}

impl StageState {
    pub(super) fn count(&self, c: Priority, what: Counted) {
        self.counters.verdicts[c.rank()][what.index()].inc();
    }

    pub(super) fn depth_changed(&self, c: Priority) {
        self.counters.depth[c.rank()].set(i64::from(self.runtime.queue.depth(c)));
    }
}

pub(super) struct Stages {
    pub(super) generation: u64,
    /// By `StageId`; none for stages without admission.
    pub(super) by_stage: Vec<Option<Arc<StageState>>>,
}

pub(super) fn counters(m: &Metrics, stage: &str) -> Counters {
    let sc = |c: Priority| StageClass {
        stage: stage.to_string(),
        class: c.as_str(),
    };
    Counters {
        verdicts: Priority::ALL.map(|c| {
            std::array::from_fn(|i| {
                m.admission
                    .verdicts
                    .get_or_create(&AdmissionVerdict {
                        stage: stage.to_string(),
                        class: c.as_str(),
                        verdict: Verdict::ALL[i],
                    })
                    .clone()
            })
        }),
        depth: Priority::ALL.map(|c| m.admission.queue_depth.get_or_create(&sc(c)).clone()),
        wait: Priority::ALL.map(|c| m.admission.wait.get_or_create(&sc(c)).clone()),
    }
}
