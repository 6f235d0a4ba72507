//! The task that probes every replica's health endpoint on an interval.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;

use super::{http_client, with_key};
use crate::state::{Event, Shared};
use crate::topology::FleetId;

/// Probes every replica of the current topology each interval, forever.
pub async fn run_checks(shared: Arc<Shared>) {
    let client = http_client();
    loop {
        let snap = shared.snapshot_full();
        let cfg = &snap.topo.health_check;
        let timeout = Duration::from_millis(cfg.timeout_ms);
        let mut probes = Vec::new();
        for (f, fleet) in snap.topo.fleets.iter().enumerate() {
            let f = FleetId(f);
            for (r, replica) in fleet.replicas.iter() {
                let url = format!("http://{}{}", replica.addr, fleet.health_path);
                // A provider may want its key on every path, probes included.
                let req = with_key(client.get(&url).timeout(timeout), fleet);
                probes.push(async move {
                    let ok = matches!(
                        req.send().await,
                        Ok(resp) if resp.status().is_success()
                    );
                    (f, r, ok)
                });
            }
        }
        for (fleet, replica, ok) in join_all(probes).await {
            let generation = snap.topo.generation;
            let _ = shared
                .events()
                .send(Event::Health {
                    generation,
                    fleet,
                    replica,
                    ok,
                })
                .await;
        }
        tokio::time::sleep(Duration::from_millis(cfg.interval_ms)).await;
    }
}
