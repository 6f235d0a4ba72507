//! What the engines' own metrics endpoints gave, per fleet: scrapes by
//! result, the signals a fleet's engine should export and did not, and the
//! prefix-cache hit ratio the engines report. Written once per scrape round,
//! read at every `/metrics` scrape.

use std::collections::BTreeMap;
use std::sync::Mutex;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use super::labels::label_values;
use crate::engine::Signals;

label_values! {
    /// What became of one scrape of one replica.
    ScrapeResult {
        Ok => "ok",
        Unreachable => "unreachable",
        HttpError => "http_error",
        Unparsable => "unparsable",
    }
}

/// One fleet's figures.
#[derive(Clone, Debug, Default)]
pub struct FleetEngine {
    pub engine: &'static str,
    /// Scrapes by [`ScrapeResult`], in its order.
    pub scrapes: [u64; 4],
    /// Signals the fleet's dialect names, and those the last round lacked.
    pub expected: Signals,
    pub missing: Signals,
    /// The engines' prefix-cache counters summed over the fleet's replicas.
    pub prefix_cache: Option<(u64, u64)>,
}

#[derive(Debug, Default)]
pub struct EngineMetrics {
    fleets: Mutex<BTreeMap<String, FleetEngine>>,
}

impl EngineMetrics {
    /// One scrape round of `fleet`: what it found replaces the last.
    pub fn record(&self, fleet: &str, round: FleetEngine) {
        let mut map = self.fleets.lock().unwrap_or_else(|e| e.into_inner());
        let entry = map.entry(fleet.to_string()).or_default();
        let mut scrapes = entry.scrapes;
        for (total, n) in scrapes.iter_mut().zip(round.scrapes) {
            *total += n;
        }
        *entry = FleetEngine { scrapes, ..round };
    }

    /// Forgets fleets no longer configured.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        let mut map = self.fleets.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|f, _| keep(f));
    }

    pub fn fleet(&self, fleet: &str) -> Option<FleetEngine> {
        let map = self.fleets.lock().unwrap_or_else(|e| e.into_inner());
        map.get(fleet).cloned()
    }
}

impl Collector for EngineMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use super::labels::Values;
        let rows: Vec<(String, FleetEngine)> = {
            let map = self.fleets.lock().unwrap_or_else(|e| e.into_inner());
            map.iter().map(|(f, e)| (f.clone(), e.clone())).collect()
        };
        let mut family = encoder.encode_descriptor(
            "engine_scrapes",
            "Scrapes of the replicas' own metrics endpoints, by result",
            None,
            MetricType::Counter,
        )?;
        for (fleet, e) in &rows {
            for (r, n) in ScrapeResult::ALL.iter().zip(e.scrapes) {
                let labels = [
                    ("fleet", fleet.as_str()),
                    ("engine", e.engine),
                    ("result", r.as_str()),
                ];
                ConstCounter::new(n).encode(family.encode_family(&labels)?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "engine_signal_missing",
            "1 when the last scrape of a fleet lacked a metric its engine should export (see the log line naming it)",
            None,
            MetricType::Gauge,
        )?;
        for (fleet, e) in &rows {
            for s in e.expected.iter() {
                let labels = [
                    ("fleet", fleet.as_str()),
                    ("engine", e.engine),
                    ("signal", s.as_str()),
                ];
                let v = i64::from(e.missing.contains(s));
                ConstGauge::new(v).encode(family.encode_family(&labels)?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "engine_prefix_cache_hit_ratio",
            "Prompt tokens the engines found in their prefix caches over those looked up, as they report it, since each started",
            None,
            MetricType::Gauge,
        )?;
        for (fleet, e) in &rows {
            if let Some((hits, queries)) = e.prefix_cache.filter(|&(_, q)| q > 0) {
                let labels = [("fleet", fleet.as_str())];
                let ratio = hits as f64 / queries as f64;
                ConstGauge::new(ratio).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}
