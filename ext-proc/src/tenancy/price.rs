//! What a request's tokens cost on one fleet: the price the cost policy
//! sees (a provider price, or GPU-hour cost over measured throughput) for
//! every token, and an optional discounted price for cached prompt tokens.

use super::ledger::Usage;

/// USD per token on one fleet, fixed when a request is admitted so its
/// estimate and its charge use the same price.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Price {
    pub per_token: f64,
    /// Prompt tokens the engine served from its cache.
    pub cached_per_token: f64,
}

impl Price {
    /// From USD per million tokens; a fleet with no known price costs
    /// nothing (its requests never move a budget), a cached price left out
    /// is the full price.
    pub fn per_million(usd_per_mtok: Option<f64>, cached_usd_per_mtok: Option<f64>) -> Price {
        let per = |v: Option<f64>| {
            v.filter(|p| p.is_finite() && *p >= 0.0)
                .map_or(0.0, |p| p / 1e6)
        };
        let per_token = per(usd_per_mtok);
        Price {
            per_token,
            cached_per_token: cached_usd_per_mtok.map_or(per_token, |c| per(Some(c))),
        }
    }

    /// An estimate: `cached` of the `prompt` tokens predicted cached, then
    /// `max_tokens` of output.
    pub fn estimate(&self, prompt: u64, cached: u64, max_tokens: u64) -> f64 {
        let cached = cached.min(prompt);
        (prompt - cached + max_tokens) as f64 * self.per_token
            + cached as f64 * self.cached_per_token
    }

    /// What `usage` cost.
    pub fn cost(&self, u: &Usage) -> f64 {
        let cached = u.cached.min(u.prompt);
        (u.prompt - cached + u.completion) as f64 * self.per_token
            + cached as f64 * self.cached_per_token
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_tokens_are_priced_apart_when_a_price_is_set() {
        let p = Price::per_million(Some(2.0), Some(0.5));
        let u = Usage {
            prompt: 1_000_000,
            cached: 600_000,
            completion: 500_000,
        };
        // 0.4 M uncached + 0.5 M out at $2, 0.6 M cached at $0.5.
        assert!((p.cost(&u) - (1.8 + 0.3)).abs() < 1e-9);
        assert!((p.estimate(1_000_000, 600_000, 500_000) - 2.1).abs() < 1e-9);
        let flat = Price::per_million(Some(2.0), None);
        assert!((flat.cost(&u) - 3.0).abs() < 1e-9);
        assert_eq!(Price::per_million(None, Some(1.0)).per_token, 0.0);
        assert_eq!(Price::per_million(Some(f64::NAN), None), Price::default());
    }
}
