//! `actorcile bench`: the same workload under actorcile, kube-runtime's `Controller` and
//! controller-runtime, each in its own child process, compared side by side.
//!
//! - [`args`]: command-line options and the arguments handed to a child;
//! - [`child`]: one runtime in one process (set-up, measurement, one JSON line on stdout);
//! - [`workload`]: the bench resource and the reconcile logic both runtimes share;
//! - [`actorcile_rt`]: the actorcile runtime side;
//! - [`kube_rt`]: the kube-runtime `Controller` side;
//! - [`controller_rt`]: the controller-runtime (Go) side, a process of its own;
//! - [`floor`]: no runtime, the workload's requests alone;
//! - [`backend`]: in-process cluster, envtest or kubeconfig;
//! - [`counting`]: the tower layer that counts API requests;
//! - [`stats`]: percentiles and peak RSS;
//! - [`report`]: result types, table and JSON output;
//! - [`sweep`]: several sizes, cost per object against size, and its plot.

pub mod actorcile_rt;
pub mod args;
pub mod backend;
pub mod child;
pub mod controller_rt;
pub mod counting;
pub mod floor;
pub mod kube_rt;
pub mod report;
pub mod stats;
pub mod sweep;
pub mod workload;

use std::process::{Command, Stdio};

use anyhow::{Context as _, Result, bail};

pub use args::BenchArgs;
use args::{Allocator, RuntimeKind};
use report::{BenchReport, RunResult};
use sweep::SweepReport;

/// Entry point of `actorcile bench` (parent or, with the hidden `--child`, child).
pub fn main(args: BenchArgs) -> Result<()> {
    if let Some(runtime) = args.child {
        let result = child::run(&args, runtime)?;
        println!(
            "{}",
            serde_json::to_string(&result).context("encoding the result")?
        );
        return Ok(());
    }
    if args.allocator == Allocator::Mimalloc && !cfg!(feature = "mimalloc") {
        bail!("--allocator mimalloc: this binary is built without mimalloc (feature `mimalloc`)");
    }
    if args.runtimes.contains(&RuntimeKind::Floor) {
        floor::check(args.workload, args.actorcile_defaults)?;
    }
    if args.runtimes.contains(&RuntimeKind::ControllerRuntime) {
        if args.backend() == args::Backend::InProcess {
            bail!(
                "controller-runtime runs in a process of its own and needs a real API server: \
                 add --envtest (or --kubeconfig PATH)"
            );
        }
        controller_rt::check(args.workload)?;
        controller_rt::binary()?;
    }
    if args.plot.is_some() && args.sizes.len() < 2 {
        bail!("--plot draws a sweep: give --objects several sizes (e.g. 1000,10000,100000)");
    }
    if let Some(path) = &args.plot {
        crate::plot_file::format_of(path)?;
    }
    if let [_] = args.sizes.as_slice() {
        let report = run_all(&args)?;
        if args.json {
            println!("{}", report.to_json_line());
        } else {
            print!("{}", report.to_table());
        }
        return Ok(());
    }
    let mut sizes = Vec::new();
    for &objects in &args.sizes {
        let report = run_all(&args.with_objects(objects))?;
        if !args.json {
            println!("{}", strip_legend(&report.to_table()));
        }
        sizes.push(report);
    }
    let sweep = SweepReport {
        workload: args.workload,
        backend: args.backend().name().to_string(),
        sizes,
    };
    if let Some(path) = &args.plot {
        sweep.plot(path)?;
    }
    if args.json {
        println!("{}", sweep.to_json_line());
    } else {
        print!("{}", sweep.to_table());
        if let Some(path) = &args.plot {
            println!("plot written to {}", path.display());
        }
        print!("\n{}", report::LEGEND);
    }
    Ok(())
}

/// A size's table without the legend (printed once, at the end of a sweep).
fn strip_legend(table: &str) -> &str {
    table
        .split(report::LEGEND)
        .next()
        .unwrap_or(table)
        .trim_end()
}

/// Runs every requested runtime in its own child process, one after the other.
pub fn run_all(args: &BenchArgs) -> Result<BenchReport> {
    let exe = std::env::current_exe().context("finding this program's path")?;
    let mut per_runtime: Vec<Vec<RunResult>> = vec![Vec::new(); args.runtimes.len()];
    for round in 1..=args.repeat {
        for (runs, &runtime) in per_runtime.iter_mut().zip(&args.runtimes) {
            if !args.json {
                eprintln!(
                    "running {runtime} ({round}/{}): workload {}, {} objects, backend {}, allocator {}…",
                    args.repeat,
                    args.workload,
                    args.objects(),
                    args.backend().name(),
                    args.allocator.as_str()
                );
            }
            runs.push(run_child(&exe, args, runtime)?);
        }
    }
    let runs = per_runtime
        .into_iter()
        .filter_map(report::median_run)
        .collect();
    Ok(BenchReport::new(
        args.workload,
        args.objects(),
        args.backend().name(),
        args.concurrency,
        runs,
    ))
}

/// Runs one child process for `runtime` and reads its result.
fn run_child(exe: &std::path::Path, args: &BenchArgs, runtime: RuntimeKind) -> Result<RunResult> {
    let output = Command::new(exe)
        .args(args.child_args(runtime))
        .env(crate::allocator::VAR, args.allocator.as_str())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("starting the {runtime} child process"))?;
    if !output.status.success() {
        bail!("the {runtime} child process failed ({})", output.status);
    }
    parse_child_output(&String::from_utf8_lossy(&output.stdout), runtime)
}

/// The result in a child's stdout: its last non-empty line, which must be the runtime's JSON.
pub fn parse_child_output(stdout: &str, runtime: RuntimeKind) -> Result<RunResult> {
    let line = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .with_context(|| format!("the {runtime} child printed no result"))?;
    let result: RunResult = serde_json::from_str(line)
        .with_context(|| format!("the {runtime} child printed a bad result: {line}"))?;
    if result.runtime != runtime {
        bail!("asked for {runtime}, the child reported {}", result.runtime);
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_output_is_last_line() {
        let line = r#"{"runtime":"kube-runtime","objects":5,"runs":10,"seconds":0.5,"runs_per_sec":20.0,"cpu_seconds":0.1,"p50_ms":1.0,"p99_ms":2.0,"latency_samples":5,"api_requests":3,"peak_rss_bytes":100,"baseline_rss_bytes":50,"rss_per_object_bytes":20,"status_writes":0,"status_write_seconds":null,"operator":null}"#;
        let out = format!("noise\n{line}\n\n");
        let r = parse_child_output(&out, RuntimeKind::KubeRuntime).unwrap();
        assert_eq!(r.runs, 10);
        assert_eq!(r.p99_ms, Some(2.0));
        assert!(parse_child_output(&out, RuntimeKind::Actorcile).is_err());
        assert!(parse_child_output("", RuntimeKind::Actorcile).is_err());
        assert!(parse_child_output("{not json}\n", RuntimeKind::Actorcile).is_err());
    }
}
