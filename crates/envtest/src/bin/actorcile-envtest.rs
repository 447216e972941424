//! `actorcile-envtest up|down|status|restart`: a real etcd + kube-apiserver that outlives the
//! command (feature `cli`; see [`actorcile_envtest::cli`]).

use std::process::ExitCode;

use clap::Parser;

/// A real Kubernetes control plane (etcd + kube-apiserver) for trying an operator by hand.
#[derive(Debug, Parser)]
#[command(name = "actorcile-envtest", version)]
struct Args {
    #[command(subcommand)]
    command: actorcile_envtest::cli::EnvtestCmd,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| {
            rt.block_on(actorcile_envtest::cli::run(
                args.command,
                "actorcile-envtest",
            ))
        });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
