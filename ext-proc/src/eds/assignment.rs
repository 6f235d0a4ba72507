//! What Envoy is told about each cluster, read off one snapshot: every fleet
//! cluster lists exactly the topology's replicas of that fleet, and every
//! stage's fail-open cluster (`fallback/<stage>`) holds its fleets' replicas,
//! one locality per fleet, weighted and prioritised as `fail_open::plan_with`
//! computes from the same members.
//!
//! Health status, and why it is safe (docs/concepts/inside-envoy.md, "Routed requests and Envoy's
//! health view"):
//! - Fleet clusters carry fleetroute's view. The override-host policy finds
//!   fleetroute's chosen host among all of the cluster's hosts whatever their
//!   status, so a routed request is never turned away by it; only the
//!   fallback policy (used when Envoy does not know the chosen host yet, or
//!   retries used up fleetroute's list) honours it, and there it steers away
//!   from replicas fleetroute would not pick. Ready → HEALTHY; healthy but
//!   warming or ejected → DEGRADED (used only when too few are healthy);
//!   failing its checks → UNHEALTHY; not probed yet → UNKNOWN (Envoy reads it
//!   as healthy); draining, or leaving (its membership source no longer
//!   lists it; it stays listed until fleetroute removes it) → DRAINING
//!   (Envoy excludes it from balancing, and its in-flight requests finish: a
//!   status change closes no connection).
//! - Fail-open clusters carry only DRAINING. Envoy health-checks them itself,
//!   and they serve exactly when fleetroute is gone: a health verdict pushed
//!   before fleetroute went down would stay frozen and keep a recovered
//!   replica out of fail-open. A drain is an operator's instruction, and a
//!   leaver is on its way out, so both hold there too.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use envoy_types::pb::envoy::config::core::v3::address::Address as AddressKind;
use envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier;
use envoy_types::pb::envoy::config::core::v3::{Address, HealthStatus, Locality, SocketAddress};
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints,
};
use envoy_types::pb::google::protobuf::UInt32Value;

use crate::fail_open;
use crate::state::health::Health;
use crate::state::{ReplicaState, Snapshot};
use crate::topology::{Fleet, Slots};

/// The clusters held back from Envoy: every dynamic fleet whose source has
/// not answered yet, and the fail-open cluster of every stage that serves
/// one. Served empty, they would make Envoy drop the hosts it kept (after a
/// fleetroute restart while DNS is down, say); not sent, Envoy keeps them,
/// or on its own first start waits out `initial_fetch_timeout`.
pub fn held_back(snap: &Snapshot) -> BTreeSet<String> {
    let unknown = |name: &str| {
        snap.topo
            .fleet_index(name)
            .is_some_and(|f| !snap.topo.fleets[f].members_known)
    };
    let mut out: BTreeSet<String> = snap
        .topo
        .fleets
        .iter()
        .filter(|f| !f.members_known)
        .map(|f| f.name.clone())
        .collect();
    for stage in &snap.config.stages {
        if stage.fleets.iter().any(|f| unknown(&f.name)) {
            out.insert(fail_open::cluster_name(&stage.name));
        }
    }
    out
}

