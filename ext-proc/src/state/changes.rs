//! Changes made while running: a reloaded config file, and the admin API's
//! edits (a fleet's weight, host bounds, experiments, draining a replica).
//! Each config edit is applied to a copy of the running config and validated
//! as a whole, with the same field-path errors as the file, before it is
//! swapped in; a refused change leaves everything as it was.

use std::time::Instant;

use super::writer::Writer;
use crate::config::{Bounds, ExperimentConfig, RouterConfig, RoutingConfig};
use crate::metrics::ResultLabel;

#[derive(Debug)]
pub enum Change {
    /// A new config file (already parsed and validated), from `source`
    /// (file change, SIGHUP, admin API).
    Reload {
        config: Box<RouterConfig>,
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
}

fn stage_index(cfg: &RouterConfig, stage: &str) -> Result<usize, String> {
    cfg.stages
        .iter()
        .position(|s| s.name == stage)
        .ok_or_else(|| format!("no stage '{stage}'"))
}

impl Writer {
    pub(super) fn change(&mut self, change: Change, now: Instant) -> Result<String, String> {
        let result = self.apply_change(change);
        if result.is_ok() {
            self.publish_if_dirty(now);
        }
        result
    }

    fn apply_change(&mut self, change: Change) -> Result<String, String> {
        let m = &self.shared.metrics;
        match change {
            Change::Reload { config, source } => {
                m.reloads
                    .get_or_create(&ResultLabel {
                        result: "applied".into(),
                    })
                    .inc();
                self.install(*config);
                Ok(format!(
                    "config reloaded ({source}), generation {}",
                    self.topo.generation
                ))
            }
            Change::SetWeight {
                stage,
                fleet,
                weight,
            } => {
                let mut cfg = (*self.config).clone();
                let s = stage_index(&cfg, &stage)?;
                let st = &mut cfg.stages[s];
                let RoutingConfig::Weighted(w) = &mut st.routing else {
                    return Err(format!(
                        "stage '{stage}' uses the {} policy; weights apply to the weighted policy",
                        st.routing.policy().name()
                    ));
                };
                if !st.fleets.contains(&fleet) {
                    return Err(format!("fleet '{fleet}' is not in stage '{stage}'"));
                }
                let weights = &mut w.weights;
                let old = weights.insert(fleet.clone(), weight).unwrap_or(1.0);
                self.commit(cfg)?;
                Ok(format!(
                    "stage '{stage}': weight of fleet '{fleet}' {old} -> {weight} (others unchanged)"
                ))
            }
            Change::Scale { fleet, min, max } => {
                let mut cfg = (*self.config).clone();
                let f = cfg
                    .fleets
                    .iter_mut()
                    .find(|f| f.name == fleet)
                    .ok_or_else(|| format!("no fleet '{fleet}'"))?;
                let old = f.hosts;
                f.hosts = Some(Bounds { min, max });
                self.commit(cfg)?;
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
                let old = std::mem::replace(&mut cfg.stages[s].experiment, experiment.clone());
                self.commit(cfg)?;
                let show = |e: &ExperimentConfig| serde_json::to_string(e).unwrap_or_default();
                Ok(format!(
                    "stage '{stage}': experiment {} -> {}",
                    show(&old),
                    show(&experiment)
                ))
            }
            Change::Drain { replica, drain } => {
                let mut found = Vec::new();
                for (f, fleet) in self.topo.fleets.iter().enumerate() {
                    for (r, rep) in fleet.replicas.iter().enumerate() {
                        if rep.addr == replica {
                            self.fleets[f].replicas[r].draining = drain;
                            found.push(fleet.name.clone());
                        }
                    }
                }
                if found.is_empty() {
                    return Err(format!("no replica at '{replica}' in any fleet"));
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
        }
    }

    /// Validates a whole edited config and swaps it in.
    fn commit(&mut self, cfg: RouterConfig) -> Result<(), String> {
        cfg.check().map_err(|e| e.to_string())?;
        self.shared.metrics.admin_changes.inc();
        self.install(cfg);
        Ok(())
    }
}
