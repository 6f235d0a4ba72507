//! The config compiled for routing: names resolved to indices, residency
//! expanded, per-replica live counters attached. Immutable; a reload or an
//! admin change builds a new one.

use std::collections::HashMap;
use std::sync::Arc;

use xxhash_rust::xxh3::xxh3_64;

use crate::config::{
    AlarmsConfig, Bounds, CapacityConfig, CostConfig, EngineMetricsConfig, HealthCheckConfig,
    OutlierConfig, PolicyKind, ReplicaChoiceConfig, RoutingConfig, ScalingConfig, ValidConfig,
    WarmupConfig,
};
pub mod ids;
pub mod load;

pub use ids::{ById, Candidate, FleetId, NonEmpty, ReplicaId, StageId};

use load::ReplicaLoad;

#[derive(Debug)]
pub struct Topology {
    pub fleets: Vec<Fleet>,
    pub stages: Vec<Stage>,
    pub by_model: HashMap<String, StageId>,
    pub by_stage_name: HashMap<String, StageId>,
    pub by_fleet_name: HashMap<String, FleetId>,
    pub default_stage: Option<StageId>,
    pub health_check: HealthCheckConfig,
    pub engine_metrics: EngineMetricsConfig,
    /// Bumped on every rebuild, so events about an older topology are dropped.
    pub generation: u64,
}

#[derive(Debug)]
pub struct Fleet {
    pub name: String,
    /// Identity for rendezvous choices between fleets.
    pub seed: u64,
    pub region: String,
    pub replicas: Vec<Replica>,
    /// Replica index by address.
    pub by_addr: HashMap<String, ReplicaId>,
    pub capacity: CapacityConfig,
    pub cost: Option<CostConfig>,
    pub hosts: Option<Bounds>,
    pub scaling: ScalingConfig,
}

#[derive(Debug)]
pub struct Replica {
    /// `ip:port`, exactly as the Envoy cluster lists it.
    pub addr: String,
    /// Identity for rendezvous hashing: a replica keeps its keys across
    /// reloads as long as its fleet and address stay the same.
    pub seed: u64,
    pub load: Arc<ReplicaLoad>,
}

#[derive(Debug)]
pub struct Stage {
    pub name: String,
    /// The stage's fleets, in its listed order.
    pub fleets: Vec<FleetId>,
    /// Sorted regions the stage may use.
    pub residency: Vec<String>,
    pub replicas: Option<Bounds>,
    pub policy: Policy,
    /// The routing block as configured (exploration, tolerance, ...).
    pub routing: RoutingConfig,
    pub replica_choice: ReplicaChoiceConfig,
    pub alarms: AlarmsConfig,
    pub outlier: OutlierConfig,
    pub warmup: Option<WarmupConfig>,
    pub experiment: Experiment,
}

/// A stage's experiments with fleets resolved to `Topology::fleets` indices.
#[derive(Clone, Debug, Default)]
pub struct Experiment {
    /// Control fleet, and variants with their percentages.
    pub ab: Option<(FleetId, Vec<(FleetId, f64)>)>,
    /// Shadow fleet and the percentage of requests mirrored to it.
    pub shadow: Option<(FleetId, f64)>,
}

/// The A/B arm a request landed in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arm {
    /// No test, or the policy chose a fleet outside it.
    None,
    Control,
    Variant,
}

impl Arm {
    pub fn as_str(self) -> &'static str {
        match self {
            Arm::None => "none",
            Arm::Control => "control",
            Arm::Variant => "variant",
        }
    }

    pub fn parse(s: &str) -> Arm {
        match s {
            "control" => Arm::Control,
            "variant" => Arm::Variant,
            _ => Arm::None,
        }
    }
}

/// A stage's policy with its fleets resolved to `Topology::fleets` indices.
#[derive(Clone, Debug)]
pub enum Policy {
    Priority {
        order: Vec<FleetId>,
    },
    /// Weight per fleet (indexed by `FleetId`; 0 = not in the split).
    Weighted {
        weights: Vec<f64>,
    },
    Latency,
    Cost,
}

pub fn replica_seed(fleet: &str, addr: &str) -> u64 {
    xxh3_64(format!("{fleet}/{addr}").as_bytes())
}

