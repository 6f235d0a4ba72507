//! Writes a generated trace (Mooncake format plus `system_blocks`) to stdout:
//! `chat` (multi-turn conversations behind one long shared system prompt),
//! `agent` (long shared tool prefixes, many short turns) or `adapters` (LoRA
//! adapter requests of Zipf popularity, each line naming its `adapter`).
//! Seeded: the same arguments give the same trace.

use clap::{Parser, ValueEnum};
use fleetroute_tests::replay::adapter_workload::{self, AdapterParams};
use fleetroute_tests::replay::workload::{Kind, Params, generate};

#[derive(Clone, Copy, ValueEnum)]
enum Workload {
    Chat,
    Agent,
    Adapters,
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
    /// `adapters`: requests per second.
    #[arg(long, default_value_t = 60.0)]
    rate: f64,
    /// `adapters`: how many adapters.
    #[arg(long, default_value_t = 300)]
    adapters: usize,
    /// `adapters`: the Zipf exponent of their popularity.
    #[arg(long, default_value_t = 1.1)]
    zipf: f64,
    /// `adapters`: popularity is dealt afresh this often (seconds).
    #[arg(long)]
    shift_every_s: Option<f64>,
}

fn main() {
    let a = Args::parse();
    let kind = match a.workload {
        Workload::Chat => Kind::Chat,
        Workload::Agent => Kind::Agent,
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
