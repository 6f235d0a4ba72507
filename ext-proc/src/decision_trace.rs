//! One `decision` span per routed request, so a slow decision can be seen:
//! stage, policy, chosen fleet and replica (or the reject code), and the time
//! the decision took. Off by default; `RUST_LOG=info,fleetroute::decision=debug`
//! turns it on. Disabled, a span costs one check of a static flag: nothing is
//! formatted and the clock is not read.

use std::time::Instant;

use tracing::Span;
use tracing::field::Empty;

use crate::route::{Decision, Reject};
use crate::state::Snapshot;
use crate::topology::Policy;

/// The target to enable.
pub const TARGET: &str = "fleetroute::decision";

pub struct DecisionSpan {
    span: Span,
    start: Option<Instant>,
}

impl DecisionSpan {
    pub fn start() -> Self {
        let span = tracing::debug_span!(
            target: TARGET,
            "decision",
            stage = Empty,
            policy = Empty,
            fleet = Empty,
            replica = Empty,
            rejected = Empty,
            elapsed_us = Empty,
        );
        let start = (!span.is_disabled()).then(crate::clock::now);
        DecisionSpan { span, start }
    }

    /// The span, to enter while the decision runs.
    pub fn span(&self) -> &Span {
        &self.span
    }

    pub fn routed(&self, snap: &Snapshot, d: &Decision) {
        let Some(start) = self.start else { return };
        let stage = &snap.topo.stages[d.stage];
        let fleet = &snap.topo.fleets[d.fleet];
        let replica = d.replicas.first().map(|&r| fleet.replicas[r].addr.as_str());
        self.span.record("stage", stage.name.as_str());
        self.span.record("policy", policy_name(&stage.policy));
        self.span.record("fleet", fleet.name.as_str());
        self.span.record("replica", replica.unwrap_or("-"));
        self.end(start);
    }

    pub fn rejected(&self, r: &Reject) {
        let Some(start) = self.start else { return };
        self.span.record("stage", r.stage().unwrap_or("-"));
        self.span.record("rejected", r.code());
        self.end(start);
    }

    fn end(&self, start: Instant) {
        let us = start.elapsed().as_micros() as u64;
        self.span.record("elapsed_us", us);
        tracing::debug!(target: TARGET, parent: &self.span, elapsed_us = us, "decided");
    }
}

fn policy_name(p: &Policy) -> &'static str {
    match p {
        Policy::Priority { .. } => "priority",
        Policy::Weighted { .. } => "weighted",
        Policy::Latency => "latency",
        Policy::Cost => "cost",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::layer::SubscriberExt;

    /// Captures formatted output.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn traced(filter: &str, f: impl FnOnce()) -> String {
        let sink = Sink::default();
        let writer = sink.clone();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_subscriber::EnvFilter::new(filter))
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(false)
                    .with_writer(move || writer.clone()),
            );
        tracing::subscriber::with_default(subscriber, f);
        String::from_utf8(sink.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn a_rejected_decision_is_traced_only_when_enabled() {
        let reject = Reject::NoReadyReplica {
            stage: "chat".into(),
            residency: "eu".into(),
        };
        let on = traced("fleetroute::decision=debug", || {
            let s = DecisionSpan::start();
            assert!(s.start.is_some());
            s.rejected(&reject);
        });
        assert!(on.contains("decision{"), "{on}");
        assert!(on.contains("stage=\"chat\""), "{on}");
        assert!(on.contains("rejected=\"no_ready_replica\""), "{on}");
        assert!(on.contains("elapsed_us="), "{on}");

        let off = traced("info", || {
            let s = DecisionSpan::start();
            assert!(s.start.is_none(), "the clock is not read when disabled");
            s.rejected(&reject);
        });
        assert!(off.is_empty(), "{off}");
    }
}
