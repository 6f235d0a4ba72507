//! Who a request's tenant is, by the source the router config names
//! (`tenants.identity`, see `config/identity.rs`): a key's hash looked up in
//! the clients' keys, a claim Envoy's `jwt_authn` verified (dynamic
//! metadata), a header a trusted gateway wrote, or no one. Whatever the
//! source, a tenant header a client typed names no one.

use std::borrow::Cow;

use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::google::protobuf::value::Kind;

use crate::config::{ApiKeys, IdentitySource, MAX_TENANT_ID_LEN, ValidConfig};
use crate::route::key::RouteKey;

/// Where Envoy's `jwt_authn` filter puts what it verified, and under which
/// key (its `payload_in_metadata`, which `fleetroute bootstrap` writes).
pub const JWT_NAMESPACE: &str = "envoy.filters.http.jwt_authn";
pub const JWT_PAYLOAD: &str = "payload";

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

/// Why a request has no tenant where one is required: a 401.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unidentified {
    /// No bearer token.
    MissingKey,
    /// A token whose hash is not among the clients' keys.
    UnknownKey,
    /// No verified token, or one without the tenant claim (a string).
    NoClaim,
}

impl Unidentified {
    pub fn code(self) -> &'static str {
        match self {
            Unidentified::MissingKey => "missing_api_key",
            Unidentified::UnknownKey => "invalid_api_key",
            Unidentified::NoClaim => "tenant_claim_missing",
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            Unidentified::MissingKey => {
                "this route needs an API key: send it as Authorization: Bearer <key>"
            }
            Unidentified::UnknownKey => "the API key is not known here",
            Unidentified::NoClaim => "the verified token names no tenant",
        }
    }
}

impl Identity {
    pub fn from_config(cfg: &ValidConfig) -> Identity {
        let id = &cfg.tenants.identity;
        match id.source {
            IdentitySource::None => Identity::None,
            IdentitySource::Header => Identity::Header,
            IdentitySource::ApiKey => Identity::ApiKey(cfg.api_keys().cloned().unwrap_or_default()),
            IdentitySource::Jwt => Identity::Jwt {
                claim: id
                    .jwt
                    .as_ref()
                    .map_or_else(String::new, |j| j.claim.clone()),
            },
        }
    }

    /// Sets `key.tenant` from this source; the header the filter wrote counts
    /// only when it is the source.
    pub fn apply<'a>(
        &self,
        key: &mut RouteKey<'a>,
        metadata: Option<&'a Metadata>,
    ) -> Result<(), Unidentified> {
        let from_header = std::mem::take(&mut key.tenant);
        key.tenant = match self {
            Identity::None => Cow::Borrowed(""),
            Identity::Header => from_header,
            Identity::ApiKey(keys) => {
                let hash = key.key_hash.ok_or(Unidentified::MissingKey)?;
                let tenant = keys.tenant(hash).ok_or(Unidentified::UnknownKey)?;
                Cow::Owned(tenant.to_string())
            }
            Identity::Jwt { claim } => Cow::Borrowed(jwt_claim(metadata, claim)?),
        };
        Ok(())
    }
}

/// The claim's string value in what `jwt_authn` verified.
fn jwt_claim<'a>(metadata: Option<&'a Metadata>, claim: &str) -> Result<&'a str, Unidentified> {
    let payload = metadata
        .and_then(|m| m.filter_metadata.get(JWT_NAMESPACE))
        .and_then(|s| s.fields.get(JWT_PAYLOAD))
        .and_then(|v| match &v.kind {
            Some(Kind::StructValue(s)) => Some(s),
            _ => None,
        })
        .ok_or(Unidentified::NoClaim)?;
    match payload.fields.get(claim).and_then(|v| v.kind.as_ref()) {
        Some(Kind::StringValue(t))
            if !t.is_empty()
                && t.len() <= MAX_TENANT_ID_LEN
                && t.bytes().all(|b| b.is_ascii_graphic()) =>
        {
            Ok(t)
        }
        _ => Err(Unidentified::NoClaim),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::google::protobuf::{Struct, Value};

    fn jwt(claims: &[(&str, &str)]) -> Metadata {
        let payload = Struct {
            fields: claims
                .iter()
                .map(|(k, v)| {
                    (
                        k.to_string(),
                        Value {
                            kind: Some(Kind::StringValue(v.to_string())),
                        },
                    )
                })
                .collect(),
        };
        let ns = Struct {
            fields: [(
                JWT_PAYLOAD.to_string(),
                Value {
                    kind: Some(Kind::StructValue(payload)),
                },
            )]
            .into(),
        };
        Metadata {
            filter_metadata: [(JWT_NAMESPACE.to_string(), ns)].into(),
            ..Default::default()
        }
    }

    fn key<'a>(tenant: &'a str, hash: Option<&'a str>) -> RouteKey<'a> {
        RouteKey {
            tenant: Cow::Borrowed(tenant),
            key_hash: hash,
            ..Default::default()
        }
    }

    #[test]
    fn only_the_configured_source_names_the_tenant() {
        let mut k = key("typed-by-client", None);
        Identity::None.apply(&mut k, None).unwrap();
        assert_eq!(k.tenant, "");
        let mut k = key("from-gateway", None);
        Identity::Header.apply(&mut k, None).unwrap();
        assert_eq!(k.tenant, "from-gateway");

        let claims = Identity::Jwt {
            claim: "org".into(),
        };
        let meta = jwt(&[("org", "acme"), ("sub", "u1")]);
        let mut k = key("beta", None);
        claims.apply(&mut k, Some(&meta)).unwrap();
        assert_eq!(k.tenant, "acme", "the claim wins over a typed header");
        let mut k = key("beta", None);
        assert_eq!(claims.apply(&mut k, None), Err(Unidentified::NoClaim));
        let no_org = jwt(&[("sub", "u1")]);
        assert_eq!(
            claims.apply(&mut k, Some(&no_org)),
            Err(Unidentified::NoClaim)
        );
    }

    #[test]
    fn a_key_names_its_tenant_and_an_unknown_or_missing_one_none() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("keys");
        // printf %s test | sha256sum
        let test = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        std::fs::write(&file, format!("{test} acme\n")).unwrap();
        let keys = ApiKeys::read(file.to_str().unwrap(), "k").unwrap();
        let id = Identity::ApiKey(keys);
        let mut k = key("beta", Some(test));
        id.apply(&mut k, None).unwrap();
        assert_eq!(k.tenant, "acme");
        let other = "0".repeat(64);
        let mut k = key("acme", Some(&other));
        assert_eq!(id.apply(&mut k, None), Err(Unidentified::UnknownKey));
        let mut k = key("acme", None);
        assert_eq!(id.apply(&mut k, None), Err(Unidentified::MissingKey));
    }
}
