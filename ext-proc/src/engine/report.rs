//! Reads one scraped `/metrics` body through a fleet's dialect. The text
//! format is parsed by `openmetrics-parser`; a body it refuses is an error,
//! a metric it does not hold is a missing signal, never a silent zero.

use std::collections::HashMap;

use openmetrics_parser::prometheus::parse_prometheus;
use openmetrics_parser::{MetricFamily, PrometheusType, PrometheusValue, Sample};

use super::{Dialect, Signal, Signals};
use crate::config::MetricSelector;

type Family = MetricFamily<PrometheusType, PrometheusValue>;

/// Bytes of a body the router reads at most: a vLLM `/metrics` is about
/// 55 KB, histograms included.
pub const MAX_BODY: usize = 4 << 20;

/// What one scrape found. `None`: the engine does not export it, or this
/// body did not hold it (then it is in `missing`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineReport {
    pub running: Option<f64>,
    pub waiting: Option<f64>,
    pub kv_usage: Option<f64>,
    /// Prompt tokens found in the prefix cache, and looked up: counters.
    pub prefix_cache: Option<(f64, f64)>,
    pub lora: Option<LoraState>,
    /// Signals the dialect names that this body lacked.
    pub missing: Signals,
}

/// The adapters an engine holds, as vLLM reports them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoraState {
    pub max: Option<u32>,
    pub running: Vec<String>,
    pub waiting: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScrapeError {
    /// Not the Prometheus text format (the message says where).
    Unparsable(String),
    TooLarge,
}

pub fn read(text: &str, d: &Dialect) -> Result<EngineReport, ScrapeError> {
    if text.len() > MAX_BODY {
        return Err(ScrapeError::TooLarge);
    }
    // Only the families the dialect reads go to the parser: a vLLM body is
    // mostly histograms it does not need (1.7 ms to parse whole, release).
    let text = wanted_lines(text, d);
    // The parser wants at least one family; an empty body holds none.
    let exposition = if text.trim().is_empty() {
        Default::default()
    } else {
        parse_prometheus(&text).map_err(|e| ScrapeError::Unparsable(short(&e.to_string())))?
    };
    let families = &exposition.families;
    let mut r = EngineReport::default();
    let mut one = |s: Signal, sel: &Option<MetricSelector>, combine: fn(f64, f64) -> f64| {
        let sel = sel.as_ref()?;
        let v = value(families, sel, combine);
        if v.is_none() {
            r.missing.insert(s);
        }
        v
    };
    r.running = one(Signal::Running, &d.running, |a, b| a + b);
    r.waiting = one(Signal::Waiting, &d.waiting, |a, b| a + b);
    // One engine serving several models shares one cache: the fullest.
    r.kv_usage = one(Signal::KvUsage, &d.kv_usage, f64::max).map(|v| v.clamp(0.0, 1.0));
    let hits = sum_all(families, &d.prefix_cache_hits);
    let queries = sum_all(families, &d.prefix_cache_queries);
    if !d.prefix_cache_hits.is_empty() && hits.is_none() {
        r.missing.insert(Signal::PrefixCacheHits);
    }
    if !d.prefix_cache_queries.is_empty() && queries.is_none() {
        r.missing.insert(Signal::PrefixCacheQueries);
    }
    r.prefix_cache = hits.zip(queries);
    // Exported only when the engine runs with LoRA on: absent is no news.
    r.lora = d.lora_info.as_ref().and_then(|s| lora(families, s));
    Ok(r)
}

/// The lines of the families `d` reads, in order. A line that names no
/// valid metric is kept, so the parser refuses a body that is not the text
/// format rather than the filter hiding it.
fn wanted_lines(text: &str, d: &Dialect) -> String {
    let names = d.metric_names();
    let wanted = |name: &str| {
        names
            .iter()
            .any(|&n| n == name || n.strip_suffix("_total") == Some(name))
    };
    let mut out = String::new();
    for line in text.lines() {
        let keep = match line.strip_prefix('#') {
            Some(c) => {
                let mut words = c.split_whitespace();
                matches!(words.next(), Some("HELP" | "TYPE")) && words.next().is_some_and(wanted)
            }
            None => {
                let name = line.split(['{', ' ', '\t']).next().unwrap_or("");
                line.trim().is_empty() || !MetricSelector::valid_name(name) || wanted(name)
            }
        };
        if keep {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// A parser's message bounded for a log line: it quotes the offending line,
/// which an engine controls.
fn short(msg: &str) -> String {
    const MAX: usize = 300;
    match msg.char_indices().nth(MAX) {
        Some((at, _)) => format!("{}…", &msg[..at]),
        None => msg.to_string(),
    }
}

/// A family by its name; a counter also by the name without `_total`.
fn family<'a>(families: &'a HashMap<String, Family>, name: &str) -> Option<&'a Family> {
    families.get(name).or_else(|| {
        name.strip_suffix("_total")
            .and_then(|base| families.get(base))
    })
}

fn number(v: &PrometheusValue) -> Option<f64> {
    let n = match v {
        PrometheusValue::Unknown(n) | PrometheusValue::Gauge(n) => n.as_f64(),
        PrometheusValue::Counter(c) => c.value.as_f64(),
        _ => return None,
    };
    n.is_finite().then_some(n)
}

/// The matching series' values combined; `None` when no series matches.
fn value(
    families: &HashMap<String, Family>,
    sel: &MetricSelector,
    combine: fn(f64, f64) -> f64,
) -> Option<f64> {
    let f = family(families, &sel.metric)?;
    f.iter_samples()
        .filter(|s| matches(s, sel))
        .filter_map(|s| number(&s.value))
        .reduce(combine)
}

/// The sum over every selector; `None` if any is absent, or none is named.
fn sum_all(families: &HashMap<String, Family>, sels: &[MetricSelector]) -> Option<f64> {
    if sels.is_empty() {
        return None;
    }
    sels.iter().map(|s| value(families, s, |a, b| a + b)).sum()
}

fn matches(s: &Sample<PrometheusValue>, sel: &MetricSelector) -> bool {
    sel.labels.is_empty()
        || s.get_labelset().is_ok_and(|l| {
            sel.labels
                .iter()
                .all(|(k, want)| l.get_label_value(k) == Some(want.as_str()))
        })
}

fn lora(families: &HashMap<String, Family>, sel: &MetricSelector) -> Option<LoraState> {
    let f = family(families, &sel.metric)?;
    let newest = f
        .iter_samples()
        .filter_map(|s| number(&s.value).map(|v| (v, s)))
        .max_by(|a, b| a.0.total_cmp(&b.0))?
        .1
        .get_labelset()
        .ok()?;
    let label = |k: &str| newest.get_label_value(k);
    let list = |k: &str| -> Vec<String> {
        label(k)
            .unwrap_or("")
            .split(',')
            .filter(|a| !a.is_empty())
            .map(str::to_string)
            .collect()
    };
    Some(LoraState {
        max: label("max_lora").and_then(|m| m.parse().ok()),
        running: list("running_lora_adapters"),
        waiting: list("waiting_lora_adapters"),
    })
}

#[cfg(test)]
#[path = "report_tests.rs"]
mod tests;
