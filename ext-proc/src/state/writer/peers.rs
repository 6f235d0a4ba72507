//! The writer's side of the peer link: its own prefix changes sent out,
//! other instances' applied by names.

use tokio::sync::mpsc;

use super::Writer;
use crate::metrics::PrefixUpdate;
use crate::state::peer::{OUTBOX, PeerChange, PeerUpdate};
use crate::topology::{ById, FleetId, ReplicaId};

impl Writer {
    /// From now on, every prefix change this instance makes (a routed
    /// request's blocks, a cache seen lost) is also sent to the returned
    /// receiver, for other instances. Bounded: when the receiver falls
    /// behind, changes are dropped and counted, never waited for.
    pub fn share_updates(&mut self) -> mpsc::Receiver<PeerUpdate> {
        let (tx, rx) = mpsc::channel(OUTBOX);
        self.outbox = Some(tx);
        rx
    }

    pub(super) fn publish(&self, fleet: FleetId, replica: ReplicaId, change: PeerChange) {
        let Some(tx) = &self.outbox else { return };
        let Some(f) = self.topo.fleets.by_id(fleet) else {
            return;
        };
        let Some(r) = f.replicas.get(replica) else {
            return;
        };
        let update = PeerUpdate {
            fleet: f.name.clone(),
            replica: r.addr.clone(),
            change,
        };
        let result = if tx.try_send(update).is_ok() {
            PrefixUpdate::Queued
        } else {
            PrefixUpdate::Dropped
        };
        self.shared.metrics.peers.updates.inc(result);
    }
}