/// Every cluster fleetroute serves, by name: the fleets', then the stages'
/// fail-open clusters (their names cannot collide: fleet names hold no '/'),
/// except those [`held_back`].
pub fn all(snap: &Snapshot) -> BTreeMap<String, ClusterLoadAssignment> {
    let held = held_back(snap);
    let mut out = BTreeMap::new();
    for (f, fleet) in snap.topo.fleets.iter().enumerate() {
        if held.contains(&fleet.name) {
            continue;
        }
        let lb_endpoints = members(fleet, snap.replicas.get(f), fleet_status);
        let cla = ClusterLoadAssignment {
            cluster_name: fleet.name.clone(),
            endpoints: vec![LocalityLbEndpoints {
                lb_endpoints,
                ..Default::default()
            }],
            ..Default::default()
        };
        out.insert(fleet.name.clone(), cla);
    }
    retry_pairs(snap, &held, &mut out);
    for stage in &snap.config.stages {
        let name = fail_open::cluster_name(&stage.name);
        if held.contains(&name) {
            continue;
        }
        // Leavers take no share of the fail-open split.
        let count = |fleet: &str| {
            snap.topo.fleet_index(fleet).map_or(0, |f| {
                snap.replicas
                    .get(f.index())
                    .map_or(0, |s| s.values().filter(|r| !r.leaving).count())
            })
        };
        let mut endpoints = Vec::new();
        for l in fail_open::plan_with(&snap.config, stage, count) {
            let Some(f) = snap.topo.fleet_index(&l.fleet) else {
                continue;
            };
            let fleet = &snap.topo.fleets[f];
            let states = snap.replicas.get(f.index());
            endpoints.push(LocalityLbEndpoints {
                locality: Some(Locality {
                    sub_zone: l.fleet.clone(),
                    ..Default::default()
                }),
                lb_endpoints: members(fleet, states, fallback_status),
                load_balancing_weight: Some(UInt32Value { value: l.weight }),
                priority: l.priority,
                ..Default::default()
            });
        }
        out.insert(
            name.clone(),
            ClusterLoadAssignment {
                cluster_name: name,
                endpoints,
                ..Default::default()
            },
        );
    }
    out
}

/// The `retry/` clusters: a stage's fleet, then (priority 1, only for
/// Envoy's fallback policy, which fleetroute's host list leaves unused) a
/// fleet of its `upstream` fallback. Held back with either fleet.
fn retry_pairs(
    snap: &Snapshot,
    held: &BTreeSet<String>,
    out: &mut BTreeMap<String, ClusterLoadAssignment>,
) {
    for (from, to) in crate::config::retry_pairs(&snap.config) {
        if held.contains(&from) || held.contains(&to) {
            continue;
        }
        let group = |name: &str, priority: u32| {
            let f = snap.topo.fleet_index(name)?;
            let lb_endpoints = members(
                &snap.topo.fleets[f],
                snap.replicas.get(f.index()),
                fleet_status,
            );
            Some(LocalityLbEndpoints {
                lb_endpoints,
                priority,
                ..Default::default()
            })
        };
        let mut endpoints: Vec<LocalityLbEndpoints> = group(&from, 0).into_iter().collect();
        if to != from {
            endpoints.extend(group(&to, 1));
        }
        let name = crate::config::retry_cluster(&from, &to);
        let cla = ClusterLoadAssignment {
            cluster_name: name.clone(),
            endpoints,
            ..Default::default()
        };
        out.insert(name, cla);
    }
}

/// What an unknown cluster is answered with: no members. fleetroute owns
/// every name its bootstrap renders, so a name it does not know is a fleet or
/// stage it no longer has (or not yet); saying so lets Envoy finish
/// initialising at once instead of waiting out `initial_fetch_timeout`.
pub fn empty(name: &str) -> ClusterLoadAssignment {
    ClusterLoadAssignment {
        cluster_name: name.to_string(),
        ..Default::default()
    }
}

fn members(
    fleet: &Fleet,
    states: Option<&Slots<ReplicaState>>,
    status: fn(&ReplicaState) -> HealthStatus,
) -> Vec<LbEndpoint> {
    fleet
        .replicas
        .iter()
        .filter_map(|(r, rep)| {
            // An address Envoy formats (from the config or a source).
            let addr: SocketAddr = rep.addr.parse().ok()?;
            let health = states
                .and_then(|s| s.get(r))
                .map_or(HealthStatus::Unknown, status);
            Some(lb_endpoint(addr, health))
        })
        .collect()
}

