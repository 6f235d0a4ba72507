//! A fleet's own model name and key: the plain list keeps working, the map
//! form and `credentials` are checked with their field paths, and a key that
//! cannot be read stops the config (at start and on every reload).

use crate::config::{RouterConfig, StageFleet};

fn config(fleet_extra: &str, stage_fleets: &str, stage_extra: &str) -> String {
    format!(
        r#"
grpc: {{ trusted_network: true }}
fleets:
  - {{ name: base, region: us, endpoints: ["10.0.0.1:8000"] }}
  - {{ name: burst, region: us, endpoints: ["10.0.1.1:8000"]{fleet_extra} }}
stages:
  - name: chat
    models: [llama]
    fleets: {stage_fleets}
{stage_extra}"#
    )
}

fn errors(yaml: &str) -> Vec<String> {
    match RouterConfig::parse_valid(yaml) {
        Ok(_) => vec![],
        Err(e) => e.0.iter().map(|e| e.to_string()).collect(),
    }
}

fn expect(yaml: &str, want: &str) {
    let got = errors(yaml);
    assert!(
        got.iter().any(|g| g.starts_with(want)),
        "want {want:?}, got {got:?}"
    );
}

#[test]
fn a_fleet_may_serve_the_model_under_its_own_name() {
    let cfg = RouterConfig::parse_valid(&config(
        "",
        "[base, { name: burst, model: meta-llama/Llama-3.1-70B-Instruct }]",
        "",
    ))
    .unwrap();
    assert_eq!(cfg.stages[0].fleets[0], StageFleet::named("base"));
    assert_eq!(
        cfg.stages[0].fleets[1].model.as_deref(),
        Some("meta-llama/Llama-3.1-70B-Instruct")
    );
    // The plain list still reads, and the map form without a model too.
    assert_eq!(
        errors(&config("", "[base, burst]", "")),
        Vec::<String>::new()
    );
    assert_eq!(
        errors(&config("", "[{ name: base }, burst]", "")),
        Vec::<String>::new()
    );
}

#[test]
fn stage_fleet_errors_name_their_path() {
    for (stage_fleets, want) in [
        (
            "[base, { name: burst, model: 'has space' }]",
            "stages[0].fleets[1].model: 'has space' must be 1-256 printable ASCII",
        ),
        (
            "[base, { name: burst, model: 'a|b' }]",
            "stages[0].fleets[1].model:",
        ),
        (
            "[base, { name: burst, modle: x }]",
            "stages[0].fleets[1]: unknown field `modle`",
        ),
        (
            "[base, { model: x }]",
            "stages[0].fleets[1]: missing field `name`",
        ),
        (
            "[base, { name: nope, model: x }]",
            "stages[0].fleets[1]: unknown fleet 'nope'",
        ),
    ] {
        expect(&config("", stage_fleets, ""), want);
    }
}

#[test]
fn credentials_are_read_and_their_errors_name_the_field() {
    let key = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(key.path(), "sk-burst\n").unwrap();
    let good = format!(
        ", credentials: {{ api_key_file: '{}' }}",
        key.path().display()
    );
    let cfg = RouterConfig::parse_valid(&config(&good, "[base, burst]", "")).unwrap();
    assert_eq!(
        cfg.key(1).map(|k| k.authorization()),
        Some(&b"Bearer sk-burst"[..])
    );
    assert!(cfg.key(0).is_none());

    for (credentials, want) in [
        (
            "{ api_key_file: /nonexistent/key }",
            "fleets[1].credentials.api_key_file: cannot read '/nonexistent/key'",
        ),
        (
            "{ api_key_env: FLEETROUTE_NO_SUCH_VAR }",
            "fleets[1].credentials.api_key_env: environment variable 'FLEETROUTE_NO_SUCH_VAR' is not set",
        ),
        (
            "{}",
            "fleets[1].credentials: set exactly one of api_key_file, api_key_env",
        ),
        (
            "{ api_key: sk-inline }",
            "fleets[1].credentials: unknown field `api_key`",
        ),
    ] {
        let fleet_extra = format!(", credentials: {credentials}");
        expect(&config(&fleet_extra, "[base, burst]", ""), want);
    }
    // A key goes only to routing calls from an authenticated peer.
    let open = config(&good, "[base, burst]", "").replace("grpc: { trusted_network: true }\n", "");
    expect(
        &open,
        "fleets[1].credentials: a fleet's key is attached only to routing calls from an authenticated peer",
    );
    // A mirror would carry someone else's Authorization to it.
    expect(
        &config(
            &good,
            "[base]",
            "    experiment: { shadow: { fleet: burst, percent: 5 } }\n",
        ),
        "stages[0].experiment.shadow.fleet: fleet 'burst' has credentials",
    );
}

#[test]
fn only_a_config_that_will_route_reads_the_keys() {
    let yaml = config(
        ", credentials: { api_key_file: /nonexistent/key }",
        "[base, burst]",
        "",
    );
    // `fleetroute bootstrap` renders Envoy's config, which holds no key.
    assert!(RouterConfig::parse(&yaml).is_ok());
    assert!(RouterConfig::parse_valid(&yaml).is_err());
}
