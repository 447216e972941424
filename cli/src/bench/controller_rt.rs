//! The controller-runtime side: the `operator` and `status` workloads under controller-runtime
//! (Go), in a process of its own.
//!
//! The Go program is `tools/bench-controller-runtime/` in the repository (a Go module of its
//! own, beside the control plane's, so that `scripts/install-test-deps.sh` builds both with the
//! same Go and the same module proxy). It is written the way a controller-runtime user writes
//! the workload (see its `main.go`). The bench starts it once the objects exist, with the
//! cluster's kubeconfig, and stops it with SIGTERM once the observer saw every object done;
//! it then prints its reconciles, its API requests, its CPU time and its peak resident
//! memory.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use serde::Deserialize;
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

use super::args::Workload;
use super::stats;

/// The variable naming the Go program's binary (else the cache's, see [`binary`]).
pub const BINARY_VAR: &str = "ACTORCILE_BENCH_CONTROLLER_RUNTIME";

/// The binary's name in the cache and in the repository.
const NAME: &str = "bench-controller-runtime";

/// The Go program's binary: `$ACTORCILE_BENCH_CONTROLLER_RUNTIME`, else where
/// `scripts/install-test-deps.sh` builds it (`~/.cache/actorcile/bench/bench-controller-runtime`).
pub fn binary() -> Result<PathBuf> {
    let path = match std::env::var_os(BINARY_VAR) {
        Some(p) => PathBuf::from(p),
        None => actorcile::envtest::cache_dir()
            .context("finding the cache folder (no home directory?)")?
            .join("bench")
            .join(NAME),
    };
    if !path.is_file() {
        bail!(
            "the controller-runtime side of the bench is not built ({} is missing): run \
             scripts/install-test-deps.sh from the repository, or build it by hand with \
             `cd tools/bench-controller-runtime && go build -o {} .` (Go 1.26), or set ${BINARY_VAR}",
            path.display(),
            path.display()
        );
    }
    Ok(path)
}

/// Whether `workload` exists on the controller-runtime side.
pub fn check(workload: Workload) -> Result<()> {
    match workload {
        Workload::Operator | Workload::Status => Ok(()),
        other => {
            bail!("controller-runtime runs the operator and status workloads only, not {other}")
        }
    }
}

/// What the Go program reports when it stops.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct Report {
    /// Reconciles it ran.
    pub reconciles: u64,
    /// Requests its client sent (a watch counts once).
    pub api_requests: u64,
    /// Status writes (`PUT` or `PATCH` of `…/status`) its client sent.
    pub status_writes: u64,
    /// Its CPU time, user plus system.
    pub cpu_seconds: f64,
    /// Its peak resident memory.
    pub peak_rss_bytes: u64,
}

/// A running controller-runtime process.
pub struct ControllerRuntimeRun {
    child: Child,
    pid: u32,
}

/// Starts the Go program on the objects in `namespace` of the cluster `kubeconfig` names.
pub fn start(
    kubeconfig: &Path,
    namespace: &str,
    workload: Workload,
    concurrency: u16,
) -> Result<ControllerRuntimeRun> {
    check(workload)?;
    let binary = binary()?;
    let mut command = Command::new(&binary);
    // As its users run it: with transparent huge pages as the system sets them (this process
    // turned them off for itself, and the flag is inherited).
    #[cfg(target_os = "linux")]
    // SAFETY: the closure runs between fork and exec and only calls prctl(2), which is
    // async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_THP_DISABLE, 0, 0, 0, 0);
            Ok(())
        });
    }
    let child = command
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--namespace", namespace])
        .args(["--workload", workload.as_str()])
        .args(["--concurrency", &concurrency.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    let pid = child
        .id()
        .context("the controller-runtime process has no pid")?;
    Ok(ControllerRuntimeRun { child, pid })
}

impl ControllerRuntimeRun {
    /// Resolves once the process has exited (it never does on its own while it runs well: a
    /// bad kubeconfig, a missing CRD or a crash end it early).
    pub async fn exited(&self) {
        loop {
            // An exited child not yet reaped is a zombie (`Z`) until `stop` waits for it.
            let state = std::fs::read_to_string(format!("/proc/{}/stat", self.pid))
                .ok()
                .and_then(|s| s.rsplit_once(") ")?.1.chars().next());
            if matches!(state, None | Some('Z' | 'X')) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Its resident memory now.
    pub fn rss_bytes(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        stats::proc_status_field_bytes(&status, "VmRSS")
    }

    /// Stops it (SIGTERM, then SIGKILL after `grace`) and reads its report.
    pub async fn stop(mut self, grace: Duration) -> Result<Report> {
        // SAFETY: kill(2) on the child this struct spawned and has not reaped.
        unsafe {
            libc::kill(self.pid as libc::pid_t, libc::SIGTERM);
        }
        let mut stdout = self.child.stdout.take().context("no stdout")?;
        let mut out = String::new();
        let status = match tokio::time::timeout(grace, async {
            stdout.read_to_string(&mut out).await?;
            self.child.wait().await
        })
        .await
        {
            Ok(status) => status.context("waiting for the controller-runtime process")?,
            Err(_) => {
                self.child.kill().await.ok();
                bail!("the controller-runtime process did not stop within {grace:?} of SIGTERM");
            }
        };
        if !status.success() {
            bail!("the controller-runtime process failed ({status})");
        }
        let line = out
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .context("the controller-runtime process printed no report")?;
        serde_json::from_str(line)
            .with_context(|| format!("the controller-runtime process printed a bad report: {line}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_binary_says_how_to_build_it() {
        // SAFETY (edition 2024: set_var is unsafe): no other test reads this variable.
        unsafe { std::env::set_var(BINARY_VAR, "/nonexistent/bench-controller-runtime") };
        let e = binary().unwrap_err().to_string();
        unsafe { std::env::remove_var(BINARY_VAR) };
        assert!(
            e.contains("install-test-deps.sh") && e.contains("go build"),
            "{e}"
        );
    }

    #[test]
    fn only_the_operator_and_status_workloads_run() {
        assert!(check(Workload::Operator).is_ok() && check(Workload::Status).is_ok());
        assert!(check(Workload::Yield).is_err());
    }

    #[test]
    fn the_report_reads_as_the_go_program_writes_it() {
        let r: Report = serde_json::from_str(
            r#"{"reconciles":3,"api_requests":9,"status_writes":2,"cpu_seconds":0.5,"peak_rss_bytes":1024}"#,
        )
        .unwrap();
        assert_eq!(
            (r.reconciles, r.api_requests, r.peak_rss_bytes),
            (3, 9, 1024)
        );
    }
}
