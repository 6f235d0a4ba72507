//! End-to-end harness: simulated engines, fleetroute and a real Envoy, all on
//! free loopback ports, stopped when the [`Lab`] is dropped.

pub mod client;
pub mod dns;
mod envoy;
mod instances;
pub mod llama;
pub mod llama_router;
pub mod procs;
pub mod redis;
pub mod scenario;
pub mod steady_load;
pub mod time;
pub mod vllm;

pub use time::{pace, wait_for_value, wait_until};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use procs::{Proc, free_port};

/// Where the binaries are: next to this test's own engine binary.
pub struct Binaries {
    pub fleetroute: PathBuf,
    pub engine: PathBuf,
    pub wasm: PathBuf,
}

impl Binaries {
    pub fn locate(engine: &str) -> Binaries {
        let engine = PathBuf::from(engine);
        let dir = engine.parent().expect("bin dir").to_path_buf();
        let target = dir.parent().expect("target dir");
        let b = Binaries {
            fleetroute: dir.join("fleetroute"),
            wasm: target.join("wasm32-wasip1/release/fleetroute_filter.wasm"),
            engine,
        };
        for p in [&b.fleetroute, &b.wasm] {
            assert!(
                p.exists(),
                "{} is missing: run scripts/build.sh (or scripts/test.sh) first",
                p.display()
            );
        }
        b
    }
}

/// Replica name → `127.0.0.1:port`.
pub type Replicas = BTreeMap<String, String>;

/// What a lab runs. `router` is a router config in which every `{name}`
/// stands for a replica's address: the harness starts a simulated replica
/// called `name` on a free port for each one.
#[derive(Default)]
pub struct LabSpec<'a> {
    pub router: &'a str,
    pub engine_args: &'a [&'a str],
    pub fail_closed: bool,
    /// Token for admin API changes (none: read-only).
    pub admin_token: Option<&'a str>,
    /// Envoy worker threads (none: 2). One worker puts every request in one
    /// Wasm VM.
    pub envoy_workers: Option<u32>,
    /// Changes the rendered Envoy bootstrap (a deployment variant).
    pub envoy_edit: Option<fn(&str) -> String>,
    /// Render the bootstrap with `--static-endpoints` (no EDS).
    pub static_endpoints: bool,
    /// fleetroute instances behind Envoy's one gRPC cluster (none: 1).
    pub instances: Option<usize>,
    /// Starts a Redis and points every instance's `peers.redis_url` at it.
    pub peers_redis: bool,
    /// Called with the replicas (name → address) before fleetroute starts:
    /// a membership source (a test DNS server) lists them from the start.
    pub before_router: Option<&'a dyn Fn(&Replicas)>,
    /// More `peers` fields with `peers_redis`, e.g. `load_stale_ms: 0`.
    pub peers_options: &'a str,
    /// More arguments for `fleetroute serve`, e.g. `--drain-ms 1000`.
    pub serve_args: &'a [&'a str],
}

/// One fleetroute instance beyond the first (`Lab::fleetroute`).
pub struct Instance {
    pub grpc: String,
    pub admin: String,
    pub proc: Proc,
}

pub struct Lab {
    pub envoy: String,
    pub envoy_admin: String,
    pub admin: String,
    pub control: String,
    /// Replica name → `127.0.0.1:port`.
    pub replicas: BTreeMap<String, String>,
    pub router_path: PathBuf,
    pub bins: Binaries,
    /// fleetroute's gRPC address (instance 0).
    pub grpc: String,
    admin_token: Option<String>,
    serve_args: Vec<String>,
    engine_args: Vec<String>,
    envoy_yaml: PathBuf,
    envoy_workers: u32,
    pub fleetroute: Proc,
    /// Instances 1.. (instance 0 is `fleetroute`, `admin`).
    pub others: Vec<Instance>,
    pub redis: Option<redis::Redis>,
    pub envoy_proc: Proc,
    pub engine: Proc,
    _dir: tempfile::TempDir,
}

/// Simulated replicas started after the lab, in their own engine process
/// (stopped when dropped).
pub struct ExtraReplicas {
    /// Replica name → `127.0.0.1:port`.
    pub replicas: BTreeMap<String, String>,
    pub proc: Proc,
}

fn placeholders(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find('{') {
        let after = &rest[start + 1..];
        match after.find('}') {
            // `{adapter}` is a LoRA `load_path`'s, not a replica.
            Some(end) if &after[..end] == "adapter" => rest = &after[end + 1..],
            Some(end)
                if end > 0
                    && after[..end]
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') =>
            {
                let name = after[..end].to_string();
                if !out.contains(&name) {
                    out.push(name);
                }
                rest = &after[end + 1..];
            }
            _ => rest = after,
        }
    }
    out
}

