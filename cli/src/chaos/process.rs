//! The operator's processes: started as `actorcile chaos-operator`, killed with SIGKILL, paused
//! with SIGSTOP, or stopped with SIGTERM.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use actorcile::envtest::Envtest;
use anyhow::{Context as _, Result};

use super::ChaosArgs;
use super::lines::wall_micros;

/// How far incarnation `incarnation`'s wall clock is set off, in seconds, for a skew of `skew`:
/// on time, `skew` ahead, `skew` behind, in turn (so replicas started together disagree, and
/// an incarnation started after a kill reads its predecessor's records on another clock).
pub fn skew_of(incarnation: u32, skew: u32) -> i64 {
    [0, i64::from(skew), -i64::from(skew)][incarnation as usize % 3]
}

/// [`skew_of`] the incarnation whose Lease holder identity is `holder` (0 for any other).
pub fn skew_of_holder(holder: &str, skew: u32) -> i64 {
    holder
        .strip_prefix(super::operator::IDENTITY_PREFIX)
        .and_then(|n| n.parse().ok())
        .map_or(0, |incarnation| skew_of(incarnation, skew))
}

/// The libfaketime library that sets a process's wall clock off (Debian's `libfaketime`).
fn libfaketime() -> Result<&'static str> {
    const PLACES: [&str; 3] = [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
    ];
    PLACES
        .into_iter()
        .find(|p| Path::new(p).exists())
        .context("skewing the operators' clocks needs libfaketime (apt-get install libfaketime), or --clock-skew 0")
}

/// One incarnation of the operator.
pub struct Operator {
    child: Child,
    incarnation: u32,
}

impl Operator {
    /// Starts incarnation `incarnation`, its logs to `operator-<incarnation>.log` in `records`.
    pub fn start(
        env: &Envtest,
        args: &ChaosArgs,
        records: &Path,
        incarnation: u32,
    ) -> Result<Self> {
        let log_path = records.join(format!("operator-{incarnation}.log"));
        let log = std::fs::File::create(&log_path)
            .with_context(|| format!("creating {}", log_path.display()))?;
        let exe = std::env::current_exe().context("finding the actorcile binary")?;
        let skew = skew_of(incarnation, args.clock_skew);
        let mut command = Command::new(exe);
        if skew != 0 {
            // The wall clock only: timers and timeouts run on the monotonic clock, which a
            // skewed machine keeps true as well.
            command
                .env("LD_PRELOAD", libfaketime()?)
                .env("FAKETIME", format!("{skew:+}"))
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        let child = command
            .arg("chaos-operator")
            .arg("--kubeconfig")
            .arg(env.user_kubeconfig_path())
            .arg("--dir")
            .arg(records)
            .args(["--incarnation", &incarnation.to_string()])
            .args(["--seed", &args.seed.to_string()])
            .args(["--panic-rate", &args.panic_rate.to_string()])
            .args(["--hang-rate", &args.hang_rate.to_string()])
            .args(args.api.command_line())
            .args(["--shards", &args.shards().to_string()])
            .arg(format!("--clock-skew={skew}"))
            .env("RUST_LOG", "info,kube_client::client::builder=off")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting the operator")?;
        Ok(Self { child, incarnation })
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills it with SIGKILL: its incarnation and when.
    pub fn kill(mut self) -> (u32, u64) {
        let _ = self.child.kill();
        let at = wall_micros();
        let _ = self.child.wait();
        (self.incarnation, at)
    }

    /// Its incarnation.
    pub fn incarnation(&self) -> u32 {
        self.incarnation
    }

    /// Freezes it (SIGSTOP) for `pause`, then lets it go on (SIGCONT): a replica that stood
    /// still past its Leases, as a long GC pause or a stalled VM does.
    pub async fn pause(&self, pause: Duration) {
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: signals a child process this value owns and has not reaped.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        tokio::time::sleep(pause).await;
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGCONT) };
    }

    /// Stops it with SIGTERM: its incarnation, and whether it exited successfully within the
    /// policy's shutdown timeout and 5 s (else it is killed).
    pub async fn stop(mut self) -> (u32, bool) {
        let timeout =
            super::operator::policy(false).runtime.shutdown_timeout + Duration::from_secs(5);
        // SAFETY: signals a child process this value owns and has not reaped.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = std::time::Instant::now() + timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return (self.incarnation, status.success()),
                Ok(None) if std::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                _ => {
                    eprintln!("chaos: the operator did not stop on SIGTERM; killing it");
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return (self.incarnation, false);
                }
            }
        }
    }
}

impl Drop for Operator {
    /// Never leave an operator behind (an error path of the driver drops it running).
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
