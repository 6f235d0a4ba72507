//! The operator commands that talk to a running fleetroute: each takes its
//! parsed arguments, prints its answer and returns the exit status (0 done,
//! 1 refused or unreachable, 2 a value refused before sending).

use std::process::ExitCode;

use super::client::{CliError, Client};
use super::render::{render_endpoint, render_metrics};
use super::tenants::{SetFlags, render_tenant, render_tenants};
use crate::admin::api::{
    self, Applied, DrainRequest, ExperimentRequest, ScaleRequest, SplitRequest, StageView,
    TenantRequest,
};
use crate::config::{AbTest, ExperimentConfig, Shadow, Variant};

/// Where the admin API is, and the token for changes.
pub struct Target {
    pub admin: String,
    pub token: Option<String>,
}

impl Target {
    fn client(&self) -> Client {
        Client::new(&self.admin, self.token.clone())
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn fail(e: &CliError) -> ExitCode {
    eprintln!("fleetroute: {e}");
    ExitCode::from(match e {
        CliError::Usage(_) => 2,
        CliError::Api(_) => 1,
    })
}

/// How a stage view is printed.
#[derive(Clone, Copy, Debug)]
pub enum View {
    Endpoint,
    Metrics,
}

/// `endpoint get` and `metrics`: a table, or with `--json` the API's JSON.
pub fn show(target: &Target, stage: &str, json: bool, view: View) -> ExitCode {
    let stage: StageView = match runtime().block_on(target.client().stage(stage)) {
        Ok(s) => s,
        Err(e) => return fail(&e),
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&stage).expect("a view serialises")
        );
    } else {
        print!(
            "{}",
            match view {
                View::Endpoint => render_endpoint(&stage),
                View::Metrics => render_metrics(&stage),
            }
        );
    }
    ExitCode::SUCCESS
}

fn applied(result: Result<Applied, CliError>) -> ExitCode {
    match result {
        Ok(a) => {
            println!("{}", a.applied);
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}

pub fn split_set(target: &Target, stage: String, fleet: String, weight: f64) -> ExitCode {
    let body = SplitRequest {
        stage,
        fleet,
        weight,
    };
    applied(runtime().block_on(target.client().change(api::SPLIT, &body)))
}

pub fn fleet_scale(target: &Target, fleet: String, min: u32, max: u32) -> ExitCode {
    let body = ScaleRequest { fleet, min, max };
    applied(runtime().block_on(target.client().change(api::SCALE, &body)))
}

pub fn replica_drain(target: &Target, replica: String, undo: bool) -> ExitCode {
    let body = DrainRequest {
        replica,
        drain: !undo,
    };
    applied(runtime().block_on(target.client().change(api::DRAIN, &body)))
}

/// `experiment set` (replaces the stage's experiments) and, with neither an
/// A/B control nor a shadow, `experiment clear`.
pub fn experiment_set(
    target: &Target,
    stage: String,
    control: Option<String>,
    variants: Vec<(String, f64)>,
    shadow: Option<(String, f64)>,
) -> ExitCode {
    let experiment = ExperimentConfig {
        ab: control.map(|control| AbTest {
            control,
            variants: variants
                .into_iter()
                .map(|(fleet, percent)| Variant { fleet, percent })
                .collect(),
        }),
        shadow: shadow.map(|(fleet, percent)| Shadow { fleet, percent }),
    };
    let body = ExperimentRequest { stage, experiment };
    applied(runtime().block_on(target.client().change(api::EXPERIMENT, &body)))
}

/// `tenant get [NAME]`: one tenant, or every tenant tracked (heaviest first).
pub fn tenant_get(target: &Target, name: Option<&str>, json: bool) -> ExitCode {
    let rt = runtime();
    let client = target.client();
    let (text, value) = match name {
        Some(n) => match rt.block_on(client.tenant(n)) {
            Ok(v) => (render_tenant(&v), serde_json::to_value(&v)),
            Err(e) => return fail(&e),
        },
        None => match rt.block_on(client.tenants()) {
            Ok(v) => (render_tenants(&v), serde_json::to_value(&v)),
            Err(e) => return fail(&e),
        },
    };
    if json {
        let v = value.expect("a view serialises");
        println!("{}", serde_json::to_string_pretty(&v).expect("JSON"));
    } else {
        print!("{text}");
    }
    ExitCode::SUCCESS
}

/// `tenant set NAME ...` (`--remove` drops its named entry).
pub fn tenant_set(target: &Target, name: String, flags: SetFlags, remove: bool) -> ExitCode {
    let body = TenantRequest {
        name,
        limits: flags.patch(),
        remove,
    };
    applied(runtime().block_on(target.client().change(api::TENANT, &body)))
}

pub fn reload(target: &Target) -> ExitCode {
    applied(runtime().block_on(target.client().reload()))
}

/// Parses `FLEET=PERCENT`.
pub fn fleet_percent(s: &str) -> Result<(String, f64), String> {
    let (f, p) = s
        .split_once('=')
        .ok_or_else(|| format!("'{s}': expected FLEET=PERCENT"))?;
    let p: f64 = p
        .trim_end_matches('%')
        .parse()
        .map_err(|_| format!("'{s}': percent is not a number"))?;
    Ok((f.to_string(), p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fleet_percent_needs_both_parts() {
        assert_eq!(fleet_percent("burst=10").unwrap(), ("burst".into(), 10.0));
        assert_eq!(fleet_percent("burst=2.5%").unwrap(), ("burst".into(), 2.5));
        assert!(fleet_percent("burst").is_err());
        assert!(fleet_percent("burst=x").is_err());
    }
}
