//! The router config file as its users write it: fleets and stages. Routing
//! per policy is in `routing.rs`, every default in `defaults.rs`.

use super::{EngineMetricsConfig, ExperimentConfig, HealthCheckConfig};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Deserialize, JsonSchema, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RouterConfig {
    /// Active checks of every replica.
    #[serde(default)]
    pub health_check: HealthCheckConfig,
    #[serde(default)]
    pub engine_metrics: EngineMetricsConfig,
    /// Bounds written into the rendered Envoy bootstrap.
    #[serde(default)]
    pub envoy: super::EnvoyConfig,
    #[serde(default)]
    pub leases: LeaseConfig,
    /// Several instances of one deployment: what they share through Redis.
    #[serde(default)]
    pub peers: PeersConfig,
    /// How fleets' members come and go (see `membership`).
    #[serde(default)]
    pub membership: MembershipConfig,
    /// Stage for requests whose model names no stage (or that name none).
    #[serde(default)]
    pub default_stage: Option<String>,
    /// The fleets: each a set of replicas of one provider or hardware in one region, an Envoy cluster of the same name.
    pub fleets: Vec<FleetConfig>,
    /// The stages: a model's endpoint, the fleets that serve it and how requests are spread over them.
    pub stages: Vec<StageConfig>,
    /// Per-tenant limits, budgets and priority classes (`tenants.rs`).
    #[serde(default)]
    pub tenants: super::TenantsConfig,
    /// Shares per-minute tenant limits between instances through Redis.
    #[serde(default)]
    pub tenants_redis: Option<super::TenantsRedisConfig>,
    /// The audit log: one JSON line per request.
    #[serde(default)]
    pub audit: super::AuditConfig,
    /// How a request's priority class is found, and the longest hold.
    #[serde(default)]
    pub admission: super::AdmissionConfig,
    /// Who may call the gRPC port (`grpc.rs`).
    #[serde(default)]
    pub grpc: super::GrpcConfig,
}

/// How long a decision holds its replica's load when the access log never
/// reports the request's end (see `state/lease.rs`).
#[derive(Clone, Debug, Deserialize, JsonSchema, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LeaseConfig {
    /// Floor of a lease: longer than the access log's flush interval.
    pub min_ms: u64,
    /// Ceiling of a lease: the route's whole-response timeout.
    pub max_ms: u64,
    /// Slowest decode rate assumed for one request, tokens per second.
    pub decode_tokens_per_sec: f64,
    /// Output assumed for a request that sets no `max_tokens`.
    pub default_max_tokens: u32,
}

/// Instances of one deployment share their prefix-index changes and forward
/// each other's access log entries through one Redis (see docs/concepts/several-instances.md, "Several
/// instances"). Read at start; a reload keeps the link it has.
#[derive(Clone, Debug, Deserialize, JsonSchema, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct PeersConfig {
    /// `redis://host:port/`; none: every instance routes on its own
    /// decisions only. May hold a password: protect the file like one.
    pub redis_url: Option<String>,
    /// Key prefix (the same Redis may serve several deployments).
    pub prefix: String,
    /// Bound on one Redis round trip.
    pub timeout_ms: u64,
    /// Changes and forwarded entries are sent, and the others' read, once
    /// per this interval, in one round trip.
    pub flush_ms: u64,
    /// Changes and forwarded entries held while Redis is slow or down;
    /// beyond it the oldest are dropped (counted).
    pub max_pending: usize,
    /// Batches the shared stream keeps (Redis memory: at most this times
    /// `max_batch_bytes`); an instance that falls further behind skips ahead.
    pub stream_max_len: u64,
    /// Largest batch written in one stream entry.
    pub max_batch_bytes: usize,
    /// Instances also share their per-replica load (requests in flight,
    /// prefill queued); a peer's report counts for this long after it was
    /// written, so a stopped peer's load stops counting within it. 0: load
    /// is not shared.
    pub load_stale_ms: u64,
}

