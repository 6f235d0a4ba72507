//! Recent decisions for `/debug/decisions`, bounded in entries and in bytes:
//! the log keeps at most [`LOG_BYTES`] of records, and one response carries
//! at most [`RESPONSE_BYTES`] of JSON, whatever the query asks.

use std::collections::VecDeque;

use serde::Serialize;

use super::Routed;
use crate::topology::{FleetId, Topology};
use fleetroute_filter::contract::KeySource;

/// Longest client `x-request-id` fleetroute keeps (bytes): anything longer is
/// cut before it is stored, hashed or logged.
pub const MAX_REQUEST_ID: usize = 128;

/// `id` cut to at most [`MAX_REQUEST_ID`] bytes, on a character boundary.
pub fn truncate_id(id: &str) -> &str {
    truncate_to(id, MAX_REQUEST_ID)
}

/// `s` cut to at most `max` bytes, on a character boundary.
pub fn truncate_to(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Most decisions kept.
pub const LOG_ENTRIES: usize = 4096;
/// Most bytes of records kept (strings plus a fixed cost per record).
pub const LOG_BYTES: usize = 1 << 20;
/// Most bytes of JSON one response carries (newest decisions first).
pub const RESPONSE_BYTES: usize = 256 << 10;
/// What a record costs beyond its strings (the struct, the deque slot).
const RECORD_OVERHEAD: usize = 160;

/// A decision as `/debug/decisions` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct DecisionRecord {
    /// fleetroute's own id of the decision (16 hex digits): the nonce the
    /// observation of the response is matched by. Unique, whatever the client sent.
    pub decision_id: String,
    /// The request's `x-request-id`, truncated to `MAX_REQUEST_ID` bytes.
    pub request_id: String,
    pub stage: String,
    pub fleet: String,
    pub replica: String,
    pub key_source: &'static str,
    pub arm: &'static str,
    /// Why this replica: `key`, `prefix`, `share`, `load_guard` or `load`.
    pub pick: &'static str,
    pub shadow: Option<String>,
    /// The prompt's tokens as the filter estimates them (bytes / 4), and
    /// those predicted in the chosen replica's cache, in the same unit.
    pub prompt_tokens: u64,
    pub predicted_cached_tokens: u64,
    /// The LoRA adapter it named, and the load expected on the chosen
    /// replica in prefill tokens (0: it was on the GPU there).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adapter: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adapter_load_tokens: Option<u64>,
    /// A placement load (`pick: placement`, no request): the model the
    /// load is expected to evict from its replica, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evicts: Option<String>,
    /// On a fallback: the stage the client named, and why it did not serve
    /// (`saturated`, `unhealthy`, `context`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback_from: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback_reason: Option<&'static str>,
}

impl DecisionRecord {
    /// A decision with its ids named.
    pub(super) fn of(topo: &Topology, r: Routed) -> DecisionRecord {
        let name = |f: FleetId| topo.fleets.get(f.index()).map(|x| x.name.clone());
        DecisionRecord {
            decision_id: format!("{:016x}", r.decision_id),
            request_id: r.request_id,
            stage: topo
                .stages
                .get(r.stage.index())
                .map(|s| s.name.clone())
                .unwrap_or_default(),
            fleet: name(r.fleet).unwrap_or_default(),
            // Empty if its slot holds another member by now.
            replica: topo
                .resolves(r.generation, r.fleet, r.replica)
                .map(|x| x.addr.clone())
                .unwrap_or_default(),
            key_source: r.key_source.map_or("none", KeySource::as_str),
            arm: r.arm.as_str(),
            pick: r.pick.as_str(),
            shadow: r.shadow.and_then(name),
            prompt_tokens: r.prompt_tokens,
            predicted_cached_tokens: r.predicted_cached_tokens,
            adapter: r.adapter.and_then(|(id, _)| {
                let stage = topo.stages.get(r.stage.index())?;
                Some(stage.adapters.name(id)?.to_string())
            }),
            adapter_load_tokens: r.adapter.map(|(_, t)| t as u64),
            evicts: None,
            fallback_from: r
                .fallback
                .and_then(|f| Some(topo.stages.get(f.from.index())?.name.clone())),
            fallback_reason: r.fallback.map(|f| f.reason.as_str()),
        }
    }

    /// A load placement started ahead of demand: `model` onto `replica`,
    /// expected to take `load_tokens` and to evict `evicts`.
    pub fn placement(
        (stage, fleet, replica): (&str, &str, &str),
        model: &str,
        load_tokens: f64,
        evicts: Option<String>,
    ) -> DecisionRecord {
        DecisionRecord {
            decision_id: format!("{:016x}", crate::clock::random_u64()),
            request_id: String::new(),
            stage: stage.to_string(),
            fleet: fleet.to_string(),
            replica: replica.to_string(),
            key_source: "none",
            arm: "none",
            pick: "placement",
            shadow: None,
            prompt_tokens: 0,
            predicted_cached_tokens: 0,
            adapter: Some(model.to_string()),
            adapter_load_tokens: Some(load_tokens as u64),
            evicts,
            fallback_from: None,
            fallback_reason: None,
        }
    }

