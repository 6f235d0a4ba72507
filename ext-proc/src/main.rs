use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use fleetroute::bootstrap::{BootstrapOptions, TEMPLATE, render};
use fleetroute::config::RouterConfig;
use fleetroute::serve::{ServeOptions, serve};

/// fleetroute: routes OpenAI-style inference requests across fleets of model
/// servers, as Envoy's ext_proc service.
#[derive(Parser)]
#[command(version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
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
        } => bootstrap(config, wasm, listen, envoy_admin, grpc, fail_closed),
        Command::Serve {
            config,
            grpc,
            admin,
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
            })) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("fleetroute: {e}");
                    ExitCode::from(1)
                }
            }
        }
    }
}

fn bootstrap(
    config: PathBuf,
    wasm: PathBuf,
    listen: SocketAddr,
    envoy_admin: SocketAddr,
    grpc: SocketAddr,
    fail_closed: bool,
) -> ExitCode {
    let cfg = match RouterConfig::load(&config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{}: invalid router config\n{e}", config.display());
            return ExitCode::from(1);
        }
    };
    let wasm = match std::path::absolute(&wasm) {
        Ok(p) => p.display().to_string(),
        Err(e) => {
            eprintln!("--wasm {}: {e}", wasm.display());
            return ExitCode::from(1);
        }
    };
    let opts = BootstrapOptions {
        listen,
        envoy_admin,
        grpc,
        wasm,
        fail_closed,
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
