//! A stage of the config compiled: its fleets by id, its residency
//! expanded, its policy resolved.

use std::collections::HashMap;
use std::sync::Arc;

use super::adapters::{AdapterId, StageAdapters};
use super::{Experiment, Fleet, FleetId, Policy, Stage};
use crate::config::PolicyKind;

/// A stage of the config, its fleets by id.
pub(super) fn stage(
    s: &crate::config::StageConfig,
    cfg: &crate::config::RouterConfig,
    fleet_idx: &HashMap<&str, FleetId>,
    fleets: &[Fleet],
) -> Stage {
    let idx: Vec<FleetId> = s.fleet_names().map(|n| fleet_idx[n.as_str()]).collect();
    let mut residency = match &s.residency {
        Some(r) => r.to_vec(),
        None => idx
            .iter()
            .map(|&i| fleets[i.index()].region.clone())
            .collect(),
    };
    residency.sort();
    residency.dedup();
    let model = s.models.first().unwrap_or(&s.name).clone();
    let packs = |i: FleetId| {
        fleets[i.index()]
            .hold
            .as_ref()
            .is_some_and(|h| h.is_models())
    };
    // A packed fleet's replicas know each model by the stage's name for it:
    // an alias a client sent is renamed to it.
    let served = s
        .fleets
        .iter()
        .zip(&idx)
        .map(|(f, &i)| {
            if packs(i) {
                Some(model.clone())
            } else {
                f.model.clone()
            }
        })
        .collect();
    let packed = idx.iter().any(|&i| packs(i)).then(|| AdapterId::of(&model));
    let r = &s.routing;
    let policy = match r.policy() {
        PolicyKind::Priority => Policy::Priority {
            order: match r.order() {
                Some(o) => o.iter().map(|n| fleet_idx[n.as_str()]).collect(),
                None => idx.clone(),
            },
        },
        PolicyKind::Weighted => {
            let mut weights = vec![0.0; fleets.len()];
            for &i in &idx {
                weights[i] = r.weight(&fleets[i.index()].name);
            }
            Policy::Weighted { weights }
        }
        PolicyKind::Latency => Policy::Latency,
        PolicyKind::Cost => Policy::Cost,
    };
    Stage {
        name: s.name.clone(),
        model: model.clone(),
        fleets: idx,
        served,
        adapters: Arc::new(StageAdapters::new(&s.adapters)),
        packed,
        warm_replicas: s.warm_replicas,
        residency,
        replicas: s.replicas,
        policy,
        routing: s.routing.clone(),
        replica_choice: s.replica_choice.clone(),
        alarms: s.alarms.clone(),
        outlier: s.outlier.clone(),
        warmup: s.warmup.clone(),
        admission: s.admission.clone(),
        // Validated: every name is a stage.
        fallbacks: s
            .fallbacks
            .iter()
            .filter_map(|f| {
                let all = &cfg.stages;
                let i = all.iter().position(|t| t.name == f.stage)?;
                Some((super::StageId(i), f.conditions()))
            })
            .collect(),
        context_tokens: s.context_tokens,
        experiment: Experiment {
            ab: s.experiment.ab.as_ref().map(|ab| {
                (
                    fleet_idx[ab.control.as_str()],
                    ab.variants
                        .iter()
                        .map(|v| (fleet_idx[v.fleet.as_str()], v.percent))
                        .collect(),
                )
            }),
            shadow: s
                .experiment
                .shadow
                .as_ref()
                .map(|sh| (fleet_idx[sh.fleet.as_str()], sh.percent)),
        },
    }
}
