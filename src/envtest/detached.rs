//! A control plane that outlives the process that started it (`actorcile envtest up`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::EnvtestError;
use super::process;

/// A control plane started by [`EnvtestBuilder::start_detached`](super::EnvtestBuilder::start_detached):
/// its etcd and kube-apiserver run in their own process group and keep running after the starting
/// process exits. The state is recorded in `<dir>/state.json`.
///
/// ```no_run
/// # async fn demo() -> Result<(), actorcile::envtest::EnvtestError> {
/// use actorcile::envtest::{DetachedEnvtest, Envtest};
/// let dir = std::path::PathBuf::from("/tmp/my-envtest");
/// match DetachedEnvtest::load(&dir)? {
///     Some(running) if running.is_running() => println!("already up: {}", running.kubeconfig.display()),
///     _ => {
///         let started = Envtest::builder().dir(&dir).start_detached().await?;
///         println!("export KUBECONFIG={}", started.kubeconfig.display());
///     }
/// }
/// // later, maybe from another process:
/// if let Some(running) = DetachedEnvtest::load(&dir)? {
///     running.stop(std::time::Duration::from_secs(5)).await?;
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DetachedEnvtest {
    /// The working directory (also holds `state.json`, logs, certificates and etcd data).
    pub dir: PathBuf,
    /// Process id of etcd.
    pub etcd_pid: u32,
    /// Process id of kube-apiserver.
    pub apiserver_pid: u32,
    /// etcd's client port on 127.0.0.1.
    pub etcd_port: u16,
    /// kube-apiserver's secure port on 127.0.0.1.
    pub apiserver_port: u16,
    /// `https://127.0.0.1:<apiserver_port>`.
    pub server_url: String,
    /// Admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// Kubeconfig of the non-admin user [`USER_NAME`](super::USER_NAME).
    pub user_kubeconfig: PathBuf,
    /// The etcd binary that was started (its file name identifies the process).
    pub etcd_binary: PathBuf,
    /// The kube-apiserver binary that was started.
    pub apiserver_binary: PathBuf,
}

/// Name of the state file inside the directory.
pub const STATE_FILE: &str = "state.json";

impl DetachedEnvtest {
    /// Reads `<dir>/state.json`; `Ok(None)` when there is none.
    pub fn load(dir: &Path) -> Result<Option<DetachedEnvtest>, EnvtestError> {
        let path = dir.join(STATE_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(EnvtestError::io(format!("reading {}", path.display()), e)),
        };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|source| EnvtestError::State { path, source })
    }

    /// Writes `<dir>/state.json`.
    pub fn save(&self) -> Result<(), EnvtestError> {
        let path = self.dir.join(STATE_FILE);
        let text = serde_json::to_string_pretty(self).map_err(|source| EnvtestError::State {
            path: path.clone(),
            source,
        })?;
        let tmp = self.dir.join(format!("{STATE_FILE}.tmp"));
        std::fs::write(&tmp, text)
            .map_err(|e| EnvtestError::io(format!("writing {}", tmp.display()), e))?;
        std::fs::rename(&tmp, &path)
            .map_err(|e| EnvtestError::io(format!("writing {}", path.display()), e))
    }

    /// Whether both processes still run (and are etcd and kube-apiserver, not a reused pid).
    pub fn is_running(&self) -> bool {
        process_is(self.etcd_pid, &self.etcd_binary)
            && process_is(self.apiserver_pid, &self.apiserver_binary)
    }

    /// Whether the apiserver answers `/readyz` with `ok` (within a few seconds).
    pub async fn is_ready(&self) -> bool {
        match super::files::client_config(&self.kubeconfig).await {
            Ok(config) => process::readyz(&config).await.is_ok(),
            Err(_) => false,
        }
    }

    /// Stops both processes (SIGTERM; SIGKILL after `grace`) and removes the directory.
    pub async fn stop(self, grace: Duration) -> Result<(), EnvtestError> {
        for (pid, name) in [
            (self.apiserver_pid, self.apiserver_binary.as_path()),
            (self.etcd_pid, self.etcd_binary.as_path()),
        ] {
            if !process_is(pid, name) {
                continue;
            }
            process::signal(pid, libc::SIGTERM);
            let deadline = Instant::now() + grace;
            while process_is(pid, name) && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if process_is(pid, name) {
                process::signal(pid, libc::SIGKILL);
                let deadline = Instant::now() + Duration::from_secs(5);
                while process_is(pid, name) && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        match std::fs::remove_dir_all(&self.dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(EnvtestError::io(
                format!("removing {}", self.dir.display()),
                e,
            )),
        }
    }
}

/// Whether `pid` is a live (not zombie) process running `binary` (compared by file name).
fn process_is(pid: u32, binary: &Path) -> bool {
    let Some(name) = binary.file_name() else {
        return false;
    };
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // Format: `pid (comm) state ...`; comm may contain spaces or parentheses, so split at the last ')'.
    let Some(after) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return false;
    };
    if matches!(after.trim_start().chars().next(), Some('Z' | 'X') | None) {
        return false;
    }
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
    let argv0 = String::from_utf8_lossy(argv0);
    Path::new(argv0.as_ref())
        .file_name()
        .is_some_and(|f| f == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(DetachedEnvtest::load(dir.path()).unwrap(), None);
        let s = DetachedEnvtest {
            dir: dir.path().into(),
            etcd_pid: 1,
            apiserver_pid: 2,
            etcd_port: 3,
            apiserver_port: 4,
            server_url: "https://127.0.0.1:4".into(),
            kubeconfig: dir.path().join("kubeconfig"),
            user_kubeconfig: dir.path().join("kubeconfig-user"),
            etcd_binary: "/usr/bin/etcd".into(),
            apiserver_binary: "/x/kube-apiserver".into(),
        };
        s.save().unwrap();
        assert_eq!(DetachedEnvtest::load(dir.path()).unwrap(), Some(s));
        std::fs::write(dir.path().join(STATE_FILE), "{not json").unwrap();
        assert!(matches!(
            DetachedEnvtest::load(dir.path()),
            Err(EnvtestError::State { .. })
        ));
    }

    #[test]
    fn process_is_checks_liveness_and_name() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        // Give the child time to finish exec under load.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !process_is(pid, Path::new("/bin/sleep")) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(
            process_is(pid, Path::new("/bin/sleep")),
            "pid {pid} cmdline {:?}",
            String::from_utf8_lossy(&cmdline)
        );
        assert!(
            !process_is(pid, Path::new("etcd")),
            "a reused pid with another program is not ours"
        );
        child.kill().unwrap();
        // Killed but not reaped: a zombie counts as gone.
        let deadline = Instant::now() + Duration::from_secs(5);
        while process_is(pid, Path::new("/bin/sleep")) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!process_is(pid, Path::new("/bin/sleep")));
        child.wait().unwrap();
        assert!(!process_is(pid, Path::new("/bin/sleep")));
    }
}
