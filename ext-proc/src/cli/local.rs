//! The commands that need no running fleetroute: `check-config` and
//! `bootstrap`.

use std::path::Path;
use std::process::ExitCode;

use crate::bootstrap::{BootstrapOptions, TEMPLATE, render};
use crate::config::RouterConfig;

fn invalid(file: &Path, e: impl std::fmt::Display) -> ExitCode {
    eprintln!("{}: invalid router config\n{e}", file.display());
    ExitCode::from(1)
}

/// Validates a router config, the fleets' keys read as `serve` reads them;
/// prints every error with its field path.
pub fn check_config(file: &Path) -> ExitCode {
    match RouterConfig::load_valid(file).map_err(|e| invalid(file, e)) {
        Ok(cfg) => {
            println!(
                "{}: ok ({} fleets, {} stages)",
                file.display(),
                cfg.fleets.len(),
                cfg.stages.len()
            );
            ExitCode::SUCCESS
        }
        Err(code) => code,
    }
}

/// Prints the Envoy bootstrap for a router config; `wasm` is made absolute.
/// The fleets' keys are not read: Envoy's config holds none.
pub fn bootstrap(config: &Path, wasm: &Path, mut opts: BootstrapOptions) -> ExitCode {
    let cfg = match RouterConfig::load(config).map_err(|e| invalid(config, e)) {
        Ok(c) => c,
        Err(code) => return code,
    };
    opts.wasm = match std::path::absolute(wasm) {
        Ok(p) => p.display().to_string(),
        Err(e) => {
            eprintln!("--wasm {}: {e}", wasm.display());
            return ExitCode::from(1);
        }
    };
    match render(TEMPLATE, &cfg, &opts) {
        Ok(yaml) => {
            print!("{yaml}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("bootstrap: {e}");
            ExitCode::from(1)
        }
    }
}
