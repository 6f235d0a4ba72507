//! Every Envoy YAML in the repository passes `envoy --mode validate` (which
//! also loads the Wasm filter and runs its configuration check).
#![cfg(feature = "e2e")] // needs Envoy and the built binaries: scripts/test.sh

use std::path::{Path, PathBuf};
use std::process::Command;

use fleetroute_tests::harness::Binaries;

const ENGINE: &str = env!("CARGO_BIN_EXE_fleetroute-engine");

fn envoy_yamls(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let p = entry.path();
        if p.is_dir() {
            envoy_yamls(&p, out);
        } else if p.extension().is_some_and(|e| e == "yaml" || e == "yml")
            && std::fs::read_to_string(&p)
                .unwrap_or_default()
                .contains("static_resources:")
        {
            out.push(p);
        }
    }
}

fn validate(text: &str, name: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("envoy.yaml");
    std::fs::write(&path, text).unwrap();
    let out = Command::new("envoy")
        .args(["--mode", "validate", "-c"])
        .arg(&path)
        .output()
        .unwrap_or_else(|e| panic!("envoy not runnable for {name}: {e}"));
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), log)
}

#[test]
fn every_envoy_yaml_validates() {
    let bins = Binaries::locate(ENGINE);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut files = Vec::new();
    envoy_yamls(&root.join("envoy-config"), &mut files);
    assert!(!files.is_empty());
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap().replace(
            "/etc/fleetroute/fleetroute_filter.wasm",
            bins.wasm.to_str().unwrap(),
        );
        let (ok, log) = validate(&text, &f.display().to_string());
        assert!(ok, "{} does not validate:\n{log}", f.display());
    }
}

/// What `fleetroute bootstrap` renders for the shipped router config, with
/// members by EDS (the default) and in the file (`--static-endpoints`),
/// failing open and closed.
#[test]
fn every_bootstrap_rendering_validates() {
    let bins = Binaries::locate(ENGINE);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    for flags in [
        &[][..],
        &["--static-endpoints"],
        &["--fail-closed"],
        &["--static-endpoints", "--fail-closed"],
    ] {
        let out = Command::new(&bins.fleetroute)
            .args(["bootstrap", "--config"])
            .arg(root.join("envoy-config/router.yaml"))
            .arg("--wasm")
            .arg(&bins.wasm)
            .args(flags)
            .output()
            .expect("fleetroute bootstrap");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        assert_eq!(
            text.contains("eds_cluster_config"),
            !flags.contains(&"--static-endpoints"),
            "{flags:?}"
        );
        let (ok, log) = validate(&text, &format!("bootstrap {flags:?}"));
        assert!(ok, "bootstrap {flags:?} does not validate:\n{log}");
    }
}

/// The filter refuses a bad plugin configuration, naming the field, and
/// Envoy refuses to start with it.
#[test]
fn a_bad_filter_configuration_stops_envoy() {
    let bins = Binaries::locate(ENGINE);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let text = std::fs::read_to_string(root.join("envoy-config/envoy.yaml"))
        .unwrap()
        .replace(
            "/etc/fleetroute/fleetroute_filter.wasm",
            bins.wasm.to_str().unwrap(),
        )
        .replace("\"max_blocks\": 256", "\"max_blocks\": 0");
    let (ok, log) = validate(&text, "bad filter config");
    assert!(!ok, "envoy accepted max_blocks 0");
    assert!(
        log.contains("max_blocks"),
        "the log does not name the field:\n{log}"
    );
}
