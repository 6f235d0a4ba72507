//! The writer's side of membership: a source's member set applied to a
//! fleet's slots, and leavers swept once idle or past their grace.

use std::time::{Duration, Instant};

use super::Writer;
use crate::config::{FleetConfig, Source};
use crate::membership::Member;
use crate::state::members::{FleetChange, log, warms_up};
use crate::topology::FleetId;

impl Writer {
    /// A source's member set for `fleet`, while `source` is still its
    /// configured source (an update from a source a reload replaced is stale).
    pub(super) fn on_membership(
        &mut self,
        fleet: &str,
        source: &Source,
        members: &[Member],
        now: Instant,
    ) {
        let Some(f) = self.topo.fleet_index(fleet) else {
            return;
        };
        if self
            .config
            .fleets
            .get(f.index())
            .map(FleetConfig::source)
            .as_ref()
            != Some(source)
        {
            tracing::debug!(fleet, "membership update from a replaced source ignored");
            return;
        }
        let generation = self.topo.generation + 1;
        let change = FleetChange {
            fleet,
            current: &self.topo.fleets[f].replicas,
            model: &mut self.fleets[f],
            generation,
            warmup: warms_up(&self.config, fleet),
            now,
        };
        let (next, sum) = change.reconcile(members);
        log(fleet, &sum, members.len(), generation);
        // The first answer makes the fleet known even when it changes no
        // member (an empty fleet, confirmed): EDS serves it from now on.
        let first = !self.topo.fleets[f].members_known;
        if sum.changed() || first {
            let mut topo = self.topo.with_replicas(generation, [(f, next)]);
            topo.fleets[f.index()].members_known = true;
            self.set_topology(topo, false);
        }
    }

    /// On every tick: leavers that are done leave the topology.
    pub(super) fn sweep_leavers(&mut self, now: Instant) {
        let generation = self.topo.generation + 1;
        let grace = Duration::from_millis(self.config.membership.removal_grace_ms);
        let mut changed = Vec::new();
        for (f, fm) in self.fleets.iter_mut().enumerate() {
            let f = FleetId(f);
            let Some(fleet) = self.topo.fleets.get(f.index()) else {
                continue;
            };
            let change = FleetChange {
                fleet: &fleet.name,
                current: &fleet.replicas,
                model: fm,
                generation,
                warmup: warms_up(&self.config, &fleet.name),
                now,
            };
            if let Some((next, sum)) = change.sweep(grace) {
                log(&fleet.name, &sum, next.len(), generation);
                changed.push((f, next));
            }
        }
        if !changed.is_empty() {
            let topo = self.topo.with_replicas(generation, changed);
            self.set_topology(topo, false);
        }
    }
}

#[cfg(test)]
#[path = "membership_tests.rs"]
mod tests;
