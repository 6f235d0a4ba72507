//! Only a verified identity names a tenant, through real Envoy: with
//! `tenants.identity.source: api_key` a client is the tenant its key maps to,
//! whatever tenant header it types; no key or an unknown one gets a 401.
//! With `jwt`, Envoy's jwt_authn verifies the token (forged, expired or
//! missing: 401) and fleetroute charges the tenant its claim names.
#![cfg(feature = "e2e")] // needs Envoy and the built binaries: scripts/test.sh

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use fleetroute_tests::harness::client::{blocking_get, chat_body_tokens, post};
use fleetroute_tests::harness::scenario::{FAST_ENGINES, chat_url};
use fleetroute_tests::harness::{Lab, LabSpec, wait_until};
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const ENGINE: &str = env!("CARGO_BIN_EXE_fleetroute-engine");

fn router(identity: &str) -> String {
    format!(
        r#"
health_check: {{ interval_ms: 500, timeout_ms: 500, healthy_threshold: 1, unhealthy_threshold: 3 }}
fleets:
  - name: pool
    region: us
    endpoints: ["{{r1}}", "{{r2}}"]
stages:
  - name: chat
    models: [m1]
    fleets: [pool]
tenants:
  identity: {identity}
  named:
    acme: {{ tokens_per_minute: 100000 }}
    beta: {{ tokens_per_minute: 100000 }}
"#
    )
}

fn lab(router: &str) -> Lab {
    Lab::start(
        ENGINE,
        LabSpec {
            router,
            engine_args: FAST_ENGINES,
            ..Default::default()
        },
    )
}

fn admitted(lab: &Lab, tenant: &str) -> u64 {
    let (status, body) =
        blocking_get(&format!("{}/v1/tenant?name={tenant}", lab.admin)).expect("admin API");
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["usage"]["admitted"].as_u64().unwrap_or(0)
}

fn ask(lab: &Lab, headers: &[(&str, &str)]) -> fleetroute_tests::harness::client::Reply {
    post(
        &chat_url(lab),
        chat_body_tokens("m1", None, "Who am I?", false, 4),
        headers,
    )
}

fn sha256_hex(s: &str) -> String {
    Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn a_client_is_the_tenant_its_key_maps_to_whatever_it_types() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("api-keys");
    std::fs::write(
        &keys,
        format!(
            "# sha256 of each key, then its tenant\n{} acme\n{} beta\n",
            sha256_hex("sk-acme-1"),
            sha256_hex("sk-beta-1")
        ),
    )
    .unwrap();
    let lab = lab(&router(&format!(
        "{{ source: api_key, api_keys_file: '{}' }}",
        keys.display()
    )));
    // acme's key, naming beta in every way a client can type: charged to acme.
    for _ in 0..3 {
        let r = ask(
            &lab,
            &[
                ("authorization", "Bearer sk-acme-1"),
                ("x-tenant", "beta"),
                ("x-fleetroute-tenant", "beta"),
            ],
        );
        assert_eq!(r.status, 200, "{}", r.body);
    }
    lab.wait_settled();
    assert_eq!(admitted(&lab, "acme"), 3);
    assert_eq!(admitted(&lab, "beta"), 0, "a typed header named a tenant");
    let r = ask(&lab, &[("authorization", "bearer sk-beta-1")]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(admitted(&lab, "beta"), 1);
    // No key, an unknown key: 401, no fleet asked.
    for (headers, code) in [
        (vec![("x-tenant", "acme")], "missing_api_key"),
        (
            vec![("authorization", "Bearer sk-guess")],
            "invalid_api_key",
        ),
        (
            vec![
                ("authorization", "Basic c2stYWNtZS0x"),
                ("x-tenant", "acme"),
            ],
            "missing_api_key",
        ),
    ] {
        let r = ask(&lab, &headers);
        assert_eq!(r.status, 401, "{headers:?}: {}", r.body);
        assert_eq!(r.json()["error"]["code"], code, "{}", r.body);
        assert_eq!(r.header("www-authenticate"), Some("Bearer"));
        assert_eq!(r.header("x-served-by"), None);
    }
    assert_eq!(admitted(&lab, "acme"), 3);
    // A new key in the file (a rotated Secret) is taken without a restart,
    // and a key taken out of it stops working.
    std::fs::write(&keys, format!("{} beta\n", sha256_hex("sk-beta-2"))).unwrap();
    wait_until("the new key file", Duration::from_secs(10), || {
        ask(&lab, &[("authorization", "Bearer sk-beta-2")]).status == 200
    });
    let r = ask(&lab, &[("authorization", "Bearer sk-acme-1")]);
    assert_eq!(r.status, 401, "{}", r.body);
}

/// An HS256 token signed with `secret`.
fn sign(secret: &[u8], claims: &Value) -> String {
    let header = B64.encode(json!({"alg": "HS256", "typ": "JWT", "kid": "k1"}).to_string());
    let payload = B64.encode(claims.to_string());
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).unwrap();
    mac.update(format!("{header}.{payload}").as_bytes());
    format!(
        "{header}.{payload}.{}",
        B64.encode(mac.finalize().into_bytes())
    )
}

#[test]
fn a_verified_token_names_the_tenant_and_a_bad_one_gets_a_401() {
    let secret = b"fleetroute-e2e-signing-secret-0123456789";
    let dir = tempfile::tempdir().unwrap();
    let jwks = dir.path().join("jwks.json");
    std::fs::write(
        &jwks,
        json!({"keys": [{"kty": "oct", "alg": "HS256", "kid": "k1", "k": B64.encode(secret)}]})
            .to_string(),
    )
    .unwrap();
    let lab = lab(&router(&format!(
        "{{ source: jwt, jwt: {{ issuer: https://issuer.example, audiences: [llm], jwks_file: '{}', claim: org }} }}",
        jwks.display()
    )));
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = |org: Option<&str>, exp: u64| {
        let mut c = json!({"iss": "https://issuer.example", "aud": "llm", "sub": "u1", "exp": exp});
        if let Some(o) = org {
            c["org"] = json!(o);
        }
        c
    };
    let bearer = |t: &str| format!("Bearer {t}");
    let good = sign(secret, &claims(Some("acme"), now + 600));
    let r = ask(
        &lab,
        &[("authorization", &bearer(&good)), ("x-tenant", "beta")],
    );
    assert_eq!(r.status, 200, "{}", r.body);
    lab.wait_settled();
    assert_eq!(admitted(&lab, "acme"), 1);
    assert_eq!(admitted(&lab, "beta"), 0);

    let forged = sign(
        b"another-secret-of-the-same-length-here",
        &claims(Some("beta"), now + 600),
    );
    let expired = sign(secret, &claims(Some("beta"), now - 600));
    let no_org = sign(secret, &claims(None, now + 600));
    for (headers, what) in [
        (vec![("authorization", bearer(&forged))], "forged"),
        (vec![("authorization", bearer(&expired))], "expired"),
        (vec![("x-tenant", "beta".to_string())], "missing"),
    ] {
        let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let r = ask(&lab, &h);
        assert_eq!(r.status, 401, "{what}: {}", r.body);
        assert!(r.body.starts_with("Jwt "), "{what}: {}", r.body);
        assert_eq!(r.header("x-served-by"), None);
    }
    // Verified, but naming no tenant: fleetroute's own 401.
    let r = ask(&lab, &[("authorization", &bearer(&no_org))]);
    assert_eq!(r.status, 401, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "tenant_claim_missing");
    assert_eq!(admitted(&lab, "beta"), 0);
}
