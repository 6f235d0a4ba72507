//! Fleet membership sources: where a fleet's replicas come from when they are
//! not a static list (the config's `dns` and `kubernetes`, see
//! `config::Source`). Every source produces the same [`MembershipUpdate`]: the
//! full, normalised set of members of one fleet, published on a `watch`
//! channel only when the set changes.

pub mod dns;
pub mod kubernetes;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::watch;

/// At most this many members per fleet; a source that reports more is cut
/// (and says so), so a runaway DNS answer or Service cannot grow state without bound.
pub const MAX_MEMBERS: usize = 1024;

/// What makes a member the same member across updates. A DNS or static member
/// is its address; a Kubernetes member is its pod (target ref name + uid), so a
/// new pod that reuses an old IP is a new member with no history.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MemberId {
    Addr(SocketAddr),
    Target { name: Arc<str>, uid: Arc<str> },
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Member {
    pub addr: SocketAddr,
    pub identity: MemberId,
}

impl Member {
    /// A member known only by its address (static and DNS sources).
    pub fn by_addr(addr: SocketAddr) -> Self {
        Self {
            addr,
            identity: MemberId::Addr(addr),
        }
    }
}

/// The full membership of one fleet at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MembershipUpdate {
    pub fleet: String,
    /// Sorted by address, one member per address, at most [`MAX_MEMBERS`].
    pub members: Vec<Member>,
}

impl MembershipUpdate {
    /// Sorts, keeps one member per address (the smallest identity, so the
    /// choice is stable) and bounds the set.
    pub fn new(fleet: &str, mut members: Vec<Member>) -> Self {
        members.sort();
        members.dedup_by(|b, a| a.addr == b.addr);
        if members.len() > MAX_MEMBERS {
            tracing::warn!(
                fleet,
                reported = members.len(),
                kept = MAX_MEMBERS,
                "membership source reported more members than the limit; the rest are ignored"
            );
            members.truncate(MAX_MEMBERS);
        }
        Self {
            fleet: fleet.to_string(),
            members,
        }
    }
}

/// The receiving end of one fleet's membership: `None` until the source has
/// produced its first set, so a fleet is never emptied before anything is known.
pub type MembershipRx = watch::Receiver<Option<MembershipUpdate>>;

/// The sending end a source publishes through; it sends only on change.
#[derive(Debug)]
pub struct MembershipTx {
    fleet: String,
    tx: watch::Sender<Option<MembershipUpdate>>,
}

/// A channel for one fleet's membership.
pub fn channel(fleet: &str) -> (MembershipTx, MembershipRx) {
    let (tx, rx) = watch::channel(None);
    (
        MembershipTx {
            fleet: fleet.to_string(),
            tx,
        },
        rx,
    )
}

impl MembershipTx {
    pub fn fleet(&self) -> &str {
        &self.fleet
    }

    /// Publishes `members` as the fleet's full set; returns whether it changed.
    pub fn publish(&self, members: Vec<Member>) -> bool {
        let update = MembershipUpdate::new(&self.fleet, members);
        self.tx.send_if_modified(|current| {
            if current.as_ref() == Some(&update) {
                return false;
            }
            *current = Some(update);
            true
        })
    }

    /// Whether any set was published yet.
    pub fn has_published(&self) -> bool {
        self.tx.borrow().is_some()
    }

    /// Number of members last published (0 before the first set).
    pub fn current_len(&self) -> usize {
        self.tx.borrow().as_ref().map_or(0, |u| u.members.len())
    }

    /// True once nobody listens any more: the source task can stop.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Resolves once nobody listens any more.
    pub async fn closed(&self) {
        self.tx.closed().await
    }
}

/// Per-source counters, plain atomics so the metrics module can read them
/// without the source knowing about Prometheus.
#[derive(Debug, Default)]
pub struct SourceCounters {
    /// Sets published because the membership changed.
    pub updates: AtomicU64,
    /// Lookups or watch calls that failed; the last good set was kept.
    pub failures: AtomicU64,
    /// Empty answers received (DNS); the fleet empties on the second in a row.
    pub empty_answers: AtomicU64,
    /// Full re-lists (Kubernetes: initial list and every re-list after 410 Gone
    /// or a lost watch).
    pub relists: AtomicU64,
}

/// A copy of [`SourceCounters`] at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CounterSnapshot {
    pub updates: u64,
    pub failures: u64,
    pub empty_answers: u64,
    pub relists: u64,
}

impl SourceCounters {
    pub fn snapshot(&self) -> CounterSnapshot {
        CounterSnapshot {
            updates: self.updates.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            empty_answers: self.empty_answers.load(Ordering::Relaxed),
            relists: self.relists.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn update_sorts_dedups_and_bounds() {
        let a = Member::by_addr(addr("10.0.0.2:80"));
        let b = Member::by_addr(addr("10.0.0.1:80"));
        let u = MembershipUpdate::new("f", vec![a.clone(), b.clone(), a.clone()]);
        assert_eq!(u.members, vec![b, a]);

        let many: Vec<Member> = (0..(MAX_MEMBERS as u32 + 10))
            .map(|i| Member::by_addr(SocketAddr::from((std::net::Ipv4Addr::from(i), 80))))
            .collect();
        assert_eq!(MembershipUpdate::new("f", many).members.len(), MAX_MEMBERS);
    }

    #[test]
    fn one_member_per_address_keeps_the_smallest_identity() {
        let at = addr("10.0.0.1:80");
        let pod = |name: &str, uid: &str| Member {
            addr: at,
            identity: MemberId::Target {
                name: name.into(),
                uid: uid.into(),
            },
        };
        let u = MembershipUpdate::new("f", vec![pod("p-2", "u2"), pod("p-1", "u1")]);
        assert_eq!(u.members, vec![pod("p-1", "u1")]);
    }

    #[test]
    fn publish_sends_only_on_change() {
        let (tx, mut rx) = channel("f");
        assert!(rx.borrow().is_none());
        let m = vec![Member::by_addr(addr("10.0.0.1:80"))];
        assert!(tx.publish(m.clone()));
        assert!(rx.has_changed().unwrap());
        rx.borrow_and_update();
        assert!(!tx.publish(m));
        assert!(!rx.has_changed().unwrap());
        assert!(tx.publish(vec![]));
        assert_eq!(rx.borrow_and_update().as_ref().unwrap().members, vec![]);
    }
}
