//! One EDS stream's side of the state-of-the-world protocol, without any I/O:
//! what Envoy subscribed to, what this stream last sent of each cluster, and
//! the nonce of its last response.
//!
//! - A request whose `response_nonce` is not the last one sent answers an
//!   older response: it is ignored (Envoy sends its full subscription again
//!   with the ACK of the latest response), except that a NACK is still
//!   reported.
//! - A NACK (`error_detail` set) leaves the stream as it was: Envoy keeps the
//!   endpoints it had, and the refused content is not sent again until it
//!   changes.
//! - Only clusters whose content differs from what this stream last sent go
//!   out; a new stream has sent nothing, so it gets everything subscribed in
//!   its first response. A cluster fleetroute does not know is answered with
//!   an empty assignment (see `assignment::empty`); one it holds back (a
//!   dynamic fleet whose source has not answered yet) is not answered at
//!   all, so Envoy keeps the endpoints it has.

use std::collections::{BTreeSet, HashMap};

use envoy_types::pb::envoy::config::core::v3::ControlPlane;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};

use super::assignment;
use super::resources::{Resource, Resources, TYPE_URL};

/// At most this many cluster names per stream (Envoy subscribes to the
/// clusters of its bootstrap: a few per stage and fleet).
pub const MAX_NAMES: usize = 4096;
/// Longer names are no cluster fleetroute renders; refused, not stored.
pub const MAX_NAME_BYTES: usize = 512;
/// How much of a NACK's message is logged.
const ERROR_LOG_BYTES: usize = 1024;

/// What a request was.
#[derive(Debug, PartialEq, Eq)]
pub enum Request {
    /// The first request, or one with new subscriptions before any response.
    Subscribe,
    /// Envoy applied the last response.
    Ack,
    /// Envoy refused the last response; the message is for the log.
    Nack(String),
    /// It answers an older response: nothing done (a NACK in it is reported
    /// as `Nack` all the same).
    Stale,
}

/// Why a request ends the stream.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("this stream serves {TYPE_URL}, not '{0}'")]
    WrongType(String),
    #[error("{0} cluster names in one request; at most {MAX_NAMES}")]
    TooManyNames(usize),
    #[error("a cluster name of {0} bytes; at most {MAX_NAME_BYTES}")]
    NameTooLong(usize),
}

#[derive(Debug, Default)]
pub struct Stream {
    names: BTreeSet<String>,
    /// Subscribed to everything: the legacy meaning of an empty first
    /// request, or an explicit "*".
    wildcard: bool,
    /// Whether any request set names (after which empty means none).
    named: bool,
    /// Per cluster, the hash of what this stream last sent.
    sent: HashMap<String, u64>,
    nonce: u64,
}

impl Stream {
    /// Applies one request from Envoy.
    pub fn on_request(&mut self, req: &DiscoveryRequest) -> Result<Request, Refused> {
        if !req.type_url.is_empty() && req.type_url != TYPE_URL {
            return Err(Refused::WrongType(truncate(&req.type_url, 200)));
        }
        if req.resource_names.len() > MAX_NAMES {
            return Err(Refused::TooManyNames(req.resource_names.len()));
        }
        if let Some(n) = req.resource_names.iter().find(|n| n.len() > MAX_NAME_BYTES) {
            return Err(Refused::NameTooLong(n.len()));
        }
        let nack = req.error_detail.as_ref().map(|e| {
            let m = truncate(&e.message, ERROR_LOG_BYTES);
            if m.is_empty() {
                format!("code {}", e.code)
            } else {
                m
            }
        });
        if req.response_nonce != self.nonce_text() {
            return Ok(nack.map_or(Request::Stale, Request::Nack));
        }
        let first_response = self.nonce == 0;
        self.subscribe(&req.resource_names);
        Ok(match nack {
            Some(m) => Request::Nack(m),
            None if first_response => Request::Subscribe,
            None => Request::Ack,
        })
    }

