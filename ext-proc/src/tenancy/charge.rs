//! A reservation on its way to its charge. It rides with the decision's load
//! lease (by decision nonce) and is committed when Envoy's access log entry
//! for that nonce says what the request used; a lease that ends without an
//! entry expires it (the estimate is charged, and a late entry corrects it).

use super::ledger::{Reservation, Usage};
use super::price::Price;

pub struct Charge {
    pub reservation: Reservation,
    /// The chosen fleet's price when the request was admitted.
    pub price: Price,
    /// The filter's estimate of the prompt (4 bytes a token).
    pub prompt_estimate: u64,
    /// The `upstream` fallback's replica Envoy may retry on, and its
    /// fleet's price: what the request is charged when that replica answers.
    pub on_retry: Option<(Box<str>, Price)>,
    /// Only with an audit log: what its record needs besides the outcome.
    pub audit: Option<Box<AuditContext>>,
}

impl std::fmt::Debug for Charge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Charge")
            .field("reservation", &self.reservation)
            .field("price", &self.price)
            .finish_non_exhaustive()
    }
}

/// The decision's side of an audit record.
#[derive(Clone, Debug, Default)]
pub struct AuditContext {
    /// When the request was admitted, ms since the Unix epoch.
    pub admitted_ms: u64,
    pub request_id: Box<str>,
    pub model: Box<str>,
    /// The fleet's own name for the model, when it serves it under another.
    pub model_served: Option<Box<str>>,
    pub policy: &'static str,
    pub reason: &'static str,
}

/// What came back for a request, as far as charging goes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// The engine's own report (the `usage` object).
    pub usage: Option<Usage>,
    /// SSE data events the filter saw pass (one token each, as engines stream).
    pub streamed: u64,
    /// The request reached a replica (Envoy connected upstream).
    pub reached_replica: bool,
}

impl Charge {
    /// What the request is charged: the engine's report; without one, a
    /// request that reached a replica is charged the prompt estimate plus
    /// what streamed past the filter, and one that never reached a replica
    /// nothing (it cost no engine any work).
    pub fn usage(&self, o: &Outcome) -> Usage {
        match o.usage {
            Some(u) => u,
            None if o.reached_replica => Usage {
                prompt: self.prompt_estimate,
                cached: 0,
                completion: o.streamed,
            },
            None => Usage::default(),
        }
    }

    /// Commits the request's real usage; what was charged and its cost.
    pub fn commit(self, o: &Outcome) -> (Usage, f64) {
        let usage = self.usage(o);
        let cost = self.price.cost(&usage);
        self.reservation.commit(usage, cost);
        (usage, cost)
    }

    /// Ends the reservation as a lost end (see `Reservation::expire`).
    pub fn expire(&self) {
        self.reservation.expire();
    }
}
