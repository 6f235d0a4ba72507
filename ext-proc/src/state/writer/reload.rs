//! A new config in a running router. Fleets are matched by name and keep
//! their models (figures, saturation, prefix index) and members; a static
//! fleet's `endpoints` are applied as a membership change (`members`), so
//! replicas that stay keep their slot, prefix entries, health, load and
//! keys. A dynamic fleet keeps its members: its source (restarted by
//! `sources` when its config changed) sends the next set. Only a changed
//! `capacity.kv_cache_tokens` drops a fleet's prefix entries (the cache
//! model changed).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use super::Writer;
use crate::config::{RouterConfig, Source, ValidConfig};
use crate::state::members::{self, FleetChange};
use crate::state::model::FleetModel;
use crate::state::prefix_index::IndexWriter;
use crate::topology::{Replica, Slots, Topology};

impl Writer {
    /// Swaps in a new config.
    pub(super) fn install(&mut self, cfg: ValidConfig, now: Instant) {
        let generation = self.topo.generation + 1;
        let old = self.topo.clone();
        let layout = if same_layout(&old, &cfg) {
            old.layout
        } else {
            generation
        };
        let mut models: HashMap<String, FleetModel> = old
            .fleets
            .iter()
            .map(|f| f.name.clone())
            .zip(std::mem::take(&mut self.fleets))
            .collect();
        let mut fleets = Vec::with_capacity(cfg.fleets.len());
        let mut replicas: Vec<Slots<Replica>> = Vec::with_capacity(cfg.fleets.len());
        for f in &cfg.fleets {
            let kv = f.capacity.kv_cache_tokens;
            let mut model = models
                .remove(&f.name)
                .unwrap_or_else(|| FleetModel::new(kv));
            if model.index.capacity_tokens() != kv {
                model.index = IndexWriter::new(kv);
            }
            let current = old
                .fleet_index(&f.name)
                .map(|p| old.fleets[p].replicas.clone())
                .unwrap_or_default();
            let next = match f.source() {
                Source::Static => {
                    let change = FleetChange {
                        fleet: &f.name,
                        current: &current,
                        model: &mut model,
                        generation,
                        warmup: members::warms_up(&cfg, &f.name),
                        now,
                    };
                    let desired = members::static_members(f);
                    let (next, sum) = change.reconcile(&desired);
                    members::log(&f.name, &sum, desired.len(), generation);
                    next
                }
                Source::Dns(_) | Source::Kubernetes(_) => current,
            };
            fleets.push(model);
            replicas.push(next);
        }
        let mut topo = Topology::build(&cfg, generation, layout, |f, _| {
            std::mem::take(&mut replicas[f.index()])
        });
        // A fleet that was known stays known: it keeps its members until its
        // (new) source answers.
        for fleet in &mut topo.fleets {
            fleet.members_known |= old
                .fleet_index(&fleet.name)
                .is_some_and(|p| old.fleets[p].members_known);
        }
        self.fleets = fleets;
        // New tenant limits from now on; counters and reservations stay.
        self.shared.tenants.reconfigure(&cfg.tenants);
        if cfg.tenants_redis != self.config.tenants_redis || cfg.audit != self.config.audit {
            tracing::warn!(
                "tenants_redis and audit changed in the config: they apply at the next start"
            );
        }
        self.config = Arc::new(cfg.into_inner());
        let pairs: HashSet<(String, String)> = topo
            .stages
            .iter()
            .flat_map(|s| {
                s.fleets
                    .iter()
                    .map(|&f| (s.name.clone(), topo.fleets[f].name.clone()))
            })
            .collect();
        self.accounting
            .retain(|s, f| pairs.contains(&(s.to_string(), f.to_string())));
        self.set_topology(topo, true);
        tracing::info!(generation, "router config applied");
    }
}

/// Whether fleet and stage ids keep their meaning: the same names in the same order.
fn same_layout(old: &Topology, cfg: &RouterConfig) -> bool {
    old.fleets
        .iter()
        .map(|f| &f.name)
        .eq(cfg.fleets.iter().map(|f| &f.name))
        && old
            .stages
            .iter()
            .map(|s| &s.name)
            .eq(cfg.stages.iter().map(|s| &s.name))
}

/// The names metric series of stages and fleets are labelled with.
pub(super) fn series_names(t: &Topology) -> Vec<String> {
    let mut names: Vec<String> = t
        .stages
        .iter()
        .map(|s| format!("s:{}:{:?}", s.name, s.fleets))
        .collect();
    names.extend(t.fleets.iter().map(|f| format!("f:{}", f.name)));
    names
}

impl Writer {
    /// Every change of the topology goes through here (a reload or an admin
    /// change, `config`; a member joining, leaving or removed): the one place
    /// that swaps it. The snapshot published next holds it and wakes
    /// `Shared::watch_replicas`. The writer's models must already match it.
    pub(super) fn set_topology(&mut self, topo: Topology, config: bool) {
        let m = &self.shared.metrics;
        if config && series_names(&topo) != series_names(&self.topo) {
            // Series of stages or fleets that left go with them; a change of
            // weights or bounds keeps every series (and counter).
            m.clear_config_series();
        } else {
            // Per-replica series of the replicas that left.
            let now: HashSet<(&str, &str)> = topo
                .fleets
                .iter()
                .flat_map(|f| {
                    f.replicas
                        .values()
                        .map(|r| (f.name.as_str(), r.addr.as_str()))
                })
                .collect();
            for f in &self.topo.fleets {
                for r in f.replicas.values() {
                    if !now.contains(&(f.name.as_str(), r.addr.as_str())) {
                        super::recorder::replica_gone(m, &f.name, &r.addr);
                    }
                }
            }
        }
        if config {
            m.prime(&topo);
        }
        self.topo = Arc::new(topo);
        self.dirty = true;
    }
}