    fn subscribe(&mut self, names: &[String]) {
        self.wildcard = names.iter().any(|n| n == "*") || (names.is_empty() && !self.named);
        self.named |= !names.is_empty();
        self.names = names.iter().filter(|n| *n != "*").cloned().collect();
        // Forget what was sent of a cluster no longer subscribed: if it is
        // subscribed again, it must be sent again.
        if !self.wildcard {
            let names = &self.names;
            self.sent.retain(|n, _| names.contains(n));
        }
    }

    /// The response that brings Envoy up to `res`, if anything it subscribed
    /// to differs from what this stream last sent.
    pub fn response(&mut self, res: &Resources) -> Option<DiscoveryResponse> {
        let mut out = Vec::new();
        let mut note = |name: &str, r: &Resource, out: &mut Vec<_>| {
            if self.sent.get(name) != Some(&r.hash) {
                self.sent.insert(name.to_string(), r.hash);
                out.push(r.any.clone());
            }
        };
        if self.wildcard {
            for name in res.names() {
                if let Some(r) = res.get(name) {
                    note(name, r, &mut out);
                }
            }
        }
        for name in &self.names {
            match res.get(name) {
                Some(r) => note(name, r, &mut out),
                // Not known yet: say nothing, so Envoy keeps what it has.
                None if res.is_held(name) => {}
                None => note(name, &Resource::of(&assignment::empty(name)), &mut out),
            }
        }
        if out.is_empty() {
            return None;
        }
        self.nonce += 1;
        Some(DiscoveryResponse {
            version_info: res.version.clone(),
            resources: out,
            type_url: TYPE_URL.to_string(),
            nonce: self.nonce_text(),
            control_plane: Some(ControlPlane {
                identifier: "fleetroute".to_string(),
            }),
            ..Default::default()
        })
    }

    /// Clusters subscribed (explicitly).
    pub fn subscribed(&self) -> usize {
        self.names.len()
    }

    fn nonce_text(&self) -> String {
        if self.nonce == 0 {
            String::new()
        } else {
            self.nonce.to_string()
        }
    }
}

