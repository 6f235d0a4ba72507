//! The Envoy side of `tenants.identity`: what the Wasm filter hands on (a
//! trusted header's tenant, or the key's hash) and, for `jwt`, Envoy's own
//! `jwt_authn` filter that verifies tokens before anything reads the body,
//! with its verified payload forwarded to fleetroute's routing call.

use super::RenderError;
use serde_json::{Map, Value as Json};
use yaml_serde::Value;

use crate::config::{IdentitySource, RouterConfig};
use crate::tenancy::identity::{JWT_NAMESPACE, JWT_PAYLOAD};

/// The provider name in the rendered `jwt_authn` filter.
const PROVIDER: &str = "fleetroute";

/// The Wasm filter's configuration (its JSON) for this identity source:
/// `tenant_header` only for a trusted header, `api_key_hash` only for keys.
pub fn filter_configuration(json: &str, cfg: &RouterConfig) -> Result<String, RenderError> {
    let mut c: Map<String, Json> = serde_json::from_str(json)
        .map_err(|e| format!("template: the Wasm filter's configuration: {e}"))?;
    let id = &cfg.tenants.identity;
    c.remove("tenant_header");
    c.remove("api_key_hash");
    match id.source {
        IdentitySource::Header => {
            let h = id.header.clone().unwrap_or_default();
            c.insert("tenant_header".into(), Json::String(h));
        }
        IdentitySource::ApiKey => {
            c.insert("api_key_hash".into(), Json::Bool(true));
        }
        IdentitySource::None | IdentitySource::Jwt => {}
    }
    let mut text = serde_json::to_string_pretty(&c).map_err(|e| e.to_string())?;
    text.push('\n');
    Ok(text)
}

/// With `jwt`: the `jwt_authn` filter first in `filters` (it answers 401
/// for a token that is missing, forged, expired or for another audience),
/// and the routing ext_proc told to forward what it verified.
pub fn jwt(filters: &mut Vec<Value>, cfg: &RouterConfig) -> Result<(), RenderError> {
    let Some(j) = cfg
        .tenants
        .identity
        .jwt
        .as_ref()
        .filter(|_| cfg.tenants.identity.source == IdentitySource::Jwt)
    else {
        return Ok(());
    };
    let provider = serde_json::json!({
        "issuer": j.issuer,
        "audiences": j.audiences,
        "local_jwks": { "filename": j.jwks_file },
        "payload_in_metadata": JWT_PAYLOAD,
    });
    let filter = serde_json::json!({
        "name": JWT_NAMESPACE,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication",
            "providers": { PROVIDER: provider },
            "rules": [{ "match": { "prefix": "/" }, "requires": { "provider_name": PROVIDER } }],
        },
    });
    for f in filters.iter_mut() {
        let routing = f.get("name").and_then(Value::as_str) == Some("envoy.filters.http.ext_proc")
            && f.get("typed_config")
                .is_some_and(|t| t.get("observability_mode").is_none());
        if !routing {
            continue;
        }
        let tc = f
            .get_mut("typed_config")
            .and_then(Value::as_mapping_mut)
            .ok_or("template: the ext_proc filter has no typed_config")?;
        let options = tc
            .entry("metadata_options".into())
            .or_insert_with(|| Value::Mapping(Default::default()));
        let forwarding: Value = yaml_serde::from_str(&format!("{{ untyped: [{JWT_NAMESPACE}] }}"))
            .map_err(|e| e.to_string())?;
        options
            .as_mapping_mut()
            .ok_or("template: metadata_options is not a mapping")?
            .insert("forwarding_namespaces".into(), forwarding);
    }
    let filter: Value = yaml_serde::to_value(&filter).map_err(|e| e.to_string())?;
    filters.insert(0, filter);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::{BootstrapOptions, TEMPLATE, render};

    const ROUTER: &str = include_str!("../../../envoy-config/router.yaml");

    fn rendered(identity: &str) -> Value {
        let plain = ROUTER
            .split("\n# DEMO ONLY")
            .next()
            .expect("the shipped router config");
        let cfg =
            RouterConfig::parse(&format!("{plain}\ntenants:\n  identity: {identity}\n")).unwrap();
        let opts = BootstrapOptions {
            listen: crate::listen::ENVOY_LISTEN.parse().unwrap(),
            envoy_admin: crate::listen::ENVOY_ADMIN.parse().unwrap(),
            grpc: vec![crate::listen::GRPC.parse().unwrap()],
            wasm: "/x.wasm".into(),
            fail_closed: false,
            static_endpoints: false,
        };
        yaml_serde::from_str(&render(TEMPLATE, &cfg, &opts).unwrap()).unwrap()
    }

    fn filters(doc: &Value) -> Vec<Value> {
        doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
            ["http_filters"]
            .as_sequence()
            .unwrap()
            .clone()
    }

    fn wasm_config(doc: &Value) -> Json {
        let f = filters(doc)
            .into_iter()
            .find(|f| f["name"] == "envoy.filters.http.wasm")
            .unwrap();
        serde_json::from_str(
            f["typed_config"]["config"]["configuration"]["value"]
                .as_str()
                .unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn the_filter_hands_on_only_what_the_source_reads() {
        let keys = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(keys.path(), "").unwrap();
        let api = rendered(&format!(
            "{{ source: api_key, api_keys_file: '{}' }}",
            keys.path().display()
        ));
        assert_eq!(wasm_config(&api)["api_key_hash"], true);
        assert!(wasm_config(&api).get("tenant_header").is_none());
        let header = rendered("{ source: header, header: x-org }");
        assert_eq!(wasm_config(&header)["tenant_header"], "x-org");
        assert!(wasm_config(&header).get("api_key_hash").is_none());
        let none = rendered("{ source: none }");
        assert!(wasm_config(&none).get("tenant_header").is_none());
        assert!(wasm_config(&none).get("api_key_hash").is_none());
        assert!(filters(&none).iter().all(|f| f["name"] != JWT_NAMESPACE));
    }

    #[test]
    fn jwt_puts_verification_first_and_forwards_what_it_verified() {
        let jwks = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(jwks.path(), r#"{"keys":[]}"#).unwrap();
        let doc = rendered(&format!(
            "{{ source: jwt, jwt: {{ issuer: https://issuer.example, audiences: [llm], jwks_file: '{}', claim: org }} }}",
            jwks.path().display()
        ));
        let fs = filters(&doc);
        assert_eq!(
            fs[0]["name"], JWT_NAMESPACE,
            "verified before the body is read"
        );
        let p = &fs[0]["typed_config"]["providers"][PROVIDER];
        assert_eq!(p["issuer"], "https://issuer.example");
        assert_eq!(p["audiences"][0], "llm");
        assert_eq!(p["payload_in_metadata"], JWT_PAYLOAD);
        assert_eq!(
            p["local_jwks"]["filename"].as_str(),
            Some(jwks.path().to_str().unwrap())
        );
        assert_eq!(
            fs[0]["typed_config"]["rules"][0]["requires"]["provider_name"],
            PROVIDER
        );
        let ext_proc = fs
            .iter()
            .find(|f| f["name"] == "envoy.filters.http.ext_proc")
            .unwrap();
        assert_eq!(
            ext_proc["typed_config"]["metadata_options"]["forwarding_namespaces"]["untyped"][0],
            JWT_NAMESPACE
        );
        // Receiving namespaces stay as they were.
        assert!(ext_proc["typed_config"]["metadata_options"]["receiving_namespaces"].is_mapping());
    }
}
