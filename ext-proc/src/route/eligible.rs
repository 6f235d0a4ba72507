//! Which fleets and replicas may serve a request: inside the residency (the
//! stage's, narrowed by the request's), and ready. For each eligible fleet it
//! also reads what the prefix index predicts each replica holds.

use fleetroute_filter::contract::split_regions;

use super::Reject;
use super::key::RouteKey;
use super::rendezvous::unit;
use crate::state::Snapshot;
use crate::state::failed_keys::Avoid;
use crate::state::prefix_index::Matches;
use crate::state::saturation;
use crate::topology::{FleetId, NonEmpty, ReplicaId, Stage};

#[derive(Debug)]
pub struct Candidates {
    /// Eligible fleets with at least one ready replica, in the stage's order.
    pub fleets: Vec<CandidateFleet>,
}

#[derive(Debug)]
pub struct CandidateFleet {
    pub fleet: FleetId,
    pub ready: NonEmpty<ReadyReplica>,
    /// The highest rendezvous unit among `ready`, for weighted choices.
    pub best_unit: f64,
    /// The longest cached prefix any ready replica holds, in blocks.
    pub best_match: u16,
    /// See `route::saturation`, over the ready replicas.
    pub utilisation: f64,
    /// The least prefill queued on any ready replica, in tokens.
    pub min_queued: u64,
}

#[derive(Clone, Copy, Debug)]
pub struct ReadyReplica {
    pub replica: ReplicaId,
    /// This request key's rendezvous unit for the replica.
    pub unit: f64,
    /// Leading prompt blocks the replica is predicted to hold.
    pub matched: u16,
}

impl CandidateFleet {
    /// Prompt tokens this fleet would not have to prefill, at best.
    pub fn best_cached_tokens(&self, key: &RouteKey<'_>) -> u64 {
        cached_tokens(self.best_match, key)
    }
}

pub fn cached_tokens(matched: u16, key: &RouteKey<'_>) -> u64 {
    (u64::from(matched) * u64::from(key.block_tokens)).min(u64::from(key.prompt_tokens))
}

pub fn candidates(
    snap: &Snapshot,
    stage: &Stage,
    key: &RouteKey<'_>,
) -> Result<Candidates, Reject> {
    let topo = &snap.topo;
    let residency = key.residency;
    // A fallback never leaves the residency of the stage the client named.
    let named = key.within.map(|s| &topo.stages[s].residency);
    let allowed = |region: &str| {
        stage.residency.iter().any(|r| r == region)
            && named.is_none_or(|n| n.iter().any(|r| r == region))
            && residency.is_none_or(|req| split_regions(req).any(|r| r == region))
    };
    if residency.is_some() && !stage.residency.iter().any(|r| allowed(r)) {
        return Err(Reject::ResidencyUnsatisfiable {
            stage: stage.name.clone(),
            requested: residency.unwrap_or_default().to_string(),
            stage_residency: stage.residency.join(","),
        });
    }
    let avoid = avoided(snap, key);
    let mut fleets = Vec::with_capacity(stage.fleets.len());
    for &f in &stage.fleets {
        let fleet = &topo.fleets[f];
        if !allowed(&fleet.region) {
            continue;
        }
        let ready = ready_replicas(snap, f, key, avoid);
        let best_unit = ready.iter().map(|r| r.unit).fold(0.0f64, f64::max);
        let best_match = ready.iter().map(|r| r.matched).max().unwrap_or(0);
        if let Some(ready) = NonEmpty::new(ready) {
            let utilisation = saturation::utilisation(fleet, ready.iter().map(|r| r.replica));
            let min_queued = ready
                .iter()
                .map(|r| fleet.replicas[r.replica].load.pending_prefill())
                .min()
                .unwrap_or(0);
            fleets.push(CandidateFleet {
                fleet: f,
                ready,
                best_unit,
                best_match,
                utilisation,
                min_queued,
            });
        }
    }
    if fleets.is_empty() {
        let regions: Vec<&str> = stage
            .residency
            .iter()
            .map(String::as_str)
            .filter(|r| allowed(r))
            .collect();
        return Err(Reject::NoReadyReplica {
            stage: stage.name.clone(),
            residency: regions.join(","),
        });
    }
    Ok(Candidates { fleets })
}

