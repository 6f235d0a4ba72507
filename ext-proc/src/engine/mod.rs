//! What an engine's own `/metrics` says about a replica, in each engine's
//! words: the dialects (`dialects`) name the metrics, `report` reads a
//! scraped body through one into an [`EngineReport`].

mod dialects;
mod report;

pub use dialects::Dialect;
pub use report::{EngineReport, LoraState, MAX_BODY, ScrapeError, read};

/// What the router reads from an engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Signal {
    Running,
    Waiting,
    KvUsage,
    PrefixCacheHits,
    PrefixCacheQueries,
    Lora,
}

impl Signal {
    pub const ALL: [Signal; 6] = [
        Signal::Running,
        Signal::Waiting,
        Signal::KvUsage,
        Signal::PrefixCacheHits,
        Signal::PrefixCacheQueries,
        Signal::Lora,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Signal::Running => "running",
            Signal::Waiting => "waiting",
            Signal::KvUsage => "kv_usage",
            Signal::PrefixCacheHits => "prefix_cache_hits",
            Signal::PrefixCacheQueries => "prefix_cache_queries",
            Signal::Lora => "lora",
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// A set of signals, for the ones a scrape did not find.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Signals(u8);

impl Signals {
    pub fn insert(&mut self, s: Signal) {
        self.0 |= s.bit();
    }

    pub fn contains(self, s: Signal) -> bool {
        self.0 & s.bit() != 0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn iter(self) -> impl Iterator<Item = Signal> {
        Signal::ALL.into_iter().filter(move |s| self.contains(*s))
    }
}