/// A member that leaves (its source or the config no longer lists it) stops
/// taking new requests at once and is removed once idle or after the grace.
#[derive(Clone, Debug, Deserialize, JsonSchema, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct MembershipConfig {
    /// Longest a leaving replica is kept for its requests in flight.
    pub removal_grace_ms: u64,
}

#[derive(Clone, Debug, Deserialize, JsonSchema, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FleetConfig {
    /// Also the Envoy cluster name.
    pub name: String,
    /// Where the fleet runs; a stage's `residency` names regions.
    pub region: String,
    /// The members, `ip:port` as the Envoy cluster lists them. Exactly one
    /// of `endpoints`, `dns` and `kubernetes` is set (see `source`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<String>,
    /// Members from DNS records of a name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<super::DnsSource>,
    /// Members from a Kubernetes Service's EndpointSlices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<super::KubernetesSource>,
    /// The fleet's price: a provider's price per million tokens, or a GPU-hour price turned into one by measured throughput.
    #[serde(default)]
    pub cost: Option<CostConfig>,
    #[serde(default)]
    pub capacity: CapacityConfig,
    /// Host bounds for autoscaling signals; without them the fleet's desired
    /// size is its endpoint count.
    #[serde(default)]
    pub hosts: Option<Bounds>,
    #[serde(default)]
    pub scaling: ScalingConfig,
    /// The fleet's own API key (an external provider): it replaces the
    /// client's `Authorization` on requests routed here.
    #[serde(default)]
    pub credentials: Option<super::CredentialsConfig>,
    /// The inference engine the replicas run: which metrics say their
    /// load, which path says they are healthy.
    #[serde(default)]
    pub engine: super::Engine,
    /// The engine's endpoints and metric names where they are not its own.
    #[serde(default, skip_serializing_if = "super::EngineApi::is_default")]
    pub engine_api: super::EngineApi,
    /// How the replicas hold LoRA adapters; needed by every fleet of a
    /// stage that lists `adapters`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<super::LoraConfig>,
    /// The replicas serve several models, loaded on demand (llama.cpp's
    /// router mode): every stage listing this fleet is one of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packing: Option<super::PackingConfig>,
}

impl FleetConfig {
    /// The path probed for health: the fleet's own, the deployment's, or
    /// the engine's.
    pub fn health_path<'a>(&'a self, hc: &'a HealthCheckConfig) -> &'a str {
        self.engine_api
            .health_path
            .as_deref()
            .or(hc.path.as_deref())
            .unwrap_or(self.engine.health_path())
    }
}

/// Per-replica targets the autoscaling signal scales to.
#[derive(Clone, Debug, Deserialize, JsonSchema, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScalingConfig {
    /// Requests waiting per replica.
    pub target_queue: f64,
    /// Tokens (prompt + completion) per second per replica.
    pub target_tokens_per_sec: Option<f64>,
    /// How long the computed desired count must stay lower before the
    /// published one falls (a rise is published at once).
    pub scale_down_after_ms: u64,
}

#[derive(Clone, Debug, Default, Deserialize, JsonSchema, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CostConfig {
    /// Price of one GPU-hour, USD.
    pub gpu_hour_usd: Option<f64>,
    /// GPUs one replica runs on.
    pub gpus_per_replica: Option<u32>,
    /// A provider's price; when set it wins over the GPU-hour derivation.
    pub usd_per_million_tokens: Option<f64>,
    /// Expected tokens per second of one replica, used for the GPU-hour
    /// derivation until the fleet's throughput has been measured.
    pub tokens_per_sec: Option<f64>,
    /// Price of a prompt token the engine served from its cache, USD per
    /// million (providers discount them); unset: priced like any token.
    /// Only tenant budgets use it.
    #[serde(default)]
    pub cached_usd_per_million_tokens: Option<f64>,
}

/// What one replica of the fleet can take before it counts as saturated.
#[derive(Clone, Debug, Deserialize, JsonSchema, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct CapacityConfig {
    /// Requests in flight per replica (about the engine's maximum batch).
    pub max_inflight: u32,
    /// Requests queued inside the engine, as it reports them.
    pub max_waiting: u32,
    /// KV-cache usage the engine reports, 0..1.
    pub max_kv_usage: f64,
    /// KV-cache capacity of one replica in tokens: bounds the router's
    /// prediction of what each replica holds.
    pub kv_cache_tokens: u64,
}