/// Fleet `f`'s ready replicas for this request, with the rendezvous unit of
/// its key and the prompt blocks each is predicted to hold; the replicas
/// that failed this conversation are skipped while another remains. The one
/// rule set for every choice of a replica: the decision's, and admission's
/// re-fit of a refused request.
/// Replicas that failed this conversation before (only real sampling keys:
/// a request-id hash never comes back), looked up once per decision.
pub fn avoided(snap: &Snapshot, key: &RouteKey<'_>) -> Option<Avoid> {
    key.conversation()
        .and_then(|k| snap.failed_keys.avoid(k, snap.topo.layout))
}

pub fn ready_replicas(
    snap: &Snapshot,
    f: FleetId,
    key: &RouteKey<'_>,
    avoid: Option<Avoid>,
) -> Vec<ReadyReplica> {
    let fleet = &snap.topo.fleets[f];
    let mut matches = Matches::default();
    let depth = if key.blocks.is_empty() {
        0
    } else {
        snap.fleets[f].prefix.matches(&key.blocks, &mut matches)
    };
    let mut ready = Vec::with_capacity(fleet.replicas.len());
    ready.extend(
        fleet
            .replicas
            .iter()
            .filter(|&(r, _)| snap.replicas[f].get(r).is_some_and(|s| s.ready()))
            .map(|(r, rep)| ReadyReplica {
                replica: r,
                unit: unit(key.key, rep.seed),
                matched: if depth == 0 { 0 } else { matches[r] },
            }),
    );
    if let Some(a) = avoid.filter(|a| a.fleet == f) {
        // A bit counts while its slot holds the member that failed.
        let failed = |r: &ReadyReplica| {
            a.mask & (1 << r.replica.index()) != 0
                && fleet.replicas[r.replica].since <= a.generation
        };
        // Skip them while another ready replica remains.
        if ready.iter().any(|r| !failed(r)) {
            ready.retain(|r| !failed(r));
        }
    }
    ready
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use fleetroute_filter::contract::KeySource;

    use crate::config::RouterConfig;
    use crate::observe::Observation;
    use crate::route::decide;
    use crate::route::experiment::Arm;
    use crate::route::key::RouteKey;
    use crate::state::{Event, Writer};
    use crate::topology::{FleetId, ReplicaId};

    #[test]
    fn a_conversation_its_replica_failed_skips_that_replica_next_turn() {
        let cfg = RouterConfig::parse_valid(
            "fleets: [{ name: f, region: us, endpoints: [\"10.0.0.1:1\", \"10.0.0.2:1\", \"10.0.0.3:1\"] }]\n\
             stages: [{ name: s, models: [m], fleets: [f] }]\n",
        )
        .unwrap();
        let (shared, mut w) = Writer::new(&cfg);
        let now = Instant::now();
        w.healthy(FleetId(0), (0..3).map(ReplicaId), now);
        let key = |k, source| RouteKey {
            model: Some("m"),
            key: k,
            key_source: source,
            ..Default::default()
        };
        let first = |k, source| {
            decide(&shared.snapshot(), &key(k, source), 0)
                .unwrap()
                .replicas[0]
        };
        let fail = |w: &mut Writer, k: u64, replica: ReplicaId, status: u16, early: bool| {
            w.apply(
                Event::Observed(Box::new(Observation {
                    stage: "s".into(),
                    fleet: "f".into(),
                    replica: cfg.fleets[0].endpoints[replica.index()].clone(),
                    served_by: None,
                    status: Some(status),
                    time_to_first_byte: None,
                    total: Duration::from_millis(5),
                    usage: None,
                    predicted_cached_tokens: 0,
                    uncached_tokens: 0,
                    queued_tokens: 0,
                    arm: Arm::None,
                    stream: true,
                    ended_early: early,
                    key: Some(k),
                    decided: None,
                })),
                now,
            );
            w.drain(now);
        };
        let user = Some(KeySource::User);
        let home = first(42, user);
        // A stream that ended early: the next turn goes elsewhere.
        fail(&mut w, 42, home, 200, true);
        let second = first(42, user);
        assert_ne!(second, home);
        // It fails there too: the third replica takes it.
        fail(&mut w, 42, second, 503, false);
        let third = first(42, user);
        assert!(third != home && third != second);
        // Every replica failed it: none is skipped rather than none served.
        fail(&mut w, 42, third, 503, false);
        assert_eq!(first(42, user), home);
        // A client error says nothing about the replica; other keys keep
        // their home.
        let other = first(7, user);
        fail(&mut w, 7, other, 400, false);
        assert_eq!(first(7, user), other);
        // Without a sampling key there is no conversation to move.
        let anon = first(9, None);
        fail(&mut w, 9, anon, 503, false);
        assert_eq!(first(9, None), anon);
    }
}
