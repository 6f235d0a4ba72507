//! Replica load shared between the instances of one deployment. Each
//! instance counts only the requests it decided (its leases); alone, two
//! instances each see a replica the other is filling as idle and pile onto
//! it. So each reports its own per-replica figures (`LoadReport`, by fleet
//! name and replica address: topologies may differ for a moment during a
//! rollout) over the peer link, and keeps the others' latest reports
//! (`PeerLoads`), each counted until a staleness bound measured from when
//! it was written: a peer that stopped (killed, restarted under a new id,
//! cut off with Redis) stops counting within that bound. The sum of the
//! fresh reports is stored next to the own counters
//! (`ReplicaLoad::set_peers`), where the decision reads both, lock-free.
//!
//! No double counting: a request's load is held by the instance that
//! decided it and nowhere else (an access log entry that reaches another
//! instance is forwarded, not held there), each instance reports only its
//! own figures, and its own report is never read back as a peer's.
//!
//! Time is passed in: the peer link uses the clock it reads reports with,
//! the replay its simulated one.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::topology::Topology;
use crate::topology::load::LoadFigures;
use crate::topology::slots::Slots;

/// Peers whose reports are kept at once; a report from one more is ignored
/// (counted) until one of them goes stale.
pub const MAX_PEERS: usize = 64;

/// One instance's own load on the replicas that have any, by names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadReport {
    pub fleets: Vec<FleetLoad>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FleetLoad {
    pub fleet: String,
    /// Replica address and its figures; idle replicas are left out.
    pub replicas: Vec<(String, LoadFigures)>,
}

impl LoadReport {
    /// This instance's own figures on every busy replica of `topo`.
    pub fn own(topo: &Topology) -> LoadReport {
        let fleets = topo
            .fleets
            .iter()
            .filter_map(|f| {
                let replicas: Vec<(String, LoadFigures)> = f
                    .replicas
                    .values()
                    .map(|r| (r.addr.clone(), r.load.own()))
                    .filter(|(_, l)| !l.is_zero())
                    .collect();
                (!replicas.is_empty()).then(|| FleetLoad {
                    fleet: f.name.clone(),
                    replicas,
                })
            })
            .collect();
        LoadReport { fleets }
    }

    pub fn is_empty(&self) -> bool {
        self.fleets.is_empty()
    }

    /// Replica figures in the report.
    pub fn len(&self) -> usize {
        self.fleets.iter().map(|f| f.replicas.len()).sum()
    }
}

/// When this instance sends its report: a changed one at its next round,
/// an empty one too (peers then drop this instance's load at once rather
/// than at the bound), an unchanged busy one every `refresh` so it stays
/// fresh, an unchanged idle one never. The first round always sends, so a
/// restarted instance replaces what its predecessor of the same id said.
#[derive(Debug)]
pub struct Reporter {
    last: Option<LoadReport>,
    sent_at: Option<Instant>,
    refresh: Duration,
}

impl Reporter {
    pub fn new(refresh: Duration) -> Self {
        Reporter {
            last: None,
            sent_at: None,
            refresh,
        }
    }

    pub fn due(&self, report: &LoadReport, now: Instant) -> bool {
        match (&self.last, self.sent_at) {
            (Some(last), Some(at)) if last == report => {
                !report.is_empty() && now.saturating_duration_since(at) >= self.refresh
            }
            _ => true,
        }
    }

    /// The store took `report` (a failed round sends it again next time).
    pub fn sent(&mut self, report: LoadReport, now: Instant) {
        self.last = Some(report);
        self.sent_at = Some(now);
    }
}

/// What became of a peer's report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Received {
    /// Kept; `unknown` of its figures name no replica here (yet).
    Kept { unknown: usize },
    /// Written longer ago than the bound (a backlog read late).
    Stale,
    /// From one peer more than `MAX_PEERS`.
    Ignored,
}

#[derive(Debug)]
struct Peer {
    report: LoadReport,
    /// When this report stops counting, on this instance's clock.
    until: Instant,
}

/// The other instances' latest reports.
#[derive(Debug)]
pub struct PeerLoads {
    peers: HashMap<String, Peer>,
    stale: Duration,
}

impl PeerLoads {
    /// Reports count for `stale` after they were written.
    pub fn new(stale: Duration) -> Self {
        PeerLoads {
            peers: HashMap::new(),
            stale,
        }
    }

