//! Reloading the config file: read, validate, then hand to the writer. Owned
//! by `serve` (file watcher, SIGHUP) and lent to the admin API, which thus
//! needs nothing from `serve`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::RouterConfig;
use crate::metrics::ResultLabel;
use crate::state::{Change, ChangeError, Shared};

#[derive(Clone, Debug)]
pub struct Reloader {
    shared: Arc<Shared>,
    path: PathBuf,
}

impl Reloader {
    pub fn new(shared: Arc<Shared>, path: PathBuf) -> Reloader {
        Reloader { shared, path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Loads, validates and applies the file. An invalid file is refused
    /// with its field-path errors and the running config stays.
    pub async fn reload(&self, source: &str) -> Result<String, ChangeError> {
        match RouterConfig::load_valid(&self.path) {
            Ok(cfg) => {
                self.shared
                    .change(Change::Reload {
                        config: Box::new(cfg),
                        source: source.to_string(),
                    })
                    .await
            }
            Err(e) => {
                self.shared
                    .metrics
                    .reloads
                    .get_or_create(&ResultLabel {
                        result: "refused".into(),
                    })
                    .inc();
                Err(ChangeError::Invalid(format!(
                    "{}: invalid router config, the running config stays:\n{e}",
                    self.path.display()
                )))
            }
        }
    }
}
