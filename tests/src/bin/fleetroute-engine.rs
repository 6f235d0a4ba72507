//! The simulated inference engine: one process, one or more replicas.

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Parser;
use fleetroute_tests::engine::adapters::AdapterSettings;
use fleetroute_tests::engine::latency::LatencyModel;
use fleetroute_tests::engine::lora::LoraModel;
use fleetroute_tests::engine::models::ModelSettings;
use fleetroute_tests::engine::replica::ReplicaSettings;
use fleetroute_tests::engine::{EngineConfig, run};

#[derive(Parser)]
#[command(
    about = "Simulated OpenAI-compatible inference engine (prefix cache, batching, streaming)"
)]
struct Args {
    /// A replica as NAME=127.0.0.1:PORT (repeatable; port 0 picks a free one).
    #[arg(long = "replica", required = true, value_parser = parse_replica)]
    replicas: Vec<(String, SocketAddr)>,
    /// Address of the control endpoint (faults, state).
    #[arg(long)]
    control: Option<SocketAddr>,
    /// Prompt bytes per prefix-cache block; must match the router's filter.
    #[arg(long, default_value_t = 1024)]
    block_bytes: usize,
    /// Prefix-cache capacity of each replica, in tokens.
    #[arg(long, default_value_t = 200_000)]
    cache_tokens: usize,
    #[arg(long, default_value_t = 20_000.0)]
    prefill_tokens_per_sec: f64,
    #[arg(long, default_value_t = 2.0)]
    decode_ms_per_token: f64,
    /// Added to each token's decode per other request running (a CPU
    /// engine's decode slows with its batch; an accelerator's barely).
    #[arg(long, default_value_t = 0.0)]
    decode_ms_per_running: f64,
    /// Requests running at once per replica; more wait in a FIFO queue.
    #[arg(long, default_value_t = 8)]
    max_batch: usize,
    /// Completion length when a request sets no max_tokens.
    #[arg(long, default_value_t = 16)]
    default_max_tokens: u64,
    /// Accepted model names, comma-separated; empty accepts any.
    #[arg(long, value_delimiter = ',', default_value = "")]
    models: Vec<String>,
    /// REPLICA=NAME: that replica serves only this model name (404 for
    /// others, like vLLM's --served-model-name). Repeatable.
    #[arg(long = "served-model", value_parser = parse_pair)]
    served_models: Vec<(String, String)>,
    /// REPLICA=KEY: that replica answers completions only with
    /// `Authorization: Bearer KEY` (401 otherwise). Repeatable.
    #[arg(long = "require-api-key", value_parser = parse_pair)]
    api_keys: Vec<(String, String)>,
    /// Allow non-loopback listen addresses (containers only).
    #[arg(long)]
    any_address: bool,
    /// Serve LoRA adapters with this many GPU slots per replica (vLLM's
    /// --max-loras); unset: no adapters.
    #[arg(long)]
    max_loras: Option<usize>,
    /// Adapters kept in host memory per replica (--max-cpu-loras).
    #[arg(long)]
    max_cpu_loras: Option<usize>,
    /// Time to copy an adapter from host memory onto the GPU, ms.
    #[arg(long, default_value_t = 25.0)]
    lora_gpu_load_ms: f64,
    /// Time to read an adapter from disk, ms.
    #[arg(long, default_value_t = 370.0)]
    lora_disk_load_ms: f64,
    /// Adapters every replica knows from the start (--lora-modules),
    /// comma-separated.
    #[arg(long, value_delimiter = ',')]
    lora: Vec<String>,
    /// Answer /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's
    /// VLLM_ALLOW_RUNTIME_LORA_UPDATING).
    #[arg(long)]
    runtime_lora: bool,
    /// Serve these models as llama.cpp's router does (`/models`,
    /// `/models/load`, `/models/unload`; no autoload), comma-separated.
    #[arg(long, value_delimiter = ',')]
    packed_models: Vec<String>,
    /// Packed models loaded at once per replica (--models-max).
    #[arg(long, default_value_t = 4)]
    models_max: usize,
    /// Time to load a packed model, ms.
    #[arg(long, default_value_t = 1000)]
    model_load_ms: u64,
}

fn parse_pair(s: &str) -> Result<(String, String), String> {
    let (replica, value) = s.split_once('=').ok_or("expected REPLICA=VALUE")?;
    if value.is_empty() {
        return Err("the value after '=' is empty".into());
    }
    Ok((replica.to_string(), value.to_string()))
}

fn parse_replica(s: &str) -> Result<(String, SocketAddr), String> {
    let (name, addr) = s.split_once('=').ok_or("expected NAME=127.0.0.1:PORT")?;
    let addr = addr.parse().map_err(|e| format!("'{addr}': {e}"))?;
    Ok((name.to_string(), addr))
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let a = Args::parse();
    let cfg = EngineConfig {
        replicas: a.replicas,
        control: a.control,
        any_address: a.any_address,
        served_models: a.served_models,
        api_keys: a.api_keys,
        settings: ReplicaSettings {
            block_bytes: a.block_bytes,
            cache_tokens: a.cache_tokens,
            latency: LatencyModel {
                prefill_tokens_per_sec: a.prefill_tokens_per_sec,
                decode_ms_per_token: a.decode_ms_per_token,
                decode_ms_per_running: a.decode_ms_per_running,
                max_batch: a.max_batch,
            },
            default_max_tokens: a.default_max_tokens,
            models: a.models.into_iter().filter(|m| !m.is_empty()).collect(),
            api_key: None,
            adapters: a.max_loras.map(|max_loras| AdapterSettings {
                model: LoraModel {
                    max_loras: max_loras.max(1),
                    max_cpu_loras: a.max_cpu_loras.unwrap_or(max_loras).max(max_loras),
                    gpu_load_ms: a.lora_gpu_load_ms,
                    disk_load_ms: a.lora_disk_load_ms,
                    overlapped: false,
                },
                preloaded: a.lora.into_iter().filter(|m| !m.is_empty()).collect(),
                runtime: a.runtime_lora,
            }),
            packed: Some(ModelSettings {
                models: a
                    .packed_models
                    .into_iter()
                    .filter(|m| !m.is_empty())
                    .collect(),
                max: a.models_max.max(1),
                load_ms: a.model_load_ms,
            })
            .filter(|m| !m.models.is_empty()),
        },
    };
    match run(cfg).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fleetroute-engine: {e}");
            ExitCode::FAILURE
        }
    }
}
