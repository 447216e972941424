//! Command-line arguments of `actorcile bench`, and how the parent reconciles them on to its children.

use std::{fmt, path::PathBuf, time::Duration};

use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};

/// What every object's reconcile does (identical logic for both runtimes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// The reconcile does no I/O: measures the runtime's own overhead.
    Noop,
    /// The reconcile writes status (phase, Ready condition, observedGeneration) when it changed.
    Status,
    /// The reconcile yields `--yields` times, `--yield-interval` apart, before it is done.
    Yield,
    /// A driver updates `spec.stampMicros` at `--churn-rate` updates/s; measures event→run latency.
    Churn,
    /// Chains of `--chain-length` objects, each Ready (status written) once the one it depends on
    /// (`spec.dependsOn`) is Ready; measures the dependency Ready → dependent Ready hop.
    Chain,
    /// What an operator does: a finalizer, one owned child ConfigMap (server-side apply), the
    /// Ready status when it changed; then every object is deleted (child deleted, finalizer
    /// removed). Measures the time until every object is Ready and then until every one is gone.
    Operator,
    /// A restart: the objects exist and a first runtime ran each once (the list alone, timed);
    /// a second runtime then starts while a driver changes random objects (`spec.stampMicros`)
    /// at `--churn-rate` changes/s until every listed object has run. Measures change→run
    /// latency and the time until the last listed object ran.
    Restart,
}

impl Workload {
    /// The name used on the command line and in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Workload::Noop => "noop",
            Workload::Status => "status",
            Workload::Yield => "yield",
            Workload::Churn => "churn",
            Workload::Chain => "chain",
            Workload::Operator => "operator",
            Workload::Restart => "restart",
        }
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A reconcile runtime under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum, Serialize, Deserialize)]
pub enum RuntimeKind {
    /// actorcile's actor runtime.
    #[value(name = "actorcile")]
    #[serde(rename = "actorcile")]
    Actorcile,
    /// kube-runtime's `Controller`.
    #[value(name = "kube-runtime")]
    #[serde(rename = "kube-runtime")]
    KubeRuntime,
    /// controller-runtime (Go), in a process of its own (`operator` and `status`, on a real API
    /// server: `--envtest` or `--kubeconfig`).
    #[value(name = "controller-runtime")]
    #[serde(rename = "controller-runtime")]
    ControllerRuntime,
    /// No runtime: actorcile's requests for the workload, sent by a plain loop over one watch
    /// (`operator` and `status` only): the time these requests alone take on the API server.
    #[value(name = "floor")]
    #[serde(rename = "floor")]
    Floor,
}

impl RuntimeKind {
    /// The name used on the command line and in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            RuntimeKind::Actorcile => "actorcile",
            RuntimeKind::KubeRuntime => "kube-runtime",
            RuntimeKind::ControllerRuntime => "controller-runtime",
            RuntimeKind::Floor => "floor",
        }
    }
}

impl fmt::Display for RuntimeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The memory allocator of the runtimes' child processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Allocator {
    /// mimalloc, its freed pages returned after 100 ms, without transparent huge pages.
    Mimalloc,
    /// The system's (glibc).
    System,
}

impl Allocator {
    /// mimalloc where this binary is built with it (feature `mimalloc`), else the system's.
    pub const DEFAULT: Allocator = if cfg!(feature = "mimalloc") {
        Allocator::Mimalloc
    } else {
        Allocator::System
    };

    /// The name `ACTORCILE_ALLOCATOR` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Allocator::Mimalloc => "mimalloc",
            Allocator::System => "system",
        }
    }
}

/// Where the objects live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// actorcile's in-process API server: no setup; each child has its own.
    InProcess,
    /// A real etcd + kube-apiserver started by `actorcile::envtest::Envtest`; each child starts its own.
    Envtest,
    /// Any cluster from a kubeconfig file; each child creates and removes its own namespace.
    Kubeconfig(PathBuf),
}

impl Backend {
    /// The name used in reports.
    pub fn name(&self) -> &'static str {
        match self {
            Backend::InProcess => "in-process",
            Backend::Envtest => "envtest",
            Backend::Kubeconfig(_) => "kubeconfig",
        }
    }
}

