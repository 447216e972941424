//! The `actorcile` command line: `bench` (reconcile throughput of actorcile side by side with
//! kube-runtime's `Controller`), `simulate` (supervisor policies compared on a seeded scenario in
//! virtual time), `envtest` (a real etcd + kube-apiserver), `chaos` (faults injected on a real
//! control plane, invariants counted), `plot-dashboard` (the example operator's dashboard panels
//! from timed scrapes).

/// mimalloc unless `ACTORCILE_ALLOCATOR=system` (see `allocator.rs` and BENCHMARKS.md:
/// allocation-heavy actor spawning; memory returned to the OS).
#[global_allocator]
static GLOBAL: allocator::Chosen = allocator::Chosen;

mod allocator;
mod bench;
mod chaos;
mod dashboard_plot;
mod plot_file;
mod retry;
mod simulate;
mod why;

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
    Envtest(actorcile_envtest::cli::EnvtestCmd),
    /// Run a mixed workload on a real etcd + kube-apiserver while injecting faults (provisioner
    /// panics and hangs, API errors, conflicts and throttling, kill -9 of the operator,
    /// kube-apiserver and etcd restarts), then count invariant violations.
    Chaos(chaos::ChaosArgs),
    /// Draw the main panels of the example operator's dashboard from timed scrapes of its
    /// /metrics (`example-operator demo --scrape-to FILE`).
    PlotDashboard(dashboard_plot::PlotDashboardArgs),
    /// Why is it not Ready? One object's live state, from a running operator's introspection
    /// address (`--introspection-addr`), as a tree: its last reconcile's cause, outcome and
    /// steps, its next wake-up, what it waits on and what holds it.
    Why(why::WhyArgs),
    /// The operator `chaos` drives, as its own process (started by `chaos`).
    #[command(hide = true)]
    ChaosOperator(chaos::operator::OperatorArgs),
}

/// Log filter when `RUST_LOG` is unset: warnings, except kube's per-request error log, which a
/// starting envtest control plane fills with expected connection failures (API errors still reach
/// the user through the commands' own error messages).
const DEFAULT_LOG_FILTER: &str = "warn,kube_client::client::builder=off";

/// Makes mimalloc return an emptied page to the OS after 100 ms. Its default delay
/// (`purge_delay`, 1 s in the mimalloc this binary links) left memory freed in a burst, such as
/// a wave of passivations, resident when the idle process was measured 0.3 s later: 4.1–5.2 KiB
/// per idle object at 100 000 `noop` objects, against 1.7–2.6 KiB with a short delay. No delay at
/// all costs CPU instead: pages purged and faulted back in, to be zeroed by the kernel again,
/// cost kube-runtime's `yield` 40 % more CPU (13.2 against 9.5 s at 100 000 objects), and 100 ms
/// gave the same idle figures as 0. Both runtimes of `bench` run with this; an operator binary on
/// mimalloc may do the same. An explicit `MIMALLOC_PURGE_DELAY` in the environment wins.
///
/// And turns transparent huge pages off for the process, as `MIMALLOC_ALLOW_THP=0` does.
/// mimalloc asks for huge pages on the arenas it commits (`madvise(MADV_HUGEPAGE)`, honoured
/// where THP is `madvise` or `always`, the common distribution settings), so every 2 MiB region
/// it touches becomes resident whole, however little of it is in use. On envtest at 1 000
/// `operator` objects that was 23.9 MiB added to actorcile's process against 10.7 MiB without
/// (and 1.38 against 1.05 CPU s: fewer, smaller page faults to zero). Both runtimes of `bench`
/// run with this; an explicit `MIMALLOC_ALLOW_THP` in the environment wins. The kernel's flag is
/// inherited by child processes: the envtest control plane and controller-runtime's process
/// clear it as they start, and run with the system's setting.
#[cfg(feature = "mimalloc")]
fn tune_mimalloc() {
    if !allocator::is_mimalloc() {
        return;
    }
    // Option numbers from `mi_option_e` in mimalloc.h (v3); libmimalloc-sys names no constants.
    const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    const MI_OPTION_ALLOW_THP: libmimalloc_sys::mi_option_t = 43;
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        const PURGE_DELAY_MS: std::ffi::c_long = 100;
        // SAFETY: sets a process-wide option; mimalloc reads options atomically at any time.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) }
    }
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        // SAFETY: as above. mimalloc reads this option when it maps memory from now on; the
        // arenas mapped before main are covered by the process-wide switch below, which is what
        // mimalloc itself does when the option is set from the environment at its start.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_ALLOW_THP, 0) }
        // SAFETY: `prctl` with integer arguments only; it sets a flag of this process's
        // address space, checked by the kernel when it faults a page in. A kernel without it
        // (before 3.15) leaves THP as it was: nothing else depends on it.
        #[cfg(target_os = "linux")]
        let _ = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    }
}

fn main() -> ExitCode {
    #[cfg(feature = "mimalloc")]
    tune_mimalloc();
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
            .and_then(|rt| rt.block_on(actorcile_envtest::cli::run(cmd, "actorcile envtest"))),
        Command::Chaos(args) => chaos::main(args),
        Command::PlotDashboard(args) => dashboard_plot::run(args).map_err(anyhow::Error::msg),
        Command::Why(args) => why::run(args),
        Command::ChaosOperator(args) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(chaos::operator::run(args))),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(all(test, feature = "mimalloc", target_os = "linux"))]
mod tests {
    /// On mimalloc the process runs without transparent huge pages: mimalloc's option and the
    /// kernel's flag for the process alike.
    #[test]
    fn mimalloc_runs_without_transparent_huge_pages() {
        if std::env::var_os("MIMALLOC_ALLOW_THP").is_some() || !super::allocator::is_mimalloc() {
            eprintln!(
                "SKIPPED: MIMALLOC_ALLOW_THP or ACTORCILE_ALLOCATOR=system is set in the environment"
            );
            return;
        }
        super::tune_mimalloc();
        // SAFETY: reads a process-wide option; asks the kernel for a flag of the process.
        let (option, flag) = unsafe {
            (
                libmimalloc_sys::mi_option_get(43),
                libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0),
            )
        };
        assert_eq!(option, 0, "mimalloc's allow_thp");
        assert_eq!(flag, 1, "PR_GET_THP_DISABLE");
    }

    /// The option number is `allow_thp`'s in the mimalloc linked: a process started with
    /// `MIMALLOC_ALLOW_THP=7` reads 7 under that number (a wrong number reads another option).
    #[test]
    fn the_option_number_is_allow_thps() {
        if std::env::var_os("MIMALLOC_ALLOW_THP").is_some() {
            // The run below itself.
            // SAFETY: reads a process-wide option.
            let option = unsafe { libmimalloc_sys::mi_option_get(43) };
            assert_eq!(option, 7);
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "tests::the_option_number_is_allow_thps"])
            .env("MIMALLOC_ALLOW_THP", "7")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
