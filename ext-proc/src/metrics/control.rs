//! The control plane's own counters: reloads, admin changes, the writer's
//! queue, refused gRPC peers, readiness, and the EDS streams.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use super::labels::{Results, label_values};
use super::registrar::Registrar;

label_values! {
    Reload {
        Applied => "applied",
        Refused => "refused",
    }
}

label_values! {
    /// Why a gRPC call was refused before any service saw it.
    Unauthenticated {
        Missing => "missing",
        Wrong => "wrong",
    }
}

label_values! {
    EdsRequest {
        Subscribe => "subscribe",
        Ack => "ack",
        Nack => "nack",
        Stale => "stale",
        Unsupported => "unsupported",
        Invalid => "invalid",
        Silent => "silent",
        Refused => "refused",
    }
}

pub struct Control {
    pub reloads: Results<Reload>,
    pub admin_changes: Counter,
    pub events_dropped: Counter,
    pub grpc_refused: Results<Unauthenticated>,
    /// Routing calls let through undecided before the instance was ready.
    pub before_ready: Counter,
    pub eds_streams: Gauge,
    pub eds_requests: Results<EdsRequest>,
    pub eds_updates: Counter,
}

impl Control {
    pub(super) fn new(r: &mut Registrar) -> Self {
        let m = Control {
            reloads: Results::default(),
            admin_changes: Counter::default(),
            events_dropped: Counter::default(),
            grpc_refused: Results::default(),
            before_ready: Counter::default(),
            eds_streams: Gauge::default(),
            eds_requests: Results::default(),
            eds_updates: Counter::default(),
        };
        r.results("config_reloads", "Config reloads by result", &m.reloads);
        r.add(
            "admin_changes",
            "Changes applied through the admin API",
            m.admin_changes.clone(),
        );
        r.add(
            "events_dropped",
            "State events dropped because the writer was behind",
            m.events_dropped.clone(),
        );
        r.results(
            "grpc_refused",
            "gRPC calls refused before any service saw them (grpc.token_file), by result: missing (no authorization), wrong (another token)",
            &m.grpc_refused,
        );
        r.add(
            "before_ready",
            "Routing calls let through undecided (to Envoy's fail-open routes) because this instance was not ready yet: Envoy called it before its health checks saw it ready",
            m.before_ready.clone(),
        );
        r.add(
            "eds_streams",
            "EDS streams open (one per Envoy and config source)",
            m.eds_streams.clone(),
        );
        r.results(
            "eds_requests",
            "EDS requests from Envoy, by result: subscribe (a stream's first), ack, nack (Envoy refused a response and kept its endpoints), stale (answers an older response), unsupported (another type on ADS, ignored), invalid (ended the stream), silent (no request within 10 s: ended), refused (too many streams, or too many from one peer address)",
            &m.eds_requests,
        );
        r.add(
            "eds_updates",
            "Changes of the served endpoint set (membership, locality weights or health status of some cluster)",
            m.eds_updates.clone(),
        );
        m
    }
}
