//! When a fleet counts as saturated: the priority policy spills past it.
//!
//! Utilisation is the highest of three ratios over the fleet's ready
//! replicas: requests in flight against `capacity.max_inflight` each, the
//! engines' reported queue against `max_waiting`, and their reported KV-cache
//! usage against `max_kv_usage`. A fleet starts spilling at 1.0 and takes
//! traffic first again only once back under `resume_below` (0.8 by default),
//! so it does not flap around the threshold.

use crate::topology::{Fleet, ReplicaId};

pub fn utilisation(fleet: &Fleet, ready: impl IntoIterator<Item = ReplicaId>) -> f64 {
    let cap = &fleet.capacity;
    let (mut n, mut inflight, mut waiting, mut kv) = (0u32, 0u64, 0u64, 0.0f64);
    for r in ready {
        let l = &fleet.replicas[r].load;
        n += 1;
        inflight += u64::from(l.inflight());
        waiting += u64::from(l.engine_waiting());
        kv += l.kv_usage();
    }
    if n == 0 {
        return f64::INFINITY;
    }
    let n = f64::from(n);
    let by_inflight = inflight as f64 / (f64::from(cap.max_inflight) * n);
    let by_queue = if cap.max_waiting == 0 {
        if waiting > 0 { f64::INFINITY } else { 0.0 }
    } else {
        waiting as f64 / (f64::from(cap.max_waiting) * n)
    };
    let by_kv = kv / n / cap.max_kv_usage;
    by_inflight.max(by_queue).max(by_kv)
}

/// The hysteresis: `was` is the previous state. A fleet with no ready replica
/// is not a candidate at all, so it is not "saturated" either.
pub fn spilling(fleet: &Fleet, ready: &[ReplicaId], was: bool, resume_below: f64) -> bool {
    if ready.is_empty() {
        return false;
    }
    let u = utilisation(fleet, ready.iter().copied());
    if was { u > resume_below } else { u >= 1.0 }
}

/// A fleet's saturation as the writer keeps it between ticks.
#[derive(Clone, Copy, Debug, Default)]
pub struct Saturation {
    pub spilling: bool,
    pub utilisation: f64,
}

impl Saturation {
    /// Re-evaluates over the ready replicas; the new state when it flipped.
    pub fn tick(&mut self, fleet: &Fleet, ready: &[ReplicaId], resume_below: f64) -> Option<bool> {
        self.utilisation = utilisation(fleet, ready.iter().copied());
        let spilling = spilling(fleet, ready, self.spilling, resume_below);
        (spilling != std::mem::replace(&mut self.spilling, spilling)).then_some(spilling)
    }
}