/// `actorcile bench`: reconcile throughput of actorcile and of kube-runtime's `Controller`, side by side.
///
/// Each runtime runs in its own child process (this binary re-executed with a hidden `--child`
/// flag) so that its peak RSS is its own. Each child creates the objects first, then starts its
/// runtime and measures from the start until every object is done.
#[derive(Debug, Clone, PartialEq, Args)]
#[command(after_help = super::report::LEGEND)]
pub struct BenchArgs {
    /// What each reconcile does.
    #[arg(long, value_enum, default_value_t = Workload::Operator)]
    pub workload: Workload,

    /// Number of objects; several, comma-separated (`1000,10000,100000`), run a sweep: the
    /// whole comparison once per size, then a table of cost per object against size.
    #[arg(
        long = "objects",
        value_name = "N[,N…]",
        value_delimiter = ',',
        default_value = "10000",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub sizes: Vec<u32>,

    /// With a sweep: draw cost per object against objects (log scales, both runtimes) to this
    /// file (`.svg` or `.png`).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,

    /// Maximum number of reconciles in flight (the same limit for both runtimes).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrency: u16,

    /// Print one JSON object as the last line of output instead of a table.
    #[arg(long)]
    pub json: bool,

    /// Run against a real etcd + kube-apiserver started for the run (actorcile::envtest).
    #[arg(long, conflicts_with = "kubeconfig")]
    pub envtest: bool,

    /// Run against the cluster of this kubeconfig (a namespace is created and removed per runtime).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,

    /// `yield` workload: how many times each object yields before it is Ready.
    #[arg(long, default_value_t = 10)]
    pub yields: u32,

    /// `yield` workload: delay each yield asks for (`1ms`, `5ms`, …).
    #[arg(long, default_value = "1ms", value_parser = parse_duration)]
    pub yield_interval: Duration,

    /// `churn` workload: spec updates per second (all objects together); `restart`: changes per
    /// second while the listed objects run.
    #[arg(long, default_value_t = 1000.0, value_parser = parse_rate)]
    pub churn_rate: f64,

    /// `churn` workload: spec updates per object.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub churn_updates: u32,

    /// `chain` workload: links per dependency chain (objects / length chains; the last one may be
    /// shorter).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    pub chain_length: u32,

    /// Which runtimes to run, in this order.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [RuntimeKind::Actorcile, RuntimeKind::KubeRuntime])]
    pub runtimes: Vec<RuntimeKind>,

    /// Run the runtimes this many times, alternating (actorcile, kube-runtime, actorcile, …), and
    /// report each runtime's median run (by seconds). Machines are noisy: one run of a
    /// runtime can take several times as long as the next.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=99))]
    pub repeat: u32,

    /// Give up on a runtime that has not finished after this long (`90s`, `10m`; at most a
    /// week).
    #[arg(long, default_value = "10m", value_parser = parse_timeout)]
    pub timeout: Duration,

    /// Let actorcile also add its finalizer (and, in every workload, write its status), as it
    /// does by default in an operator. Without this flag both runtimes do the same API work: no
    /// finalizer, and status writes only in the `status` workload.
    #[arg(long)]
    pub actorcile_defaults: bool,

    /// actorcile lists and watches instead of streaming its initial list (`sendInitialEvents`,
    /// which it asks for by default and which the API server may refuse): to compare the two.
    #[arg(long)]
    pub no_streaming_lists: bool,

    /// kube-runtime caches its objects pruned as actorcile does by default (without
    /// `managedFields` and the last-applied annotation: a watcher with `.modify()` into the
    /// controller's reflector, the kube-rs memory advice): to compare memory like for like.
    #[arg(long)]
    pub prune_kube_runtime: bool,

    /// The memory allocator of the runtimes' processes (both Rust runtimes alike;
    /// controller-runtime is Go's): `mimalloc` returns freed memory to the OS soon, so idle
    /// figures are low, but keeps more resident at a peak of many threads' allocations; `system`
    /// is glibc's, the reverse.
    #[arg(long, value_enum, default_value_t = Allocator::DEFAULT)]
    pub allocator: Allocator,

    /// Internal: run one runtime in this process and print its result as one JSON line.
    #[arg(long, value_enum, hide = true)]
    pub child: Option<RuntimeKind>,
}

fn parse_rate(s: &str) -> Result<f64, String> {
    let rate: f64 = s.parse().map_err(|e| format!("{e}"))?;
    // At least one update a day: 1/rate seconds must make a duration.
    if rate.is_finite() && rate >= 1.0 / 86_400.0 {
        Ok(rate)
    } else {
        Err("must be a number of updates per second, at least one a day".into())
    }
}

