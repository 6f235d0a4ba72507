//! Active health checks: a state machine per replica with hysteresis, and the
//! task that probes every replica on an interval.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;

use super::{Event, Shared};
use crate::config::HealthCheckConfig;
use crate::topology::{Fleet, FleetId};

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    /// Not probed yet: not routed to.
    Unknown,
    Healthy,
    Unhealthy,
}

/// Flips only after `healthy_threshold` passes or `unhealthy_threshold`
/// failures in a row; the very first probe decides at once.
#[derive(Clone, Copy, Debug)]
pub struct HealthMachine {
    pub state: Health,
    streak: u32,
}

impl Default for HealthMachine {
    fn default() -> Self {
        HealthMachine {
            state: Health::Unknown,
            streak: 0,
        }
    }
}

impl HealthMachine {
    /// Records one probe; returns the new state when it flipped.
    pub fn record(&mut self, ok: bool, cfg: &HealthCheckConfig) -> Option<Health> {
        let (target, threshold) = if ok {
            (Health::Healthy, cfg.healthy_threshold)
        } else {
            (Health::Unhealthy, cfg.unhealthy_threshold)
        };
        if self.state == target {
            self.streak = 0;
            return None;
        }
        self.streak += 1;
        if self.state == Health::Unknown || self.streak >= threshold {
            self.state = target;
            self.streak = 0;
            return Some(target);
        }
        None
    }
}

fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(1)
        .build()
        .expect("http client")
}

/// A request of the router's own (probe, golden prompt, scrape) to a fleet
/// with its own key carries that key, as routed requests do.
pub fn with_key(req: reqwest::RequestBuilder, fleet: &Fleet) -> reqwest::RequestBuilder {
    match &fleet.key {
        Some(k) => req.header("authorization", k.authorization()),
        None => req,
    }
}

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
                let url = format!("http://{}{}", replica.addr, cfg.path);
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

/// Runs the golden prompts of every stage a fleet serves against its healthy
/// replicas that have not passed warmup yet. A task of its own, so a slow or
/// hanging replica under warmup never delays anyone's health checks.
pub async fn run_warmups(shared: Arc<Shared>) {
    let client = http_client();
    loop {
        let snap = shared.snapshot_full();
        let mut warmups = Vec::new();
        for (f, fleet) in snap.topo.fleets.iter().enumerate() {
            let f = FleetId(f);
            for (r, replica) in fleet.replicas.iter() {
                let st = snap.replicas[f][r];
                if st.health != Health::Healthy || st.warm || st.leaving {
                    continue;
                }
                // Each stage's prompts under the name this fleet serves its
                // model by; without any, a short probe (a replica back from
                // an ejection must serve before it rejoins).
                let stages: Vec<_> = snap
                    .topo
                    .stages_of(f)
                    .filter_map(|s| Some((s.warmup.clone()?, s.served_as(f).map(str::to_string))))
                    .collect();
                let probe = snap
                    .topo
                    .stages_of(f)
                    .next()
                    .map(|s| (s.model.clone(), s.served_as(f).map(str::to_string)));
                let client = &client;
                let addr = replica.addr.clone();
                let name = fleet.name.clone();
                warmups.push(async move {
                    let mut result = Ok(());
                    for (w, served) in &stages {
                        let to = super::warmup::Target {
                            addr: &addr,
                            served: served.as_deref(),
                            fleet,
                        };
                        result = super::warmup::check(client, &to, w).await;
                        if result.is_err() {
                            break;
                        }
                    }
                    if let (true, Some((model, served))) = (stages.is_empty(), &probe) {
                        let to = super::warmup::Target {
                            addr: &addr,
                            served: served.as_deref(),
                            fleet,
                        };
                        let bound = Duration::from_millis(crate::config::WarmupConfig::DEFAULT_TIMEOUT_MS);
                        result = super::warmup::probe(client, &to, model, bound).await;
                    }
                    if let Err(e) = &result {
                        tracing::warn!(fleet = %name, replica = %addr, "warmup failed, replica stays out: {e}");
                    }
                    (f, r, result.is_ok())
                });
            }
        }
        for (fleet, replica, ok) in join_all(warmups).await {
            let generation = snap.topo.generation;
            let _ = shared
                .events()
                .send(Event::Warmup {
                    generation,
                    fleet,
                    replica,
                    ok,
                })
                .await;
        }
        tokio::time::sleep(Duration::from_millis(snap.topo.health_check.interval_ms)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hysteresis() {
        let cfg = HealthCheckConfig {
            healthy_threshold: 2,
            unhealthy_threshold: 3,
            ..Default::default()
        };
        let mut m = HealthMachine::default();
        assert_eq!(
            m.record(true, &cfg),
            Some(Health::Healthy),
            "first probe decides"
        );
        assert_eq!(m.record(false, &cfg), None);
        assert_eq!(m.record(false, &cfg), None);
        assert_eq!(
            m.record(true, &cfg),
            None,
            "a pass resets the failure streak"
        );
        assert_eq!(m.record(false, &cfg), None);
        assert_eq!(m.record(false, &cfg), None);
        assert_eq!(m.record(false, &cfg), Some(Health::Unhealthy));
        assert_eq!(m.record(true, &cfg), None);
        assert_eq!(m.record(true, &cfg), Some(Health::Healthy));
    }
}