fn truncate(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use envoy_types::pb::envoy::config::endpoint::v3::{
        ClusterLoadAssignment, LocalityLbEndpoints,
    };
    use envoy_types::pb::google::rpc::Status;
    use prost::Message;

    use super::*;

    fn set(clusters: &[(&str, usize)]) -> Resources {
        let mut m = BTreeMap::new();
        for (name, n) in clusters {
            let mut cla = assignment::empty(name);
            cla.endpoints = vec![LocalityLbEndpoints::default(); *n];
            m.insert(name.to_string(), cla);
        }
        Resources::of(m)
    }

    fn req(names: &[&str], nonce: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            resource_names: names.iter().map(|s| s.to_string()).collect(),
            response_nonce: nonce.into(),
            type_url: TYPE_URL.into(),
            ..Default::default()
        }
    }

    fn names(r: &DiscoveryResponse) -> Vec<(String, usize)> {
        r.resources
            .iter()
            .map(|a| {
                let c = ClusterLoadAssignment::decode(a.value.as_slice()).unwrap();
                (c.cluster_name, c.endpoints.len())
            })
            .collect()
    }

    #[test]
    fn a_new_stream_gets_everything_then_only_changes() {
        let mut s = Stream::default();
        let v1 = set(&[("a", 1), ("b", 2), ("c", 1)]);
        assert_eq!(s.on_request(&req(&["a", "b"], "")), Ok(Request::Subscribe));
        let r1 = s.response(&v1).unwrap();
        assert_eq!(names(&r1), [("a".into(), 1), ("b".into(), 2)]);
        assert_eq!(r1.version_info, v1.version);
        assert!(s.response(&v1).is_none(), "nothing changed: nothing sent");
        assert_eq!(s.on_request(&req(&["a", "b"], &r1.nonce)), Ok(Request::Ack));
        assert!(s.response(&v1).is_none());
        // b grows; a and c do not: only b goes out.
        let v2 = set(&[("a", 1), ("b", 3), ("c", 1)]);
        let r2 = s.response(&v2).unwrap();
        assert_eq!(names(&r2), [("b".into(), 3)]);
        assert_ne!(r2.nonce, r1.nonce);
        assert_eq!(r2.version_info, v2.version);
    }

    #[test]
    fn stale_requests_change_nothing_and_the_ack_of_the_latest_does() {
        let mut s = Stream::default();
        let v1 = set(&[("a", 1), ("b", 1)]);
        s.on_request(&req(&["a"], "")).unwrap();
        let r1 = s.response(&v1).unwrap();
        let r2 = s.response(&set(&[("a", 2), ("b", 1)])).unwrap();
        // Envoy adds b while it has only seen r1: an old nonce, ignored.
        assert_eq!(
            s.on_request(&req(&["a", "b"], &r1.nonce)),
            Ok(Request::Stale)
        );
        assert_eq!(s.subscribed(), 1);
        // With r2's ACK it names both again: b goes out now.
        assert_eq!(s.on_request(&req(&["a", "b"], &r2.nonce)), Ok(Request::Ack));
        let r3 = s.response(&set(&[("a", 2), ("b", 1)])).unwrap();
        assert_eq!(names(&r3), [("b".into(), 1)]);
    }

    #[test]
    fn a_nack_is_reported_and_not_answered_with_the_same_again() {
        let mut s = Stream::default();
        let v = set(&[("a", 1)]);
        s.on_request(&req(&["a"], "")).unwrap();
        let r = s.response(&v).unwrap();
        let mut nack = req(&["a"], &r.nonce);
        nack.error_detail = Some(Status {
            code: 3,
            message: "x".repeat(5000),
            ..Default::default()
        });
        match s.on_request(&nack) {
            Ok(Request::Nack(m)) => assert_eq!(m.len(), ERROR_LOG_BYTES),
            other => panic!("{other:?}"),
        }
        assert!(s.response(&v).is_none(), "the refused content was resent");
        // New content goes out again.
        assert!(s.response(&set(&[("a", 2)])).is_some());
        // A stale NACK is still a NACK.
        nack.response_nonce = "1".into();
        assert!(matches!(s.on_request(&nack), Ok(Request::Nack(_))));
    }

    #[test]
    fn unknown_clusters_get_an_empty_assignment_and_follow_when_they_appear() {
        let mut s = Stream::default();
        s.on_request(&req(&["a", "gone"], "")).unwrap();
        let r = s.response(&set(&[("a", 1)])).unwrap();
        assert_eq!(names(&r), [("a".into(), 1), ("gone".into(), 0)]);
        let r = s.response(&set(&[("a", 1), ("gone", 2)])).unwrap();
        assert_eq!(names(&r), [("gone".into(), 2)]);
    }

    #[test]
    fn resubscribing_resends_and_unsubscribed_clusters_stay_quiet() {
        let mut s = Stream::default();
        let v = set(&[("a", 1), ("b", 1)]);
        s.on_request(&req(&["a", "b"], "")).unwrap();
        let r = s.response(&v).unwrap();
        s.on_request(&req(&["a"], &r.nonce)).unwrap();
        assert!(s.response(&set(&[("a", 1), ("b", 5)])).is_none());
        s.on_request(&req(&["a", "b"], &r.nonce)).unwrap();
        let r = s.response(&set(&[("a", 1), ("b", 5)])).unwrap();
        assert_eq!(names(&r), [("b".into(), 5)]);
        // An empty list after names: subscribed to nothing (not a wildcard).
        s.on_request(&req(&[], &r.nonce)).unwrap();
        assert!(s.response(&set(&[("a", 9), ("b", 9)])).is_none());
    }

    #[test]
    fn an_empty_first_request_or_a_star_means_every_cluster() {
        let mut s = Stream::default();
        s.on_request(&req(&[], "")).unwrap();
        let r = s.response(&set(&[("a", 1), ("b", 1)])).unwrap();
        assert_eq!(names(&r).len(), 2);
        let mut s = Stream::default();
        s.on_request(&req(&["*", "x"], "")).unwrap();
        let r = s.response(&set(&[("a", 1)])).unwrap();
        assert_eq!(names(&r), [("a".into(), 1), ("x".into(), 0)]);
    }

    #[test]
    fn hostile_requests_are_refused_before_anything_is_kept() {
        let mut s = Stream::default();
        let mut r = req(&["a"], "");
        r.type_url = "type.googleapis.com/envoy.config.cluster.v3.Cluster".into();
        assert!(matches!(s.on_request(&r), Err(Refused::WrongType(_))));
        let many: Vec<String> = (0..=MAX_NAMES).map(|i| i.to_string()).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert_eq!(
            s.on_request(&req(&many, "")),
            Err(Refused::TooManyNames(MAX_NAMES + 1))
        );
        let long = "x".repeat(MAX_NAME_BYTES + 1);
        assert!(matches!(
            s.on_request(&req(&[&long], "")),
            Err(Refused::NameTooLong(_))
        ));
        assert_eq!(s.subscribed(), 0);
        // No type at all is Envoy's singleton EDS: accepted.
        let mut r = req(&["a"], "");
        r.type_url.clear();
        assert_eq!(s.on_request(&r), Ok(Request::Subscribe));
    }

    #[test]
    fn a_dynamic_fleet_is_held_back_until_its_source_answers_then_served_even_empty() {
        use std::time::Instant;

        use crate::config::RouterConfig;
        use crate::state::{Event, Writer};

        let yaml = "fleets:\n  - { name: a, region: us, endpoints: [\"10.0.0.1:80\"] }\n  \
                    - { name: pool, region: us, dns: { name: pool.test, port: 80 } }\n\
                    stages:\n  - { name: only, models: [m], fleets: [a] }\n  \
                    - { name: both, models: [n], fleets: [a, pool] }\n";
        let cfg = RouterConfig::parse_valid(yaml).unwrap();
        let source = cfg.fleets[1].source();
        let (shared, mut w) = Writer::new(&cfg);
        let subscribed = ["a", "pool", "fallback/only", "fallback/both"];
        let mut s = Stream::default();
        assert_eq!(s.on_request(&req(&subscribed, "")), Ok(Request::Subscribe));

        // Before any answer: the fleet and the fail-open cluster of the stage
        // serving it are not sent at all (an empty one would empty Envoy's).
        let before = Resources::build(&shared.snapshot());
        assert!(before.is_held("pool") && before.is_held("fallback/both"));
        assert!(!before.is_held("a") && !before.is_held("fallback/only"));
        let r1 = s.response(&before).unwrap();
        assert_eq!(names(&r1), [("a".into(), 1), ("fallback/only".into(), 1)]);
        assert_eq!(s.on_request(&req(&subscribed, &r1.nonce)), Ok(Request::Ack));

        // Its first answer, even an empty one (confirmed by the source), makes
        // it known: served as it is from then on.
        let view = shared.watch_replicas();
        w.apply(
            Event::Membership {
                fleet: "pool".into(),
                source,
                members: vec![],
            },
            Instant::now(),
        );
        w.drain(Instant::now());
        assert!(view.has_changed().unwrap(), "EDS was not woken");
        let after = Resources::build(&shared.snapshot());
        assert!(!after.is_held("pool") && !after.is_held("fallback/both"));
        assert_ne!(before.version, after.version);
        let r2 = s.response(&after).unwrap();
        assert_eq!(
            names(&r2),
            [("fallback/both".into(), 1), ("pool".into(), 1)]
        );
        let pool = ClusterLoadAssignment::decode(r2.resources[1].value.as_slice()).unwrap();
        assert!(
            pool.endpoints.iter().all(|g| g.lb_endpoints.is_empty()),
            "{pool:?}"
        );
    }
}
