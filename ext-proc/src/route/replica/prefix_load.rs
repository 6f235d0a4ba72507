//! KV-prefix locality balanced against load.
//!
//! Each ready replica is scored in tokens, lower is better:
//!
//! ```text
//! cost = load_weight   × (prefill tokens already queued on it
//!                         + engine-reported queue × engine_queue_tokens)
//!      − prefix_weight × prompt tokens it already holds
//! ```
//!
//! i.e. the prefill this request would wait for, minus the prefill its cached
//! prefix saves. A bounded-load guard keeps a hot prefix from piling onto one
//! replica: a replica that would pass `load_factor` × the fleet's mean
//! in-flight requests (counting this one, and never less than `min_bound`), or
//! is at its `max_inflight`, is only used when every replica is. A request with no cached prefix anywhere goes by the
//! rendezvous hash of its sampling key (so a new conversation keeps a home),
//! and exact ties fall to it too.

use super::{FALLBACKS, ReplicaChoice};
use crate::config::ReplicaChoiceConfig;
use crate::route::eligible::{CandidateFleet, cached_tokens};
use crate::route::key::RouteKey;
use crate::topology::Fleet;

struct Scored {
    replica: usize,
    overloaded: bool,
    cost: f64,
    unit: f64,
    cached: u64,
}

pub fn choose(
    fleet: &Fleet,
    cand: &CandidateFleet,
    key: &RouteKey<'_>,
    cfg: &ReplicaChoiceConfig,
) -> ReplicaChoice {
    let n = cand.ready.len() as f64;
    let total: u64 = cand
        .ready
        .iter()
        .map(|r| u64::from(fleet.replicas[r.replica].load.inflight()))
        .sum();
    let bound = (cfg.load_factor * (total as f64 + 1.0) / n).max(f64::from(cfg.min_bound));
    let use_prefix = cand.best_match > 0;
    let mut scored: Vec<Scored> = cand
        .ready
        .iter()
        .map(|r| {
            let load = &fleet.replicas[r.replica].load;
            let inflight = load.inflight();
            let cached = cached_tokens(r.matched, key);
            let queued = load.pending_prefill() as f64
                + f64::from(load.engine_waiting()) * cfg.engine_queue_tokens;
            Scored {
                replica: r.replica,
                overloaded: f64::from(inflight) + 1.0 > bound
                    || inflight >= fleet.capacity.max_inflight,
                cost: if use_prefix {
                    cfg.load_weight * queued - cfg.prefix_weight * cached as f64
                } else {
                    0.0
                },
                unit: r.unit,
                cached,
            }
        })
        .collect();
    scored.sort_unstable_by(|a, b| {
        a.overloaded
            .cmp(&b.overloaded)
            .then(a.cost.total_cmp(&b.cost))
            .then(b.unit.total_cmp(&a.unit))
    });
    ReplicaChoice {
        cached_tokens: scored.first().map_or(0, |s| s.cached),
        order: scored
            .iter()
            .take(1 + FALLBACKS)
            .map(|s| s.replica)
            .collect(),
    }
}
