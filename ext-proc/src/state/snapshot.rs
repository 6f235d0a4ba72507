//! Building the snapshot the decision path reads, from the writer's models.

use std::sync::Arc;
use std::time::Instant;

use super::accounting::Accounting;
use super::failed_keys::FailedKeysWriter;
use super::model::FleetModel;
use super::{FleetState, Snapshot, StageFleetFigures};
use crate::config::RouterConfig;
use crate::topology::Topology;

pub(super) fn build(
    topo: &Arc<Topology>,
    config: &Arc<RouterConfig>,
    fleets: &[FleetModel],
    acc: &Accounting,
    failed_keys: &FailedKeysWriter,
    now: Instant,
) -> Snapshot {
    Snapshot {
        failed_keys: failed_keys.keys(),
        topo: topo.clone(),
        config: config.clone(),
        replicas: fleets
            .iter()
            .map(|fm| fm.replicas.map(|_, m| m.state(now)))
            .collect(),
        fleets: fleets
            .iter()
            .map(|fm| FleetState {
                prefix: fm.index.index(),
                figures: fm.figures,
                spilling: fm.saturation.spilling,
                utilisation: fm.saturation.utilisation,
                desired_replicas: fm.desired,
            })
            .collect(),
        stages: topo
            .stages
            .iter()
            .map(|s| {
                s.fleets
                    .iter()
                    .map(|&f| {
                        let fleet = &topo.fleets[f].name;
                        let (p, e) = acc.hit_rates(&s.name, fleet);
                        StageFleetFigures {
                            traffic_share: acc.share(&s.name, fleet),
                            hit_rate_predicted: p,
                            hit_rate_engine: e,
                        }
                    })
                    .collect()
            })
            .collect(),
    }
}
