//! A request its stage cannot take, tried on the stage's fallbacks for the
//! condition, in order: the first whose decision admission admits now and
//! the tenant's limits let through is committed (its load, its price, its
//! audit record are the fallback's). A fallback never holds a request: one
//! admission would hold or refuse is skipped. None taking it, the request
//! gets its own stage's answer.

use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::HeaderMap;

use super::Asked;
use super::place::{Placed, admit_and_commit};
use crate::admission::{Admission, Judged};
use crate::config::Condition;
use crate::route::fallback::{self, Fallen};
use crate::route::key::RouteKey;
use crate::state::{Shared, Snapshot};
use crate::topology::StageId;

/// Places the request on the first of `from`'s fallbacks for `reason` that
/// takes it now.
pub async fn fall_back<'a>(
    shared: &Shared,
    admission: &Admission,
    snapshot: &Arc<Snapshot>,
    key: &RouteKey<'a>,
    headers: &HeaderMap,
    from: StageId,
    reason: Condition,
) -> Option<(Placed, Asked<'a>)> {
    let topo = &snapshot.topo;
    for to in fallback::for_reason(&topo.stages[from], reason) {
        // `None`: the request names an adapter of its own stage's model.
        let fkey = fallback::rekey(topo, key, from, to)?;
        let fallen = Fallen { from, reason };
        let rng = crate::clock::random_u64();
        let Ok(d) = fallback::decide(snapshot, &fkey, to, fallen, rng) else {
            continue;
        };
        // A fallback as full as the stage it relieves is no relief.
        if reason == Condition::Saturated && d.stage_load.saturated {
            continue;
        }
        let now = crate::clock::now();
        let Judged::Admit(d) = admission.judge(&shared.metrics, snapshot, headers, &fkey, d, now)
        else {
            continue;
        };
        let asked = Asked::of(&fkey);
        if let Ok(p) = admit_and_commit(shared, snapshot.clone(), d, fkey).await {
            return Some((p, asked));
        }
    }
    None
}

/// A decision its stage would admit although every eligible fleet is
/// saturated: on a stage without admission, that is its only sign of
/// saturation, so a `saturated` fallback with room takes the request.
pub fn saturated_without_admission(snapshot: &Snapshot, d: &crate::route::Decision) -> bool {
    let stage = &snapshot.topo.stages[d.stage];
    d.fallback.is_none()
        && d.stage_load.saturated
        && stage.admission.is_none()
        && fallback::has(stage, Condition::Saturated)
}