    /// `from`'s report, read at `now` and written `age` before, as the
    /// store's own clock tells (never the peer's: clocks differ between
    /// machines). It replaces `from`'s previous one.
    pub fn receive(
        &mut self,
        topo: &Topology,
        from: &str,
        report: LoadReport,
        age: Duration,
        now: Instant,
    ) -> Received {
        let Some(left) = self.stale.checked_sub(age).filter(|d| !d.is_zero()) else {
            return Received::Stale;
        };
        if !self.peers.contains_key(from) {
            self.peers.retain(|_, p| p.until > now);
            if self.peers.len() >= MAX_PEERS {
                return Received::Ignored;
            }
        }
        let unknown = report
            .fleets
            .iter()
            .map(|f| match topo.fleet_index(&f.fleet) {
                Some(i) => f
                    .replicas
                    .iter()
                    .filter(|(a, _)| topo.fleets[i.index()].replica_index(a).is_none())
                    .count(),
                None => f.replicas.len(),
            })
            .sum();
        self.peers.insert(
            from.to_string(),
            Peer {
                report,
                until: now + left,
            },
        );
        Received::Kept { unknown }
    }

    /// Drops the reports past their bound and stores the sum of the rest
    /// in every replica of `topo` (zero where no peer reports load).
    /// Returns the peers counted.
    pub fn apply(&mut self, topo: &Topology, now: Instant) -> usize {
        self.peers.retain(|_, p| p.until > now);
        // By the current slots: a peer's figure follows its replica's name
        // and address to whatever slot it holds now; a replica that left
        // has no slot and its figures count nowhere.
        let mut sums: Vec<Slots<LoadFigures>> = topo
            .fleets
            .iter()
            .map(|f| f.replicas.map(|_, _| LoadFigures::default()))
            .collect();
        for p in self.peers.values() {
            for f in &p.report.fleets {
                let Some(fi) = topo.fleet_index(&f.fleet) else {
                    continue;
                };
                let fleet = &topo.fleets[fi.index()];
                for (addr, figures) in &f.replicas {
                    if let Some(sum) = fleet
                        .replica_index(addr)
                        .and_then(|r| sums[fi.index()].get_mut(r))
                    {
                        sum.add(figures);
                    }
                }
            }
        }
        for (fleet, sums) in topo.fleets.iter().zip(&sums) {
            for (id, r) in fleet.replicas.iter() {
                r.load.set_peers(&sums[id]);
            }
        }
        self.peers.len()
    }

