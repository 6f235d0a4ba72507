//! A fleet's own API key, for fleets that are external providers: where the
//! config says to read it (never the key itself), and the key once read. It
//! is read whenever a config is validated (start, every reload and admin
//! change), so a rotated file or variable takes effect on reload. Neither the
//! key nor anything derived from it is ever printed: [`ApiKey`] shows as
//! `<redacted>`, and errors name the field, the file or the variable, never
//! what they hold.

use schemars::JsonSchema;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// `credentials: { api_key_file: PATH }` or `{ api_key_env: VAR }`.
#[derive(Clone, Debug, Default, Deserialize, JsonSchema, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CredentialsConfig {
    /// A file holding the key (read again on every reload).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_file: Option<String>,
    /// An environment variable holding the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
}

/// Longest key accepted (a header value).
const MAX_KEY_BYTES: usize = 4096;

/// The `Authorization` value a fleet's requests carry: `Bearer <key>`.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(Vec<u8>);

impl ApiKey {
    /// The header value, for the routing reply only.
    pub fn authorization(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// Reads the key `c` points at; errors are at `p` (`fleets[i].credentials`).
pub fn read(c: &CredentialsConfig, p: &str) -> Result<ApiKey, ConfigError> {
    let fields = ["api_key_file", "api_key_env"];
    let key = read_secret(
        c.api_key_file.as_deref(),
        c.api_key_env.as_deref(),
        p,
        fields,
    )?;
    Ok(ApiKey::bearer(&key))
}

impl ApiKey {
    /// `Bearer <key>`.
    pub(super) fn bearer(key: &[u8]) -> ApiKey {
        let mut v = b"Bearer ".to_vec();
        v.extend_from_slice(key);
        ApiKey(v)
    }
}

/// A secret from exactly one of a file and an environment variable, trimmed
/// and checked to travel in a header; errors are at `p`, naming the field
/// (`fields`: the file's and the variable's), never the secret.
pub(super) fn read_secret(
    file: Option<&str>,
    env: Option<&str>,
    p: &str,
    [file_field, env_field]: [&str; 2],
) -> Result<Vec<u8>, ConfigError> {
    let err = |field: &str, message: String| ConfigError {
        path: if field.is_empty() {
            p.to_string()
        } else {
            format!("{p}.{field}")
        },
        message,
    };
    let (field, raw) = match (file, env) {
        (Some(path), None) => (
            file_field,
            std::fs::read(path)
                .map_err(|e| err(file_field, format!("cannot read '{path}': {e}")))?,
        ),
        (None, Some(var)) => (
            env_field,
            std::env::var_os(var)
                .ok_or_else(|| {
                    err(
                        env_field,
                        format!("environment variable '{var}' is not set"),
                    )
                })?
                .into_encoded_bytes(),
        ),
        _ => {
            return Err(err(
                "",
                format!("set exactly one of {file_field}, {env_field}"),
            ));
        }
    };
    // A file usually ends with a newline; nothing else around the key counts.
    let key = raw.trim_ascii();
    if key.is_empty() {
        return Err(err(field, "the key is empty".into()));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(err(
            field,
            format!("the key is longer than {MAX_KEY_BYTES} bytes"),
        ));
    }
    if !key.iter().all(u8::is_ascii_graphic) {
        return Err(err(
            field,
            "the key must be printable ASCII without spaces (it travels in a header)".into(),
        ));
    }
    Ok(key.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &[u8]) -> (tempfile::NamedTempFile, CredentialsConfig) {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        let c = CredentialsConfig {
            api_key_file: Some(f.path().display().to_string()),
            api_key_env: None,
        };
        (f, c)
    }

    #[test]
    fn a_key_file_is_read_trimmed_and_never_shown() {
        let (_f, c) = file(b"sk-fleet-secret\n");
        let k = read(&c, "fleets[1].credentials").unwrap();
        assert_eq!(k.authorization(), b"Bearer sk-fleet-secret");
        assert!(!format!("{k:?}").contains("sk-fleet"), "{k:?}");
    }

    #[test]
    fn errors_name_the_field_and_never_the_key() {
        let p = "fleets[1].credentials";
        let missing = CredentialsConfig {
            api_key_file: Some("/nonexistent/fleetroute-key".into()),
            api_key_env: None,
        };
        let e = read(&missing, p).unwrap_err();
        assert_eq!(e.path, "fleets[1].credentials.api_key_file");
        assert!(e.message.contains("/nonexistent/fleetroute-key"), "{e}");
        let unset = CredentialsConfig {
            api_key_file: None,
            api_key_env: Some("FLEETROUTE_TEST_UNSET_KEY_VAR".into()),
        };
        let e = read(&unset, p).unwrap_err();
        assert_eq!(
            e.to_string(),
            "fleets[1].credentials.api_key_env: environment variable 'FLEETROUTE_TEST_UNSET_KEY_VAR' is not set"
        );
        let e = read(&CredentialsConfig::default(), p).unwrap_err();
        assert_eq!(e.path, p);
        for (text, why) in [
            (&b" \n"[..], "empty"),
            (b"sk bad key", "printable"),
            (b"sk-\xffsecret", "printable"),
        ] {
            let (_f, c) = file(text);
            let e = read(&c, p).unwrap_err();
            assert!(e.message.contains(why), "{e}");
            assert!(!e.to_string().contains("secret"), "{e}");
        }
    }
}
