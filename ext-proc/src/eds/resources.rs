//! The set of assignments every EDS stream serves from: each cluster's
//! assignment encoded once, with a version that is a hash of its content, so
//! equal membership has equal versions across restarts and across router
//! instances. One task rebuilds the set when the writer's replica view moves
//! and publishes it only when some cluster's content actually changed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::google::protobuf::Any;
use prost::Message;
use tokio::sync::watch;
use xxhash_rust::xxh3::{Xxh3, xxh3_64};

use super::assignment;
use crate::state::{Shared, Snapshot};

pub const TYPE_URL: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

/// One cluster's assignment, encoded.
#[derive(Clone, Debug, PartialEq)]
pub struct Resource {
    /// Hash of the encoding: what a stream compares to know it must resend.
    pub hash: u64,
    pub any: Any,
}

impl Resource {
    pub fn of(cla: &ClusterLoadAssignment) -> Resource {
        let value = cla.encode_to_vec();
        Resource {
            hash: xxh3_64(&value),
            any: Any {
                type_url: TYPE_URL.to_string(),
                value,
            },
        }
    }
}

#[derive(Debug)]
pub struct Resources {
    /// Of the whole set (every cluster's name and hash), as the responses'
    /// `version_info`.
    pub version: String,
    clusters: BTreeMap<String, Resource>,
    /// Names not sent at all (`assignment::held_back`): not even as empty.
    held: BTreeSet<String>,
}

impl Resources {
    pub fn build(snap: &Snapshot) -> Resources {
        Self::of(assignment::all(snap)).holding(assignment::held_back(snap))
    }

    /// Holds `names` back: a stream sends nothing for them.
    pub fn holding(mut self, names: BTreeSet<String>) -> Resources {
        let mut h = Xxh3::new();
        h.update(self.version.as_bytes());
        for name in &names {
            h.update(name.as_bytes());
            h.update(&[0]);
        }
        if !names.is_empty() {
            self.version = format!("{:016x}", h.digest());
        }
        self.held = names;
        self
    }

    pub fn is_held(&self, name: &str) -> bool {
        self.held.contains(name)
    }

    pub fn of(assignments: BTreeMap<String, ClusterLoadAssignment>) -> Resources {
        let clusters: BTreeMap<String, Resource> = assignments
            .into_iter()
            .map(|(name, cla)| {
                let r = Resource::of(&cla);
                (name, r)
            })
            .collect();
        let mut h = Xxh3::new();
        for (name, r) in &clusters {
            h.update(name.as_bytes());
            h.update(&[0]);
            h.update(&r.hash.to_le_bytes());
        }
        Resources {
            version: format!("{:016x}", h.digest()),
            clusters,
            held: BTreeSet::new(),
        }
    }

    pub fn get(&self, name: &str) -> Option<&Resource> {
        self.clusters.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.clusters.keys().map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.clusters.len()
    }

    pub fn is_empty(&self) -> bool {
        self.clusters.is_empty()
    }
}

/// Starts the task that keeps the served set current; streams watch the
/// receiver. Runs as long as the router does.
pub fn publish(shared: Arc<Shared>) -> watch::Receiver<Arc<Resources>> {
    // Subscribe before the first build, so a change in between is not missed.
    let mut view = shared.watch_replicas();
    let first = Resources::build(&shared.snapshot());
    tracing::info!(
        clusters = first.len(),
        version = %first.version,
        "serving endpoints (EDS)"
    );
    let (tx, rx) = watch::channel(Arc::new(first));
    tokio::spawn(async move {
        while view.changed().await.is_ok() {
            let next = Resources::build(&shared.snapshot());
            if next.version == tx.borrow().version {
                continue;
            }
            tracing::info!(
                clusters = next.len(),
                version = %next.version,
                "endpoints changed"
            );
            shared.metrics.control.eds_updates.inc();
            tx.send_replace(Arc::new(next));
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[(&str, usize)]) -> Resources {
        let mut m = BTreeMap::new();
        for (name, n) in names {
            let mut cla = assignment::empty(name);
            cla.endpoints = vec![Default::default(); *n];
            m.insert(name.to_string(), cla);
        }
        Resources::of(m)
    }

    #[test]
    fn the_version_follows_content_only() {
        let a = set(&[("x", 1), ("y", 2)]);
        assert_eq!(a.version, set(&[("x", 1), ("y", 2)]).version);
        assert_ne!(a.version, set(&[("x", 1), ("y", 3)]).version);
        assert_ne!(a.version, set(&[("x", 1)]).version);
        // A name is not confused with its neighbour's bytes.
        assert_ne!(
            set(&[("ab", 1)]).version,
            set(&[("a", 1), ("b", 1)]).version
        );
        let b = set(&[("x", 1), ("y", 3)]);
        assert_eq!(
            a.get("x"),
            b.get("x"),
            "an unchanged cluster keeps its hash"
        );
        assert_ne!(a.get("y").unwrap().hash, b.get("y").unwrap().hash);
        assert_eq!(a.get("x").unwrap().any.type_url, TYPE_URL);
    }
}
