//! What happened to requests: decisions, refusals, responses, latency,
//! tokens, and each fleet's share and hit rate in its stage.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

use super::GaugeF;
use super::labels::{StageFleet, Values, label_values};
use super::registrar::Registrar;
use crate::topology::Topology;

label_values! {
    /// How a response ended.
    Class {
        Ok => "ok",
        ClientError => "client_error",
        ServerError => "server_error",
        EndedEarly => "ended_early",
        NoResponse => "no_response",
    }
}

label_values! {
    /// `cached` as the engine reported it, `predicted_cached` as the
    /// router's prefix index predicted it.
    TokenKind {
        Prompt => "prompt",
        Completion => "completion",
        Cached => "cached",
        PredictedCached => "predicted_cached",
    }
}

label_values! {
    HitSource {
        Predicted => "predicted",
        Engine => "engine",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageFleetArm {
    pub stage: String,
    pub fleet: String,
    /// `none` outside an A/B test, else `control` or `variant`.
    pub arm: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Outcome {
    pub stage: String,
    pub fleet: String,
    pub arm: String,
    pub class: Class,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Tokens {
    pub stage: String,
    pub fleet: String,
    pub kind: TokenKind,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HitRate {
    pub stage: String,
    pub fleet: String,
    pub source: HitSource,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Rejected {
    pub stage: String,
    pub reason: &'static str,
}

/// A request its stage did not serve, served by a fallback.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FellBack {
    /// The stage the client named.
    pub stage: String,
    /// The stage that served it.
    pub fallback: String,
    pub reason: &'static str,
}

#[derive(Clone)]
pub struct Buckets(pub fn() -> Histogram);

impl MetricConstructor<Histogram> for Buckets {
    fn new_metric(&self) -> Histogram {
        (self.0)()
    }
}

fn seconds() -> Histogram {
    // 5 ms to ~164 s.
    Histogram::new(exponential_buckets(0.005, 2.0, 16))
}

pub struct Routing {
    pub requests: Family<StageFleetArm, Counter>,
    pub responses: Family<Outcome, Counter>,
    pub rejected: Family<Rejected, Counter>,
    pub fallbacks: Family<FellBack, Counter>,
    pub shadowed: Family<StageFleet, Counter>,
    pub ttft: Family<StageFleet, Histogram, Buckets>,
    pub duration: Family<StageFleet, Histogram, Buckets>,
    pub tokens: Family<Tokens, Counter>,
    pub traffic_share: Family<StageFleet, GaugeF>,
    pub hit_rate: Family<HitRate, GaugeF>,
    /// LoRA adapter registrations on replicas (`lora.load_path`).
    pub adapter_loads: super::Results<AdapterLoad>,
    /// Model loads on packed replicas (`packing`).
    pub model_loads: super::Results<AdapterLoad>,
    /// Models loaded ahead of demand (`packing.placement`).
    pub placement_loads: super::Results<AdapterLoad>,
}

super::labels::label_values! {
    AdapterLoad {
        Ok => "ok",
        Failed => "failed",
    }
}

impl Routing {
    pub(super) fn new(r: &mut Registrar) -> Self {
        let m = Routing {
            requests: Family::default(),
            responses: Family::default(),
            rejected: Family::default(),
            fallbacks: Family::default(),
            shadowed: Family::default(),
            ttft: Family::new_with_constructor(Buckets(seconds)),
            duration: Family::new_with_constructor(Buckets(seconds)),
            tokens: Family::default(),
            traffic_share: Family::default(),
            hit_rate: Family::default(),
            adapter_loads: super::Results::default(),
            model_loads: super::Results::default(),
            placement_loads: super::Results::default(),
        };
        r.results(
            "adapter_loads",
            "Requests that waited for their LoRA adapter to be registered on their replica, by result",
            &m.adapter_loads,
        );
        r.results(
            "model_loads",
            "Requests that waited for their model to be loaded on their packed replica, by result",
            &m.model_loads,
        );
        r.results(
            "placement_loads",
            "Models loaded on packed replicas ahead of demand (packing.placement), by result",
            &m.placement_loads,
        );
        r.add(
            "requests",
            "Requests routed, by stage, fleet and A/B arm",
            m.requests.clone(),
        );
        r.add(
            "responses",
            "Responses observed, by outcome class",
            m.responses.clone(),
        );
        r.add(
            "rejected",
            "Requests answered by fleetroute with an error, by reason",
            m.rejected.clone(),
        );
        r.add(
            "fallbacks",
            "Requests served by a fallback stage instead of the stage they named, by reason",
            m.fallbacks.clone(),
        );
        r.add(
            "shadow_requests",
            "Requests mirrored to a shadow fleet (never served to clients)",
            m.shadowed.clone(),
        );
        r.add(
            "time_to_first_token_seconds",
            "Time to first token of streamed responses",
            m.ttft.clone(),
        );
        r.add(
            "request_duration_seconds",
            "Time from routing to the end of the response",
            m.duration.clone(),
        );
        r.add(
            "tokens",
            "Tokens by kind: prompt, completion, cached (engine-reported), predicted_cached",
            m.tokens.clone(),
        );
        r.add(
            "traffic_share",
            "Share of the stage's routed requests (decaying, ~30 s)",
            m.traffic_share.clone(),
        );
        r.add(
            "kv_cache_hit_rate",
            "Prompt tokens served from KV cache, predicted and engine-reported (decaying, ~30 s)",
            m.hit_rate.clone(),
        );
        m
    }

    /// Every counter series the config can produce, at zero.
    pub(super) fn prime(&self, topo: &Topology) {
        for reason in ["model_required", "model_not_found"] {
            drop(self.rejected.get_or_create(&Rejected {
                stage: String::new(),
                reason,
            }));
        }
        for stage in &topo.stages {
            let limits = crate::tenancy::ledger::Limit::ALL.map(|l| l.as_str());
            for reason in [
                "no_ready_replica",
                "residency_unsatisfiable",
                "no_acceptable_fleet",
            ]
            .into_iter()
            .chain(limits)
            {
                drop(self.rejected.get_or_create(&Rejected {
                    stage: stage.name.clone(),
                    reason,
                }));
            }
            let arms: &[&str] = if stage.experiment.ab.is_some() {
                &["none", "control", "variant"]
            } else {
                &["none"]
            };
            for &f in &stage.fleets {
                let fleet = &topo.fleets[f].name;
                for arm in arms {
                    drop(self.requests.get_or_create(&StageFleetArm {
                        stage: stage.name.clone(),
                        fleet: fleet.clone(),
                        arm: arm.to_string(),
                    }));
                    for &class in Class::ALL {
                        drop(self.responses.get_or_create(&Outcome {
                            stage: stage.name.clone(),
                            fleet: fleet.clone(),
                            arm: arm.to_string(),
                            class,
                        }));
                    }
                }
            }
            for (to, on) in &stage.fallbacks {
                for c in on {
                    drop(self.fallbacks.get_or_create(&FellBack {
                        stage: stage.name.clone(),
                        fallback: topo.stages[*to].name.clone(),
                        reason: c.as_str(),
                    }));
                }
            }
            if let Some((f, _)) = stage.experiment.shadow {
                drop(self.shadowed.get_or_create(&StageFleet {
                    stage: stage.name.clone(),
                    fleet: topo.fleets[f].name.clone(),
                }));
            }
        }
    }

    pub(super) fn clear(&self) {
        self.requests.clear();
        self.responses.clear();
        self.rejected.clear();
        self.fallbacks.clear();
        self.shadowed.clear();
        self.ttft.clear();
        self.duration.clear();
        self.tokens.clear();
        self.traffic_share.clear();
        self.hit_rate.clear();
    }
}
