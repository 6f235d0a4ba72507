//! Registration in one place: every family goes into the registry and into
//! the catalog the generated metrics reference is made from.

use prometheus_client::metrics::TypedMetric;
use prometheus_client::registry::{Metric, Registry};

use super::labels::{ResultGauges, Results, Values};

/// (name without the prefix, type, help) of every registered family.
pub type Catalog = Vec<(&'static str, &'static str, &'static str)>;

pub struct Registrar<'a> {
    pub(super) registry: &'a mut Registry,
    pub(super) catalog: &'a mut Catalog,
}

impl Registrar<'_> {
    pub fn add<M: Metric + TypedMetric>(&mut self, name: &'static str, help: &'static str, m: M) {
        self.catalog.push((name, M::TYPE.as_str(), help));
        self.registry.register(name, help, m);
    }

    pub fn results<E: Values>(&mut self, name: &'static str, help: &'static str, m: &Results<E>) {
        self.add(name, help, m.0.clone());
    }

    pub fn result_gauges<E: Values>(
        &mut self,
        name: &'static str,
        help: &'static str,
        m: &ResultGauges<E>,
    ) {
        self.add(name, help, m.0.clone());
    }
}
