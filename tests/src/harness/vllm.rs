//! A real vLLM server on CPU for the end-to-end tests, on a free loopback
//! port, stopped when dropped. `scripts/setup-vllm.sh` installs it into a
//! virtualenv keyed by its versions, with SmolLM2 converted to safetensors
//! and two LoRA adapters; `FLEETROUTE_VLLM_VENV` points elsewhere.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::client;
use super::procs::{Proc, free_port};
use super::time::wait_until;

/// The model name the server answers to (`--served-model-name`).
pub const MODEL: &str = "smollm2";

/// The virtualenv `scripts/setup-vllm.sh` makes.
pub fn venv() -> PathBuf {
    if let Some(v) = std::env::var_os("FLEETROUTE_VLLM_VENV") {
        return PathBuf::from(v);
    }
    let cache = std::env::var_os("FLEETROUTE_CACHE").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/fleetroute"),
        PathBuf::from,
    );
    cache.join("vllm-0.32.0-torch-2.13.0")
}

pub struct VllmServer {
    /// `127.0.0.1:port`.
    pub addr: String,
    pub venv: PathBuf,
    pub proc: Proc,
}

impl VllmServer {
    /// Starts a server with prefix caching, cached-token usage and runtime
    /// LoRA loading, and waits until `/health` answers (about 30-40 s).
    pub fn start(name: &str, dir: &Path) -> VllmServer {
        let venv = venv();
        let python = venv.join("bin/python");
        let model = venv.join("models/smollm2-hf");
        assert!(
            python.exists() && model.exists(),
            "vLLM is not installed at {}: run scripts/setup-vllm.sh",
            venv.display()
        );
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let mut cmd = Command::new(&python);
        cmd.args(["-m", "vllm.entrypoints.openai.api_server", "--model"])
            .arg(&model)
            .args(["--served-model-name", MODEL, "--host", "127.0.0.1"])
            .args(["--port", &port.to_string()])
            // Eager: ready in about 30 s instead of 90 on these CPUs.
            .args(["--enforce-eager", "--max-model-len", "2048"])
            .args(["--enable-prefix-caching", "--enable-prompt-tokens-details"])
            .args(["--enable-lora", "--max-loras", "2", "--max-lora-rank", "8"])
            .env("VLLM_CPU_KVCACHE_SPACE", "1")
            .env("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
            // `/is_sleeping` and the other development endpoints. Sleep mode
            // itself (`--enable-sleep-mode`) is refused on CPU at start.
            .env("VLLM_SERVER_DEV_MODE", "1");
        // Its engine core and workers are processes of their own: stopped
        // with it as one group, or they would outlive the test.
        let mut proc = Proc::spawn_group(&format!("vllm-{name}"), &mut cmd, dir);
        let url = format!("http://{addr}/health");
        wait_until("vLLM to load its model", Duration::from_secs(240), || {
            assert!(!proc.exited(), "vLLM exited:\n{}", proc.log_tail(40));
            client::blocking_get(&url).is_some_and(|(s, _)| s == 200)
        });
        VllmServer { addr, venv, proc }
    }

    /// Loads one of the adapters `setup-vllm.sh` made, at run time.
    pub fn load_adapter(&self, name: &str) -> (u16, String) {
        let path = self.venv.join("models/lora").join(name);
        let body = serde_json::json!({ "lora_name": name, "lora_path": path }).to_string();
        client::blocking_send(
            "POST",
            &format!("http://{}/v1/load_lora_adapter", self.addr),
            &body,
        )
        .expect("vLLM answers")
    }
}
