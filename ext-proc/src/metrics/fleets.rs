//! Each fleet's state: price, throughput, replicas by state, utilisation,
//! members, and each replica's own load.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use super::GaugeF;
use super::labels::{FleetLabel, Replica, label_values};
use super::registrar::Registrar;

label_values! {
    /// A replica's state, as `fleetroute fleets` shows it.
    ReplicaState {
        Ready => "ready",
        Unhealthy => "unhealthy",
        Warming => "warming",
        Ejected => "ejected",
        Draining => "draining",
        Leaving => "leaving",
        Unknown => "unknown",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReplicaStates {
    pub fleet: String,
    pub state: ReplicaState,
}

pub struct Fleets {
    pub cost_gpu_hour: Family<FleetLabel, GaugeF>,
    pub cost_mtok: Family<FleetLabel, GaugeF>,
    pub tokens_per_sec: Family<FleetLabel, GaugeF>,
    pub replicas: Family<ReplicaStates, Gauge>,
    pub utilisation: Family<FleetLabel, GaugeF>,
    pub saturated: Family<FleetLabel, Gauge>,
    pub desired: Family<FleetLabel, Gauge>,
    pub inflight: Family<Replica, Gauge>,
    pub queued_tokens: Family<Replica, Gauge>,
    /// Members per fleet (leaving ones not counted).
    pub members: Family<FleetLabel, Gauge>,
    /// Members a source lists beyond the fleet's slots.
    pub members_ignored: Family<FleetLabel, Gauge>,
}

impl Fleets {
    pub(super) fn new(r: &mut Registrar) -> Self {
        let m = Fleets {
            cost_gpu_hour: Family::default(),
            cost_mtok: Family::default(),
            tokens_per_sec: Family::default(),
            replicas: Family::default(),
            utilisation: Family::default(),
            saturated: Family::default(),
            desired: Family::default(),
            inflight: Family::default(),
            queued_tokens: Family::default(),
            members: Family::default(),
            members_ignored: Family::default(),
        };
        r.add(
            "cost_usd_per_gpu_hour",
            "Configured price per GPU-hour",
            m.cost_gpu_hour.clone(),
        );
        r.add(
            "cost_usd_per_million_tokens",
            "Provider price, or GPU-hour price over measured throughput",
            m.cost_mtok.clone(),
        );
        r.add(
            "fleet_tokens_per_second",
            "Tokens (prompt + completion) the fleet served per second over the alarms window",
            m.tokens_per_sec.clone(),
        );
        r.add("replicas", "Replicas by state", m.replicas.clone());
        r.add(
            "fleet_utilisation",
            "Highest of in-flight, queue and KV-usage ratios to capacity",
            m.utilisation.clone(),
        );
        r.add(
            "fleet_saturated",
            "1 while the fleet is saturated (priority spills past it)",
            m.saturated.clone(),
        );
        r.add(
            "desired_replicas",
            "Replicas the fleet should run, for an autoscaler",
            m.desired.clone(),
        );
        r.add(
            "replica_inflight",
            "Requests in flight per replica",
            m.inflight.clone(),
        );
        r.add(
            "replica_queued_tokens",
            "Prefill tokens routed and not yet answered, per replica",
            m.queued_tokens.clone(),
        );
        r.add(
            "fleet_members",
            "Members of the fleet in routing (joined, not leaving), from its endpoints, DNS or Kubernetes",
            m.members.clone(),
        );
        r.add(
            "fleet_members_ignored",
            "Members a fleet's source lists beyond its 64 slots, ignored until a slot frees",
            m.members_ignored.clone(),
        );
        m
    }

    pub(super) fn clear(&self) {
        self.cost_gpu_hour.clear();
        self.cost_mtok.clear();
        self.tokens_per_sec.clear();
        self.replicas.clear();
        self.utilisation.clear();
        self.saturated.clear();
        self.desired.clear();
        self.inflight.clear();
        self.queued_tokens.clear();
        self.members.clear();
        self.members_ignored.clear();
    }
}
