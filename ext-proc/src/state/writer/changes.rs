//! Changes made while running: a reloaded config file, and the admin API's
//! edits (a fleet's weight, host bounds, experiments, draining a replica, a
//! tenant's limits).
//! Each config edit is applied to a copy of the running config and validated
//! as a whole, with the same field-path errors as the file, before it is
//! swapped in; a refused change leaves everything as it was.

use std::time::Instant;

use super::Writer;
use crate::config::{
    Bounds, ExperimentConfig, RouterConfig, RoutingConfig, TenantPatch, ValidConfig,
};
use crate::metrics::Reload;

#[derive(Debug)]
pub enum Change {
    /// A new config file (already parsed and validated), from `source`
    /// (file change, SIGHUP, admin API).
    Reload {
        config: Box<ValidConfig>,
        source: String,
    },
    /// Set one fleet's weight in a weighted stage, keeping the others'.
    SetWeight {
        stage: String,
        fleet: String,
        weight: f64,
    },
    /// Set a fleet's host bounds (used by the autoscaling signal).
    Scale { fleet: String, min: u32, max: u32 },
    /// Stop (or resume) new requests to a replica; in-flight ones finish.
    Drain { replica: String, drain: bool },
    /// Replace a stage's experiments (A/B test, shadow).
    Experiment {
        stage: String,
        experiment: ExperimentConfig,
    },
    /// Change one tenant's limits (its named entry, made from `default` if
    /// it has none), or remove its named entry (back to `default`).
    Tenant {
        name: String,
        patch: TenantPatch,
        remove: bool,
    },
}

/// Why a change was refused; the admin API maps each kind to its status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChangeError {
    /// The change itself is malformed (a config file that does not validate).
    #[error("{0}")]
    Invalid(String),
    /// It names a stage, fleet or replica that does not exist.
    #[error("{0}")]
    Unknown(String),
    /// Well-formed, but the running config cannot take it (wrong policy,
    /// residency, bounds): the whole edited config fails validation.
    #[error("{0}")]
    Conflict(String),
    /// The writer is gone: nothing can change until fleetroute restarts.
    #[error("the state writer has stopped")]
    Stopped,
}

fn stage_index(cfg: &RouterConfig, stage: &str) -> Result<usize, ChangeError> {
    cfg.stages
        .iter()
        .position(|s| s.name == stage)
        .ok_or_else(|| ChangeError::Unknown(format!("no stage '{stage}'")))
}

/// Every fleet an experiment names must exist (whether it belongs to the
/// stage is the validator's, a conflict).
fn known_fleets(cfg: &RouterConfig, ex: &ExperimentConfig) -> Result<(), ChangeError> {
    let ab = ex
        .ab
        .iter()
        .flat_map(|ab| std::iter::once(&ab.control).chain(ab.variants.iter().map(|v| &v.fleet)));
    for name in ab.chain(ex.shadow.iter().map(|s| &s.fleet)) {
        if !cfg.fleets.iter().any(|f| &f.name == name) {
            return Err(ChangeError::Unknown(format!("unknown fleet '{name}'")));
        }
    }
    Ok(())
}

impl Writer {
    pub(super) fn change(&mut self, change: Change, now: Instant) -> Result<String, ChangeError> {
        let result = self.apply_change(change, now);
        if result.is_ok() {
            self.publish_if_dirty(now);
        }
        result
    }

    fn apply_change(&mut self, change: Change, now: Instant) -> Result<String, ChangeError> {
        let m = &self.shared.metrics;
        match change {
            Change::Reload { config, source } => {
                m.control.reloads.inc(Reload::Applied);
                self.install(*config, now);
                Ok(format!(
                    "config reloaded ({source}), generation {}",
                    self.topo.generation
                ))
            }
            Change::SetWeight {
                stage,
                fleet,
                weight,
            } => self.set_weight(stage, fleet, weight, now),
            Change::Scale { fleet, min, max } => {
                let mut cfg = (*self.config).clone();
                let f = cfg
                    .fleets
                    .iter_mut()
                    .find(|f| f.name == fleet)
                    .ok_or_else(|| ChangeError::Unknown(format!("no fleet '{fleet}'")))?;
                let old = f.hosts;
                f.hosts = Some(Bounds { min, max });
                self.commit(cfg, now)?;
                Ok(format!(
                    "fleet '{fleet}': hosts {} -> min {min}, max {max}",
                    old.map_or("unset".to_string(), |b| format!(
                        "min {}, max {}",
                        b.min, b.max
                    ))
                ))
            }
            Change::Experiment { stage, experiment } => {
                let mut cfg = (*self.config).clone();
                let s = stage_index(&cfg, &stage)?;
                known_fleets(&cfg, &experiment)?;
                let old = std::mem::replace(&mut cfg.stages[s].experiment, experiment.clone());
                self.commit(cfg, now)?;
                let show = |e: &ExperimentConfig| serde_json::to_string(e).unwrap_or_default();
                Ok(format!(
                    "stage '{stage}': experiment {} -> {}",
                    show(&old),
                    show(&experiment)
                ))
            }
            Change::Tenant {
                name,
                patch,
                remove,
            } => self.set_tenant(name, patch, remove, now),
            Change::Drain { replica, drain } => self.set_draining(replica, drain),
        }
    }

