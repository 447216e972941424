//! Minimal `actorcile` entry point wiring `envtest` (branch `envtest`; the lead replaces this file).

mod envtest_cmd;

use clap::Parser;

#[derive(Debug, Parser)]
#[command(name = "actorcile")]
enum Cli {
    /// A real etcd + kube-apiserver for trying operators by hand.
    #[command(subcommand)]
    Envtest(envtest_cmd::EnvtestCmd),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse() {
        Cli::Envtest(cmd) => envtest_cmd::run(cmd).await,
    }
}
