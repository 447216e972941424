//! Measures sharded replicas of the example operator on a real control plane: the CPU split
//! over 1, 2 and 3 replicas, and failover after `kill -9` (sharded, leader election warm and
//! cold). See `scaleout.rs` for what each figure is.
//!
//! ```text
//! cargo build --release -p example-operator
//! cargo run --release -p operator-scaleout -- [--objects N] [--replicas 1,2,3] [--kills K]
//! ```

mod scaleout;

use std::process::ExitCode;

use clap::Parser;

/// Measure sharded replicas of the example operator on a real control plane.
#[derive(Parser)]
#[command(version)]
struct Args {
    #[command(flatten)]
    scaleout: scaleout::ScaleoutArgs,
}

#[tokio::main]
async fn main() -> ExitCode {
    match scaleout::run(Args::parse().scaleout).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("operator-scaleout: {e}");
            ExitCode::FAILURE
        }
    }
}
