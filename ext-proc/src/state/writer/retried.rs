//! An access log entry answered by another fleet's replica: Envoy retried
//! the request on its stage's `upstream` fallback after the chosen replica
//! failed before its first byte. Counted as a fallback, and the chosen
//! replica's attempt as the failure it was: the access log reports only the
//! attempt that answered, and a replica that fails every request while its
//! health check passes must still stand out.

use std::time::Instant;

use super::Writer;
use crate::config::Condition;
use crate::metrics::FellBack;
use crate::state::observation::Observation;
use crate::topology::{ById, FleetId, ReplicaId};

impl Writer {
    pub(super) fn retried_elsewhere(
        &mut self,
        o: &Observation,
        (f, routed): (FleetId, ReplicaId),
        addr: &str,
        now: Instant,
    ) {
        let topo = &self.topo;
        let Some(&from) = topo.by_stage_name.get(&o.stage) else {
            return;
        };
        let answered = topo.stages[from]
            .fallbacks
            .iter()
            .filter(|(_, on)| on.contains(&Condition::Upstream))
            .map(|&(to, _)| to)
            .find(|&to| {
                topo.stages[to]
                    .fleets
                    .iter()
                    .any(|&g| topo.fleets[g].replica_index(addr).is_some())
            });
        let Some(to) = answered else {
            return;
        };
        self.shared
            .metrics
            .routing
            .fallbacks
            .get_or_create(&FellBack {
                stage: o.stage.clone(),
                fallback: topo.stages[to].name.clone(),
                reason: Condition::Upstream.as_str(),
            })
            .inc();
        let failed = Observation {
            status: Some(503),
            served_by: None,
            time_to_first_byte: None,
            usage: None,
            ..o.clone()
        };
        if let Some(m) = self.fleets.by_id_mut(f)
            && m.outcome(routed, &failed, true, now)
        {
            self.publish(f, routed, crate::state::peer::PeerChange::Cleared);
        }
    }
}
