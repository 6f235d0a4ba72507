//! The config compiled for routing: names resolved to indices, residency
//! expanded, each fleet's current members in their slots with their live
//! counters attached. Immutable; a reload, an admin change or a membership
//! change builds a new one (see `state::writer`, `set_topology`).

use std::collections::HashMap;
use std::sync::Arc;

use xxhash_rust::xxh3::xxh3_64;

use crate::config::{
    AlarmsConfig, ApiKey, Bounds, CapacityConfig, CostConfig, Engine, EngineApi,
    EngineMetricsConfig, FleetConfig, HealthCheckConfig, OutlierConfig, ReplicaChoiceConfig,
    RoutingConfig, ScalingConfig, StageAdmission, ValidConfig, WarmupConfig, model_list,
};
pub mod adapters;
pub mod fallen;
pub mod hold;
pub mod ids;
pub mod load;
pub mod pick;
pub mod resident;
pub mod slots;
mod stages;

pub use adapters::{AdapterId, StageAdapters};
pub use fallen::Fallen;
pub use hold::{Hold, HoldKind};
pub use ids::{ById, Candidate, FleetId, NonEmpty, ReplicaId, StageId};
pub use pick::Pick;
pub use slots::{MAX_SLOTS, Slots};

use load::ReplicaLoad;

#[derive(Clone, Debug)]
pub struct Topology {
    pub fleets: Vec<Fleet>,
    pub stages: Vec<Stage>,
    pub by_model: HashMap<String, StageId>,
    pub by_stage_name: HashMap<String, StageId>,
    pub by_fleet_name: HashMap<String, FleetId>,
    pub default_stage: Option<StageId>,
    pub health_check: HealthCheckConfig,
    pub engine_metrics: EngineMetricsConfig,
    /// Bumped on every change (config or membership). Ids handed out with
    /// one generation stay valid in a later one as long as [`Topology::resolves`] says so.
    pub generation: u64,
    /// The generation whose config last changed the order of fleets or
    /// stages: `FleetId`s and `StageId`s of an older one mean nothing now.
    pub layout: u64,
    /// The `GET /v1/models` answer (OpenAI's list), built once per topology.
    pub model_list: Vec<u8>,
    /// The `authorization` every gRPC call must carry (`grpc.token_file`).
    pub grpc_token: Option<ApiKey>,
    /// Where a request's tenant comes from (`tenants.identity`).
    pub identity: crate::config::Identity,
}

#[derive(Clone, Debug)]
pub struct Fleet {
    pub name: String,
    /// Identity for rendezvous choices between fleets.
    pub seed: u64,
    pub region: String,
    /// Current members (leaving ones included, until removed), by slot.
    pub replicas: Slots<Replica>,
    /// Replica slot by address.
    pub by_addr: HashMap<String, ReplicaId>,
    pub capacity: CapacityConfig,
    pub cost: Option<CostConfig>,
    pub hosts: Option<Bounds>,
    pub scaling: ScalingConfig,
    /// The fleet's own `Authorization`, replacing the client's (a provider).
    pub key: Option<ApiKey>,
    /// Whether `replicas` is the fleet's membership: always for a static
    /// fleet; for a dynamic one only once its source has answered (or it
    /// kept members from before a reload). EDS holds back a fleet that is
    /// not known rather than serve it empty.
    pub members_known: bool,
    /// The engine run, its endpoints, the path probed (`FleetConfig::health_path`).
    pub engine: Engine,
    pub engine_api: EngineApi,
    pub health_path: String,
    /// How its replicas hold adapters (`FleetConfig::lora`) or models
    /// (`FleetConfig::packing`).
    pub hold: Option<Hold>,
}

#[derive(Clone, Debug)]
pub struct Replica {
    /// `ip:port`, as Envoy formats a host address.
    pub addr: String,
    /// What makes it the same member across changes: its address (static,
    /// DNS), or `pod-name/pod-uid` (Kubernetes), so a new pod on an old
    /// address is a new replica.
    pub identity: Arc<str>,
    /// Identity for rendezvous hashing: a replica keeps its keys across
    /// changes as long as its fleet and address stay the same.
    pub seed: u64,
    pub load: Arc<ReplicaLoad>,
    /// The generation in which this member took its slot.
    pub since: u64,
}

