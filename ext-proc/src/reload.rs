//! Reloading the config file: read, validate, then hand to the writer. Owned
//! by `serve` (file watcher, SIGHUP) and lent to the admin API, which thus
//! needs nothing from `serve`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::config::RouterConfig;
use crate::metrics::Reload;
use crate::state::{Change, ChangeError, Shared};

#[derive(Clone, Debug)]
pub struct Reloader {
    shared: Arc<Shared>,
    path: PathBuf,
    /// Where gRPC is served: a reload may not leave it unguarded.
    grpc: Option<SocketAddr>,
    /// The files the config in effect reads secrets from (the gRPC token,
    /// the clients' keys, fleets' keys): a change to one reloads too.
    secrets: Arc<Mutex<Vec<PathBuf>>>,
}

/// The files `cfg` reads secrets from.
pub fn secret_files(cfg: &RouterConfig) -> Vec<PathBuf> {
    let fleets = cfg
        .fleets
        .iter()
        .filter_map(|f| f.credentials.as_ref()?.api_key_file.clone());
    cfg.grpc
        .token_file
        .clone()
        .into_iter()
        .chain(cfg.tenants.identity.api_keys_file.clone())
        .chain(fleets)
        .map(PathBuf::from)
        .collect()
}

impl Reloader {
    pub fn new(shared: Arc<Shared>, path: PathBuf) -> Reloader {
        Reloader {
            shared,
            path,
            grpc: None,
            secrets: Arc::default(),
        }
    }

    /// Also watches the secret files of `cfg`, the config in effect.
    pub fn watching(self, cfg: &RouterConfig) -> Reloader {
        *self.secrets.lock().unwrap_or_else(|e| e.into_inner()) = secret_files(cfg);
        self
    }

    /// The config file and the secret files of the config in effect.
    pub fn watched(&self) -> Vec<PathBuf> {
        let secrets = self.secrets.lock().unwrap_or_else(|e| e.into_inner());
        std::iter::once(self.path.clone())
            .chain(secrets.iter().cloned())
            .collect()
    }

    /// Refuses reloads that would leave gRPC on `addr` without a peer check.
    pub fn serving_grpc_on(mut self, addr: SocketAddr) -> Reloader {
        self.grpc = Some(addr);
        self
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Loads, validates and applies the file. An invalid file is refused
    /// with its field-path errors and the running config stays.
    pub async fn reload(&self, source: &str) -> Result<String, ChangeError> {
        let loaded = RouterConfig::load_valid(&self.path).map_err(|e| e.to_string());
        let checked = loaded.and_then(|cfg| match self.grpc {
            Some(addr) => crate::peer_auth::check_listen(addr, &cfg.grpc).map(|()| cfg),
            None => Ok(cfg),
        });
        match checked {
            Ok(cfg) => {
                *self.secrets.lock().unwrap_or_else(|e| e.into_inner()) = secret_files(&cfg);
                self.shared
                    .change(Change::Reload {
                        config: Box::new(cfg),
                        source: source.to_string(),
                    })
                    .await
            }
            Err(e) => {
                self.shared.metrics.control.reloads.inc(Reload::Refused);
                Err(ChangeError::Invalid(format!(
                    "{}: invalid router config, the running config stays:\n{e}",
                    self.path.display()
                )))
            }
        }
    }
}
