//! The link between instances: shared prefix-index changes, forwarded
//! access log entries and load reports.

use prometheus_client::metrics::gauge::Gauge;

use super::labels::{Results, label_values};
use super::registrar::Registrar;

label_values! {
    PrefixUpdate {
        Queued => "queued",
        Dropped => "dropped",
        Sent => "sent",
        Applied => "applied",
        Unknown => "unknown",
        Bad => "bad",
    }
}

label_values! {
    Direction {
        Sent => "sent",
        Received => "received",
    }
}

label_values! {
    Forwarded {
        Sent => "sent",
        Dropped => "dropped",
        Received => "received",
        Bad => "bad",
    }
}

label_values! {
    LoadExchange {
        Sent => "sent",
        Received => "received",
        Stale => "stale",
        Ignored => "ignored",
        Unknown => "unknown",
        Truncated => "truncated",
        Bad => "bad",
    }
}

pub struct Peers {
    /// Prefix-index changes shared with other instances.
    pub updates: Results<PrefixUpdate>,
    /// Bytes written to and read from the peer link.
    pub bytes: Results<Direction>,
    /// 1 while the peer link (Redis) answers, 0 while this instance is alone.
    pub up: Gauge,
    /// Access log entries of other instances' decisions, by what became of them.
    pub forwards: Results<Forwarded>,
    pub load_reports: Results<LoadExchange>,
    /// Other instances whose load reports count here now.
    pub load_peers: Gauge,
}

impl Peers {
    pub(super) fn new(r: &mut Registrar) -> Self {
        let m = Peers {
            updates: Results::default(),
            bytes: Results::default(),
            up: Gauge::default(),
            forwards: Results::default(),
            load_reports: Results::default(),
            load_peers: Gauge::default(),
        };
        r.results(
            "peer_prefix_updates",
            "Prefix-index changes shared between instances, by result: queued (for other instances), dropped (outbox or link buffer full), sent, applied (another instance's, applied here), unknown (names no fleet or replica here), bad (an undecodable batch)",
            &m.updates,
        );
        r.results(
            "peer_bytes",
            "Bytes this instance wrote to (sent) and read from (received) the peer link",
            &m.bytes,
        );
        r.add(
            "peers_up",
            "1 while the peer link (Redis) answers; 0 while this instance routes alone",
            m.up.clone(),
        );
        r.results(
            "access_log_forwards",
            "Access log entries of decisions another instance made, by result: sent (to their owner), dropped (link buffer full or down too long), received (from another instance, for this one's decisions), bad (undecodable)",
            &m.forwards,
        );
        r.results(
            "peer_load_reports",
            "Per-replica load reports shared between instances, by result: sent (this instance's), received (another's, counted here), stale (written longer than peers.load_stale_ms before it was read), ignored (from more peers than are kept), unknown (names a fleet or replica not here), truncated (this instance's, cut to max_batch_bytes), bad (undecodable)",
            &m.load_reports,
        );
        r.add(
            "peer_load_peers",
            "Other instances whose load reports count in this instance's decisions now (0: it routes on its own load)",
            m.load_peers.clone(),
        );
        m
    }
}
