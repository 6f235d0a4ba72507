//! Loading what a request needs on the replica it goes to: a LoRA adapter
//! on a fleet whose replicas learn adapters at run time (`lora.load_path`,
//! vLLM's `POST /v1/load_lora_adapter`), or a model on a packed fleet
//! (`packing`, llama.cpp's `POST /models/load`). Once per replica and
//! adapter or model: the first request makes the call and the ones behind
//! it wait for the same call (one load, never one per request or per
//! replica: the replica choice sends them where the first went). The wait
//! is bounded by the fleet's `load_timeout_ms`; the client reads it in
//! `x-fleetroute-cold-start`, or gets a 503 with `retry-after` when it fails.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OnceCell;

use super::engine_call::EngineCall;
use super::model_load;
use crate::topology::{AdapterId, FleetId, HoldKind, ReplicaId, StageId, Topology};

/// Bytes of an engine's answer to a registration that are read.
const MAX_ANSWER: usize = 4096;

/// Registrations remembered, each a replica and adapter or model.
const MAX_REGISTRATIONS: u64 = 65_536;

/// (replica identity, what it holds' epoch, adapter or model).
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
    cell: Arc<OnceCell<()>>,
    addr: String,
    authorization: Option<Vec<u8>>,
    pub timeout: Duration,
    pub stage: String,
    /// The adapter's or model's name.
    pub name: Arc<str>,
    /// `Some(path)`: an adapter, registered from there; `None`: a model.
    adapter_path: Option<String>,
    /// The replica's record of what it holds: a model that failed to load
    /// is not held.
    replica: Arc<crate::topology::load::ReplicaLoad>,
    id: AdapterId,
}

impl Pending {
    pub fn is_model(&self) -> bool {
        self.adapter_path.is_none()
    }
}

impl Registrations {
    /// The call a request for `id` (an adapter, or a packed model), routed
    /// to `replica`, waits for: none when it is registered there already,
    /// or the fleet's replicas know every adapter. `was_ready`: the
    /// decision found it ready there (a packed model loaded); one that is
    /// not, though loaded before, was evicted since and loads again.
    pub fn needed(
        &self,
        topo: &Topology,
        (stage, fleet, replica): (StageId, FleetId, ReplicaId),
        id: AdapterId,
        was_ready: bool,
    ) -> Option<Pending> {
        let fleet = topo.fleets.get(fleet.index())?;
        let hold = fleet.hold.as_ref()?;
        let stage = topo.stages.get(stage.index())?;
        // An adapter's path (with `{adapter}`), or none for a model.
        let template = match &hold.kind {
            HoldKind::Adapters { load_path } => Some(load_path.as_deref()?),
            HoldKind::Models { .. } => None,
        };
        let replica = fleet.replicas.get(replica)?;
        let key = (
            xxhash_rust::xxh3::xxh3_64(replica.identity.as_bytes()),
            replica.load.adapters.epoch(),
            id,
        );
        match self.done.get(&key).map(|c| c.initialized()) {
            // An adapter stays registered; a model stays loaded until the
            // replica evicts it for others.
            Some(true) if template.is_some() || was_ready => return None,
            // Evicted since: load it again.
            Some(true) => {
                self.done.remove(&key);
            }
            // In flight: wait for it.
            Some(false) => {}
            // A model the engine reports loaded (another instance's load,
            // or one from its start). Every load of this instance made its
            // call before the model was marked held.
            None if template.is_none() && was_ready => return None,
            None => {}
        }
        // Only a request that waits pays for these.
        let name = Arc::<str>::from(stage.held_name(id)?);
        let adapter_path = template.map(|t| t.replace("{adapter}", &name));
        Some(Pending {
            key,
            // Made now, not when waited for: a request decided meanwhile
            // finds it in flight.
            cell: self.done.get_with(key, || Arc::new(OnceCell::new())),
            addr: replica.addr.clone(),
            authorization: fleet.key.as_ref().map(|k| k.authorization().to_vec()),
            timeout: Duration::from_millis(hold.load_timeout_ms),
            stage: stage.name.clone(),
            name,
            adapter_path,
            replica: replica.load.clone(),
            id,
        })
    }

    /// Makes the call, or waits for the one in flight; how long it waited.
    pub async fn run(&self, p: &Pending) -> Result<Duration, String> {
        let start = crate::clock::now();
        let call = p.cell.get_or_try_init(|| async {
            match &p.adapter_path {
                Some(path) => self.register_adapter(p, path).await,
                None => model_load::load(&self.call(p), &p.name).await,
            }
        });
        let out = match tokio::time::timeout(p.timeout, call).await {
            Ok(Ok(_)) => Ok(start.elapsed()),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(format!("no answer within {} ms", p.timeout.as_millis())),
        };
        if out.is_err() {
            // The next request tries again, on a fresh call.
            self.done.remove(&p.key);
            if p.is_model() {
                p.replica.adapters.forget(p.id);
            }
        }
        out
    }

    fn call<'a>(&'a self, p: &'a Pending) -> EngineCall<'a> {
        EngineCall {
            client: &self.client,
            addr: &p.addr,
            authorization: p.authorization.as_deref(),
            timeout: p.timeout,
        }
    }

    async fn register_adapter(&self, p: &Pending, path: &str) -> Result<(), String> {
        const PATH: &str = "/v1/load_lora_adapter";
        let body = serde_json::json!({ "lora_name": &*p.name, "lora_path": path });
        let call = self.call(p);
        let (status, answer) = call.post(PATH, body.to_string(), MAX_ANSWER).await?;
        // Another instance (or an earlier run) registered it first.
        if status.is_success() || contains(&answer, "already been loaded") {
            tracing::info!(adapter = %p.name, addr = %p.addr, "adapter registered");
            return Ok(());
        }
        Err(call.refused(PATH, status, &answer))
    }
}

fn contains(answer: &[u8], text: &str) -> bool {
    String::from_utf8_lossy(answer).contains(text)
}
