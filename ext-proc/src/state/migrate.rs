//! A new config in a running router: the topology is rebuilt, and replicas
//! whose fleet and address are unchanged keep their health, load, ejection
//! and keys; a fleet whose replica list and cache size are unchanged keeps
//! everything, its prefix index included.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::model::{FleetModel, ReplicaModel};
use super::recorder;
use super::writer::Writer;
use crate::config::ValidConfig;
use crate::topology::load::ReplicaLoad;
use crate::topology::{ById, FleetId, Topology};

/// The live counters of each replica, by fleet name and address, so a
/// replica that survives a reload keeps its in-flight count.
pub(super) type Loads = HashMap<(String, String), Arc<ReplicaLoad>>;

impl Writer {
    /// Swaps in a new config.
    pub(super) fn install(&mut self, cfg: ValidConfig) {
        let topo = Arc::new(build_topology(
            &cfg,
            self.topo.generation + 1,
            &mut self.loads,
        ));
        let old = std::mem::take(&mut self.fleets);
        self.fleets = fleet_models(&topo, old, &self.topo);
        let renamed = series_names(&topo) != series_names(&self.topo);
        self.topo = topo;
        self.config = Arc::new(cfg.into_inner());
        // Counters of replicas that left go with them.
        let live: HashSet<(String, String)> = self
            .topo
            .fleets
            .iter()
            .flat_map(|f| f.replicas.iter().map(|r| (f.name.clone(), r.addr.clone())))
            .collect();
        self.loads.retain(|k, _| live.contains(k));
        let pairs: HashSet<(String, String)> = self
            .topo
            .stages
            .iter()
            .flat_map(|s| {
                s.fleets
                    .iter()
                    .map(|&f| (s.name.clone(), self.topo.fleets[f].name.clone()))
            })
            .collect();
        self.accounting
            .retain(|s, f| pairs.contains(&(s.to_string(), f.to_string())));
        recorder::reconfigured(&self.shared.metrics, &self.topo, renamed);
        tracing::info!(generation = self.topo.generation, "router config applied");
        self.dirty = true;
    }
}

/// The names metric series are labelled with.
fn series_names(t: &Topology) -> Vec<String> {
    let mut names: Vec<String> = t
        .stages
        .iter()
        .map(|s| format!("s:{}:{:?}", s.name, s.fleets))
        .collect();
    for f in &t.fleets {
        names.push(format!("f:{}", f.name));
        names.extend(
            f.replicas
                .iter()
                .map(|r| format!("r:{}/{}", f.name, r.addr)),
        );
    }
    names
}

pub(super) fn build_topology(cfg: &ValidConfig, generation: u64, loads: &mut Loads) -> Topology {
    Topology::build(cfg, generation, |fleet, addr| {
        loads
            .entry((fleet.to_string(), addr.to_string()))
            .or_default()
            .clone()
    })
}

/// Models for a new topology, carried over from the old one where they can.
pub(super) fn fleet_models(
    topo: &Topology,
    mut old: Vec<FleetModel>,
    old_topo: &Topology,
) -> Vec<FleetModel> {
    let mut out = Vec::with_capacity(topo.fleets.len());
    for (f, fleet) in topo.fleets.iter().enumerate() {
        let f = FleetId(f);
        let warmup = topo.stages_of(f).any(|s| s.warmup.is_some());
        let prev = old_topo.fleet_index(&fleet.name);
        let unchanged = prev.is_some_and(|p| {
            let o = &old_topo.fleets[p];
            o.capacity.kv_cache_tokens == fleet.capacity.kv_cache_tokens
                && o.replicas
                    .iter()
                    .map(|r| &r.addr)
                    .eq(fleet.replicas.iter().map(|r| &r.addr))
        });
        if unchanged
            && let Some(p) = prev
            && p.index() < old.len()
        {
            out.push(std::mem::replace(&mut old[p], FleetModel::new(0, 1)));
            continue;
        }
        let mut m = FleetModel::new(fleet.replicas.len(), fleet.capacity.kv_cache_tokens);
        for (r, rep) in fleet.replicas.iter().enumerate() {
            let carried = prev.and_then(|p| {
                let oi = old_topo.fleets[p]
                    .replicas
                    .iter()
                    .position(|x| x.addr == rep.addr)?;
                old.by_id_mut(p)
                    .and_then(|fm| fm.replicas.get_mut(oi))
                    .map(std::mem::take)
            });
            m.replicas[r] = carried.unwrap_or_else(|| ReplicaModel::joining(warmup));
        }
        out.push(m);
    }
    out
}
