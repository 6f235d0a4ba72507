//! Re-fitting a refused request: another ready replica of the decision's
//! fleet that can meet the class's objective.

use super::*;
use crate::config::{Priority, StageAdmission};
use crate::route::Decision;
use crate::route::eligible::{avoided, cached_tokens, ready_replicas};
use crate::route::key::RouteKey;
use crate::route::replica::FALLBACKS;
use crate::state::Snapshot;
use crate::topology::{NonEmpty, ReplicaId};

/// The request's prediction on its chosen replica. When that one cannot
/// take it now, the first of the decision's fallbacks that can, else the
/// fleet's ready replica that can with the shortest prediction, takes it
/// instead (its cached prefix read from the prefix index again). Only
/// requests that are not admitted at once pay for this.
#[allow(clippy::too_many_arguments)]
pub(super) fn fit<'c>(
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
        // The decision's own rule set: the fleet's ready replicas, their
        // predicted prefixes, failed conversations skipped.
        let ready = ready_replicas(snap, d.fleet, key, avoided(snap, key));
        let cached = |r: ReplicaId| {
            ready
                .iter()
                .find(|x| x.replica == r)
                .map_or(0, |x| cached_tokens(x.matched, key))
        };
        let fallback = d.replicas[1..].iter().map(|&r| on(r, cached(r))).find(fits);
        let better = fallback.or_else(|| {
            ready
                .iter()
                .filter(|x| x.replica != head)
                .map(|x| on(x.replica, cached_tokens(x.matched, key)))
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
