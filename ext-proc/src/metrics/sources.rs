//! The membership sources' counters, read live at every scrape.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;

use super::labels::FleetLabel;
use crate::membership::{CounterSnapshot, SourceCounters};

/// `fleetroute_membership_{updates,failures,empty_answers,relists}_total{fleet}`:
/// each running source's [`SourceCounters`], read live at every scrape (the
/// sources count without knowing about Prometheus). One entry per fleet with
/// a `dns` or `kubernetes` source, kept across source restarts.
#[derive(Debug, Default)]
pub struct SourceMetrics {
    fleets: Mutex<BTreeMap<String, Arc<SourceCounters>>>,
}

impl SourceMetrics {
    /// The counters of `fleet`'s source, created on first use.
    pub fn counters(&self, fleet: &str) -> Arc<SourceCounters> {
        let mut map = self.fleets.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(fleet.to_string()).or_default().clone()
    }

    /// Lookups or watch calls of `fleet`'s source that failed so far (0 for
    /// a fleet with no source).
    pub fn failures(&self, fleet: &str) -> u64 {
        let map = self.fleets.lock().unwrap_or_else(|e| e.into_inner());
        map.get(fleet)
            .map_or(0, |c| c.failures.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Forgets the fleets no longer served by a source.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        let mut map = self.fleets.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|f, _| keep(f));
    }
}

impl Collector for SourceMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let rows: Vec<(String, CounterSnapshot)> = {
            let map = self.fleets.lock().unwrap_or_else(|e| e.into_inner());
            map.iter().map(|(f, c)| (f.clone(), c.snapshot())).collect()
        };
        type Read = fn(&CounterSnapshot) -> u64;
        let families: [(&str, &str, Read); 4] = [
            (
                "membership_updates",
                "Member sets a fleet's source published because membership changed",
                |c| c.updates,
            ),
            (
                "membership_failures",
                "Failed lookups or watch calls of a fleet's source (the last good set was kept)",
                |c| c.failures,
            ),
            (
                "membership_empty_answers",
                "Empty DNS answers (the fleet empties on the second in a row)",
                |c| c.empty_answers,
            ),
            (
                "membership_relists",
                "Full re-lists of a Kubernetes source (the first list, and after 410 Gone or a lost watch)",
                |c| c.relists,
            ),
        ];
        for (name, help, value) in families {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (fleet, c) in &rows {
                let label = FleetLabel {
                    fleet: fleet.clone(),
                };
                ConstCounter::new(value(c)).encode(family.encode_family(&label)?)?;
            }
        }
        Ok(())
    }
}
