//! Parses the command line and dispatches to the modules that do the work.

#![deny(clippy::too_many_lines, clippy::disallowed_methods)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, CommandFactory, Parser, Subcommand};
use fleetroute::bootstrap::BootstrapOptions;
use fleetroute::cli::tenants::{SetFlags, Setting, budget_arg, limit_arg, priority_arg};
use fleetroute::cli::{Target, View, commands, fleet_percent, local};
use fleetroute::config::{Budget, Priority};
use fleetroute::listen;
use fleetroute::serve::{self, ServeOptions};

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
        default_value = listen::ADMIN,
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

impl Admin {
    fn target(self) -> Target {
        Target {
            admin: self.admin,
            token: self.token,
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Serve ext_proc (gRPC) and the admin API.
    Serve {
        /// Router config (fleets and stages).
        #[arg(long, short, env = "FLEETROUTE_CONFIG")]
        config: PathBuf,
        /// ext_proc gRPC listen address.
        #[arg(long, env = "FLEETROUTE_GRPC", default_value = listen::GRPC)]
        grpc: SocketAddr,
        /// Admin API listen address (metrics, readiness, changes).
        #[arg(long, env = "FLEETROUTE_ADMIN", default_value = listen::ADMIN)]
        admin: SocketAddr,
        /// Bearer token that admin API changes must carry; without it the
        /// admin API is read-only.
        #[arg(long, env = "FLEETROUTE_ADMIN_TOKEN", hide_env_values = true)]
        admin_token: Option<String>,
        /// Envoy's admin address: its access log counters (entries written,
        /// dropped) are exported as fleetroute_envoy_access_log.
        #[arg(long, env = "FLEETROUTE_ENVOY_ADMIN")]
        envoy_admin: Option<SocketAddr>,
        /// This instance's name among several (1-64 of [A-Za-z0-9._-], e.g.
        /// the pod name); without it, a random one at each start.
        #[arg(long, env = "FLEETROUTE_INSTANCE_ID")]
        instance_id: Option<String>,
        /// On SIGTERM, how long to keep serving after readiness is withdrawn
        /// (Envoy moves its calls meanwhile); then the listeners and streams
        /// close, and the process exits at most 5 s later.
        #[arg(long, env = "FLEETROUTE_DRAIN_MS", default_value_t = 3000)]
        drain_ms: u64,
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
        #[arg(long, default_value = listen::ENVOY_LISTEN)]
        listen: SocketAddr,
        /// Envoy's admin listener.
        #[arg(long, default_value = listen::ENVOY_ADMIN)]
        envoy_admin: SocketAddr,
        /// Where fleetroute serves ext_proc; repeat for several instances
        /// (Envoy health-checks each and moves calls off a dead one).
        #[arg(long, default_value = listen::GRPC, action = clap::ArgAction::Append)]
        grpc: Vec<SocketAddr>,
        /// Answer a JSON 503 when fleetroute is unreachable instead of failing open.
        #[arg(long)]
        fail_closed: bool,
        /// Write the config's endpoints into the file (STATIC clusters)
        /// instead of having Envoy ask fleetroute for them (EDS): for a
        /// control plane that owns EDS itself (Istio).
        #[arg(long)]
        static_endpoints: bool,
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
    /// A tenant's limits, what it uses now and what it was charged.
    Tenant {
        #[command(subcommand)]
        cmd: TenantCmd,
    },
    /// Reload the router config file now (validated first).
    Reload {
        #[command(flatten)]
        admin: Admin,
    },
    /// Print a reference page in Markdown: every router config field, every
    /// metric, or the whole command line (docs/reference/ holds all three).
    Reference {
        #[arg(value_enum)]
        what: ReferencePage,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ReferencePage {
    Config,
    Metrics,
    Cli,
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
enum TenantCmd {
    /// Every tenant tracked (heaviest first), or one: limits, usage, budget left.
    Get {
        name: Option<String>,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        admin: Admin,
    },
    /// Change a tenant's limits (its named entry; made from the default
    /// limits when it has none). `none` makes a limit unlimited.
    Set {
        name: String,
        /// Requests in flight.
        #[arg(long, value_parser = limit_arg)]
        max_requests: Option<Setting<u64>>,
        /// Prompt + max_tokens of the requests in flight.
        #[arg(long, value_parser = limit_arg)]
        max_tokens: Option<Setting<u64>>,
        /// Prompt + completion tokens per minute.
        #[arg(long, value_parser = limit_arg)]
        tpm: Option<Setting<u64>>,
        /// USD/day or USD/month, e.g. 500/month.
        #[arg(long, value_parser = budget_arg)]
        budget: Option<Setting<Budget>>,
        /// critical, standard or sheddable.
        #[arg(long, value_parser = priority_arg)]
        priority: Option<Priority>,
        /// Drop the named entry: the default limits apply again.
        #[arg(long, conflicts_with_all = ["max_requests", "max_tokens", "tpm", "budget", "priority"])]
        remove: bool,
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
        Command::CheckConfig { file } => local::check_config(&file),
        Command::Bootstrap {
            config,
            wasm,
            listen,
            envoy_admin,
            grpc,
            fail_closed,
            static_endpoints,
        } => local::bootstrap(
            &config,
            &wasm,
            BootstrapOptions {
                listen,
                envoy_admin,
                grpc,
                wasm: String::new(),
                fail_closed,
                static_endpoints,
            },
        ),
        Command::Serve {
            config,
            grpc,
            admin,
            admin_token,
            envoy_admin,
            instance_id,
            drain_ms,
        } => serve::run(ServeOptions {
            config,
            grpc,
            admin,
            admin_token,
            envoy_admin,
            instance_id,
            drain: std::time::Duration::from_millis(drain_ms),
        }),
        Command::Reference { what } => {
            print!(
                "{}",
                match what {
                    ReferencePage::Config => fleetroute::reference::config(),
                    ReferencePage::Metrics => fleetroute::reference::metrics(),
                    ReferencePage::Cli => fleetroute::reference::cli(&Cli::command()),
                }
            );
            ExitCode::SUCCESS
        }
        admin => admin_command(admin),
    }
}

/// The commands that talk to a running instance's admin API.
fn admin_command(command: Command) -> ExitCode {
    match command {
        Command::Endpoint {
            cmd: EndpointCmd::Get { stage, json, admin },
        } => commands::show(&admin.target(), &stage, json, View::Endpoint),
        Command::Metrics { stage, json, admin } => {
            commands::show(&admin.target(), &stage, json, View::Metrics)
        }
        Command::Split {
            cmd:
                SplitCmd::Set {
                    stage,
                    fleet,
                    weight,
                    admin,
                },
        } => commands::split_set(&admin.target(), stage, fleet, weight),
        Command::Fleet {
            cmd:
                FleetCmd::Scale {
                    fleet,
                    min,
                    max,
                    admin,
                },
        } => commands::fleet_scale(&admin.target(), fleet, min, max),
        Command::Replica {
            cmd: ReplicaCmd::Drain { host, undo, admin },
        } => commands::replica_drain(&admin.target(), host, undo),
        Command::Experiment {
            cmd:
                ExperimentCmd::Set {
                    stage,
                    control,
                    variant,
                    shadow,
                    admin,
                },
        } => commands::experiment_set(&admin.target(), stage, control, variant, shadow),
        Command::Experiment {
            cmd: ExperimentCmd::Clear { stage, admin },
        } => commands::experiment_set(&admin.target(), stage, None, Vec::new(), None),
        Command::Tenant {
            cmd: TenantCmd::Get { name, json, admin },
        } => commands::tenant_get(&admin.target(), name.as_deref(), json),
        Command::Tenant {
            cmd:
                TenantCmd::Set {
                    name,
                    max_requests,
                    max_tokens,
                    tpm,
                    budget,
                    priority,
                    remove,
                    admin,
                },
        } => commands::tenant_set(
            &admin.target(),
            name,
            SetFlags {
                max_requests,
                max_tokens,
                tpm,
                budget,
                priority,
            },
            remove,
        ),
        Command::Reload { admin } => commands::reload(&admin.target()),
        Command::CheckConfig { .. }
        | Command::Bootstrap { .. }
        | Command::Serve { .. }
        | Command::Reference { .. } => unreachable!("run locally by main"),
    }
}