fn lb_endpoint(addr: SocketAddr, health: HealthStatus) -> LbEndpoint {
    LbEndpoint {
        host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
            address: Some(Address {
                address: Some(AddressKind::SocketAddress(SocketAddress {
                    address: addr.ip().to_string(),
                    port_specifier: Some(PortSpecifier::PortValue(u32::from(addr.port()))),
                    ..Default::default()
                })),
            }),
            ..Default::default()
        })),
        health_status: health as i32,
        ..Default::default()
    }
}

/// A fleet cluster's member: fleetroute's view (see the module doc).
pub fn fleet_status(s: &ReplicaState) -> HealthStatus {
    if s.draining || s.leaving {
        return HealthStatus::Draining;
    }
    match s.health {
        Health::Unknown => HealthStatus::Unknown,
        Health::Unhealthy => HealthStatus::Unhealthy,
        Health::Healthy if s.ready() => HealthStatus::Healthy,
        Health::Healthy => HealthStatus::Degraded,
    }
}

/// A fail-open cluster's member: Envoy's own checks decide, except a drain.
pub fn fallback_status(s: &ReplicaState) -> HealthStatus {
    if s.draining || s.leaving {
        HealthStatus::Draining
    } else {
        HealthStatus::Unknown
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::config::RouterConfig;
    use crate::state::{Change, Event, Writer};
    use crate::topology::{FleetId, ReplicaId};

    const CONFIG: &str = r#"
fleets:
  - { name: a, region: us, endpoints: ["10.0.0.1:80", "10.0.0.2:80"] }
  - { name: b, region: us, endpoints: ["[fd00::1]:81"] }
  - { name: far, region: eu, endpoints: ["10.9.0.1:80"] }
stages:
  - name: s/1
    models: [m]
    fleets: [a, b]
    residency: us
    routing: { policy: weighted, weights: { a: 1, b: 3 } }
  - name: eu
    models: [e]
    fleets: [far]
"#;

    fn addrs(cla: &ClusterLoadAssignment) -> Vec<(String, Option<String>, i32)> {
        cla.endpoints
            .iter()
            .flat_map(|g| {
                let zone = g.locality.as_ref().map(|l| l.sub_zone.clone());
                g.lb_endpoints.iter().map(move |e| {
                    let Some(HostIdentifier::Endpoint(ep)) = &e.host_identifier else {
                        panic!("no endpoint");
                    };
                    let Some(AddressKind::SocketAddress(sa)) =
                        ep.address.as_ref().and_then(|a| a.address.as_ref())
                    else {
                        panic!("no socket address");
                    };
                    let Some(PortSpecifier::PortValue(p)) = sa.port_specifier else {
                        panic!("no port");
                    };
                    (format!("{}:{p}", sa.address), zone.clone(), e.health_status)
                })
            })
            .collect()
    }

    fn writer() -> (std::sync::Arc<crate::state::Shared>, Writer) {
        Writer::new(&RouterConfig::parse_valid(CONFIG).unwrap())
    }

    #[test]
    fn fleets_list_their_replicas_and_fail_open_keeps_the_stage() {
        let (shared, _w) = writer();
        let all = all(&shared.snapshot());
        let names: Vec<&str> = all.keys().map(String::as_str).collect();
        assert_eq!(names, ["a", "b", "fallback/eu", "fallback/s/1", "far"]);
        let unknown = HealthStatus::Unknown as i32;
        assert_eq!(
            addrs(&all["a"]),
            vec![
                ("10.0.0.1:80".into(), None, unknown),
                ("10.0.0.2:80".into(), None, unknown)
            ]
        );
        assert_eq!(addrs(&all["b"])[0].0, "fd00::1:81");
        let s1 = &all["fallback/s/1"];
        // weighted: a 1 × 2 replicas, b 3 × 1 replica.
        let w: Vec<(String, u32, u32)> = s1
            .endpoints
            .iter()
            .map(|g| {
                (
                    g.locality.as_ref().unwrap().sub_zone.clone(),
                    g.load_balancing_weight.as_ref().unwrap().value,
                    g.priority,
                )
            })
            .collect();
        assert_eq!(w, vec![("a".into(), 2, 0), ("b".into(), 3, 0)]);
        assert!(
            !addrs(s1).iter().any(|(a, ..)| a.starts_with("10.9.")),
            "fail-open left its residency"
        );
        assert_eq!(addrs(&all["fallback/eu"]).len(), 1);
    }

    #[test]
    fn health_shows_on_fleet_clusters_and_only_a_drain_on_fail_open() {
        let (shared, mut w) = writer();
        let now = Instant::now();
        let health = |replica, ok| Event::Health {
            generation: 1,
            fleet: FleetId(0),
            replica: ReplicaId(replica),
            ok,
        };
        w.apply(health(0, true), now);
        w.apply(health(1, false), now);
        w.drain(now);
        let all1 = all(&shared.snapshot());
        let status: Vec<i32> = addrs(&all1["a"]).into_iter().map(|a| a.2).collect();
        assert_eq!(
            status,
            [HealthStatus::Healthy as i32, HealthStatus::Unhealthy as i32]
        );
        assert!(
            addrs(&all1["fallback/s/1"])
                .iter()
                .all(|a| a.2 == HealthStatus::Unknown as i32),
            "fleetroute's health reached a fail-open cluster"
        );
        w.apply(
            Event::Change {
                change: Box::new(Change::Drain {
                    replica: "10.0.0.1:80".into(),
                    drain: true,
                }),
                reply: None,
            },
            now,
        );
        let all2 = all(&shared.snapshot());
        let draining = HealthStatus::Draining as i32;
        assert_eq!(addrs(&all2["a"])[0].2, draining);
        assert_eq!(addrs(&all2["fallback/s/1"])[0].2, draining);
        assert_eq!(
            addrs(&all2["a"]).len(),
            2,
            "a draining replica stays listed"
        );
    }

    #[test]
    fn the_static_rendering_and_the_served_endpoints_agree() {
        // The static bootstrap's fail-open endpoints (from the config) and
        // the served ones (from the topology) for the same config.
        let cfg = RouterConfig::parse(CONFIG).unwrap();
        let (shared, _w) = writer();
        let served = all(&shared.snapshot());
        for stage in &cfg.stages {
            let rendered = fail_open::endpoints(&cfg, stage).unwrap();
            let rendered: Vec<(String, u64, u64, Vec<String>)> = rendered
                .as_sequence()
                .unwrap()
                .iter()
                .map(|g| {
                    let eps = g["lb_endpoints"]
                        .as_sequence()
                        .unwrap()
                        .iter()
                        .map(|e| {
                            let sa = &e["endpoint"]["address"]["socket_address"];
                            format!(
                                "{}:{}",
                                sa["address"].as_str().unwrap(),
                                sa["port_value"].as_u64().unwrap()
                            )
                        })
                        .collect();
                    (
                        g["locality"]["sub_zone"].as_str().unwrap().to_string(),
                        g["load_balancing_weight"].as_u64().unwrap(),
                        g["priority"].as_u64().unwrap_or(0),
                        eps,
                    )
                })
                .collect();
            let cla = &served[&fail_open::cluster_name(&stage.name)];
            let served: Vec<(String, u64, u64, Vec<String>)> = cla
                .endpoints
                .iter()
                .map(|g| {
                    let one = ClusterLoadAssignment {
                        endpoints: vec![g.clone()],
                        ..Default::default()
                    };
                    (
                        g.locality.as_ref().unwrap().sub_zone.clone(),
                        u64::from(g.load_balancing_weight.as_ref().unwrap().value),
                        u64::from(g.priority),
                        addrs(&one).into_iter().map(|(a, ..)| a).collect(),
                    )
                })
                .collect();
            assert_eq!(rendered, served, "stage {}", stage.name);
        }
    }
}
