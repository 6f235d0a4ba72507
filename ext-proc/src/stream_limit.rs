//! Bounds on the long-lived gRPC streams (EDS, access log): at most so many
//! at once in all, and at most a share of them from one peer address, so one
//! peer (a misconfigured Envoy, or anything that got past the token) cannot
//! take every place and leave a starting Envoy without its endpoints. A
//! stream whose peer sends nothing within `FIRST_MESSAGE` is ended: Envoy
//! sends its first message as soon as it opens one.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tonic::Status;

/// How long a new stream may stay silent before it is ended.
pub const FIRST_MESSAGE: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub struct StreamLimit {
    what: &'static str,
    total: usize,
    per_peer: usize,
    /// Streams open by peer address (`None`: a peer without one, e.g. a test
    /// transport); an entry exists only while it has one, so at most
    /// `total` entries.
    open: Mutex<HashMap<Option<IpAddr>, usize>>,
}

/// One open stream's place; given back when dropped.
#[derive(Debug)]
pub struct Place {
    limit: Arc<StreamLimit>,
    peer: Option<IpAddr>,
}

impl StreamLimit {
    pub fn new(what: &'static str, total: usize, per_peer: usize) -> Arc<Self> {
        Arc::new(StreamLimit {
            what,
            total,
            per_peer: per_peer.min(total),
            open: Mutex::new(HashMap::new()),
        })
    }

    /// A place for a stream from `peer`, or RESOURCE_EXHAUSTED (Envoy retries
    /// with backoff).
    pub fn take(self: &Arc<Self>, peer: Option<IpAddr>) -> Result<Place, Status> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let all: usize = open.values().sum();
        let mine = open.get(&peer).copied().unwrap_or(0);
        if all >= self.total {
            return Err(Status::resource_exhausted(format!(
                "fleetroute serves at most {} {} streams at once",
                self.total, self.what
            )));
        }
        if mine >= self.per_peer {
            return Err(Status::resource_exhausted(format!(
                "fleetroute serves at most {} {} streams to one peer address",
                self.per_peer, self.what
            )));
        }
        open.insert(peer, mine + 1);
        Ok(Place {
            limit: self.clone(),
            peer,
        })
    }

    /// Streams open now.
    pub fn open(&self) -> usize {
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .sum()
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut open = self.limit.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.peer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_peer_takes_at_most_its_share_and_places_come_back() {
        let limit = StreamLimit::new("EDS", 4, 2);
        let a: Option<IpAddr> = Some("10.0.0.1".parse().unwrap());
        let b: Option<IpAddr> = Some("10.0.0.2".parse().unwrap());
        let a1 = limit.take(a).unwrap();
        let _a2 = limit.take(a).unwrap();
        let e = limit.take(a).unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert!(e.message().contains("one peer address"), "{e}");
        // Another peer still gets in, up to the total.
        let _b1 = limit.take(b).unwrap();
        let _b2 = limit.take(b).unwrap();
        assert!(limit.take(None).unwrap_err().message().contains("at once"));
        drop(a1);
        assert_eq!(limit.open(), 3);
        let _a3 = limit.take(a).unwrap();
        assert_eq!(limit.open(), 4);
    }
}
