//! `grpc:` — who may call fleetroute's gRPC port (ext_proc, access log,
//! ADS/EDS, health). A routing call reads fleet keys and moves load, an
//! access log entry charges tenants and ejects replicas, an EDS stream
//! lists every member: only Envoy may make them.
//!
//! ```yaml
//! grpc:
//!   token_file: /etc/fleetroute/grpc-token   # or token_env: FLEETROUTE_GRPC_TOKEN
//! ```
//!
//! With a token every call must carry `authorization: Bearer <token>`
//! (Envoy's `GrpcService.initial_metadata`, which `fleetroute bootstrap`
//! writes), compared in constant time. `trusted_network: true` says instead
//! that something in front of the port already admits only Envoy (a mesh's
//! mutual TLS with an authorization policy, a NetworkPolicy, a private
//! network). Neither: fleetroute serves gRPC on loopback only, and attaches
//! no fleet key.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::credentials::read_secret;
use super::{ApiKey, ConfigError};

#[derive(Clone, Debug, Default, Deserialize, JsonSchema, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct GrpcConfig {
    /// File holding the token every gRPC call must carry (read again on
    /// every reload, so a rotated file takes effect then).
    pub token_file: Option<String>,
    /// Environment variable holding it, instead of a file.
    pub token_env: Option<String>,
    /// The network in front of the gRPC port admits only Envoy: fleetroute
    /// checks no token and may then listen beyond loopback.
    pub trusted_network: bool,
}

/// Shortest token accepted: guessing one must be out of reach.
pub const MIN_TOKEN_BYTES: usize = 16;

impl GrpcConfig {
    /// The `authorization` value calls must carry, when a token is set.
    pub fn token(&self) -> Result<Option<ApiKey>, ConfigError> {
        if self.token_file.is_none() && self.token_env.is_none() {
            return Ok(None);
        }
        let token = read_secret(
            self.token_file.as_deref(),
            self.token_env.as_deref(),
            "grpc",
            ["token_file", "token_env"],
        )?;
        let field = if self.token_file.is_some() {
            "grpc.token_file"
        } else {
            "grpc.token_env"
        };
        let err = |message: String| ConfigError {
            path: field.into(),
            message,
        };
        if token.len() < MIN_TOKEN_BYTES {
            return Err(err(format!(
                "the token is shorter than {MIN_TOKEN_BYTES} bytes (e.g. `openssl rand -hex 32`)"
            )));
        }
        // Envoy reads `%` in initial_metadata as the start of a formatter.
        if token.contains(&b'%') {
            return Err(err("the token must not contain '%'".into()));
        }
        Ok(Some(ApiKey::bearer(&token)))
    }

    /// Whether some peer check guards the port (a token, or the network).
    pub fn authenticated(&self) -> bool {
        self.token_file.is_some() || self.token_env.is_some() || self.trusted_network
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_file(text: &[u8]) -> (tempfile::NamedTempFile, GrpcConfig) {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        let c = GrpcConfig {
            token_file: Some(f.path().display().to_string()),
            ..GrpcConfig::default()
        };
        (f, c)
    }

    #[test]
    fn a_token_is_read_as_the_authorization_calls_carry() {
        let (_f, c) = with_file(b"0123456789abcdef0123\n");
        let t = c.token().unwrap().unwrap();
        assert_eq!(t.authorization(), b"Bearer 0123456789abcdef0123");
        assert!(c.authenticated());
        assert_eq!(GrpcConfig::default().token().unwrap(), None);
        assert!(!GrpcConfig::default().authenticated());
    }

    #[test]
    fn short_or_formatter_tokens_are_refused_by_field() {
        let (_f, c) = with_file(b"short");
        let e = c.token().unwrap_err();
        assert_eq!(e.path, "grpc.token_file");
        assert!(e.message.contains("shorter than 16"), "{e}");
        let (_f, c) = with_file(b"0123456789%abcdef");
        assert!(c.token().unwrap_err().message.contains("'%'"));
        let both = GrpcConfig {
            token_file: Some("/x".into()),
            token_env: Some("X".into()),
            trusted_network: false,
        };
        let e = both.token().unwrap_err();
        assert_eq!(
            e.to_string(),
            "grpc: set exactly one of token_file, token_env"
        );
    }
}
