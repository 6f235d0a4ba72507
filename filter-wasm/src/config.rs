//! Plugin configuration: the JSON in the Envoy YAML's `configuration` field.

use serde::Deserialize;

use crate::contract::{INTERNAL_PREFIX, MAX_BLOCKS};

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FilterConfig {
    /// Request paths whose JSON bodies are read. Anything else passes untouched
    /// (internal headers are still stripped).
    pub paths: Vec<String>,
    /// `GET` path of the model list, which ext-proc answers (none: every
    /// `GET` goes to a fleet like any request).
    pub models_path: Option<String>,
    /// Largest body the filter reads; a larger one gets a 413 JSON error. Keep it
    /// at or below the route's `request_body_buffer_limit`.
    pub max_body_bytes: usize,
    /// Request-body bytes that Envoy may hold, per worker, for requests this
    /// filter pauses to read; past it new bodies get a 503 JSON error
    /// (`overloaded`). At least `max_body_bytes`.
    pub max_buffered_bytes_per_worker: u64,
    /// Prompt bytes per prefix block (about 4 bytes per token).
    pub block_bytes: usize,
    /// Most blocks hashed per prompt; the tail of longer prompts is not indexed.
    pub max_blocks: usize,
    /// Client header carrying a residency (comma-separated regions), if any.
    pub residency_header: Option<String>,
    /// Client header naming the tenant, trusted as such: set only when a
    /// gateway in front writes it (router config `tenants.identity.source:
    /// header`). Unset: no header names a tenant.
    pub tenant_header: Option<String>,
    /// Hand on the SHA-256 of the client's bearer token (router config
    /// `tenants.identity.source: api_key`, which maps it to a tenant).
    pub api_key_hash: bool,
}

impl Default for FilterConfig {
    fn default() -> Self {
        FilterConfig {
            paths: vec!["/v1/chat/completions".into(), "/v1/completions".into()],
            models_path: Some("/v1/models".into()),
            max_body_bytes: 1 << 20,
            max_buffered_bytes_per_worker: 256 << 20,
            block_bytes: 1024,
            max_blocks: 256,
            residency_header: Some("x-residency".into()),
            tenant_header: None,
            api_key_hash: false,
        }
    }
}

/// Largest per-worker body budget (16 GiB): well past any worker's memory.
const MAX_BUFFERED_BYTES: u64 = 16 << 30;

/// Bytes per token used for every token estimate from text.
pub const BYTES_PER_TOKEN: usize = 4;

impl FilterConfig {
    /// Parses and validates; the error names the offending field.
    pub fn parse(json: &[u8]) -> Result<Self, String> {
        let cfg: FilterConfig = if json.iter().all(u8::is_ascii_whitespace) {
            FilterConfig::default()
        } else {
            serde_json::from_slice(json).map_err(|e| format!("plugin configuration: {e}"))?
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), String> {
        if self.paths.is_empty() {
            return Err("paths: must list at least one path".into());
        }
        for (i, p) in self.paths.iter().enumerate() {
            if !p.starts_with('/') {
                return Err(format!("paths[{i}]: '{p}' must start with '/'"));
            }
        }
        if let Some(p) = &self.models_path
            && !p.starts_with('/')
        {
            return Err(format!("models_path: '{p}' must start with '/'"));
        }
        if self.max_body_bytes == 0 || self.max_body_bytes > 64 << 20 {
            return Err("max_body_bytes: must be between 1 and 67108864".into());
        }
        let min_budget = self.max_body_bytes as u64;
        if !(min_budget..=MAX_BUFFERED_BYTES).contains(&self.max_buffered_bytes_per_worker) {
            return Err(format!(
                "max_buffered_bytes_per_worker: must be between max_body_bytes ({min_budget}) and {MAX_BUFFERED_BYTES}"
            ));
        }
        if self.block_bytes < 16 || !self.block_bytes.is_multiple_of(BYTES_PER_TOKEN) {
            return Err(format!(
                "block_bytes: must be a multiple of {BYTES_PER_TOKEN} and at least 16"
            ));
        }
        if self.max_blocks == 0 || self.max_blocks > MAX_BLOCKS {
            return Err(format!("max_blocks: must be between 1 and {MAX_BLOCKS}"));
        }
        for (field, value) in [
            ("residency_header", &self.residency_header),
            ("tenant_header", &self.tenant_header),
        ] {
            if let Some(h) = value {
                check_client_header(field, h)?;
            }
        }
        Ok(())
    }

    pub fn block_tokens(&self) -> usize {
        self.block_bytes / BYTES_PER_TOKEN
    }
}

fn check_client_header(field: &str, name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if !valid {
        return Err(format!(
            "{field}: '{name}' must be a lowercase HTTP header name"
        ));
    }
    if name.starts_with(INTERNAL_PREFIX) {
        return Err(format!(
            "{field}: '{name}' uses the internal prefix '{INTERNAL_PREFIX}', which clients may never set"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_configuration_is_the_default() {
        assert_eq!(FilterConfig::parse(b"").unwrap(), FilterConfig::default());
        assert_eq!(FilterConfig::parse(b"{}").unwrap(), FilterConfig::default());
    }

    #[test]
    fn errors_name_the_field() {
        let cases: &[(&str, &str)] = &[
            (r#"{"max_blocks": 0}"#, "max_blocks"),
            (r#"{"block_bytes": 10}"#, "block_bytes"),
            (r#"{"paths": ["v1/x"]}"#, "paths[0]"),
            (r#"{"models_path": "v1/models"}"#, "models_path"),
            (r#"{"tenant_header": "X-Tenant"}"#, "tenant_header"),
            (
                r#"{"residency_header": "x-fleetroute-residency"}"#,
                "residency_header",
            ),
            (r#"{"max_body_byte": 10}"#, "max_body_byte"),
            (
                r#"{"max_body_bytes": 2048, "max_buffered_bytes_per_worker": 1024}"#,
                "max_buffered_bytes_per_worker",
            ),
            (
                r#"{"max_buffered_bytes_per_worker": 17179869185}"#,
                "max_buffered_bytes_per_worker",
            ),
            (r#"{"max_body_bytes": "big"}"#, "plugin configuration"),
        ];
        for (json, field) in cases {
            let err = FilterConfig::parse(json.as_bytes()).unwrap_err();
            assert!(err.contains(field), "{json}: {err}");
        }
    }
}