    fn bytes(&self) -> usize {
        RECORD_OVERHEAD
            + self.decision_id.len()
            + self.request_id.len()
            + self.stage.len()
            + self.fleet.len()
            + self.replica.len()
            + self.shadow.as_ref().map_or(0, String::len)
            + self.adapter.as_ref().map_or(0, String::len)
            + self.evicts.as_ref().map_or(0, String::len)
            + self.fallback_from.as_ref().map_or(0, String::len)
    }
}

/// Which decisions a query asks for.
#[derive(Clone, Copy, Debug, Default)]
pub struct Query<'a> {
    /// By `x-request-id` (truncated like the stored ids before comparing).
    pub request_id: Option<&'a str>,
    /// By fleetroute's decision id.
    pub decision_id: Option<&'a str>,
    pub limit: usize,
}

#[derive(Debug, Default)]
pub struct DecisionLog {
    records: VecDeque<DecisionRecord>,
    bytes: usize,
}

impl DecisionLog {
    pub fn push(&mut self, record: DecisionRecord) {
        self.bytes += record.bytes();
        self.records.push_back(record);
        while self.records.len() > LOG_ENTRIES || self.bytes > LOG_BYTES {
            match self.records.pop_front() {
                Some(old) => self.bytes -= old.bytes(),
                None => break,
            }
        }
    }

    /// Bytes the kept records account for.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Matching records, newest first, at most `q.limit` of them.
    pub fn find(&self, q: Query<'_>) -> Vec<DecisionRecord> {
        let request_id = q.request_id.map(truncate_id);
        self.records
            .iter()
            .rev()
            .filter(|d| request_id.is_none_or(|id| d.request_id == id))
            .filter(|d| q.decision_id.is_none_or(|id| d.decision_id == id))
            .take(q.limit)
            .cloned()
            .collect()
    }
}

/// A JSON array of `records`, cut at the last whole record that fits in
/// `budget` bytes.
pub fn json_within(records: &[DecisionRecord], budget: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(budget.min(64 << 10));
    out.push(b'[');
    for r in records {
        let Ok(json) = serde_json::to_vec(r) else {
            continue;
        };
        // The separator and the closing bracket must fit too.
        if out.len() + json.len() + 2 > budget {
            break;
        }
        if out.len() > 1 {
            out.push(b',');
        }
        out.extend_from_slice(&json);
    }
    out.push(b']');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(i: usize, id_len: usize) -> DecisionRecord {
        DecisionRecord {
            decision_id: format!("{i:016x}"),
            request_id: "\"".repeat(id_len),
            stage: "s".into(),
            fleet: "f".into(),
            replica: "127.0.0.1:1".into(),
            key_source: "user",
            arm: "none",
            pick: "key",
            shadow: None,
            prompt_tokens: 0,
            predicted_cached_tokens: 0,
            adapter: None,
            adapter_load_tokens: None,
            evicts: None,
            fallback_from: None,
            fallback_reason: None,
        }
    }

    #[test]
    fn the_log_is_bounded_in_bytes_and_entries() {
        let mut log = DecisionLog::default();
        for i in 0..10_000 {
            log.push(record(i, 128));
        }
        assert!(log.bytes() <= LOG_BYTES);
        let all = log.find(Query {
            limit: usize::MAX,
            ..Default::default()
        });
        assert!(all.len() < LOG_ENTRIES, "{}", all.len());
        assert_eq!(all[0].decision_id, format!("{:016x}", 9_999));
        let mut small = DecisionLog::default();
        for i in 0..5000 {
            small.push(record(i, 0));
        }
        assert_eq!(
            small
                .find(Query {
                    limit: usize::MAX,
                    ..Default::default()
                })
                .len(),
            LOG_ENTRIES
        );
    }

    #[test]
    fn a_response_stays_within_its_budget_and_is_valid_json() {
        // Quotes are escaped: the JSON is larger than the strings.
        let records: Vec<DecisionRecord> = (0..2000).map(|i| record(i, 128)).collect();
        let json = json_within(&records, RESPONSE_BYTES);
        assert!(json.len() <= RESPONSE_BYTES, "{}", json.len());
        let v: Vec<serde_json::Value> = serde_json::from_slice(&json).unwrap();
        assert!(v.len() > 100 && v.len() < 2000, "{}", v.len());
        assert_eq!(v[0]["decision_id"], records[0].decision_id);
        assert_eq!(json_within(&records, 10), b"[]");
    }

    #[test]
    fn lookups_by_request_id_truncate_the_query_like_the_ids() {
        let mut log = DecisionLog::default();
        let long = "x".repeat(50_000);
        let mut r = record(7, 0);
        r.request_id = truncate_id(&long).to_string();
        log.push(r);
        log.push(record(8, 3));
        let q = |request_id, decision_id| {
            log.find(Query {
                request_id,
                decision_id,
                limit: 10,
            })
            .len()
        };
        assert_eq!(q(Some(&long), None), 1);
        assert_eq!(q(Some("\"\"\""), None), 1);
        assert_eq!(q(None, Some("0000000000000007")), 1);
        assert_eq!(q(Some(&long), Some("0000000000000008")), 0);
        assert_eq!(q(None, None), 2);
    }
}