impl Replica {
    /// A member joining `fleet` in `generation`, with fresh counters.
    pub fn joining(fleet: &str, addr: String, identity: Arc<str>, generation: u64) -> Replica {
        Replica {
            seed: replica_seed(fleet, &addr),
            addr,
            identity,
            load: Arc::default(),
            since: generation,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Stage {
    pub name: String,
    /// The model name its clients use first (its first `models` entry, else
    /// its name): what a probe asks a replica for.
    pub model: String,
    /// The stage's fleets, in its listed order.
    pub fleets: Vec<FleetId>,
    /// Parallel to `fleets`: the name a fleet serves the model under, if its own.
    pub served: Vec<Option<String>>,
    /// The LoRA adapters of its model clients may name.
    pub adapters: Arc<StageAdapters>,
    /// Its model as a packed fleet's replicas hold it (some fleet of the
    /// stage loads models on demand): what a replica must have loaded.
    pub packed: Option<AdapterId>,
    /// Replicas of each packed fleet kept holding its model (placement).
    pub warm_replicas: u32,
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
    /// Objectives and shedding under overload (`crate::admission` reads it).
    pub admission: Option<StageAdmission>,
    /// Stages to answer instead, in order, with their conditions.
    pub fallbacks: Vec<(StageId, Vec<crate::config::Condition>)>,
    /// Longest prompt its model takes, tokens.
    pub context_tokens: Option<u32>,
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
    /// Builds from a validated config with each static fleet's `endpoints`
    /// in slots 0, 1, ... in order, and dynamic fleets empty (tests and
    /// simulations; the running router builds through the writer).
    pub fn from_config(cfg: &ValidConfig, generation: u64) -> Topology {
        Topology::build(cfg, generation, generation, |_, f| {
            f.endpoints
                .iter()
                .map(|a| {
                    let addr = canonical_addr(a);
                    Replica::joining(&f.name, addr.clone(), addr.into(), generation)
                })
                .collect()
        })
    }

    /// Builds from a validated config; `replicas` gives each fleet's members.
    pub fn build(
        cfg: &ValidConfig,
        generation: u64,
        layout: u64,
        mut replicas: impl FnMut(FleetId, &FleetConfig) -> Slots<Replica>,
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
            .enumerate()
            .map(|(i, f)| {
                let replicas = replicas(FleetId(i), f);
                Fleet {
                    key: cfg.key(i).cloned(),
                    name: f.name.clone(),
                    seed: xxh3_64(f.name.as_bytes()),
                    region: f.region.clone(),
                    by_addr: by_addr(&replicas),
                    replicas,
                    capacity: f.capacity.clone(),
                    cost: f.cost.clone(),
                    hosts: f.hosts,
                    scaling: f.scaling.clone(),
                    members_known: !f.source().is_dynamic(),
                    engine: f.engine,
                    engine_api: f.engine_api.clone(),
                    health_path: f.health_path(&cfg.health_check).to_string(),
                    hold: f
                        .lora
                        .as_ref()
                        .map(Hold::adapters)
                        .or(f.packing.as_ref().map(Hold::models)),
                }
            })
            .collect::<Vec<_>>();
        let stages = cfg
            .stages
            .iter()
            .map(|s| stages::stage(s, cfg, &fleet_idx, &fleets))
            .collect::<Vec<_>>();
        let mut by_model = HashMap::new();
        for (i, s) in cfg.stages.iter().enumerate() {
            for m in s.models.iter().chain(&s.adapters) {
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
            layout,
            model_list: model_list::body(cfg).into_bytes(),
            grpc_token: cfg.grpc_token().cloned(),
            identity: crate::config::Identity::of(&cfg.tenants.identity, cfg.api_keys()),
        }
    }

    /// A copy as `generation`, with the replicas of the `changed` fleets replaced.
    pub fn with_replicas(
        &self,
        generation: u64,
        changed: impl IntoIterator<Item = (FleetId, Slots<Replica>)>,
    ) -> Topology {
        let mut t = self.clone();
        t.generation = generation;
        for (f, replicas) in changed {
            if let Some(fleet) = t.fleets.get_mut(f.index()) {
                fleet.by_addr = by_addr(&replicas);
                fleet.replicas = replicas;
            }
        }
        t
    }

    /// The replica that ids handed out in `generation` name, if it is still
    /// the same member in the same slot: the fleet order has not changed
    /// since, and the slot's member took it no later than `generation`.
    pub fn resolves(
        &self,
        generation: u64,
        fleet: FleetId,
        replica: ReplicaId,
    ) -> Option<&Replica> {
        if !self.knows(generation) {
            return None;
        }
        let r = self.fleets.get(fleet.index())?.replicas.get(replica)?;
        (r.since <= generation).then_some(r)
    }

    /// Whether fleet and stage ids handed out in `generation` mean the same now.
    pub fn knows(&self, generation: u64) -> bool {
        (self.layout..=self.generation).contains(&generation)
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

impl Stage {
    /// The name `fleet` serves this stage's model under, if it has its own.
    /// The name of what a replica holds for this stage: an adapter's, or
    /// its own model's on a packed fleet.
    pub fn held_name(&self, id: AdapterId) -> Option<&str> {
        match self.adapters.name(id) {
            Some(n) => Some(n),
            None => (self.packed == Some(id)).then_some(self.model.as_str()),
        }
    }

    /// Whether `id` is one of the stage's adapters (not its packed model).
    pub fn is_adapter(&self, id: AdapterId) -> bool {
        self.packed != Some(id)
    }

    /// The model name written upstream on `fleet` for a request holding
    /// `held`: the fleet's own name for the model, but an adapter keeps its
    /// own (the fleet's name is its base model's).
    pub fn rename(&self, fleet: FleetId, held: Option<AdapterId>) -> Option<&str> {
        self.served_as(fleet)
            .filter(|_| held.is_none_or(|id| !self.is_adapter(id)))
    }

    pub fn served_as(&self, fleet: FleetId) -> Option<&str> {
        let i = self.fleets.iter().position(|&f| f == fleet)?;
        self.served.get(i)?.as_deref()
    }
}

impl Fleet {
    pub fn replica_index(&self, addr: &str) -> Option<ReplicaId> {
        self.by_addr.get(addr).copied()
    }
}

fn by_addr(replicas: &Slots<Replica>) -> HashMap<String, ReplicaId> {
    replicas
        .iter()
        .map(|(id, r)| (r.addr.clone(), id))
        .collect()
}

/// `ip:port` as Envoy writes a host (IPv6 in brackets, no leading zeros);
/// text that is not an address (never in a valid config) stays as it is.
pub fn canonical_addr(text: &str) -> String {
    text.parse::<std::net::SocketAddr>()
        .map_or_else(|_| text.to_string(), |a| a.to_string())
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
            layout: 0,
            model_list: br#"{"object":"list","data":[]}"#.to_vec(),
            grpc_token: None,
            identity: crate::config::Identity::None,
        }
    }
}
