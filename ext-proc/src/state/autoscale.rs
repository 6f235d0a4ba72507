//! Autoscaling signals: how many replicas each fleet should run, within the
//! fleet's host bounds and the stage's replica range, for an autoscaler (HPA,
//! KEDA) to act on.
//!
//! A fleet's need, in replicas, is the highest of
//! - busy: requests in flight / `capacity.max_inflight`,
//! - queue: requests waiting (engine-reported, or routed and not yet
//!   answering beyond one per replica) / `scaling.target_queue`,
//! - throughput: tokens per second / `scaling.target_tokens_per_sec`.
//!
//! A stage's need is the sum over its fleets. With the priority policy it is
//! allocated in fill order: the base fleet takes it up to its maximum, and the
//! next fleet grows only with what is left, or with what a saturated base
//! cannot take yet (it only covers what its ready replicas serve now). So the
//! base scales first and the burst fleet shrinks first. Other policies keep
//! each fleet's own need. Either way the stage's total stays in its range
//! (config validation ensures the fleets' minimums fit in it).
//!
//! The published count rises at once and falls only after the computed one
//! has stayed lower for `scaling.scale_down_after_ms`, to the highest value
//! it had meanwhile: in-flight counts sampled every tick swing by a request
//! or two, and a load near a replica boundary would otherwise flip the
//! count every tick, starting and stopping a replica each time. Every fleet
//! waits as long, so the burst fleet still shrinks before the base.

use std::time::{Duration, Instant};

use crate::topology::{Policy, Topology};

/// The published desired count of one fleet, held against brief dips.
#[derive(Clone, Copy, Debug, Default)]
pub struct StepDown {
    held: u32,
    /// Since when the computed count has been below `held`, and its highest
    /// value since.
    below: Option<(Instant, u32)>,
}

