//! A config that passed validation. Only `validate` makes one, so code that
//! holds a `ValidConfig` may rely on what validation proves (names resolve,
//! at most 64 replicas per fleet, bounds in range).

use std::ops::Deref;

use super::{ConfigErrors, RouterConfig};

#[derive(Clone, Debug)]
pub struct ValidConfig(RouterConfig);

/// Checks the whole config and reports every error at once.
pub fn validate(cfg: RouterConfig) -> Result<ValidConfig, ConfigErrors> {
    let errors = super::validate::errors(&cfg);
    if errors.is_empty() {
        Ok(ValidConfig(cfg))
    } else {
        Err(ConfigErrors(errors))
    }
}

impl ValidConfig {
    pub fn into_inner(self) -> RouterConfig {
        self.0
    }
}

impl Deref for ValidConfig {
    type Target = RouterConfig;

    fn deref(&self) -> &RouterConfig {
        &self.0
    }
}
