//! The generated references in docs/reference/ are what `fleetroute
//! reference` prints now: a metric or an argument added, renamed or
//! redescribed without `scripts/reference.sh` fails here.
//! `UPDATE_REFERENCE=1` writes them instead (what the script does).
#![allow(clippy::unwrap_used)] // test code says what it expects

use std::path::PathBuf;
use std::process::Command;

fn generated(page: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_fleetroute"))
        .args(["reference", page])
        .output()
        .expect("fleetroute reference");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

fn check(page: &str, file: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../docs/reference")
        .join(file);
    let now = generated(page);
    if std::env::var_os("UPDATE_REFERENCE").is_some() {
        std::fs::write(&path, &now).expect("write the reference");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == now,
        "{} is stale: run scripts/reference.sh",
        path.display()
    );
}

#[test]
fn the_config_reference_is_current() {
    check("config", "router-config-fields.md");
}

#[test]
fn the_metrics_reference_is_current() {
    check("metrics", "metrics.md");
}

#[test]
fn the_cli_reference_is_current() {
    check("cli", "cli.md");
}