    fn set_weight(
        &mut self,
        stage: String,
        fleet: String,
        weight: f64,
        now: Instant,
    ) -> Result<String, ChangeError> {
        let mut cfg = (*self.config).clone();
        let s = stage_index(&cfg, &stage)?;
        let st = &mut cfg.stages[s];
        let RoutingConfig::Weighted(w) = &mut st.routing else {
            return Err(ChangeError::Conflict(format!(
                "stage '{stage}' uses the {} policy; weights apply to the weighted policy",
                st.routing.policy().name()
            )));
        };
        if !st.fleets.iter().any(|f| f.name == fleet) {
            return Err(ChangeError::Unknown(format!(
                "fleet '{fleet}' is not in stage '{stage}'"
            )));
        }
        let weights = &mut w.weights;
        let old = weights.insert(fleet.clone(), weight).unwrap_or(1.0);
        // Unlisted fleets weigh 1; with every weight 0 nothing routes.
        if st.fleets.iter().all(|f| weights.get(&f.name) == Some(&0.0)) {
            return Err(ChangeError::Conflict(format!(
                "stage '{stage}' would have no fleet with a weight above 0"
            )));
        }
        self.commit(cfg, now)?;
        Ok(format!(
            "stage '{stage}': weight of fleet '{fleet}' {old} -> {weight} (others unchanged)"
        ))
    }

    fn set_tenant(
        &mut self,
        name: String,
        patch: TenantPatch,
        remove: bool,
        now: Instant,
    ) -> Result<String, ChangeError> {
        let mut cfg = (*self.config).clone();
        let named = &mut cfg.tenants.named;
        let old = named.get(&name).cloned();
        let was = old.as_ref().unwrap_or(&cfg.tenants.default).to_string();
        let after = if remove {
            if named.remove(&name).is_none() {
                return Err(ChangeError::Unknown(format!(
                    "tenant '{name}' has no entry in tenants.named"
                )));
            }
            format!("default limits ({})", cfg.tenants.default)
        } else {
            let mut l = old.unwrap_or_else(|| cfg.tenants.default.clone());
            patch.apply(&mut l);
            let text = l.to_string();
            named.insert(name.clone(), l);
            text
        };
        self.commit(cfg, now)?;
        Ok(format!("tenant '{name}': {was} -> {after}"))
    }

    fn set_draining(&mut self, replica: String, drain: bool) -> Result<String, ChangeError> {
        let mut found = Vec::new();
        for (f, fleet) in self.topo.fleets.iter().enumerate() {
            if let Some(r) = fleet.replica_index(&replica)
                && let Some(m) = self.fleets[f].replicas.get_mut(r)
            {
                m.draining = drain;
                found.push(fleet.name.clone());
            }
        }
        if found.is_empty() {
            return Err(ChangeError::Unknown(format!(
                "no replica at '{replica}' in any fleet"
            )));
        }
        self.dirty = true;
        let verb = if drain {
            "draining (no new requests; in-flight ones finish)"
        } else {
            "back in rotation"
        };
        Ok(format!(
            "replica {replica} in fleet {}: {verb}",
            found.join(", ")
        ))
    }

    /// Validates a whole edited config and swaps it in.
    fn commit(&mut self, cfg: RouterConfig, now: Instant) -> Result<(), ChangeError> {
        let cfg = crate::config::validate(cfg).map_err(|e| ChangeError::Conflict(e.to_string()))?;
        self.shared.metrics.control.admin_changes.inc();
        self.install(cfg, now);
        Ok(())
    }
}
