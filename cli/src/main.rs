//! The `actorcile` command line: `bench` (reconcile throughput of actorcile side by side with
//! kube-runtime's `Controller`), `simulate` (supervisor policies compared on a seeded scenario in
//! virtual time), `envtest` (a real etcd + kube-apiserver).

/// mimalloc: see BENCHMARKS.md (allocation-heavy actor spawning; memory returned to the OS).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod bench;
mod envtest_cmd;
mod simulate;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The `actorcile` command.
#[derive(Debug, Parser)]
#[command(
    name = "actorcile",
    version,
    about = "actorcile: an actor-based reconcile runtime for Kubernetes operators"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Subcommands of `actorcile`.
#[derive(Debug, Subcommand)]
enum Command {
    /// Measure reconcile throughput, latency, API requests and memory of actorcile and of
    /// kube-runtime's `Controller` on the same workload, side by side.
    Bench(bench::BenchArgs),
    /// Compare supervisor policies on a seeded scenario, in virtual time.
    Simulate(simulate::SimulateArgs),
    /// A real etcd + kube-apiserver for trying operators by hand.
    #[command(subcommand)]
    Envtest(envtest_cmd::EnvtestCmd),
}

/// Log filter when `RUST_LOG` is unset: warnings, except kube's per-request error log, which a
/// starting envtest control plane fills with expected connection failures (API errors still reach
/// the user through the commands' own error messages).
const DEFAULT_LOG_FILTER: &str = "warn,kube_client::client::builder=off";

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER)),
        )
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench(args) => bench::main(args),
        Command::Simulate(args) => simulate::run(args),
        Command::Envtest(cmd) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(envtest_cmd::run(cmd))),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
