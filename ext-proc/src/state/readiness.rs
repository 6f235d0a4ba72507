//! Readiness: whether this instance may take routing calls. Before, a call
//! fails open (`Shared::deciding`), `/ready` answers 503 and the gRPC health
//! service NOT_SERVING, so Envoy's checks keep calls away from it.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::health::Health;
use super::{Shared, Snapshot};

/// How long a DNS or Kubernetes fleet whose source keeps failing holds the
/// router unready after it starts. Unready, Envoy fails open with the
/// members it kept; after this the router serves without that fleet's
/// members (its stages fail over or answer 503) rather than never.
pub const SOURCE_GRACE: Duration = Duration::from_secs(10);

/// Why the router is not ready yet at `now` (`/ready`, and gRPC health for
/// Envoy's checks of the ext_proc cluster): a DNS or Kubernetes fleet whose
/// source has not answered (before that it has no members, so "every
/// replica probed" would hold with nothing to route to; a source that
/// failed is waited for until `SOURCE_GRACE`), or replicas not probed.
pub fn not_ready(shared: &Shared, now: Instant) -> Option<String> {
    if shared.shutdown.draining() {
        return Some("stopping: calls go to another instance".into());
    }
    let snap = shared.snapshot();
    let waited = now.saturating_duration_since(shared.started);
    let unknown: Vec<&str> = snap
        .topo
        .fleets
        .iter()
        .filter(|f| !f.members_known)
        .filter(|f| waited < SOURCE_GRACE || shared.metrics.sources.failures(&f.name) == 0)
        .map(|f| f.name.as_str())
        .collect();
    if !unknown.is_empty() {
        return Some(format!("membership not known yet for fleets {unknown:?}"));
    }
    match unprobed(&snap) {
        0 => None,
        n => Some(format!("{n} replicas not probed yet")),
    }
}

/// Replicas not probed yet.
fn unprobed(snap: &Snapshot) -> usize {
    snap.replicas
        .iter()
        .flat_map(|f| f.values())
        .filter(|r| r.health == Health::Unknown && !r.leaving)
        .count()
}

/// Whether routing calls are decided now; the first call after the
/// instance became ready sets it for good (what it checks walks every
/// replica, so only calls before that pay it).
pub fn deciding(shared: &Shared) -> bool {
    if shared.deciding.load(Ordering::Relaxed) {
        return true;
    }
    let ready = not_ready(shared, crate::clock::now()).is_none();
    if ready {
        shared.deciding.store(true, Ordering::Relaxed);
    }
    ready
}