    /// Peers whose reports were kept and have not yet been found stale.
    pub fn peers(&self) -> usize {
        self.peers.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RouterConfig;
    use crate::state::Writer;
    use crate::topology::{Replica, ReplicaId};

    const CFG: &str = "fleets:\n  - { name: a, region: us, endpoints: [\"10.0.0.1:1\", \"10.0.0.2:1\"] }\n  \
                       - { name: b, region: us, endpoints: [\"10.0.1.1:1\"] }\n\
                       stages: [{ name: s, models: [m], fleets: [a, b] }]\n";

    fn topo() -> std::sync::Arc<Topology> {
        let (shared, _w) = Writer::new(&RouterConfig::parse_valid(CFG).unwrap());
        shared.snapshot().topo.clone()
    }

    fn report(fleet: &str, addr: &str, inflight: u32, tokens: u64) -> LoadReport {
        LoadReport {
            fleets: vec![FleetLoad {
                fleet: fleet.into(),
                replicas: vec![(
                    addr.into(),
                    LoadFigures {
                        inflight,
                        prefilling: inflight,
                        pending_prefill: tokens,
                    },
                )],
            }],
        }
    }

    #[test]
    fn own_reports_name_busy_replicas_only() {
        let t = topo();
        assert!(LoadReport::own(&t).is_empty());
        let _g = t.fleets[0].replicas[ReplicaId(1)].load.start(500);
        // A peer's figures are not this instance's to report.
        t.fleets[1].replicas[ReplicaId(0)]
            .load
            .set_peers(&LoadFigures {
                inflight: 9,
                ..Default::default()
            });
        assert_eq!(LoadReport::own(&t), report("a", "10.0.0.2:1", 1, 500));
    }

    #[test]
    fn fresh_reports_sum_and_stale_ones_stop_counting() {
        let t = topo();
        let mut p = PeerLoads::new(Duration::from_millis(1000));
        let now = Instant::now();
        let load = &t.fleets[0].replicas[ReplicaId(0)].load;
        let r = |n| report("a", "10.0.0.1:1", n, 100 * u64::from(n));
        assert_eq!(
            p.receive(&t, "x", r(2), Duration::ZERO, now),
            Received::Kept { unknown: 0 }
        );
        // Written 600 ms before it was read: it counts 400 ms more.
        p.receive(&t, "y", r(3), Duration::from_millis(600), now);
        assert_eq!(p.apply(&t, now), 2);
        assert_eq!((load.inflight(), load.pending_prefill()), (5, 500));
        assert_eq!(load.own_inflight(), 0);
        assert_eq!(p.apply(&t, now + Duration::from_millis(500)), 1);
        assert_eq!(load.inflight(), 2, "y's report went stale");
        // A newer report replaces the peer's last one.
        p.receive(
            &t,
            "x",
            r(1),
            Duration::ZERO,
            now + Duration::from_millis(900),
        );
        assert_eq!(p.apply(&t, now + Duration::from_millis(1500)), 1);
        assert_eq!(load.inflight(), 1);
        // Nothing more heard from x: gone within the bound.
        assert_eq!(p.apply(&t, now + Duration::from_millis(1900)), 0);
        assert_eq!((load.inflight(), load.pending_prefill()), (0, 0));
        // Read too late to count at all.
        assert_eq!(
            p.receive(&t, "z", r(4), Duration::from_millis(1000), now),
            Received::Stale
        );
    }

    #[test]
    fn unknown_names_are_counted_and_skipped_and_peers_are_bounded() {
        let t = topo();
        let mut p = PeerLoads::new(Duration::from_secs(1));
        let now = Instant::now();
        let mut rep = report("a", "10.9.9.9:1", 1, 1);
        rep.fleets.push(FleetLoad {
            fleet: "gone".into(),
            replicas: vec![("10.0.0.1:1".into(), LoadFigures::default())],
        });
        assert_eq!(
            p.receive(&t, "x", rep, Duration::ZERO, now),
            Received::Kept { unknown: 2 }
        );
        p.apply(&t, now);
        assert!(
            t.fleets
                .iter()
                .flat_map(|f| f.replicas.values())
                .all(|r| r.load.inflight() == 0)
        );
        for i in 1..MAX_PEERS {
            p.receive(
                &t,
                &format!("p{i}"),
                LoadReport::default(),
                Duration::ZERO,
                now,
            );
        }
        assert_eq!(
            p.receive(&t, "one-more", LoadReport::default(), Duration::ZERO, now),
            Received::Ignored
        );
        // Once the others are stale there is room again.
        let later = now + Duration::from_secs(2);
        assert_eq!(
            p.receive(&t, "one-more", LoadReport::default(), Duration::ZERO, later),
            Received::Kept { unknown: 0 }
        );
        assert_eq!(p.peers(), 1);
    }

    #[test]
    fn reports_go_when_changed_or_due_for_refresh_and_idle_ones_once() {
        let mut r = Reporter::new(Duration::from_millis(250));
        let now = Instant::now();
        let idle = LoadReport::default();
        assert!(r.due(&idle, now), "the first round always reports");
        r.sent(idle.clone(), now);
        assert!(
            !r.due(&idle, now + Duration::from_secs(5)),
            "idle stays quiet"
        );
        let busy = report("a", "10.0.0.1:1", 1, 10);
        assert!(r.due(&busy, now));
        r.sent(busy.clone(), now);
        assert!(!r.due(&busy, now + Duration::from_millis(100)));
        assert!(r.due(&busy, now + Duration::from_millis(250)), "refresh");
        assert!(r.due(&idle, now + Duration::from_millis(100)), "load ended");
    }

    #[test]
    fn figures_follow_the_address_to_its_current_slot_and_a_leaver_drops_them() {
        let t = topo();
        let mut p = PeerLoads::new(Duration::from_secs(1));
        let now = Instant::now();
        let mut rep = report("a", "10.0.0.1:1", 2, 20);
        rep.fleets[0].replicas.push((
            "10.0.0.2:1".into(),
            LoadFigures {
                inflight: 3,
                ..Default::default()
            },
        ));
        p.receive(&t, "x", rep, Duration::ZERO, now);
        p.apply(&t, now);
        let a = &t.fleets[0].replicas;
        assert_eq!(a[ReplicaId(0)].load.peers().inflight, 2);
        assert_eq!(a[ReplicaId(1)].load.peers().inflight, 3);

        // 10.0.0.1 leaves and 10.0.0.3 takes its slot: the peer still
        // names 10.0.0.1, which now counts nowhere; 10.0.0.2 keeps its own.
        let mut next = (*t).clone();
        let fleet = &mut next.fleets[0];
        let left = fleet.replicas.remove(ReplicaId(0)).unwrap();
        let joined = Replica::joining("a", "10.0.0.3:1".into(), "10.0.0.3:1".into(), 2);
        fleet.replicas.insert(ReplicaId(0), joined);
        fleet.by_addr.remove(&left.addr);
        fleet.by_addr.insert("10.0.0.3:1".into(), ReplicaId(0));
        assert_eq!(p.apply(&next, now), 1);
        let a = &next.fleets[0].replicas;
        assert!(a[ReplicaId(0)].load.peers().is_zero(), "the joiner");
        assert_eq!(a[ReplicaId(1)].load.peers().inflight, 3);
        // The old topology's stay with the leaver; nothing reads them.
        assert_eq!(left.load.peers().inflight, 2);
    }
}