#[derive(Clone, Copy, Debug, Deserialize, JsonSchema, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Bounds {
    /// Fewest replicas.
    pub min: u32,
    /// Most replicas.
    pub max: u32,
}

#[derive(Clone, Debug, Deserialize, JsonSchema, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StageConfig {
    /// The stage's name, unique in the file.
    pub name: String,
    /// Model names clients send in `model` for this stage; empty: the stage's name.
    #[serde(default)]
    pub models: Vec<String>,
    /// LoRA adapters of the stage's model, as clients name them in `model`:
    /// each fleet's replicas serve them (its `lora` says how many at once),
    /// and a request goes to a replica that holds its adapter when that
    /// costs less than loading it elsewhere.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub adapters: Vec<String>,
    /// Replicas of each packed fleet that keep this stage's model loaded
    /// even when no request asks for it (the fleet's `packing.placement`
    /// loads them): no cold start for a model with few requests.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub warm_replicas: u32,
    /// Fleet names; `{ name, model }` for a fleet that serves the model
    /// under another name.
    pub fleets: Vec<super::StageFleet>,
    /// Regions the stage may never leave; absent = every fleet's region.
    #[serde(default)]
    pub residency: Option<OneOrMany>,
    /// Bounds on the replicas of all the stage's fleets together, for autoscaling signals.
    #[serde(default)]
    pub replicas: Option<Bounds>,
    #[serde(default)]
    pub routing: super::RoutingConfig,
    #[serde(default)]
    pub replica_choice: ReplicaChoiceConfig,
    #[serde(default)]
    pub alarms: AlarmsConfig,
    #[serde(default)]
    pub outlier: OutlierConfig,
    #[serde(default)]
    pub warmup: Option<WarmupConfig>,
    #[serde(default)]
    pub experiment: ExperimentConfig,
    /// Objectives and shedding under overload; none: every request is routed.
    #[serde(default)]
    pub admission: Option<super::StageAdmission>,
    /// Other stages to answer instead of failing, in order, each for the
    /// conditions it lists (`concepts/fallbacks.md`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fallbacks: Vec<super::FallbackConfig>,
    /// Longest prompt the stage's model takes, tokens (the filter's
    /// estimate): a longer one goes to a `context` fallback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_tokens: Option<u32>,
}

impl StageConfig {
    /// The names of the stage's fleets, in order.
    pub fn fleet_names(&self) -> impl Iterator<Item = &String> {
        self.fleets.iter().map(|f| &f.name)
    }

    pub fn has_fleet(&self, name: &str) -> bool {
        self.fleets.iter().any(|f| f.name == name)
    }
}

/// How a replica is picked inside the chosen fleet: the prompt prefix it
/// already holds against the work already queued on it.
#[derive(Clone, Debug, Deserialize, JsonSchema, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReplicaChoiceConfig {
    /// Weight of a cached prompt token (prefill it saves).
    pub prefix_weight: f64,
    /// Weight of a token already waiting for prefill on the replica.
    pub load_weight: f64,
    /// Tokens charged per request the engine reports queued (work the router
    /// did not send, e.g. from other routers).
    pub engine_queue_tokens: f64,
    /// Replicas whose cost is within this many tokens of the best count as
    /// tied; ties go to the sampling key's rendezvous order.
    pub tie_tokens: f64,
    /// Bounded load: no replica takes a request while its queued tokens
    /// exceed this multiple of the fleet's mean...
    pub load_factor: f64,
    /// ...plus this many tokens (so an idle fleet is not "overloaded" by one
    /// prompt).
    pub load_slack_tokens: f64,
    /// New conversations (requests that hold no reply and that no replica
    /// holds beyond their opening blocks) skip a replica whose recent
    /// requests exceed this multiple of the fleet's mean (one with no full
    /// block past its opening still takes its key's home)... (0 turns the
    /// bound off)
    pub share_factor: f64,
    /// ...plus this many requests.
    pub share_slack: f64,
    /// ...but not when the replica's queue is shorter, by more than this
    /// many prefill tokens, than that of every replica within its share: the
    /// bound balances the turns to come and may make a request wait at most
    /// this much for it.
    pub share_wait_tokens: f64,
    /// A replica whose recent requests are below this fraction of the
    /// fleet's mean, less `share_slack`, is scored for a new conversation as
    /// if it held the conversation's opening (0 never; at most 1).
    pub share_floor: f64,
}

