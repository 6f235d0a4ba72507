//! Writes a generated trace (Mooncake format plus `system_blocks`) to stdout:
//! `chat` (multi-turn conversations behind one long shared system prompt) or
//! `agent` (long shared tool prefixes, many short turns). Seeded: the same
//! arguments give the same trace.

use clap::{Parser, ValueEnum};
use fleetroute_tests::replay::workload::{Kind, Params, generate};

#[derive(Clone, Copy, ValueEnum)]
enum Workload {
    Chat,
    Agent,
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
}

fn main() {
    let a = Args::parse();
    let kind = match a.workload {
        Workload::Chat => Kind::Chat,
        Workload::Agent => Kind::Agent,
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
