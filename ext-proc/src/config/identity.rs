//! `tenants.identity:` — where a request's tenant comes from. A tenant
//! spends a quota and a budget and has a priority class, so it is whoever a
//! verified credential says it is, never what a client types:
//!
//! ```yaml
//! tenants:
//!   identity:
//!     source: api_key                            # none | api_key | jwt | header
//!     api_keys_file: /etc/fleetroute/api-keys    # `<sha256 of the key, hex> <tenant>` per line
//! ```
//!
//! - `none` (the default): no request names a tenant; all count as one
//!   (`other`), under `tenants.default`.
//! - `api_key`: the filter hands on the SHA-256 of the client's bearer
//!   token; the file maps it to a tenant. No key, or one not in the file:
//!   401. The file holds no key, only hashes (`printf %s "$KEY" | sha256sum`),
//!   and is read again when it changes.
//! - `jwt`: Envoy's `jwt_authn` filter verifies the token (issuer,
//!   audiences, signature by a key of `jwks_file`, expiry) and answers 401
//!   itself; fleetroute reads the tenant from the verified `claim`.
//! - `header`: a gateway in front verified the client and wrote the tenant
//!   into `header`; only then is a header trusted to name one.

use schemars::JsonSchema;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::ConfigError;

#[derive(Clone, Copy, Debug, Default, Deserialize, JsonSchema, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum IdentitySource {
    #[default]
    None,
    ApiKey,
    Jwt,
    Header,
}

#[derive(Clone, Debug, Default, Deserialize, JsonSchema, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct IdentityConfig {
    /// What names a request's tenant: nothing (`none`), the client's API key, a verified JWT claim, or a header only a trusted gateway writes.
    pub source: IdentitySource,
    /// `api_key`: lines of `<sha256 hex of a key> <tenant>`.
    pub api_keys_file: Option<String>,
    /// `jwt`: what Envoy verifies and the claim that names the tenant.
    pub jwt: Option<JwtConfig>,
    /// `header`: the client header a trusted gateway in front writes.
    pub header: Option<String>,
}

#[derive(Clone, Debug, Deserialize, JsonSchema, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct JwtConfig {
    /// The `iss` a token must carry.
    pub issuer: String,
    /// Audiences a token may carry (`aud`); empty: any.
    #[serde(default)]
    pub audiences: Vec<String>,
    /// The issuer's public keys (a JWKS document) as a file Envoy reads.
    pub jwks_file: String,
    /// The claim whose string value is the tenant.
    #[serde(default = "default_claim")]
    pub claim: String,
}

fn default_claim() -> String {
    "tenant".into()
}

/// The identity source in effect, its keys read: what the request path
/// reads (`tenancy::identity::tenant`).
#[derive(Clone, Debug, Default)]
pub enum Identity {
    /// No request names a tenant.
    #[default]
    None,
    /// The filter's tenant header, written from a header a gateway set.
    Header,
    ApiKey(ApiKeys),
    Jwt {
        claim: String,
    },
}

impl Identity {
    pub fn of(cfg: &IdentityConfig, keys: Option<&ApiKeys>) -> Identity {
        match cfg.source {
            IdentitySource::None => Identity::None,
            IdentitySource::Header => Identity::Header,
            IdentitySource::ApiKey => Identity::ApiKey(keys.cloned().unwrap_or_default()),
            IdentitySource::Jwt => Identity::Jwt {
                claim: cfg
                    .jwt
                    .as_ref()
                    .map_or_else(String::new, |j| j.claim.clone()),
            },
        }
    }
}

/// The hashes of the clients' keys and their tenants.
#[derive(Clone, Default, PartialEq)]
pub struct ApiKeys(Arc<HashMap<[u8; 32], Arc<str>>>);

impl fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ApiKeys({} keys)", self.0.len())
    }
}

/// Largest key file read (about 150,000 keys).
const MAX_FILE_BYTES: u64 = 16 << 20;

impl ApiKeys {
    /// The tenant of a key given by its hash (64 lowercase hex digits).
    pub fn tenant(&self, hash_hex: &str) -> Option<&Arc<str>> {
        self.0.get(&decode_hash(hash_hex)?)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Reads `path`; errors are at `p` and name the line, never a hash.
    pub fn read(path: &str, p: &str) -> Result<ApiKeys, ConfigError> {
        let err = |message: String| ConfigError {
            path: p.into(),
            message,
        };
        let meta =
            std::fs::metadata(path).map_err(|e| err(format!("cannot read '{path}': {e}")))?;
        if meta.len() > MAX_FILE_BYTES {
            return Err(err(format!(
                "'{path}' is larger than {MAX_FILE_BYTES} bytes"
            )));
        }
        let text =
            std::fs::read_to_string(path).map_err(|e| err(format!("cannot read '{path}': {e}")))?;
        Self::parse(&text).map_err(|(line, why)| err(format!("'{path}' line {line}: {why}")))
    }

    fn parse(text: &str) -> Result<ApiKeys, (usize, String)> {
        let mut keys = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut words = line.split_whitespace();
            let (Some(hash), Some(tenant), None) = (words.next(), words.next(), words.next())
            else {
                return Err((i + 1, "expected `<sha256 hex> <tenant>`".into()));
            };
            let hash = decode_hash(&hash.to_ascii_lowercase())
                .ok_or((i + 1, "the hash is not 64 hex digits".to_string()))?;
            super::check_tenant_id(tenant).map_err(|e| (i + 1, e))?;
            if keys.insert(hash, Arc::from(tenant)).is_some() {
                return Err((i + 1, "this hash is listed twice".into()));
            }
        }
        Ok(ApiKeys(Arc::new(keys)))
    }
}