impl StepDown {
    /// Takes this tick's computed count; the count to publish.
    pub fn update(&mut self, computed: u32, hold: Duration, now: Instant) -> u32 {
        if computed >= self.held {
            self.held = computed;
            self.below = None;
            return self.held;
        }
        let (since, highest) = self.below.get_or_insert((now, computed));
        *highest = (*highest).max(computed);
        if now.duration_since(*since) >= hold {
            self.held = *highest;
            // Lower still: the next step down waits its own hold.
            self.below = (computed < self.held).then_some((now, computed));
        }
        self.held
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Signal {
    pub ready: u32,
    pub inflight: f64,
    pub max_inflight: f64,
    pub waiting: f64,
    pub target_queue: f64,
    pub tokens_per_sec: f64,
    pub target_tokens_per_sec: Option<f64>,
    pub min: u32,
    pub max: u32,
    pub saturated: bool,
}

impl Signal {
    /// Replicas' worth of work (fractional).
    pub fn need(&self) -> f64 {
        let busy = self.inflight / self.max_inflight.max(1.0);
        let queue = self.waiting / self.target_queue.max(f64::MIN_POSITIVE);
        let throughput = self
            .target_tokens_per_sec
            .map_or(0.0, |t| self.tokens_per_sec / t);
        busy.max(queue).max(throughput)
    }
}

fn clamp(v: u32, min: u32, max: u32) -> u32 {
    v.max(min).min(max.max(min))
}

/// Desired replicas for a stage's fleets, `fleets` in fill order.
pub fn allocate(fleets: &[Signal], priority: bool, stage_min: u32, stage_max: u32) -> Vec<u32> {
    if priority {
        let need: f64 = fleets.iter().map(Signal::need).sum();
        let mut remaining = clamp(need.ceil() as u32, stage_min, stage_max);
        return fleets
            .iter()
            .map(|f| {
                let alloc = clamp(remaining, f.min, f.max);
                let covers = if f.saturated {
                    alloc.min(f.ready)
                } else {
                    alloc
                };
                remaining = remaining.saturating_sub(covers);
                alloc
            })
            .collect();
    }
    let mut out: Vec<u32> = fleets
        .iter()
        .map(|f| clamp(f.need().ceil() as u32, f.min, f.max))
        .collect();
    let mut total: u32 = out.iter().sum();
    for (i, f) in fleets.iter().enumerate().rev() {
        while total > stage_max && out[i] > f.min {
            out[i] -= 1;
            total -= 1;
        }
    }
    for (i, f) in fleets.iter().enumerate() {
        while total < stage_min && out[i] < f.max {
            out[i] += 1;
            total += 1;
        }
    }
    out
}

/// Desired replicas per fleet before the step-down hold, from each stage
/// that uses it (the largest). `last[f]` is what fleet `f` published last.
pub(super) fn desired(topo: &Topology, signals: &[Signal], last: &[u32]) -> Vec<u32> {
    let mut desired: Vec<Option<u32>> = vec![None; topo.fleets.len()];
    // In a priority order a fleet does not shrink while a later one still
    // asks for more than its minimum (as published last tick): the burst
    // goes first, and the base's hold starts only once the burst is down.
    let mut keep = vec![false; topo.fleets.len()];
    for stage in &topo.stages {
        let (order, priority) = match &stage.policy {
            Policy::Priority { order } => {
                let mut o = order.clone();
                o.extend(stage.fleets.iter().filter(|f| !order.contains(f)));
                (o, true)
            }
            _ => (stage.fleets.clone(), false),
        };
        let (min, max) = stage.replicas.map_or((0, u32::MAX), |b| (b.min, b.max));
        if priority {
            for (i, &f) in order.iter().enumerate() {
                keep[f] |= order[i + 1..].iter().any(|&g| last[g] > signals[g].min);
            }
        }
        let sig: Vec<Signal> = order.iter().map(|&f| signals[f]).collect();
        for (&f, d) in order.iter().zip(allocate(&sig, priority, min, max)) {
            desired[f] = Some(desired[f].map_or(d, |x: u32| x.max(d)));
        }
    }
    desired
        .into_iter()
        .enumerate()
        .map(|(f, d)| {
            let computed =
                d.unwrap_or_else(|| signals[f].min.max(signals[f].ready.min(signals[f].max)));
            if keep[f] {
                computed.max(last[f])
            } else {
                computed
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fleet(inflight: f64, min: u32, max: u32, ready: u32, saturated: bool) -> Signal {
        Signal {
            ready,
            inflight,
            max_inflight: 4.0,
            target_queue: 4.0,
            min,
            max,
            saturated,
            ..Default::default()
        }
    }

    #[test]
    fn priority_scales_the_base_first_and_shrinks_the_burst_first() {
        // Demand in replicas: 1, 3, 5, 7, 5, 3, 1 over base [1, 4] and burst [0, 4].
        let mut seen = Vec::new();
        for need in [1.0, 3.0, 5.0, 7.0, 5.0, 3.0, 1.0] {
            let base = fleet(need * 4.0, 1, 4, 4, false);
            let burst = fleet(0.0, 0, 4, 0, false);
            seen.push(allocate(&[base, burst], true, 1, 8));
        }
        assert_eq!(
            seen,
            vec![
                vec![1, 0],
                vec![3, 0],
                vec![4, 1],
                vec![4, 3],
                vec![4, 1],
                vec![3, 0],
                vec![1, 0]
            ]
        );
    }

    #[test]
    fn a_saturated_base_that_cannot_grow_yet_sends_the_overflow_to_burst() {
        // Need 3 replicas; the base may grow to 4 but serves with 1 ready now.
        let base = fleet(12.0, 1, 4, 1, true);
        let burst = fleet(0.0, 0, 4, 0, false);
        assert_eq!(allocate(&[base, burst], true, 0, 8), vec![3, 2]);
        // Once its replicas are up it is not saturated: burst goes back to 0.
        let base = fleet(12.0, 1, 4, 3, false);
        assert_eq!(allocate(&[base, burst], true, 0, 8), vec![3, 0]);
    }

    #[test]
    fn a_count_that_dips_for_less_than_the_hold_is_not_published() {
        // Computed every 250 ms near a replica boundary: 2, 1, 2, 1, ...
        let (t0, hold) = (Instant::now(), Duration::from_secs(2));
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut s = StepDown::default();
        let flapping: Vec<u32> = (0..8)
            .map(|i| s.update(if i % 2 == 0 { 2 } else { 1 }, hold, at(i * 250)))
            .collect();
        assert_eq!(flapping, vec![2; 8], "a flapping count publishes its top");
        // The last 1 (at 1750 ms) stays for the whole hold, then it is
        // published (a rise is at once).
        assert_eq!(s.update(1, hold, at(2000)), 2);
        assert_eq!(s.update(1, hold, at(3749)), 2);
        assert_eq!(s.update(1, hold, at(3750)), 1);
        assert_eq!(s.update(3, hold, at(4250)), 3);
        // Down by two with a 2 in between: the highest since, then the rest later.
        assert_eq!(s.update(1, hold, at(5000)), 3);
        assert_eq!(s.update(2, hold, at(6000)), 3);
        assert_eq!(s.update(1, hold, at(7000)), 2);
        assert_eq!(s.update(1, hold, at(8999)), 2);
        assert_eq!(s.update(1, hold, at(9000)), 1);
        // No hold: the computed count as it is.
        let mut s = StepDown::default();
        let seq: Vec<u32> = [3, 1, 2, 0]
            .iter()
            .map(|&c| s.update(c, Duration::ZERO, t0))
            .collect();
        assert_eq!(seq, vec![3, 1, 2, 0]);
    }

    #[test]
    fn in_a_priority_order_the_base_waits_for_the_burst_to_shrink() {
        use crate::config::RouterConfig;
        use crate::state::Writer;
        use crate::topology::{FleetId, ReplicaId};
        let eps = |n: u8| {
            (1..=3)
                .map(|i| format!("\"10.0.{n}.{i}:1\""))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let cfg = RouterConfig::parse_valid(&format!(
            "fleets:\n\
             - {{ name: base, region: us, endpoints: [{}], capacity: {{ max_inflight: 2 }}, hosts: {{ min: 1, max: 3 }}, scaling: {{ scale_down_after_ms: 1000 }} }}\n\
             - {{ name: burst, region: us, endpoints: [{}], capacity: {{ max_inflight: 2 }}, hosts: {{ min: 0, max: 3 }}, scaling: {{ scale_down_after_ms: 1000 }} }}\n\
             stages: [{{ name: s, models: [m], fleets: [base, burst], routing: {{ policy: priority, order: [base, burst] }} }}]\n",
            eps(0),
            eps(1)
        ))
        .unwrap();
        let (shared, mut w) = Writer::new(&cfg);
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let desired = |shared: &crate::state::Shared| {
            let s = shared.snapshot();
            (s.fleets[0].desired_replicas, s.fleets[1].desired_replicas)
        };
        // Six replicas' worth of requests on the base: both fleets at 3.
        let guards: Vec<_> = {
            let snap = shared.snapshot();
            let base = &snap.topo.fleets[FleetId(0).0];
            (0..12)
                .map(|i| base.replicas[ReplicaId(i % 3)].load.start(0))
                .collect()
        };
        w.tick(at(0));
        assert_eq!(desired(&shared), (3, 3));
        // The load goes at once: the burst steps down after its hold, the
        // base only a hold after the burst reached its minimum.
        drop(guards);
        let mut seen = Vec::new();
        for ms in (250..=3000).step_by(250) {
            w.tick(at(ms));
            seen.push((ms, desired(&shared)));
        }
        let burst_down = seen.iter().find(|x| x.1.1 == 0).expect("burst shrinks").0;
        let base_down = seen.iter().find(|x| x.1.0 < 3).expect("base shrinks").0;
        assert!(
            seen.iter().all(|x| x.1.0 == 3 || x.1.1 == 0),
            "the base shrank while the burst was up: {seen:?}"
        );
        assert!(base_down >= burst_down + 1000, "{seen:?}");
    }

    #[test]
    fn bounds_hold() {
        let a = fleet(40.0, 0, 4, 4, false);
        let b = fleet(40.0, 0, 4, 4, false);
        assert_eq!(
            allocate(&[a, b], false, 0, 6),
            vec![4, 2],
            "stage max trims the last fleet first"
        );
        let idle = fleet(0.0, 0, 4, 4, false);
        assert_eq!(
            allocate(&[idle, idle], false, 2, 8),
            vec![2, 0],
            "stage min fills the first fleet first"
        );
        let q = Signal {
            waiting: 10.0,
            target_queue: 2.0,
            max: 9,
            ..Default::default()
        };
        assert_eq!(allocate(&[q], false, 0, 100), vec![5]);
        let t = Signal {
            tokens_per_sec: 9000.0,
            target_tokens_per_sec: Some(2000.0),
            max: 9,
            ..Default::default()
        };
        assert_eq!(allocate(&[t], false, 0, 100), vec![5]);
    }
}
