//! The lab's fleetroute instances: started, stopped, restarted, and read
//! through their admin APIs.

use super::*;

impl Lab {
    /// `addrs`: gRPC, admin, Envoy admin.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn spawn_fleetroute(
        bin: &Path,
        router: &Path,
        [grpc, admin, envoy_admin]: [&str; 3],
        token: Option<&str>,
        serve_args: &[String],
        dir: &Path,
        n: usize,
    ) -> Proc {
        let mut cmd = Command::new(bin);
        cmd.args(["serve", "--instance-id", &format!("fr{n}")])
            .args(serve_args);
        cmd.arg("--config")
            .arg(router)
            .args([
                "--grpc",
                grpc,
                "--admin",
                admin,
                "--envoy-admin",
                envoy_admin,
            ])
            .env("RUST_LOG", "info")
            .env_remove("FLEETROUTE_ADMIN_TOKEN");
        if let Some(t) = token {
            cmd.args(["--admin-token", t]);
        }
        let name = if n == 0 {
            "fleetroute".to_string()
        } else {
            format!("fleetroute{n}")
        };
        Proc::spawn(&name, &mut cmd, dir)
    }

    /// Admin URLs of every instance, instance 0 first.
    pub fn admins(&self) -> Vec<String> {
        std::iter::once(self.admin.clone())
            .chain(self.others.iter().map(|o| o.admin.clone()))
            .collect()
    }

    /// Kills instance `i` (>= 1) with SIGKILL.
    pub fn kill_instance(&mut self, i: usize) {
        self.others[i - 1].proc.stop();
    }

    /// Starts instance `i` (>= 1) again on its ports and waits until ready.
    pub fn restart_instance(&mut self, i: usize) {
        let o = &self.others[i - 1];
        let mut proc = Self::spawn_fleetroute(
            &self.bins.fleetroute,
            &self.router_path,
            [
                &o.grpc,
                o.admin.trim_start_matches("http://"),
                self.envoy_admin.trim_start_matches("http://"),
            ],
            self.admin_token.as_deref(),
            &self.serve_args,
            self._dir.path(),
            i,
        );
        Self::wait_ready(&mut proc, o.admin.trim_start_matches("http://"));
        self.others[i - 1].proc = proc;
    }

    /// A counter or gauge of instance `i`'s `/metrics` (sum of its series
    /// whose line holds every label); `None` when it does not answer.
    pub fn instance_metric(&self, i: usize, metric: &str, labels: &[&str]) -> Option<f64> {
        let admin = &self.admins()[i];
        let (status, body) = client::blocking_get(&format!("{admin}/metrics"))?;
        (status == 200).then(|| client::metric_sum(&body, metric, labels))
    }

    /// Requests instance `i` still counts in flight (`/debug/snapshot`).
    pub fn instance_inflight(&self, i: usize) -> Option<u64> {
        inflight_at(&self.admins()[i])
    }

    /// Instance `i`'s view of each replica's requests in flight, by
    /// address: (its own, the sum of its peers' fresh reports).
    pub fn instance_replica_load(&self, i: usize) -> Option<BTreeMap<String, (u64, u64)>> {
        let url = format!("{}/debug/snapshot", self.admins()[i]);
        let (_, body) = client::blocking_get(&url)?;
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        let mut out = BTreeMap::new();
        for f in v["fleets"].as_array()? {
            for r in f["replicas"].as_array()? {
                let n = |k: &str| r[k].as_u64().unwrap_or(0);
                out.insert(
                    r["addr"].as_str()?.to_string(),
                    (n("inflight"), n("peer_inflight")),
                );
            }
        }
        Some(out)
    }

    pub fn wait_router_ready(&mut self) {
        let admin = self.admin.trim_start_matches("http://").to_string();
        Self::wait_ready(&mut self.fleetroute, &admin);
    }

    pub(super) fn wait_ready(proc: &mut Proc, admin: &str) {
        let url = format!("http://{admin}/ready");
        wait_until("fleetroute ready", Duration::from_secs(20), || {
            assert!(!proc.exited(), "fleetroute exited:\n{}", proc.log_tail(30));
            http_ok(&url)
        });
    }

    /// Stops fleetroute (to test fail-open / fail-closed).
    pub fn stop_router(&mut self) {
        self.fleetroute.stop();
    }

    pub fn restart_router(&mut self) {
        self.fleetroute.stop();
        self.start_router();
    }

    /// Starts fleetroute (instance 0) on its ports and waits until ready.
    pub fn start_router(&mut self) {
        self.fleetroute = Self::spawn_fleetroute(
            &self.bins.fleetroute,
            &self.router_path,
            [
                &self.grpc,
                self.admin.trim_start_matches("http://"),
                self.envoy_admin.trim_start_matches("http://"),
            ],
            self.admin_token.as_deref(),
            &self.serve_args,
            self._dir.path(),
            0,
        );
        self.wait_router_ready();
    }

    /// Requests fleetroute still counts in flight on its replicas (from
    /// `/debug/snapshot`).
    pub fn router_inflight(&self) -> Option<u64> {
        inflight_at(&self.admin)
    }

    /// Waits until fleetroute has learned the end of every request sent so
    /// far: the access log reports ends in batches (see the bootstrap's
    /// `buffer_flush_interval`), so a request's load outlives its response
    /// by up to that interval.
    pub fn wait_settled(&self) {
        wait_until(
            "fleetroute to see every request end",
            Duration::from_secs(10),
            || self.router_inflight() == Some(0),
        );
    }
}