fn decode_hash(hex: &str) -> Option<[u8; 32]> {
    let b = hex.as_bytes();
    if b.len() != 64 {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; 32];
    for (o, pair) in out.iter_mut().zip(b.chunks_exact(2)) {
        *o = (digit(pair[0])? << 4) | digit(pair[1])?;
    }
    Some(out)
}

impl IdentityConfig {
    /// Checks the fields the source needs (and only those), and reads the
    /// key file of `api_key`.
    pub fn load(&self) -> Result<Option<ApiKeys>, Vec<ConfigError>> {
        const P: &str = "tenants.identity";
        let err = |field: &str, message: &str| ConfigError {
            path: format!("{P}.{field}"),
            message: message.into(),
        };
        let mut errors = Vec::new();
        let s = self.source;
        for (field, set, wanted) in [
            (
                "api_keys_file",
                self.api_keys_file.is_some(),
                IdentitySource::ApiKey,
            ),
            ("jwt", self.jwt.is_some(), IdentitySource::Jwt),
            ("header", self.header.is_some(), IdentitySource::Header),
        ] {
            if set && s != wanted {
                errors.push(err(field, "is read only with the source that uses it"));
            }
            if !set && s == wanted {
                errors.push(err(field, "is needed by this source"));
            }
        }
        if let Some(h) = &self.header
            && let Err(e) = super::client_header_name(h)
        {
            errors.push(err("header", &e));
        }
        if let Some(j) = &self.jwt {
            if j.issuer.trim().is_empty() {
                errors.push(err("jwt.issuer", "must not be empty"));
            }
            if j.claim.trim().is_empty() {
                errors.push(err("jwt.claim", "must not be empty"));
            }
            if let Err(e) = std::fs::metadata(&j.jwks_file) {
                errors.push(err(
                    "jwt.jwks_file",
                    &format!("cannot read '{}': {e}", j.jwks_file),
                ));
            }
        }
        let keys = match (&self.api_keys_file, s) {
            (Some(path), IdentitySource::ApiKey) => {
                match ApiKeys::read(path, &format!("{P}.api_keys_file")) {
                    Ok(k) => Some(k),
                    Err(e) => {
                        errors.push(e);
                        None
                    }
                }
            }
            _ => None,
        };
        if errors.is_empty() {
            Ok(keys)
        } else {
            Err(errors)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEST: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    #[test]
    fn a_key_file_maps_hashes_to_tenants_and_errors_name_the_line() {
        let k =
            ApiKeys::parse(&format!("# keys\n\n{TEST} acme\n{} beta\n", "0".repeat(64))).unwrap();
        assert_eq!(k.tenant(TEST).map(|t| &**t), Some("acme"));
        assert_eq!(k.tenant(&"0".repeat(64)).map(|t| &**t), Some("beta"));
        assert_eq!(k.tenant(&"1".repeat(64)), None);
        assert_eq!(k.tenant("test"), None);
        assert_eq!(format!("{k:?}"), "ApiKeys(2 keys)");
        // Upper-case hex in the file is read as the filter's lower case.
        let upper = ApiKeys::parse(&format!("{} acme", TEST.to_uppercase())).unwrap();
        assert!(upper.tenant(TEST).is_some());
        for (text, line, why) in [
            (TEST.to_string(), 1, "expected"),
            (format!("{TEST} a b"), 1, "expected"),
            ("abc acme".to_string(), 1, "64 hex"),
            (format!("\n{TEST} acme\n{TEST} beta"), 3, "twice"),
            (format!("{TEST} other"), 1, "reserved"),
        ] {
            let (l, w) = ApiKeys::parse(&text).unwrap_err();
            assert_eq!(l, line, "{text}");
            assert!(w.contains(why), "{text}: {w}");
        }
    }

    #[test]
    fn each_source_needs_its_fields_and_only_those() {
        let keys = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(keys.path(), format!("{TEST} acme\n")).unwrap();
        let path = keys.path().display().to_string();
        let api = IdentityConfig {
            source: IdentitySource::ApiKey,
            api_keys_file: Some(path.clone()),
            ..Default::default()
        };
        assert_eq!(api.load().unwrap().unwrap().len(), 1);
        let bare = IdentityConfig {
            source: IdentitySource::ApiKey,
            ..Default::default()
        };
        let e = bare.load().unwrap_err();
        assert_eq!(
            e[0].to_string(),
            "tenants.identity.api_keys_file: is needed by this source"
        );
        let stray = IdentityConfig {
            header: Some("x-tenant".into()),
            ..Default::default()
        };
        assert_eq!(
            stray.load().unwrap_err()[0].to_string(),
            "tenants.identity.header: is read only with the source that uses it"
        );
        let internal = IdentityConfig {
            source: IdentitySource::Header,
            header: Some("x-fleetroute-tenant".into()),
            ..Default::default()
        };
        assert!(internal.load().unwrap_err()[0].message.contains("reserved"));
        let jwt = IdentityConfig {
            source: IdentitySource::Jwt,
            jwt: Some(JwtConfig {
                issuer: "https://issuer".into(),
                audiences: vec![],
                jwks_file: "/nonexistent/jwks.json".into(),
                claim: "tenant".into(),
            }),
            ..Default::default()
        };
        assert_eq!(
            jwt.load().unwrap_err()[0].path,
            "tenants.identity.jwt.jwks_file"
        );
    }
}