impl BenchArgs {
    /// The number of objects of one comparison (the first size; a child gets only one).
    pub fn objects(&self) -> u32 {
        self.sizes.first().copied().unwrap_or(10_000)
    }

    /// These arguments for one size of a sweep.
    pub fn with_objects(&self, objects: u32) -> Self {
        Self {
            sizes: vec![objects],
            ..self.clone()
        }
    }

    /// The backend chosen by `--envtest` / `--kubeconfig` (the in-process cluster otherwise).
    pub fn backend(&self) -> Backend {
        match (&self.kubeconfig, self.envtest) {
            (Some(path), _) => Backend::Kubeconfig(path.clone()),
            (None, true) => Backend::Envtest,
            (None, false) => Backend::InProcess,
        }
    }

    /// Arguments (after the binary name) that re-run this benchmark as a child for `runtime`.
    pub fn child_args(&self, runtime: RuntimeKind) -> Vec<String> {
        let mut args = vec![
            "bench".to_string(),
            "--child".into(),
            runtime.as_str().into(),
            "--workload".into(),
            self.workload.as_str().into(),
            "--objects".into(),
            self.objects().to_string(),
            "--concurrency".into(),
            self.concurrency.to_string(),
            "--yields".into(),
            self.yields.to_string(),
            "--yield-interval".into(),
            format_duration(self.yield_interval),
            "--churn-rate".into(),
            self.churn_rate.to_string(),
            "--churn-updates".into(),
            self.churn_updates.to_string(),
            "--chain-length".into(),
            self.chain_length.to_string(),
            "--timeout".into(),
            format_duration(self.timeout),
            "--runtimes".into(),
            runtime.as_str().into(),
        ];
        if self.json {
            args.push("--json".into());
        }
        if self.actorcile_defaults {
            args.push("--actorcile-defaults".into());
        }
        if self.no_streaming_lists {
            args.push("--no-streaming-lists".into());
        }
        if self.prune_kube_runtime {
            args.push("--prune-kube-runtime".into());
        }
        match self.backend() {
            Backend::InProcess => {}
            Backend::Envtest => args.push("--envtest".into()),
            Backend::Kubeconfig(path) => {
                args.push("--kubeconfig".into());
                args.push(path.to_string_lossy().into_owned());
            }
        }
        args
    }
}

/// A duration flag: humantime's form (`250ms`, `90s`, `10m`, `1h 30m`).
fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime_serde::re::humantime::parse_duration(s)
        .map_err(|e| format!("{e} (e.g. 5ms, 90s, 10m)"))
}

/// `--timeout`: above zero and at most a week.
fn parse_timeout(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() || d > Duration::from_secs(7 * 24 * 3600) {
        return Err("must be above zero and at most a week (168h)".into());
    }
    Ok(d)
}

