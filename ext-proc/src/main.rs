use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use fleetroute::bootstrap::{BootstrapOptions, TEMPLATE, render};
use fleetroute::cli::{Client, fleet_percent, render_endpoint, render_metrics};
use fleetroute::config::RouterConfig;
use fleetroute::serve::{ServeOptions, serve};
use serde_json::{Value, json};

/// fleetroute: routes OpenAI-style inference requests across fleets of model
/// servers, as Envoy's ext_proc service.
#[derive(Parser)]
#[command(version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// How to reach a running fleetroute's admin API.
#[derive(Args)]
struct Admin {
    /// Admin API address.
    #[arg(
        long,
        env = "FLEETROUTE_ADMIN",
        default_value = "127.0.0.1:9190",
        global = true
    )]
    admin: String,
    /// Bearer token for changes (the one fleetroute serve was started with).
    #[arg(
        long,
        env = "FLEETROUTE_ADMIN_TOKEN",
        hide_env_values = true,
        global = true
    )]
    token: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Serve ext_proc (gRPC) and the admin API.
    Serve {
        /// Router config (fleets and stages).
        #[arg(long, short, env = "FLEETROUTE_CONFIG")]
        config: PathBuf,
        /// ext_proc gRPC listen address.
        #[arg(long, env = "FLEETROUTE_GRPC", default_value = "127.0.0.1:50051")]
        grpc: SocketAddr,
        /// Admin API listen address (metrics, readiness, changes).
        #[arg(long, env = "FLEETROUTE_ADMIN", default_value = "127.0.0.1:9190")]
        admin: SocketAddr,
        /// Bearer token that admin API changes must carry; without it the
        /// admin API is read-only.
        #[arg(long, env = "FLEETROUTE_ADMIN_TOKEN", hide_env_values = true)]
        admin_token: Option<String>,
        /// Envoy's admin address: its access log counters (entries written,
        /// dropped) are exported as fleetroute_envoy_access_log.
        #[arg(long, env = "FLEETROUTE_ENVOY_ADMIN")]
        envoy_admin: Option<SocketAddr>,
    },
    /// Validate a router config; prints every error with its field path.
    CheckConfig { file: PathBuf },
    /// Print an Envoy bootstrap for a router config: the fleet clusters, their
    /// members and the fail-open routes generated from it.
    Bootstrap {
        /// Router config (fleets and stages).
        #[arg(long, short)]
        config: PathBuf,
        /// Absolute path of fleetroute_filter.wasm.
        #[arg(long)]
        wasm: PathBuf,
        /// Envoy's listener for clients.
        #[arg(long, default_value = "127.0.0.1:10000")]
        listen: SocketAddr,
        /// Envoy's admin listener.
        #[arg(long, default_value = "127.0.0.1:9901")]
        envoy_admin: SocketAddr,
        /// Where fleetroute serves ext_proc.
        #[arg(long, default_value = "127.0.0.1:50051")]
        grpc: SocketAddr,
        /// Answer a JSON 503 when fleetroute is unreachable instead of failing open.
        #[arg(long)]
        fail_closed: bool,
    },
    /// A stage's routing: policy, weights, fleets, replica states, desired replicas.
    Endpoint {
        #[command(subcommand)]
        cmd: EndpointCmd,
    },
    /// A stage's figures: share of traffic, KV-cache hit rate, latency, cost.
    Metrics {
        stage: String,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        admin: Admin,
    },
    /// Change how a stage splits its traffic.
    Split {
        #[command(subcommand)]
        cmd: SplitCmd,
    },
    /// A fleet's host bounds (for the autoscaling signal).
    Fleet {
        #[command(subcommand)]
        cmd: FleetCmd,
    },
    /// Take a replica out of rotation without cutting in-flight requests.
    Replica {
        #[command(subcommand)]
        cmd: ReplicaCmd,
    },
    /// A stage's A/B test and shadow traffic.
    Experiment {
        #[command(subcommand)]
        cmd: ExperimentCmd,
    },
    /// Reload the router config file now (validated first).
    Reload {
        #[command(flatten)]
        admin: Admin,
    },
}

#[derive(Subcommand)]
enum EndpointCmd {
    Get {
        stage: String,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        admin: Admin,
    },
}

#[derive(Subcommand)]
enum SplitCmd {
    /// Set one fleet's weight; the others keep theirs. 0 takes the fleet out
    /// of the split and keeps it running.
    Set {
        stage: String,
        fleet: String,
        #[arg(long, allow_negative_numbers = true)]
        weight: f64,
        #[command(flatten)]
        admin: Admin,
    },
}

#[derive(Subcommand)]
enum FleetCmd {
    Scale {
        fleet: String,
        #[arg(long)]
        min: u32,
        #[arg(long)]
        max: u32,
        #[command(flatten)]
        admin: Admin,
    },
}

#[derive(Subcommand)]
enum ReplicaCmd {
    /// Stop new requests to HOST (ip:port); `--undo` puts it back.
    Drain {
        host: String,
        #[arg(long)]
        undo: bool,
        #[command(flatten)]
        admin: Admin,
    },
}

