//! The Prometheus metrics of `/metrics`, one file per component: each
//! registers its families with their help text, primes the series its config
//! can produce and clears them when names change, so adding a metric touches
//! one file. Labels are names from the config (stage, fleet, replica address)
//! and enums of fixed values, so cardinality stays bounded.

mod access_log;
mod admission;
mod control;
mod engines;
mod fleets;
mod labels;
mod peers;
mod registrar;
mod routing;
mod sources;
mod tenants;

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

pub use access_log::{AccessLog, Entry, EnvoyLog, PrefillEnded, Released};
pub use admission::{Admission, AdmissionVerdict, StageClass, Verdict};
pub use control::{Control, EdsRequest, Reload, Unauthenticated};
pub use engines::{EngineMetrics, FleetEngine, ScrapeResult};
pub use fleets::{Fleets, ReplicaState, ReplicaStates};
pub use labels::{FleetLabel, Replica, ResultGauges, Results, StageFleet, Values};
pub use peers::{Direction, Forwarded, LoadExchange, Peers, PrefixUpdate};
pub use routing::{
    AdapterLoad, Class, FellBack, HitRate, HitSource, Outcome, Rejected, Routing, StageFleetArm,
    TokenKind, Tokens,
};
pub use sources::SourceMetrics;
pub use tenants::{Audit, SharedCounters, TenantLabel, TenantRefusal, Tenants};

use registrar::{Catalog, Registrar};

type GaugeF = Gauge<f64, AtomicU64>;

pub struct Metrics {
    registry: Registry,
    catalog: Catalog,
    pub routing: Routing,
    pub fleets: Fleets,
    pub access_log: AccessLog,
    pub control: Control,
    pub peers: Peers,
    pub tenants: Tenants,
    pub admission: Admission,
    /// The membership sources' own counters, read at each scrape.
    pub sources: Arc<SourceMetrics>,
    /// What the engines' own metrics endpoints gave, per fleet.
    pub engines: Arc<EngineMetrics>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("fleetroute");
        let mut catalog = Catalog::new();
        let mut r = Registrar {
            registry: &mut registry,
            catalog: &mut catalog,
        };
        let routing = Routing::new(&mut r);
        let fleets = Fleets::new(&mut r);
        let control = Control::new(&mut r);
        let access_log = AccessLog::new(&mut r);
        let peers = Peers::new(&mut r);
        let tenants = Tenants::new(&mut r);
        let admission = Admission::new(&mut r);
        let sources = Arc::<SourceMetrics>::default();
        registry.register_collector(Box::new(sources.clone()));
        let engines = Arc::<EngineMetrics>::default();
        registry.register_collector(Box::new(engines.clone()));
        Metrics {
            registry,
            catalog,
            routing,
            fleets,
            access_log,
            control,
            peers,
            tenants,
            admission,
            sources,
            engines,
        }
    }

    /// Every family: (name with its prefix and, for a counter, `_total`,
    /// type, help), sorted by name.
    pub fn catalog(&self) -> Vec<(String, &'static str, &'static str)> {
        let mut out: Vec<_> = self
            .catalog
            .iter()
            .map(|&(name, kind, help)| {
                let suffix = if kind == "counter" { "_total" } else { "" };
                (format!("fleetroute_{name}{suffix}"), kind, help)
            })
            .collect();
        out.sort();
        out
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("encode to string");
        out
    }

    /// Creates every counter series the config can produce, at zero, so the
    /// first event of each shows in `rate()` and `increase()` (a series that
    /// appears already at 1 does not).
    pub fn prime(&self, topo: &crate::topology::Topology) {
        self.routing.prime(topo);
        self.admission.prime(topo);
    }

    /// Forgets every config-labelled series (counters restart from zero,
    /// which Prometheus reads as a restart); used when names change.
    pub fn clear_config_series(&self) {
        self.routing.clear();
        self.fleets.clear();
        self.admission.clear();
    }
}
