//! The lab's Envoy: started, restarted, and read through its admin API.

use super::*;

impl Lab {
    pub(super) fn spawn_envoy(config: &Path, workers: u32, dir: &Path) -> Proc {
        Proc::spawn(
            "envoy",
            Command::new("envoy")
                .arg("-c")
                .arg(config)
                .args(["--log-level", "warn", "--concurrency"])
                .arg(workers.to_string())
                .arg("--base-id")
                .arg(free_port().to_string()),
            dir,
        )
    }

    /// Envoy answers `/ready` (it has initialised: members fetched, or its
    /// initial fetch timeout passed).
    pub fn wait_envoy_ready(&self) {
        wait_until("envoy", Duration::from_secs(30), || {
            http_ok(&format!("{}/ready", self.envoy_admin))
        });
    }

    /// Starts Envoy anew on the same bootstrap (does not wait for it).
    pub fn restart_envoy(&mut self) {
        self.envoy_proc.stop();
        self.envoy_proc = Self::spawn_envoy(&self.envoy_yaml, self.envoy_workers, self._dir.path());
    }

    /// Each cluster's members as Envoy's admin `/clusters` lists them:
    /// cluster → (`ip:port` → the health flags Envoy shows).
    pub fn envoy_members(&self) -> Option<BTreeMap<String, BTreeMap<String, Vec<String>>>> {
        let (status, body) =
            client::blocking_get(&format!("{}/clusters?format=json", self.envoy_admin))?;
        if status != 200 {
            return None;
        }
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        let mut out = BTreeMap::new();
        for c in v["cluster_statuses"].as_array()? {
            let mut hosts = BTreeMap::new();
            for h in c["host_statuses"].as_array().into_iter().flatten() {
                let sa = &h["address"]["socket_address"];
                let addr = format!("{}:{}", sa["address"].as_str()?, sa["port_value"].as_u64()?);
                let flags = h["health_status"]
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .filter(|(k, v)| *k == "eds_health_status" || v.as_bool() == Some(true))
                            .map(|(k, v)| match v.as_str() {
                                Some(s) => format!("{k}={s}"),
                                None => k.clone(),
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                hosts.insert(addr, flags);
            }
            out.insert(c["name"].as_str()?.to_string(), hosts);
        }
        Some(out)
    }

    /// Envoy's counter value, 0 when absent.
    pub fn envoy_stat(&self, name: &str) -> u64 {
        let (_, body) =
            client::blocking_get(&format!("{}/stats?filter=^{name}$", self.envoy_admin))
                .unwrap_or_default();
        body.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }
}