/// The requests in flight a fleetroute admin API reports, summed over replicas.
fn inflight_at(admin: &str) -> Option<u64> {
    fn sum(v: &serde_json::Value) -> u64 {
        match v {
            serde_json::Value::Object(m) => m
                .iter()
                .map(|(k, v)| match (k.as_str(), v.as_u64()) {
                    ("inflight", Some(n)) => n,
                    _ => sum(v),
                })
                .sum(),
            serde_json::Value::Array(a) => a.iter().map(sum).sum(),
            _ => 0,
        }
    }
    let (_, body) = client::blocking_get(&format!("{admin}/debug/snapshot"))?;
    Some(sum(&serde_json::from_str(&body).ok()?))
}

fn http_ok(url: &str) -> bool {
    client::blocking_get(url).is_some_and(|(status, _)| status == 200)
}

impl Lab {
    pub fn start(engine_bin: &str, spec: LabSpec<'_>) -> Lab {
        let bins = Binaries::locate(engine_bin);
        let dir = tempfile::tempdir().expect("temp dir");

        let mut replicas = BTreeMap::new();
        let mut router = spec.router.to_string();
        for name in placeholders(spec.router) {
            let addr = format!("127.0.0.1:{}", free_port());
            router = router.replace(&format!("{{{name}}}"), &addr);
            replicas.insert(name, addr);
        }
        let control = format!("127.0.0.1:{}", free_port());
        let mut cmd = Command::new(&bins.engine);
        for (name, addr) in &replicas {
            cmd.arg("--replica").arg(format!("{name}={addr}"));
        }
        if replicas.is_empty() {
            // Every replica is a real engine the test started: the simulator
            // runs one the config does not name (it wants at least one).
            cmd.arg("--replica")
                .arg(format!("unused=127.0.0.1:{}", free_port()));
        }
        cmd.arg("--control").arg(&control).args(spec.engine_args);
        let engine = Proc::spawn("engine", &mut cmd, dir.path());
        if let Some(f) = spec.before_router {
            f(&replicas);
        }

        let redis = spec.peers_redis.then(redis::Redis::require);
        if let Some(r) = &redis {
            let more = match spec.peers_options {
                "" => String::new(),
                o => format!(", {o}"),
            };
            router = format!(
                "peers: {{ redis_url: \"{}\", flush_ms: 20{more} }}\n{router}",
                r.url()
            );
        }
        let router_path = dir.path().join("router.yaml");
        std::fs::write(&router_path, &router).expect("write router config");
        let grpc = format!("127.0.0.1:{}", free_port());
        let others: Vec<(String, String)> = (1..spec.instances.unwrap_or(1))
            .map(|_| {
                (
                    format!("127.0.0.1:{}", free_port()),
                    format!("127.0.0.1:{}", free_port()),
                )
            })
            .collect();
        let admin = format!("127.0.0.1:{}", free_port());
        let listen = format!("127.0.0.1:{}", free_port());
        let envoy_admin = format!("127.0.0.1:{}", free_port());

        let envoy_yaml = dir.path().join("envoy.yaml");
        let mut bootstrap = Command::new(&bins.fleetroute);
        bootstrap
            .args(["bootstrap", "--config"])
            .arg(&router_path)
            .arg("--wasm")
            .arg(&bins.wasm)
            .args([
                "--listen",
                &listen,
                "--envoy-admin",
                &envoy_admin,
                "--grpc",
                &grpc,
            ]);
        for (g, _) in &others {
            bootstrap.args(["--grpc", g]);
        }
        if spec.fail_closed {
            bootstrap.arg("--fail-closed");
        }
        if spec.static_endpoints {
            bootstrap.arg("--static-endpoints");
        }
        let out = bootstrap.output().expect("fleetroute bootstrap");
        assert!(
            out.status.success(),
            "fleetroute bootstrap failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut envoy_text = String::from_utf8(out.stdout).expect("UTF-8 bootstrap");
        if let Some(edit) = spec.envoy_edit {
            envoy_text = edit(&envoy_text);
        }
        std::fs::write(&envoy_yaml, &envoy_text).expect("write envoy config");

        let admin_token = spec.admin_token.map(str::to_string);
        let serve_args: Vec<String> = spec.serve_args.iter().map(|a| a.to_string()).collect();
        let mut fleetroute = Self::spawn_fleetroute(
            &bins.fleetroute,
            &router_path,
            [&grpc, &admin, &envoy_admin],
            admin_token.as_deref(),
            &serve_args,
            dir.path(),
            0,
        );
        let mut others: Vec<Instance> = others
            .into_iter()
            .enumerate()
            .map(|(i, (grpc, admin))| Instance {
                proc: Self::spawn_fleetroute(
                    &bins.fleetroute,
                    &router_path,
                    [&grpc, &admin, &envoy_admin],
                    admin_token.as_deref(),
                    &serve_args,
                    dir.path(),
                    i + 1,
                ),
                grpc,
                admin: format!("http://{admin}"),
            })
            .collect();
        // Envoy asks fleetroute for its members (EDS) as it starts, and waits
        // up to its initial fetch timeout: start it once fleetroute is up.
        let mut engine = engine;
        wait_until("engines", Duration::from_secs(20), || {
            assert!(
                !engine.exited(),
                "the engine exited:\n{}",
                engine.log_tail(30)
            );
            http_ok(&format!("http://{control}/replicas"))
        });
        Self::wait_ready(&mut fleetroute, &admin);
        for o in &mut others {
            Self::wait_ready(&mut o.proc, o.admin.trim_start_matches("http://"));
        }
        let envoy_workers = spec.envoy_workers.unwrap_or(2);
        let envoy_proc = Self::spawn_envoy(&envoy_yaml, envoy_workers, dir.path());
        let lab = Lab {
            envoy: format!("http://{listen}"),
            envoy_admin: format!("http://{envoy_admin}"),
            admin: format!("http://{admin}"),
            control: format!("http://{control}"),
            replicas,
            router_path,
            bins,
            grpc,
            admin_token,
            serve_args,
            engine_args: spec.engine_args.iter().map(|a| a.to_string()).collect(),
            envoy_yaml,
            envoy_workers,
            fleetroute,
            others,
            redis,
            envoy_proc,
            engine,
            _dir: dir,
        };
        lab.wait_envoy_ready();
        lab
    }

    /// Starts simulated replicas named `names` (with the lab's engine
    /// arguments) in a second engine process, on free ports.
    pub fn start_replicas(&self, names: &[&str]) -> ExtraReplicas {
        let mut replicas = BTreeMap::new();
        let mut cmd = Command::new(&self.bins.engine);
        for name in names {
            let addr = format!("127.0.0.1:{}", free_port());
            cmd.arg("--replica").arg(format!("{name}={addr}"));
            replicas.insert(name.to_string(), addr);
        }
        let control = format!("127.0.0.1:{}", free_port());
        cmd.arg("--control").arg(&control).args(&self.engine_args);
        let mut proc = Proc::spawn(
            &format!("engine-{}", names.join("-")),
            &mut cmd,
            self._dir.path(),
        );
        wait_until("the extra replicas", Duration::from_secs(20), || {
            assert!(!proc.exited(), "the engine exited:\n{}", proc.log_tail(30));
            replicas
                .values()
                .all(|a| http_ok(&format!("http://{a}/health")))
        });
        ExtraReplicas { replicas, proc }
    }

    /// Runs the fleetroute CLI against this lab's admin API; returns
    /// (success, stdout, stderr).
    pub fn cli(&self, args: &[&str], token: Option<&str>) -> (bool, String, String) {
        let mut cmd = Command::new(&self.bins.fleetroute);
        cmd.args(args)
            .env("FLEETROUTE_ADMIN", self.admin.trim_start_matches("http://"))
            .env_remove("FLEETROUTE_ADMIN_TOKEN");
        if let Some(t) = token {
            cmd.env("FLEETROUTE_ADMIN_TOKEN", t);
        }
        let out = cmd.output().expect("run the fleetroute CLI");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Sets a fault on a simulated replica (see the engine's control API).
    pub fn fault(&self, replica: &str, json: &str) {
        let (status, body) = client::blocking_send(
            "POST",
            &format!("{}/replicas/{replica}/fault", self.control),
            json,
        )
        .expect("control endpoint");
        assert_eq!(status, 200, "fault {json} on {replica}: {body}");
    }

    pub fn clear_fault(&self, replica: &str) {
        let (status, body) = client::blocking_send(
            "DELETE",
            &format!("{}/replicas/{replica}/fault", self.control),
            "",
        )
        .expect("control endpoint");
        assert_eq!(status, 200, "clear fault on {replica}: {body}");
    }

    /// fleetroute's recorded decision for a request id: (fleet, replica addr).
    pub fn decision(&self, request_id: &str) -> Option<(String, String)> {
        let url = format!("{}/debug/decisions?id={request_id}", self.admin);
        wait_for_value(Duration::from_secs(2), || {
            let (_, body) = client::blocking_get(&url)?;
            let v: serde_json::Value = serde_json::from_str(&body).ok()?;
            let d = v.as_array()?.first()?;
            Some((
                d["fleet"].as_str()?.to_string(),
                d["replica"].as_str()?.to_string(),
            ))
        })
    }
}