#[derive(Subcommand)]
enum ExperimentCmd {
    /// Set a stage's experiments (replaces the current ones).
    Set {
        stage: String,
        /// A/B control fleet.
        #[arg(long, requires = "variant")]
        control: Option<String>,
        /// A/B variant as FLEET=PERCENT (repeatable).
        #[arg(long, value_parser = fleet_percent)]
        variant: Vec<(String, f64)>,
        /// Shadow as FLEET=PERCENT.
        #[arg(long, value_parser = fleet_percent)]
        shadow: Option<(String, f64)>,
        #[command(flatten)]
        admin: Admin,
    },
    /// End a stage's A/B test and shadow.
    Clear {
        stage: String,
        #[command(flatten)]
        admin: Admin,
    },
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::CheckConfig { file } => match RouterConfig::load(&file) {
            Ok(cfg) => {
                println!(
                    "{}: ok ({} fleets, {} stages)",
                    file.display(),
                    cfg.fleets.len(),
                    cfg.stages.len()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{}: invalid router config\n{e}", file.display());
                ExitCode::from(1)
            }
        },
        Command::Bootstrap {
            config,
            wasm,
            listen,
            envoy_admin,
            grpc,
            fail_closed,
        } => bootstrap(
            config,
            wasm,
            BootstrapOptions {
                listen,
                envoy_admin,
                grpc,
                wasm: String::new(),
                fail_closed,
            },
        ),
        Command::Serve {
            config,
            grpc,
            admin,
            admin_token,
            envoy_admin,
        } => {
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| "info".into()),
                )
                .init();
            let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
            match rt.block_on(serve(ServeOptions {
                config,
                grpc,
                admin,
                admin_token,
                envoy_admin,
            })) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("fleetroute: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Command::Endpoint {
            cmd: EndpointCmd::Get { stage, json, admin },
        } => show(&admin, &stage, json, render_endpoint),
        Command::Metrics { stage, json, admin } => show(&admin, &stage, json, render_metrics),
        Command::Split {
            cmd:
                SplitCmd::Set {
                    stage,
                    fleet,
                    weight,
                    admin,
                },
        } => {
            // JSON cannot carry NaN or infinity; the service checks the rest.
            if !weight.is_finite() {
                eprintln!("fleetroute: weight {weight} must be a finite number >= 0");
                return ExitCode::from(2);
            }
            change(
                &admin,
                "/v1/split",
                json!({ "stage": stage, "fleet": fleet, "weight": weight }),
            )
        }
        Command::Fleet {
            cmd:
                FleetCmd::Scale {
                    fleet,
                    min,
                    max,
                    admin,
                },
        } => change(
            &admin,
            "/v1/scale",
            json!({ "fleet": fleet, "min": min, "max": max }),
        ),
        Command::Replica {
            cmd: ReplicaCmd::Drain { host, undo, admin },
        } => change(
            &admin,
            "/v1/drain",
            json!({ "replica": host, "drain": !undo }),
        ),
        Command::Experiment {
            cmd:
                ExperimentCmd::Set {
                    stage,
                    control,
                    variant,
                    shadow,
                    admin,
                },
        } => {
            let mut ex = json!({});
            if let Some(c) = control {
                let variants: Vec<Value> = variant
                    .iter()
                    .map(|(f, p)| json!({ "fleet": f, "percent": p }))
                    .collect();
                ex["ab"] = json!({ "control": c, "variants": variants });
            }
            if let Some((f, p)) = shadow {
                ex["shadow"] = json!({ "fleet": f, "percent": p });
            }
            change(
                &admin,
                "/v1/experiment",
                json!({ "stage": stage, "experiment": ex }),
            )
        }
        Command::Experiment {
            cmd: ExperimentCmd::Clear { stage, admin },
        } => change(
            &admin,
            "/v1/experiment",
            json!({ "stage": stage, "experiment": {} }),
        ),
        Command::Reload { admin } => change(&admin, "/v1/reload", json!({})),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn show(admin: &Admin, stage: &str, json: bool, render: fn(&Value) -> String) -> ExitCode {
    let client = Client::new(&admin.admin, admin.token.clone());
    match runtime().block_on(client.get("/v1/stage", &[("name", stage)])) {
        Ok(v) if json => {
            println!("{}", serde_json::to_string_pretty(&v).expect("json"));
            ExitCode::SUCCESS
        }
        Ok(v) => {
            print!("{}", render(&v));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("fleetroute: {e}");
            ExitCode::from(1)
        }
    }
}

fn change(admin: &Admin, path: &str, body: Value) -> ExitCode {
    let client = Client::new(&admin.admin, admin.token.clone());
    match runtime().block_on(client.post(path, body)) {
        Ok(v) => {
            println!("{}", v["applied"].as_str().unwrap_or("applied"));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("fleetroute: {e}");
            ExitCode::from(1)
        }
    }
}

fn bootstrap(config: PathBuf, wasm: PathBuf, mut opts: BootstrapOptions) -> ExitCode {
    let cfg = match RouterConfig::load(&config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{}: invalid router config\n{e}", config.display());
            return ExitCode::from(1);
        }
    };
    opts.wasm = match std::path::absolute(&wasm) {
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
