//! Loading and validating the router config. Every error names its field path,
//! e.g. `stages[1].routing.order[0]: unknown fleet 'h200-bust'`.

mod envoy;
mod model;
mod validate;

use std::fmt;
use std::path::Path;

pub use envoy::*;
pub use model::*;

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

impl RouterConfig {
    /// Parses and validates YAML text.
    pub fn parse(text: &str) -> Result<Self, ConfigErrors> {
        // serde_yaml's message already starts with the field path and ends with
        // the line and column.
        let cfg: RouterConfig = serde_yaml::from_str(text).map_err(|e| {
            ConfigErrors(vec![ConfigError {
                path: String::new(),
                message: e.to_string(),
            }])
        })?;
        let errors = validate::validate(&cfg);
        if errors.is_empty() {
            Ok(cfg)
        } else {
            Err(ConfigErrors(errors))
        }
    }

    /// Validates a config built or edited in code.
    pub fn check(&self) -> Result<(), ConfigErrors> {
        let errors = validate::validate(self);
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ConfigErrors(errors))
        }
    }

    pub fn load(path: &Path) -> Result<Self, ConfigErrors> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigErrors(vec![ConfigError {
                path: String::new(),
                message: format!("cannot read {}: {e}", path.display()),
            }])
        })?;
        Self::parse(&text)
    }
}