impl Topology {
    /// Builds from a validated config. `loads` hands out the live counters, so a
    /// replica that survives a reload keeps its in-flight count.
    pub fn build(
        cfg: &ValidConfig,
        generation: u64,
        mut loads: impl FnMut(&str, &str) -> Arc<ReplicaLoad>,
    ) -> Topology {
        let fleet_idx: HashMap<&str, FleetId> = cfg
            .fleets
            .iter()
            .enumerate()
            .map(|(i, f)| (f.name.as_str(), FleetId(i)))
            .collect();
        let fleets = cfg
            .fleets
            .iter()
            .map(|f| Fleet {
                name: f.name.clone(),
                seed: xxh3_64(f.name.as_bytes()),
                region: f.region.clone(),
                replicas: f
                    .endpoints
                    .iter()
                    .map(|a| Replica {
                        addr: a.clone(),
                        seed: replica_seed(&f.name, a),
                        load: loads(&f.name, a),
                    })
                    .collect(),
                by_addr: f
                    .endpoints
                    .iter()
                    .enumerate()
                    .map(|(i, a)| (a.clone(), ReplicaId(i)))
                    .collect(),
                capacity: f.capacity.clone(),
                cost: f.cost.clone(),
                hosts: f.hosts,
                scaling: f.scaling.clone(),
            })
            .collect::<Vec<_>>();
        let stages = cfg
            .stages
            .iter()
            .map(|s| {
                let idx: Vec<FleetId> = s.fleets.iter().map(|n| fleet_idx[n.as_str()]).collect();
                let mut residency = match &s.residency {
                    Some(r) => r.to_vec(),
                    None => idx
                        .iter()
                        .map(|&i| fleets[i.index()].region.clone())
                        .collect(),
                };
                residency.sort();
                residency.dedup();
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
                    fleets: idx,
                    residency,
                    replicas: s.replicas,
                    policy,
                    routing: s.routing.clone(),
                    replica_choice: s.replica_choice.clone(),
                    alarms: s.alarms.clone(),
                    outlier: s.outlier.clone(),
                    warmup: s.warmup.clone(),
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
            })
            .collect::<Vec<_>>();
        let mut by_model = HashMap::new();
        for (i, s) in cfg.stages.iter().enumerate() {
            for m in &s.models {
                by_model.insert(m.clone(), StageId(i));
            }
        }
        let by_stage_name: HashMap<String, StageId> = stages
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name.clone(), StageId(i)))
            .collect();
        let by_fleet_name = fleets
            .iter()
            .enumerate()
            .map(|(i, f)| (f.name.clone(), FleetId(i)))
            .collect();
        Topology {
            default_stage: cfg.default_stage.as_ref().map(|d| by_stage_name[d]),
            by_fleet_name,
            fleets,
            stages,
            by_model,
            by_stage_name,
            health_check: cfg.health_check.clone(),
            engine_metrics: cfg.engine_metrics.clone(),
            generation,
        }
    }

    pub fn fleet_index(&self, name: &str) -> Option<FleetId> {
        self.by_fleet_name.get(name).copied()
    }

    /// Stages a fleet serves.
    pub fn stages_of(&self, fleet: FleetId) -> impl Iterator<Item = &Stage> {
        self.stages
            .iter()
            .filter(move |s| s.fleets.contains(&fleet))
    }

    /// The outlier settings that apply to a fleet: those of the first stage
    /// that uses it with ejection enabled (fleets are usually in one stage).
    pub fn outlier_for(&self, fleet: FleetId) -> Option<&OutlierConfig> {
        self.stages_of(fleet)
            .map(|s| &s.outlier)
            .find(|o| o.enabled)
    }
}

impl Fleet {
    pub fn replica_index(&self, addr: &str) -> Option<ReplicaId> {
        self.by_addr.get(addr).copied()
    }
}

impl Topology {
    /// No fleets, no stages: the state before the first config.
    pub fn empty() -> Topology {
        Topology {
            fleets: Vec::new(),
            stages: Vec::new(),
            by_model: HashMap::new(),
            by_stage_name: HashMap::new(),
            by_fleet_name: HashMap::new(),
            default_stage: None,
            health_check: HealthCheckConfig::default(),
            engine_metrics: EngineMetricsConfig::default(),
            generation: 0,
        }
    }
}
