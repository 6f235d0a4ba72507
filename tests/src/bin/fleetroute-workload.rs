//! Writes a generated trace (Mooncake format plus `system_blocks`) to stdout:
//! `chat` (multi-turn conversations behind one long shared system prompt),
//! `agent` (long shared tool prefixes, many short turns), `adapters` (LoRA
//! adapter requests of Zipf popularity, each line naming its `adapter`) or
//! `models` (requests for many models of Zipf demand swinging through a
//! day, each line naming its `model`).
//! Seeded: the same arguments give the same trace.

use clap::{Parser, ValueEnum};
use fleetroute_tests::replay::adapter_workload::{self, AdapterParams};
use fleetroute_tests::replay::model_workload::{self, ModelParams};
use fleetroute_tests::replay::workload::{Kind, Params, generate};

#[derive(Clone, Copy, ValueEnum)]
enum Workload {
    Chat,
    Agent,
    Adapters,
    Models,
}

#[derive(Parser)]
#[command(about = "Seeded generator of chat and agent traces in the Mooncake format")]
struct Args {
    #[arg(value_enum)]
    workload: Workload,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long, default_value_t = 2000)]
    requests: usize,
    /// New conversations (sessions) per second.
    #[arg(long)]
    session_rate: Option<f64>,
    #[arg(long, default_value_t = 512)]
    block_tokens: u64,
    /// `adapters`, `models`: requests per second (`models`: the day's mean).
    #[arg(long, default_value_t = 60.0)]
    rate: f64,
    /// `adapters`: how many adapters.
    #[arg(long, default_value_t = 300)]
    adapters: usize,
    /// `adapters`, `models`: the Zipf exponent of their popularity.
    #[arg(long, default_value_t = 1.1)]
    zipf: f64,
    /// `adapters`: popularity is dealt afresh this often (seconds).
    #[arg(long)]
    shift_every_s: Option<f64>,
    /// `models`: how many models.
    #[arg(long, default_value_t = 20)]
    models: usize,
    /// `models`: seconds of one (compressed) day.
    #[arg(long, default_value_t = 3600.0)]
    day_s: f64,
    /// `models`: the rate swings ± this share of the mean through the day.
    #[arg(long, default_value_t = 0.5)]
    swing: f64,
}

fn main() {
    let a = Args::parse();
    let kind = match a.workload {
        Workload::Chat => Kind::Chat,
        Workload::Agent => Kind::Agent,
        Workload::Models => {
            print!(
                "{}",
                model_workload::generate(&ModelParams {
                    seed: a.seed,
                    requests: a.requests.min(2_000_000),
                    rate: a.rate,
                    models: a.models.clamp(1, 1000),
                    zipf: a.zipf,
                    day_s: a.day_s,
                    swing: a.swing,
                    block_tokens: a.block_tokens,
                })
            );
            return;
        }
        Workload::Adapters => {
            print!(
                "{}",
                adapter_workload::generate(&AdapterParams {
                    seed: a.seed,
                    requests: a.requests.min(2_000_000),
                    rate: a.rate,
                    adapters: a.adapters.clamp(1, 100_000),
                    zipf: a.zipf,
                    shift_every_s: a.shift_every_s,
                    block_tokens: a.block_tokens,
                })
            );
            return;
        }
    };
    // Defaults load 8 replicas of the replay's model about as much as the
    // shipped trace does at its own rate.
    let session_rate = a.session_rate.unwrap_or(match kind {
        Kind::Chat => 1.2,
        Kind::Agent => 0.4,
    });
    print!(
        "{}",
        generate(&Params {
            kind,
            seed: a.seed,
            requests: a.requests.min(1_000_000),
            session_rate,
            block_tokens: a.block_tokens,
        })
    );
}
