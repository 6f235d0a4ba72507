//! A real llama.cpp server in router mode (`llama-server --models-dir`):
//! one endpoint serving several models, each run by a child process that
//! the router starts on `POST /models/load` and stops when it evicts the
//! least recently used past `--models-max`. Started without autoload, so a
//! request for a model it has not loaded is refused (400 "model is not
//! loaded"): what fleetroute must never let happen.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::client;
use super::llama::Llama;
use super::procs::{Proc, free_port};
use super::time::wait_until;

pub struct LlamaRouter {
    /// `127.0.0.1:port`.
    pub addr: String,
    pub proc: Proc,
}

impl LlamaRouter {
    /// A router serving `models` (each a link to the SmolLM2 weights, or,
    /// named `broken`, a file that is no model), at most `max` loaded.
    pub fn start(llama: &Llama, name: &str, dir: &Path, models: &[&str], max: u32) -> LlamaRouter {
        let models_dir = dir.join(format!("{name}-models"));
        std::fs::create_dir_all(&models_dir).expect("models dir");
        for m in models {
            let path = models_dir.join(format!("{m}.gguf"));
            if *m == "broken" {
                std::fs::write(&path, b"not a model").expect("broken model");
            } else {
                std::os::unix::fs::symlink(&llama.model, &path).expect("model link");
            }
        }
        let addr = format!("127.0.0.1:{}", free_port());
        let (host, port) = addr.rsplit_once(':').expect("ip:port");
        let mut cmd = Command::new(&llama.server);
        cmd.arg("--models-dir")
            .arg(&models_dir)
            .args(["--models-max", &max.to_string(), "--no-models-autoload"])
            .args(["--host", host, "--port", port])
            // Passed on to every model's process: small and single-threaded.
            .args([
                "-c",
                "2048",
                "--parallel",
                "2",
                "--threads",
                "1",
                "--no-webui",
            ]);
        // The router's model processes die with it.
        let mut proc = Proc::spawn_group(&format!("llama-router-{name}"), &mut cmd, dir);
        let url = format!("http://{addr}/health");
        wait_until(
            "the llama.cpp router to listen",
            Duration::from_secs(30),
            || {
                assert!(
                    !proc.exited(),
                    "llama-server exited:\n{}",
                    proc.log_tail(30)
                );
                client::blocking_get(&url).is_some_and(|(s, _)| s == 200)
            },
        );
        LlamaRouter { addr, proc }
    }

    /// The models it has loaded now (`GET /models`, status `loaded`).
    pub fn loaded(&self) -> Vec<String> {
        let Some((200, body)) = client::blocking_get(&format!("http://{}/models", self.addr))
        else {
            return vec![];
        };
        let v: serde_json::Value = serde_json::from_str(&body).expect("model list");
        let mut out: Vec<String> = v["data"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["status"]["value"] == "loaded")
            .filter_map(|m| m["id"].as_str().map(String::from))
            .collect();
        out.sort();
        out
    }
}