/// `d` as the duration flags read it.
fn format_duration(d: Duration) -> String {
    humantime_serde::re::humantime::format_duration(d).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        cmd: Cmd,
    }
    #[derive(Debug, clap::Subcommand)]
    enum Cmd {
        Bench(BenchArgs),
    }

    fn parse(args: &[&str]) -> Result<BenchArgs, clap::Error> {
        let mut argv = vec!["actorcile"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv).map(|cli| match cli.cmd {
            Cmd::Bench(args) => args,
        })
    }

    #[test]
    fn defaults() {
        let args = parse(&["bench"]).unwrap();
        assert_eq!(args.workload, Workload::Operator);
        assert_eq!(args.objects(), 10_000);
        assert_eq!(args.sizes, vec![10_000]);
        assert_eq!(args.plot, None);
        assert_eq!(args.allocator, Allocator::DEFAULT);
        assert_eq!(args.concurrency, 64);
        assert!(!args.json);
        assert_eq!(args.backend(), Backend::InProcess);
        assert_eq!(args.yields, 10);
        assert_eq!(args.yield_interval, Duration::from_millis(1));
        assert_eq!(args.timeout, Duration::from_secs(600));
        assert_eq!(args.chain_length, 10);
        assert_eq!(args.repeat, 3);
        assert_eq!(
            args.runtimes,
            vec![RuntimeKind::Actorcile, RuntimeKind::KubeRuntime]
        );
        assert_eq!(args.child, None);
    }

    #[test]
    fn options_parse() {
        let args = parse(&[
            "bench",
            "--workload",
            "yield",
            "--objects",
            "50",
            "--concurrency",
            "8",
            "--json",
            "--envtest",
            "--yields",
            "3",
            "--runtimes",
            "kube-runtime",
        ])
        .unwrap();
        assert_eq!(args.workload, Workload::Yield);
        assert_eq!(args.objects(), 50);
        let sweep = parse(&["bench", "--objects", "1000,10000", "--plot", "x.svg"]).unwrap();
        assert_eq!(sweep.sizes, vec![1000, 10_000]);
        assert_eq!(sweep.with_objects(10_000).objects(), 10_000);
        assert_eq!(sweep.plot, Some(PathBuf::from("x.svg")));
        assert_eq!(args.concurrency, 8);
        assert!(args.json);
        assert_eq!(args.backend(), Backend::Envtest);
        assert_eq!(args.yields, 3);
        assert_eq!(args.runtimes, vec![RuntimeKind::KubeRuntime]);

        let args = parse(&["bench", "--kubeconfig", "/tmp/kc", "--workload", "churn"]).unwrap();
        assert_eq!(args.backend(), Backend::Kubeconfig("/tmp/kc".into()));
        assert_eq!(args.workload, Workload::Churn);

        let args = parse(&["bench", "--allocator", "system"]).unwrap();
        assert_eq!(args.allocator, Allocator::System);
        assert_eq!(args.allocator.as_str(), "system");
        assert!(parse(&["bench", "--allocator", "jemalloc"]).is_err());

        let args = parse(&["bench", "--workload", "chain", "--chain-length", "4"]).unwrap();
        assert_eq!(args.workload, Workload::Chain);
        assert_eq!(args.workload.to_string(), "chain");
        assert_eq!(args.chain_length, 4);
    }

    #[test]
    fn bad_values_are_rejected() {
        assert!(parse(&["bench", "--objects", "0"]).is_err());
        assert!(parse(&["bench", "--objects", "-3"]).is_err());
        assert!(parse(&["bench", "--objects", "1000,0"]).is_err());
        assert!(parse(&["bench", "--objects", "1000,x"]).is_err());
        assert!(parse(&["bench", "--concurrency", "0"]).is_err());
        assert!(parse(&["bench", "--concurrency", "70000"]).is_err());
        assert!(parse(&["bench", "--workload", "chain2"]).is_err());
        assert!(parse(&["bench", "--churn-rate", "0"]).is_err());
        assert!(parse(&["bench", "--churn-rate", "nan"]).is_err());
        assert!(parse(&["bench", "--envtest", "--kubeconfig", "x"]).is_err());
        assert!(parse(&["bench", "--runtimes", "go"]).is_err());
        assert!(parse(&["bench", "--chain-length", "0"]).is_err());
        assert!(parse(&["bench", "--chain-length", "x"]).is_err());
        assert!(parse(&["bench", "--timeout", "0s"]).is_err());
        assert!(parse(&["bench", "--timeout", "169h"]).is_err());
        assert!(parse(&["bench", "--timeout", "600"]).is_err());
        assert!(parse(&["bench", "--yield-interval", "fast"]).is_err());
    }

    #[test]
    fn child_args_round_trip() {
        let args = parse(&[
            "bench",
            "--workload",
            "churn",
            "--objects",
            "77",
            "--concurrency",
            "5",
            "--json",
            "--kubeconfig",
            "/x/kc",
            "--churn-rate",
            "250.5",
            "--churn-updates",
            "3",
            "--yield-interval",
            "4ms",
            "--timeout",
            "9s",
            "--chain-length",
            "6",
        ])
        .unwrap();
        let child_argv = args.child_args(RuntimeKind::KubeRuntime);
        let refs: Vec<&str> = child_argv.iter().map(String::as_str).collect();
        let child = parse(&refs).unwrap();
        assert_eq!(child.child, Some(RuntimeKind::KubeRuntime));
        assert_eq!(
            BenchArgs {
                child: None,
                runtimes: args.runtimes.clone(),
                ..child
            },
            BenchArgs {
                runtimes: args.runtimes.clone(),
                ..args
            }
        );
    }
}
