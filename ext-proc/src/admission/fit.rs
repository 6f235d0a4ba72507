//! Re-fitting a refused request: another ready replica of the decision's
//! fleet that can meet the class's objective.

use super::*;
use crate::config::{Priority, StageAdmission};
use crate::route::Decision;
use crate::route::eligible::cached_tokens;
use crate::route::key::RouteKey;
use crate::route::replica::FALLBACKS;
use crate::state::Snapshot;
use crate::state::prefix_index::Matches;
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
        // What the prefix index predicts each replica of the fleet holds.
        let mut matches = Matches::default();
        let depth = if key.blocks.is_empty() {
            0
        } else {
            snap.fleets[d.fleet]
                .prefix
                .matches(&key.blocks, &mut matches)
        };
        let cached = |r: ReplicaId| {
            if depth == 0 {
                0
            } else {
                cached_tokens(matches[r], key)
            }
        };
        // Replicas this conversation failed stay skipped, as in the decision
        // (a bit counts while its slot holds the member that failed).
        let avoid = key
            .conversation()
            .and_then(|k| snap.failed_keys.avoid(k, snap.topo.layout))
            .filter(|a| a.fleet == d.fleet);
        let failed = |r: ReplicaId| {
            avoid.is_some_and(|a| {
                a.mask & (1 << r.index()) != 0 && fleet.replicas[r].since <= a.generation
            })
        };
        let fallback = d.replicas[1..].iter().map(|&r| on(r, cached(r))).find(fits);
        let better = fallback.or_else(|| {
            // Occupied slots only: a member that left leaves its slot free.
            fleet
                .replicas
                .ids()
                .filter(|&r| r != head && snap.replicas[d.fleet][r].ready())
                .filter(|&r| !failed(r))
                .map(|r| on(r, cached(r)))
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
