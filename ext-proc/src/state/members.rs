//! Fleet membership in the writer. A fleet's full member set, from its
//! source (`Event::Membership`) or from the config's `endpoints` on a reload,
//! becomes joins and leaves on the fleet's replica slots:
//!
//! - a member that stays keeps its slot (its `ReplicaId` and prefix-index
//!   bit), its prefix entries, health, warmup, outlier state, load counters
//!   and rendezvous seed: nothing about it is rebuilt;
//! - a joiner takes the lowest free slot with no prefix entries and health
//!   unknown: it takes traffic once probed healthy (and warmed up);
//! - a leaver is `leaving`: no new decisions, its prefix entries dropped at
//!   once, its requests in flight finish on it (their leases keep counting);
//!   it is removed once idle (seen idle on a tick after it started leaving,
//!   so a decision taken from the snapshot before still counts) or after
//!   `membership.removal_grace_ms`; a leaver that comes back before that
//!   is simply in rotation again;
//! - a joiner at a leaver's address (a new pod on an old IP) removes the
//!   leaver at once: the old pod is gone, and the two cannot share an address;
//! - beyond [`MAX_SLOTS`] members wait, counted and logged, for a free slot.
//!
//! A change costs the affected replicas' own blocks in the prefix index
//! (`IndexWriter::clear` of a leaver), never a rebuild of the fleet's index.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::TICK;
use super::model::{FleetModel, ReplicaModel};
use crate::config::{FleetConfig, RouterConfig};
use crate::membership::{Member, MemberId};
use crate::topology::{MAX_SLOTS, Replica, ReplicaId, Slots};

/// What one change did to a fleet, for its log line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Summary {
    pub joined: usize,
    /// Started leaving.
    pub left: usize,
    /// Were leaving, listed again.
    pub rejoined: usize,
    /// Out of the topology.
    pub removed: usize,
    /// Listed, but no slot free.
    pub waiting: usize,
}

impl Summary {
    pub fn changed(&self) -> bool {
        self.joined + self.left + self.rejoined + self.removed > 0
    }
}

/// A member's identity as the topology keeps it.
pub(super) fn identity(m: &Member) -> Arc<str> {
    match &m.identity {
        MemberId::Addr(a) => a.to_string().into(),
        MemberId::Target { name, uid } => format!("{name}/{uid}").into(),
    }
}

/// A static fleet's members, in the config's order (slot `i` = `endpoints[i]`
/// on a fresh start).
pub(super) fn static_members(f: &FleetConfig) -> Vec<Member> {
    f.endpoints
        .iter()
        .filter_map(|e| e.parse().ok())
        .map(Member::by_addr)
        .collect()
}

/// Whether a stage serving `fleet` has golden prompts: its joiners warm up first.
pub(super) fn warms_up(cfg: &RouterConfig, fleet: &str) -> bool {
    cfg.stages
        .iter()
        .any(|s| s.warmup.is_some() && s.fleet_names().any(|f| f == fleet))
}

/// One fleet's change, applied to its model and returned as its new slots.
pub(super) struct FleetChange<'a> {
    pub fleet: &'a str,
    /// The slots of the topology in effect.
    pub current: &'a Slots<Replica>,
    pub model: &'a mut FleetModel,
    /// The generation the new slots will be published in.
    pub generation: u64,
    pub warmup: bool,
    pub now: Instant,
}

