//! Replica choice inside the chosen fleet.

mod prefix_load;

pub use prefix_load::choose;

use crate::topology::{NonEmpty, Pick, ReplicaId};

/// Fallback hosts Envoy may retry on, after the chosen one.
pub const FALLBACKS: usize = 2;

#[derive(Debug)]
pub struct ReplicaChoice {
    /// Replica indices, the chosen one first, then fallbacks for retries.
    pub order: NonEmpty<ReplicaId>,
    /// Prompt tokens the chosen replica is predicted to hold.
    pub cached_tokens: u64,
    /// Prefill tokens already waiting on the chosen replica.
    pub queued_tokens: u64,
    /// Why this replica rather than the key's rendezvous choice: `key` (it
    /// is that choice), `prefix` (it holds more of the prompt), `load_guard`
    /// (that choice was past the bounded-load guard), `share` (a new
    /// conversation, and that choice had more than its share of recent
    /// requests) or `load` (its queue put it outside the tie).
    pub pick: Pick,
    /// Prefill tokens' worth of adapter loading on the chosen replica.
    pub adapter_tokens: f64,
}
