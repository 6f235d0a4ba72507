//! The commands that need no running fleetroute: `check-config` and
//! `bootstrap`.

use std::path::Path;
use std::process::ExitCode;

use crate::bootstrap::{BootstrapOptions, TEMPLATE, render};
use crate::config::RouterConfig;

fn load(file: &Path) -> Result<RouterConfig, ExitCode> {
    RouterConfig::load(file).map_err(|e| {
        eprintln!("{}: invalid router config\n{e}", file.display());
        ExitCode::from(1)
    })
}

/// Validates a router config; prints every error with its field path.
pub fn check_config(file: &Path) -> ExitCode {
    match load(file) {
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
pub fn bootstrap(config: &Path, wasm: &Path, mut opts: BootstrapOptions) -> ExitCode {
    let cfg = match load(config) {
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
