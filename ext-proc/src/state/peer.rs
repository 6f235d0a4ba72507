//! Prefix-index changes exchanged with other fleetroute instances. Each
//! instance predicts replica caches from its own decisions; several
//! instances behind one Envoy cluster each see only their share, so each
//! publishes what it routed (and the caches it saw lost) and applies what
//! the others publish. The writer hands its own changes to a bounded outbox
//! (`Writer::share_updates`) off the decision path, and applies the others'
//! as `Event::Peer`, by fleet name and replica address (ids differ between
//! instances whose topologies were built at different generations). A
//! peer's change is never published again, so nothing echoes.

/// One change of the prefix index, named for another instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerUpdate {
    pub fleet: String,
    pub replica: String,
    pub change: PeerChange,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerChange {
    /// A request with these prompt blocks was routed to the replica.
    Routed { blocks: Vec<u64>, block_tokens: u32 },
    /// The replica reported no cached tokens where a prefix was predicted:
    /// it lost its cache.
    Cleared,
}

/// Updates the outbox holds before the writer drops new ones (counted).
pub const OUTBOX: usize = 8192;