/// What a fleet must meet to be chosen by the cost policy (and what the
/// dashboards alarm on), over a sliding window.
#[derive(Clone, Debug, Deserialize, JsonSchema, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AlarmsConfig {
    /// Highest 95th percentile of time to first token, ms.
    pub ttft_p95_ms: Option<f64>,
    /// Highest share of failed requests.
    pub error_rate: Option<f64>,
    /// The sliding window the figures are taken over, seconds.
    pub window_s: u64,
    /// Below this many samples in the window a fleet counts as meeting them.
    pub min_samples: u32,
}

/// Ejecting replicas that fall behind their fleet's median.
#[derive(Clone, Debug, Deserialize, JsonSchema, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutlierConfig {
    /// Whether replicas are ejected at all.
    pub enabled: bool,
    /// A replica is an outlier when its figure exceeds the fleet median by
    /// this factor.
    pub factor: f64,
    /// Error rates also need to exceed the median by this much (absolute), so
    /// 2% against 0% is not an outlier.
    pub min_error_rate_gap: f64,
    /// Latencies also need to exceed the median by this many ms (per 1000
    /// prompt tokens for time to first token, per output token for decode),
    /// so replicas answering in a few ms are not ejected on scheduling noise.
    pub min_latency_gap_ms: f64,
    /// A replica whose error rate (errors and streams that ended early) is
    /// at least this is ejected even without three comparable replicas to
    /// compare it with (one- and two-replica fleets).
    pub max_error_rate: f64,
    /// The window outcomes are judged over, seconds.
    pub window_s: u64,
    /// Outcomes a replica needs in the window before it is judged.
    pub min_samples: u32,
    /// Never more than this share of a fleet's replicas ejected at once;
    /// when every stage of the fleet has somewhere else for its traffic
    /// (another fleet, or an `unhealthy` fallback, with a ready replica), a
    /// fleet whose share rounds to none may still lose one, and replicas
    /// failing at least `max_error_rate` leave past the share.
    pub max_ejected_share: f64,
    /// First ejection time, seconds; doubled for each ejection in a row.
    pub base_ejection_s: u64,
    /// Longest ejection, seconds.
    pub max_ejection_s: u64,
}

impl WarmupConfig {
    /// How long one golden prompt (or a probe) may take.
    pub const DEFAULT_TIMEOUT_MS: u64 = 10_000;
}

/// Golden prompts a replica must answer before it (re)joins the rotation.
#[derive(Clone, Debug, Deserialize, JsonSchema, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WarmupConfig {
    /// Request path, e.g. /v1/chat/completions.
    #[serde(default = "super::defaults::warmup_path")]
    pub path: String,
    /// The golden prompts, each sent as it is.
    pub prompts: Vec<GoldenPrompt>,
    /// Bound on one golden prompt's answer.
    #[serde(default = "super::defaults::warmup_timeout_ms")]
    pub timeout_ms: u64,
}

#[derive(Clone, Debug, Deserialize, JsonSchema, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GoldenPrompt {
    /// The request body, as JSON.
    pub body: serde_json::Value,
    /// Text the answer must contain (e.g. at temperature 0).
    #[serde(default)]
    pub expect: Option<String>,
}

#[derive(Clone, Debug, Deserialize, JsonSchema, Serialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub fn to_vec(&self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s.clone()],
            OneOrMany::Many(v) => v.clone(),
        }
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}
