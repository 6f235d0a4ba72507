//! Registering a LoRA adapter on the replica a request goes to, for fleets
//! whose replicas learn adapters at run time (`lora.load_path`): vLLM's
//! `POST /v1/load_lora_adapter`, once per replica and adapter. The first
//! request makes the call and the ones behind it wait for the same call
//! (one load, never one per request or per replica: the replica choice
//! sends them where the first went). The wait is bounded by
//! `lora.load_timeout_ms`; the client reads it in `x-fleetroute-cold-start`,
//! or gets a 503 with `retry-after` when it fails.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OnceCell;

use crate::topology::{AdapterId, FleetId, ReplicaId, StageId, Topology};

/// Bytes of an engine's answer to a registration that are read.
const MAX_ANSWER: usize = 4096;

/// Registrations remembered, each a replica and adapter.
const MAX_REGISTRATIONS: u64 = 65_536;

/// (replica identity, its adapters' epoch, adapter).
type Key = (u64, u64, AdapterId);

pub struct Registrations {
    done: moka::sync::Cache<Key, Arc<OnceCell<()>>>,
    client: reqwest::Client,
}

impl Default for Registrations {
    fn default() -> Self {
        Registrations {
            done: moka::sync::Cache::new(MAX_REGISTRATIONS),
            client: crate::state::probe::http_client(),
        }
    }
}

/// A registration a request waits for before it is routed.
#[derive(Debug)]
pub struct Pending {
    key: Key,
    url: String,
    body: String,
    authorization: Option<Vec<u8>>,
    pub timeout: Duration,
    pub stage: String,
    pub adapter: Arc<str>,
}

impl Registrations {
    /// The call a request for adapter `id`, routed to `replica`, waits
    /// for: none when the adapter is registered there already, or the
    /// fleet's replicas know every adapter.
    pub fn needed(
        &self,
        topo: &Topology,
        (stage, fleet, replica): (StageId, FleetId, ReplicaId),
        id: AdapterId,
    ) -> Option<Pending> {
        let fleet = topo.fleets.get(fleet.index())?;
        let lora = fleet.lora.as_ref()?;
        let stage = topo.stages.get(stage.index())?;
        let name = stage.adapters.name(id)?;
        let path = lora.path_of(name)?;
        let replica = fleet.replicas.get(replica)?;
        let key = (
            xxhash_rust::xxh3::xxh3_64(replica.identity.as_bytes()),
            replica.load.adapters.epoch(),
            id,
        );
        if self.done.get(&key).is_some_and(|c| c.initialized()) {
            return None;
        }
        Some(Pending {
            key,
            url: format!("http://{}/v1/load_lora_adapter", replica.addr),
            body: serde_json::json!({ "lora_name": &**name, "lora_path": path }).to_string(),
            authorization: fleet.key.as_ref().map(|k| k.authorization().to_vec()),
            timeout: Duration::from_millis(lora.load_timeout_ms),
            stage: stage.name.clone(),
            adapter: name.clone(),
        })
    }

    /// Makes the call, or waits for the one in flight; how long it waited.
    pub async fn run(&self, p: &Pending) -> Result<Duration, String> {
        let start = crate::clock::now();
        let cell = self.done.get_with(p.key, || Arc::new(OnceCell::new()));
        let call = cell.get_or_try_init(|| self.call(p));
        match tokio::time::timeout(p.timeout, call).await {
            Ok(Ok(())) => Ok(start.elapsed()),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(format!("no answer within {} ms", p.timeout.as_millis())),
        }
    }

    async fn call(&self, p: &Pending) -> Result<(), String> {
        let mut req = self
            .client
            .post(&p.url)
            .header("content-type", "application/json")
            .body(p.body.clone())
            .timeout(p.timeout);
        if let Some(a) = &p.authorization {
            req = req.header("authorization", a.as_slice());
        }
        let mut res = req.send().await.map_err(|e| format!("{}: {e}", p.url))?;
        let status = res.status();
        // The engine's answer is a line; read no more than a few of them.
        let mut body = Vec::new();
        while body.len() < MAX_ANSWER {
            match res.chunk().await {
                Ok(Some(c)) => body.extend_from_slice(&c[..c.len().min(MAX_ANSWER - body.len())]),
                _ => break,
            }
        }
        let text = String::from_utf8_lossy(&body);
        // Another instance (or an earlier run) registered it first.
        if status.is_success() || text.contains("already been loaded") {
            tracing::info!(adapter = %p.adapter, url = %p.url, "adapter registered");
            return Ok(());
        }
        let text: String = text.chars().take(200).collect();
        Err(format!("{} answered {status}: {text}", p.url))
    }
}
