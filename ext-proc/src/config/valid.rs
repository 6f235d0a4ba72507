//! A config that passed validation. Only `validate` makes one, so code that
//! holds a `ValidConfig` may rely on what validation proves (names resolve,
//! at most 64 replicas per fleet, bounds in range, every fleet's credentials
//! and the gRPC token were readable: they travel with it).

use std::ops::Deref;
use std::sync::Arc;

use super::{ApiKey, ApiKeys, ConfigErrors, RouterConfig, credentials};

#[derive(Clone, Debug)]
pub struct ValidConfig {
    cfg: RouterConfig,
    /// Parallel to `cfg.fleets`: each fleet's key, read from where its
    /// `credentials` point.
    keys: Arc<[Option<ApiKey>]>,
    /// The `authorization` every gRPC call must carry, read from where
    /// `grpc` points.
    grpc_token: Option<ApiKey>,
    /// `tenants.identity.source: api_key`: the clients' keys, read from
    /// `api_keys_file`.
    api_keys: Option<ApiKeys>,
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
        if f.credentials.is_some() && !cfg.grpc.authenticated() {
            errors.push(super::ConfigError {
                path: format!("fleets[{i}].credentials"),
                message: "a fleet's key is attached only to routing calls from an \
                          authenticated peer: set grpc.token_file (or grpc.token_env, or \
                          grpc.trusted_network)"
                    .into(),
            });
        }
    }
    let grpc_token = cfg.grpc.token().map_err(|e| errors.push(e)).ok().flatten();
    let api_keys = cfg
        .tenants
        .identity
        .load()
        .map_err(|e| errors.extend(e))
        .ok()
        .flatten();
    if errors.is_empty() {
        Ok(ValidConfig {
            cfg,
            keys: keys.into(),
            grpc_token,
            api_keys,
        })
    } else {
        Err(ConfigErrors(errors))
    }
}

impl ValidConfig {
    pub fn into_inner(self) -> RouterConfig {
        self.cfg
    }

    /// What every gRPC call must carry as `authorization`, when set.
    pub fn grpc_token(&self) -> Option<&ApiKey> {
        self.grpc_token.as_ref()
    }

    /// The clients' keys by hash, for `tenants.identity.source: api_key`.
    pub fn api_keys(&self) -> Option<&ApiKeys> {
        self.api_keys.as_ref()
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
