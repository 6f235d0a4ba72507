//! What a request may use and what it used, and the limit a refusal names.

use std::time::Duration;

/// What one request may use, known at admission.
#[derive(Clone, Copy, Debug)]
pub struct Estimate {
    pub prompt_tokens: u64,
    pub max_tokens: u64,
    /// What the estimate costs on the chosen fleet, USD (reserved against
    /// the budget; the commit is priced by the caller).
    pub cost_usd: f64,
    /// Lease bound: the reservation ends by itself after this. `None` when
    /// the caller's own lease ends it (`Reservation::expire`).
    pub ttl: Option<Duration>,
}

impl Estimate {
    pub fn tokens(&self) -> u64 {
        self.prompt_tokens.saturating_add(self.max_tokens)
    }
    pub(super) fn micro_usd(&self) -> u64 {
        micro(self.cost_usd)
    }
}

/// What a request really used, reported when it ends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// All prompt tokens, cached ones included.
    pub prompt: u64,
    pub cached: u64,
    pub completion: u64,
}

impl Usage {
    /// Tokens charged against the limits: prompt plus completion.
    pub fn tokens(&self) -> u64 {
        self.prompt.saturating_add(self.completion)
    }
}

pub(crate) fn micro(usd: f64) -> u64 {
    if usd.is_finite() && usd > 0.0 {
        (usd * 1e6).round().min(1e15) as u64
    } else {
        0
    }
}

/// The limit a refusal names (also its name in the 429 body and metrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    MaxRequestsInFlight,
    MaxTokensInFlight,
    TokensPerMinute,
    Budget,
}

impl Limit {
    pub const ALL: [Limit; 4] = [
        Limit::MaxRequestsInFlight,
        Limit::MaxTokensInFlight,
        Limit::TokensPerMinute,
        Limit::Budget,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Limit::MaxRequestsInFlight => "max_requests_in_flight",
            Limit::MaxTokensInFlight => "max_tokens_in_flight",
            Limit::TokensPerMinute => "tokens_per_minute",
            Limit::Budget => "budget",
        }
    }

    pub(super) fn index(self) -> usize {
        self as usize
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Refusal {
    pub limit: Limit,
    pub retry_after: Duration,
    /// The shared per-minute allowance ran out and a refill from Redis may
    /// admit it (see `shared::Shared::admit`).
    pub refill: bool,
}
