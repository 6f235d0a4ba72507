//! KV-prefix locality balanced against load.
//!
//! Each ready replica is scored in prompt tokens, lower is better:
//!
//! ```text
//! queued = prefill tokens the router has sent it and not yet seen answered
//!        + requests the engine reports waiting × engine_queue_tokens
//! cost   = load_weight × queued − prefix_weight × prompt tokens it holds
//! ```
//!
//! With both weights at 1 the cost is this request's time to first token in
//! prefill-token units, up to a constant: the prefill waiting ahead of it
//! plus its own, less what its cached prefix saves.
//!
//! A bounded-load guard keeps a hot prefix from piling onto one replica: a
//! replica whose queued tokens exceed `load_factor` × the fleet's mean plus
//! `load_slack_tokens`, or that is at its `max_inflight`, is used only when
//! every replica is. Replicas within `tie_tokens` of the best cost are tied,
//! and ties go to the sampling key's rendezvous order, so a request with no
//! cached prefix anywhere, on a balanced fleet, lands where its key hashes
//! and a new conversation keeps a home.

use super::{FALLBACKS, ReplicaChoice};
use crate::config::ReplicaChoiceConfig;
use crate::route::eligible::{CandidateFleet, cached_tokens};
use crate::route::key::RouteKey;
use crate::topology::{Fleet, NonEmpty, ReplicaId};

struct Scored {
    replica: ReplicaId,
    overloaded: bool,
    queued: f64,
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
    let mut scored: Vec<Scored> = cand
        .ready
        .iter()
        .map(|r| {
            let load = &fleet.replicas[r.replica].load;
            let queued = load.pending_prefill() as f64
                + f64::from(load.engine_waiting()) * cfg.engine_queue_tokens;
            let cached = cached_tokens(r.matched, key);
            Scored {
                replica: r.replica,
                overloaded: load.inflight() >= fleet.capacity.max_inflight,
                queued,
                cost: 0.0,
                unit: r.unit,
                cached,
            }
        })
        .collect();
    let mean = scored.iter().map(|s| s.queued).sum::<f64>() / scored.len().max(1) as f64;
    let bound = cfg.load_factor * mean + cfg.load_slack_tokens;
    for s in &mut scored {
        s.overloaded |= s.queued > bound;
        s.cost = cfg.load_weight * s.queued - cfg.prefix_weight * s.cached as f64;
    }
    let best = scored
        .iter()
        .filter(|s| !s.overloaded)
        .map(|s| s.cost)
        .fold(f64::INFINITY, f64::min);
    let best = if best.is_finite() {
        best
    } else {
        scored.iter().map(|s| s.cost).fold(f64::INFINITY, f64::min)
    };
    let tied = |s: &Scored| s.cost <= best + cfg.tie_tokens;
    scored.sort_unstable_by(|a, b| {
        a.overloaded
            .cmp(&b.overloaded)
            .then(tied(b).cmp(&tied(a)))
            .then_with(|| {
                if tied(a) && tied(b) {
                    b.unit.total_cmp(&a.unit)
                } else {
                    a.cost.total_cmp(&b.cost)
                }
            })
            .then(b.unit.total_cmp(&a.unit))
    });
    ReplicaChoice {
        cached_tokens: scored.first().map_or(0, |s| s.cached),
        queued_tokens: scored.first().map_or(0, |s| s.queued as u64),
        // One score per ready replica, and a candidate fleet has one.
        order: NonEmpty::new(
            scored
                .iter()
                .take(1 + FALLBACKS)
                .map(|s| s.replica)
                .collect(),
        )
        .expect("a candidate fleet has a ready replica"),
    }
}
