//! Admission's verdicts, queue depths and waits, by stage and class.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

use super::labels::{Values, label_values};
use super::registrar::Registrar;
use super::routing::Buckets;
use crate::topology::Topology;

label_values! {
    /// What admission did with a request: routed at once or after a hold;
    /// refused because the stage is saturated, because the capacity is kept
    /// for a higher class, because its class queue was full (or a lighter
    /// tenant took its place), because even waiting could not meet its
    /// objective, or because its hold ran out; or the client left while held.
    Verdict {
        Admitted => "admitted",
        AdmittedAfterWait => "admitted_after_wait",
        Saturated => "saturated",
        Reserved => "reserved",
        QueueFull => "queue_full",
        Objective => "objective",
        TimedOut => "timed_out",
        Cancelled => "cancelled",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageClass {
    pub stage: String,
    /// critical | standard | sheddable
    pub class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionVerdict {
    pub stage: String,
    pub class: &'static str,
    pub verdict: Verdict,
}

fn wait_seconds() -> Histogram {
    // 1 ms to ~33 s: holds are bounded by admission.max_wait_ms (30 s at most).
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

pub struct Admission {
    pub verdicts: Family<AdmissionVerdict, Counter>,
    pub queue_depth: Family<StageClass, Gauge>,
    pub wait: Family<StageClass, Histogram, Buckets>,
}

impl Admission {
    pub(super) fn new(r: &mut Registrar) -> Self {
        let m = Admission {
            verdicts: Family::default(),
            queue_depth: Family::default(),
            wait: Family::new_with_constructor(Buckets(wait_seconds)),
        };
        r.add(
            "admission_verdicts",
            "Admission verdicts in stages with admission, by class: admitted, admitted_after_wait, saturated, reserved, queue_full, objective, timed_out, cancelled",
            m.verdicts.clone(),
        );
        r.add(
            "admission_queue_depth",
            "Requests held by admission now, by stage and class",
            m.queue_depth.clone(),
        );
        r.add(
            "admission_wait_seconds",
            "Time held requests waited, whatever became of them",
            m.wait.clone(),
        );
        m
    }

    pub(super) fn prime(&self, topo: &Topology) {
        for stage in topo.stages.iter().filter(|s| s.admission.is_some()) {
            for class in crate::config::Priority::ALL {
                let sc = StageClass {
                    stage: stage.name.clone(),
                    class: class.as_str(),
                };
                drop(self.queue_depth.get_or_create(&sc));
                drop(self.wait.get_or_create(&sc));
                for &verdict in Verdict::ALL {
                    drop(self.verdicts.get_or_create(&AdmissionVerdict {
                        stage: stage.name.clone(),
                        class: class.as_str(),
                        verdict,
                    }));
                }
            }
        }
    }

    pub(super) fn clear(&self) {
        self.verdicts.clear();
        self.queue_depth.clear();
        self.wait.clear();
    }
}
