//! Loading and validating the router config. Every error names its field path,
//! e.g. `stages[1].routing.order[0]: unknown fleet 'h200-bust'`.

mod admission;
mod credentials;
mod defaults;
mod engine;
mod envoy;
mod experiment;
mod fallback;
mod grpc;
mod identity;
mod lora;
mod model;
pub mod model_list;
mod packing;
mod routing;
mod source;
mod stage_fleet;
mod tenants;
mod valid;
mod validate;

use std::fmt;
use std::path::Path;

pub use admission::*;
pub use credentials::{ApiKey, CredentialsConfig};
pub use defaults::{EXPLORATION, RESUME_BELOW, TOLERANCE};
pub use engine::{
    Engine, EngineApi, EngineMetricsConfig, HealthCheckConfig, MetricMap, MetricSelector,
};
pub use envoy::*;
pub use experiment::{AbTest, ExperimentConfig, Shadow, Variant};
pub use fallback::{Condition, FallbackConfig, blocks_retry, retry_cluster, retry_pairs};
pub use grpc::{GrpcConfig, MIN_TOKEN_BYTES};
pub use identity::{ApiKeys, Identity, IdentityConfig, IdentitySource, JwtConfig};
pub use lora::{LoraConfig, MAX_ADAPTERS_PER_STAGE};
pub use model::*;
pub use packing::{PackingConfig, PlacementConfig};
pub use routing::*;
pub use source::*;
pub use stage_fleet::StageFleet;
pub use tenants::*;
pub use valid::{ValidConfig, validate};
pub use validate::{check_tenant_id, client_header_name};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub path: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// All errors of one file, one per line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// yaml_serde writes `path: message at line L column C`, without the path at
/// the document's root; there the field the message names is the path.
/// Some syntax errors carry no position in their text: it is added.
fn yaml_error(e: &yaml_serde::Error) -> ConfigError {
    let mut text = e.to_string();
    if let Some(l) = e.location()
        && !text.contains(" at line ")
    {
        text = format!("{text} at line {} column {}", l.line(), l.column());
    }
    if let Some((path, message)) = text.split_once(": ")
        && !path.is_empty()
        && !path.contains(char::is_whitespace)
    {
        return ConfigError {
            path: path.to_string(),
            message: message.to_string(),
        };
    }
    let field = ["unknown field `", "missing field `", "duplicate field `"]
        .iter()
        .find_map(|p| text.strip_prefix(p))
        .and_then(|rest| {
            // The name itself may hold a backquote.
            let end = rest.find("`, expected").or_else(|| rest.rfind('`'))?;
            Some(&rest[..end])
        });
    ConfigError {
        path: field.unwrap_or_default().to_string(),
        message: text,
    }
}

impl RouterConfig {
    /// Parses and validates YAML text, without reading the fleets' keys
    /// (the config alone does not hold them: `fleetroute bootstrap` needs no
    /// key where it renders).
    pub fn parse(text: &str) -> Result<Self, ConfigErrors> {
        let cfg = Self::parse_unchecked(text)?;
        cfg.check()?;
        Ok(cfg)
    }

    /// Parses YAML text into a config only the validator can vouch for, with
    /// the fleets' keys read.
    pub fn parse_valid(text: &str) -> Result<ValidConfig, ConfigErrors> {
        validate(Self::parse_unchecked(text)?)
    }

    fn parse_unchecked(text: &str) -> Result<Self, ConfigErrors> {
        yaml_serde::from_str(text).map_err(|e| ConfigErrors(vec![yaml_error(&e)]))
    }

    /// Validates a config built or edited in code.
    pub fn check(&self) -> Result<(), ConfigErrors> {
        let errors = validate::errors(self);
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ConfigErrors(errors))
        }
    }

    /// Reads and validates a config file, without reading the fleets' keys.
    pub fn load(path: &Path) -> Result<Self, ConfigErrors> {
        Self::parse(&Self::read(path)?)
    }

    /// Reads and validates a config file, the fleets' keys included.
    pub fn load_valid(path: &Path) -> Result<ValidConfig, ConfigErrors> {
        Self::parse_valid(&Self::read(path)?)
    }

    fn read(path: &Path) -> Result<String, ConfigErrors> {
        std::fs::read_to_string(path).map_err(|e| {
            ConfigErrors(vec![ConfigError {
                path: String::new(),
                message: format!("cannot read {}: {e}", path.display()),
            }])
        })
    }
}
