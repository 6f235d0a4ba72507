//! A config that passed validation. Only `validate` makes one, so code that
//! holds a `ValidConfig` may rely on what validation proves (names resolve,
//! at most 64 replicas per fleet, bounds in range, every fleet's credentials
//! were readable: they travel with it).

use std::ops::Deref;
use std::sync::Arc;

use super::{ApiKey, ConfigErrors, RouterConfig, credentials};

#[derive(Clone, Debug)]
pub struct ValidConfig {
    cfg: RouterConfig,
    /// Parallel to `cfg.fleets`: each fleet's key, read from where its
    /// `credentials` point.
    keys: Arc<[Option<ApiKey>]>,
}

/// Checks the whole config, reads the fleets' keys, and reports every error
/// at once.
pub fn validate(cfg: RouterConfig) -> Result<ValidConfig, ConfigErrors> {
    let mut errors = super::validate::errors(&cfg);
    let mut keys = Vec::with_capacity(cfg.fleets.len());
    for (i, f) in cfg.fleets.iter().enumerate() {
        let key = f.credentials.as_ref().map(|c| {
            credentials::read(c, &format!("fleets[{i}].credentials"))
                .map_err(|e| errors.push(e))
                .ok()
        });
        keys.push(key.flatten());
    }
    if errors.is_empty() {
        Ok(ValidConfig {
            cfg,
            keys: keys.into(),
        })
    } else {
        Err(ConfigErrors(errors))
    }
}

impl ValidConfig {
    pub fn into_inner(self) -> RouterConfig {
        self.cfg
    }

    /// Fleet `i`'s key, if it has credentials.
    pub fn key(&self, fleet: usize) -> Option<&ApiKey> {
        self.keys.get(fleet).and_then(Option::as_ref)
    }
}

impl Deref for ValidConfig {
    type Target = RouterConfig;

    fn deref(&self) -> &RouterConfig {
        &self.cfg
    }
}
