//! Who a request's tenant is, by the source the router config names
//! (`tenants.identity`, see `config/identity.rs`): a key's hash looked up in
//! the clients' keys, a claim Envoy's `jwt_authn` verified (dynamic
//! metadata), a header a trusted gateway wrote, or no one. Whatever the
//! source, a tenant header a client typed names no one.

use std::borrow::Cow;

use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::google::protobuf::value::Kind;

use crate::config::{Identity, MAX_TENANT_ID_LEN};

/// Where Envoy's `jwt_authn` filter puts what it verified, and under which
/// key (its `payload_in_metadata`, which `fleetroute bootstrap` writes).
pub const JWT_NAMESPACE: &str = "envoy.filters.http.jwt_authn";
pub const JWT_PAYLOAD: &str = "payload";

/// Why a request has no tenant where one is required: a 401.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
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

/// The tenant by `id`'s source: the one the filter's trusted header named
/// (`from_header`) counts only when it is the source; `key_hash` is the
/// filter's hash of the client's key.
pub fn tenant<'a>(
    id: &Identity,
    from_header: Cow<'a, str>,
    key_hash: Option<&str>,
    metadata: Option<&'a Metadata>,
) -> Result<Cow<'a, str>, Unidentified> {
    Ok(match id {
        Identity::None => Cow::Borrowed(""),
        Identity::Header => from_header,
        Identity::ApiKey(keys) => {
            let hash = key_hash.ok_or(Unidentified::MissingKey)?;
            let tenant = keys.tenant(hash).ok_or(Unidentified::UnknownKey)?;
            Cow::Owned(tenant.to_string())
        }
        Identity::Jwt { claim } => Cow::Borrowed(jwt_claim(metadata, claim)?),
    })
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
    use crate::config::ApiKeys;
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

    /// The tenant `id` names for a request whose filter wrote `tenant` and
    /// `hash`.
    fn named<'a>(
        id: &Identity,
        tenant: &'a str,
        hash: Option<&str>,
        metadata: Option<&'a Metadata>,
    ) -> Result<Cow<'a, str>, Unidentified> {
        super::tenant(id, Cow::Borrowed(tenant), hash, metadata)
    }

    #[test]
    fn only_the_configured_source_names_the_tenant() {
        assert_eq!(
            named(&Identity::None, "typed-by-client", None, None).unwrap(),
            ""
        );
        assert_eq!(
            named(&Identity::Header, "from-gateway", None, None).unwrap(),
            "from-gateway"
        );
        let claims = Identity::Jwt {
            claim: "org".into(),
        };
        let meta = jwt(&[("org", "acme"), ("sub", "u1")]);
        assert_eq!(
            named(&claims, "beta", None, Some(&meta)).unwrap(),
            "acme",
            "the claim wins over a typed header"
        );
        assert_eq!(
            named(&claims, "beta", None, None),
            Err(Unidentified::NoClaim)
        );
        let no_org = jwt(&[("sub", "u1")]);
        assert_eq!(
            named(&claims, "beta", None, Some(&no_org)),
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
        assert_eq!(named(&id, "beta", Some(test), None).unwrap(), "acme");
        let other = "0".repeat(64);
        assert_eq!(
            named(&id, "acme", Some(&other), None),
            Err(Unidentified::UnknownKey)
        );
        assert_eq!(
            named(&id, "acme", None, None),
            Err(Unidentified::MissingKey)
        );
    }
}