impl FleetChange<'_> {
    /// `desired` is the fleet's full member set now.
    pub fn reconcile(self, desired: &[Member]) -> (Slots<Replica>, Summary) {
        let mut sum = Summary::default();
        let mut next = self.current.clone();
        let want: HashMap<(Arc<str>, String), usize> = desired
            .iter()
            .enumerate()
            .map(|(i, m)| ((identity(m), m.addr.to_string()), i))
            .collect();
        let mut listed = vec![false; desired.len()];
        for (r, rep) in self.current.iter() {
            let Some(m) = self.model.replicas.get_mut(r) else {
                continue;
            };
            match want.get(&(rep.identity.clone(), rep.addr.clone())) {
                Some(&i) => {
                    listed[i] = true;
                    if m.leaving.take().is_some() {
                        sum.rejoined += 1;
                    }
                }
                None if m.leaving.is_none() => {
                    m.leaving = Some(self.now);
                    // Its cache is no longer a reason to send anything there.
                    self.model.index.clear(r);
                    sum.left += 1;
                }
                None => {}
            }
        }
        let joiners = desired
            .iter()
            .zip(listed)
            .filter(|(_, listed)| !listed)
            .map(|(m, _)| m.clone());
        let mut admit = Admit {
            fleet: self.fleet,
            next: &mut next,
            model: self.model,
            generation: self.generation,
            warmup: self.warmup,
            sum: &mut sum,
        };
        let waiting: Vec<Member> = joiners.filter(|m| !admit.one(m)).collect();
        sum.waiting = waiting.len();
        self.model.waiting = waiting;
        (next, sum)
    }

    /// Removes the leavers that are done and lets waiting members into the
    /// freed slots; `None` when nothing changed.
    pub fn sweep(self, grace: Duration) -> Option<(Slots<Replica>, Summary)> {
        let done: Vec<ReplicaId> = self
            .model
            .replicas
            .iter()
            .filter_map(|(r, m)| {
                let since = m.leaving?;
                let gone = self.now.saturating_duration_since(since);
                let idle = self.current.get(r).is_none_or(|x| x.load.inflight() == 0);
                ((idle && gone >= TICK) || gone >= grace).then_some(r)
            })
            .collect();
        if done.is_empty() {
            return None;
        }
        let mut sum = Summary::default();
        let mut next = self.current.clone();
        for &r in &done {
            remove(&mut next, self.model, r);
            sum.removed += 1;
        }
        let waiting = std::mem::take(&mut self.model.waiting);
        let mut admit = Admit {
            fleet: self.fleet,
            next: &mut next,
            model: self.model,
            generation: self.generation,
            warmup: self.warmup,
            sum: &mut sum,
        };
        let still: Vec<Member> = waiting.into_iter().filter(|m| !admit.one(m)).collect();
        sum.waiting = still.len();
        self.model.waiting = still;
        Some((next, sum))
    }
}

/// Gives joiners a slot.
struct Admit<'a> {
    fleet: &'a str,
    next: &'a mut Slots<Replica>,
    model: &'a mut FleetModel,
    generation: u64,
    warmup: bool,
    sum: &'a mut Summary,
}

impl Admit<'_> {
    /// Whether `m` got a slot.
    fn one(&mut self, m: &Member) -> bool {
        let addr = m.addr.to_string();
        // Only a leaver can hold the address (a member that stays would have
        // matched): its pod is gone, its address is someone else's now.
        let holder = self
            .next
            .iter()
            .find(|(_, x)| x.addr == addr)
            .map(|(r, _)| r);
        if let Some(r) = holder {
            remove(self.next, self.model, r);
            self.sum.removed += 1;
        }
        let Some(r) = self.next.free() else {
            return false;
        };
        debug_assert!(r.index() < MAX_SLOTS);
        self.next.insert(
            r,
            Replica::joining(self.fleet, addr, identity(m), self.generation),
        );
        self.model
            .replicas
            .insert(r, ReplicaModel::joining(self.warmup));
        // A freed slot's entries went with its last member; make sure.
        self.model.index.clear(r);
        self.sum.joined += 1;
        true
    }
}

fn remove(next: &mut Slots<Replica>, model: &mut FleetModel, r: ReplicaId) {
    next.remove(r);
    model.replicas.remove(r);
    model.index.clear(r);
}

/// One line per change, with its counts (what an operator greps for).
pub(super) fn log(fleet: &str, sum: &Summary, members: usize, generation: u64) {
    if sum.changed() {
        tracing::info!(
            fleet,
            joined = sum.joined,
            left = sum.left,
            rejoined = sum.rejoined,
            removed = sum.removed,
            waiting = sum.waiting,
            members,
            generation,
            "fleet membership changed"
        );
    }
    if sum.waiting > 0 {
        tracing::warn!(
            fleet,
            waiting = sum.waiting,
            slots = MAX_SLOTS,
            "fleet lists more members than it has slots; the rest are ignored until a slot frees"
        );
    }
}
