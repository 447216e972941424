//! A control plane that outlives the process that started it (`actorcile envtest up`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::files::{self, WorkDir};
use super::process::{self, Component, Proc, SpawnMode};
use super::procs::{PidFd, find_process, pid_alive, process_is};
use super::{EnvtestError, KubeVersion, Ports};

/// A control plane started by [`EnvtestBuilder::start_detached`](super::EnvtestBuilder::start_detached):
/// its etcd and kube-apiserver run in their own process group and keep running after the starting
/// process exits. The state is recorded in `<dir>/state.json`.
///
/// ```no_run
/// # async fn demo() -> Result<(), actorcile_envtest::EnvtestError> {
/// use actorcile_envtest::{DetachedEnvtest, Envtest};
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
    /// etcd's peer port on 127.0.0.1 (0 in states written before it was recorded: such a
    /// control plane cannot [`restart`](Self::restart) its etcd).
    #[serde(default)]
    pub etcd_peer_port: u16,
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
    /// The Kubernetes release the apiserver binary reported (`v1.37.2`; empty in states written
    /// before it was recorded).
    #[serde(default)]
    pub version: String,
    /// Process id of kube-controller-manager, when one was started.
    #[serde(default)]
    pub controller_manager_pid: Option<u32>,
    /// The kube-controller-manager binary, when one was started.
    #[serde(default)]
    pub controller_manager_binary: Option<PathBuf>,
    /// kube-apiserver's `--feature-gates`, empty for none
    /// ([`EnvtestBuilder::feature_gates`](super::EnvtestBuilder::feature_gates)).
    #[serde(default)]
    pub feature_gates: String,
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
        self.runs(Component::Etcd) && self.runs(Component::KubeApiserver)
    }

    /// Whether `component`'s recorded process runs.
    pub fn runs(&self, component: Component) -> bool {
        process_is(self.pid(component), self.binary(component))
    }

    /// The recorded process id of `component`.
    pub fn pid(&self, component: Component) -> u32 {
        match component {
            Component::Etcd => self.etcd_pid,
            Component::KubeApiserver => self.apiserver_pid,
            // 0 names no process: `runs` says false.
            Component::KubeControllerManager => self.controller_manager_pid.unwrap_or(0),
        }
    }

    fn binary(&self, component: Component) -> &Path {
        match component {
            Component::Etcd => &self.etcd_binary,
            Component::KubeApiserver => &self.apiserver_binary,
            Component::KubeControllerManager => self
                .controller_manager_binary
                .as_deref()
                .unwrap_or(Path::new("")),
        }
    }

    fn set_pid(&mut self, component: Component, pid: u32) {
        match component {
            Component::Etcd => self.etcd_pid = pid,
            Component::KubeApiserver => self.apiserver_pid = pid,
            Component::KubeControllerManager => self.controller_manager_pid = Some(pid),
        }
    }

    /// The flag only this control plane's `component` is started with (its own port).
    fn own_flag(&self, component: Component) -> String {
        match component {
            Component::Etcd => format!("--listen-client-urls=http://127.0.0.1:{}", self.etcd_port),
            Component::KubeApiserver => format!("--secure-port={}", self.apiserver_port),
            Component::KubeControllerManager => "--controllers=garbagecollector,namespace".into(),
        }
    }

    /// Takes over the pid of a component that was restarted by hand with the same flags (its
    /// recorded process is gone, and a process of the same program serves this control plane's
    /// port): what `kill -9` and a restart from the shell leave behind. Returns the components
    /// adopted, with their old and new pids; [`save`](Self::save) records them.
    pub fn adopt_restarted(&mut self) -> Vec<(Component, u32, u32)> {
        let mut adopted = Vec::new();
        for c in [Component::Etcd, Component::KubeApiserver] {
            if self.runs(c) {
                continue;
            }
            if let Some(pid) = find_process(self.binary(c), &self.own_flag(c)) {
                adopted.push((c, self.pid(c), pid));
                self.set_pid(c, pid);
            }
        }
        adopted
    }

    /// Stops `component` (`SIGKILL`, as a crash; `graceful`: `SIGTERM`, then `SIGKILL` after
    /// 10 s), starts it again with the same flags, data and
    /// ports, waits until the apiserver is ready again (at most `timeout`) and records the new
    /// pid in the state file. A component that is not running is just started. Returns the new
    /// pid.
    pub async fn restart(
        &mut self,
        component: Component,
        graceful: bool,
        timeout: Duration,
    ) -> Result<u32, EnvtestError> {
        let binary = self.binary(component).to_path_buf();
        let ports = Ports {
            etcd_client: self.etcd_port,
            etcd_peer: self.etcd_peer_port,
            apiserver: self.apiserver_port,
        };
        if component == Component::KubeControllerManager {
            return Err(EnvtestError::Startup {
                component: component.name(),
                reason: "restarting the controller manager alone is not supported: \
                         `actorcile envtest down`, then `up --controller-manager`"
                    .into(),
                log_tail: String::new(),
            });
        }
        if component == Component::Etcd && ports.etcd_peer == 0 {
            return Err(EnvtestError::Startup {
                component: component.name(),
                reason: "the state file does not record etcd's peer port (written by an older \
                         actorcile): `actorcile envtest down`, then `up`"
                    .into(),
                log_tail: String::new(),
            });
        }
        let first = if graceful {
            libc::SIGTERM
        } else {
            libc::SIGKILL
        };
        end_process(self.pid(component), &binary, first, Duration::from_secs(10)).await;
        let deadline = Instant::now() + timeout;
        let own_ports = match component {
            Component::Etcd => vec![ports.etcd_client, ports.etcd_peer],
            _ => vec![ports.apiserver],
        };
        wait_ports_free(component, &own_ports, deadline).await?;
        let work = WorkDir::create(Some(self.dir.clone()), true)?;
        let args = match component {
            Component::Etcd => process::etcd_args(&work, &ports),
            _ => {
                // The version recorded at start; a state written before it was recorded asks
                // the binary.
                let version = match KubeVersion::parse(&self.version) {
                    Some(v) => v,
                    None => KubeVersion::of_binary(&self.apiserver_binary)?,
                };
                process::apiserver_args(&work, &ports, version, &self.feature_gates)
            }
        };
        let mut proc = Proc::spawn(component, &binary, &args, &work, SpawnMode::Detached)?;
        if component == Component::Etcd {
            process::wait_etcd_healthy(&mut proc, ports.etcd_client, deadline).await?;
        }
        let config = files::client_config(&self.kubeconfig).await?;
        if component == Component::KubeApiserver {
            process::wait_apiserver_ready(&mut proc, &config, deadline).await?;
        } else {
            // The apiserver is not this process's child: poll its /readyz alone.
            while let Err(last) = process::readyz(&config).await {
                if Instant::now() >= deadline {
                    return Err(EnvtestError::Startup {
                        component: Component::KubeApiserver.name(),
                        reason: format!(
                            "/readyz not ok in time after etcd restarted (last: {last})"
                        ),
                        log_tail: process::log_tail(&work.log_path(Component::KubeApiserver)),
                    });
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        let pid = proc.detach();
        self.set_pid(component, pid);
        self.save()?;
        Ok(pid)
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
        let all = [
            Component::KubeControllerManager,
            Component::KubeApiserver,
            Component::Etcd,
        ];
        for c in all {
            end_process(self.pid(c), self.binary(c), libc::SIGTERM, grace).await;
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

/// Waits until every one of `ports` can be bound on loopback again.
///
/// The process that held them is not this one's child, so there is no `waitpid` to tell when it
/// has fully exited: a killed multi-threaded process (etcd, kube-apiserver) shows its main thread
/// as a zombie — [`process_is`] says gone — while its other threads still hold the listening
/// sockets for a moment, and a new process started then fails with "address already in use".
async fn wait_ports_free(
    component: Component,
    ports: &[u16],
    deadline: Instant,
) -> Result<(), EnvtestError> {
    loop {
        let busy: Vec<u16> = ports
            .iter()
            .copied()
            .filter(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_err())
            .collect();
        if busy.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(EnvtestError::Startup {
                component: component.name(),
                reason: format!("its ports {busy:?} are still in use after the old process ended"),
                log_tail: String::new(),
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Ends `pid` if it is a live `binary`: `signal`, then `SIGKILL` if it still runs after
/// `grace`, waiting 5 s at most for that.
///
/// Whether it has ended is asked of a pidfd taken before the first signal, not of `/proc`: a
/// pidfd keeps naming this very process (never a reused pid) and becomes readable only once every
/// thread of it has exited. `/proc` misleads here: while a process exits, its `cmdline` is
/// already empty (so a check by name calls it gone) and its main thread can be a zombie while
/// other threads still run and hold its ports.
async fn end_process(pid: u32, binary: &Path, signal: libc::c_int, grace: Duration) {
    if !process_is(pid, binary) {
        return;
    }
    let handle = PidFd::open(pid);
    process::signal(pid, signal);
    if wait_exited(handle.as_ref(), pid, grace).await {
        return;
    }
    process::signal(pid, libc::SIGKILL);
    wait_exited(handle.as_ref(), pid, Duration::from_secs(5)).await;
}

/// Waits up to `limit` for `pid` to have exited; `true` if it has.
async fn wait_exited(handle: Option<&PidFd>, pid: u32, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        let exited = match handle {
            Some(fd) => fd.exited(),
            None => !pid_alive(pid),
        };
        if exited {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
            etcd_peer_port: 5,
            apiserver_port: 4,
            server_url: "https://127.0.0.1:4".into(),
            kubeconfig: dir.path().join("kubeconfig"),
            user_kubeconfig: dir.path().join("kubeconfig-user"),
            etcd_binary: "/usr/bin/etcd".into(),
            apiserver_binary: "/x/kube-apiserver".into(),
            version: "v1.37.2".into(),
            controller_manager_pid: None,
            controller_manager_binary: None,
            feature_gates: "ShardedListAndWatch=true".into(),
        };
        s.save().unwrap();
        assert_eq!(DetachedEnvtest::load(dir.path()).unwrap(), Some(s));
        std::fs::write(dir.path().join(STATE_FILE), "{not json").unwrap();
        assert!(matches!(
            DetachedEnvtest::load(dir.path()),
            Err(EnvtestError::State { .. })
        ));
    }

    #[tokio::test]
    async fn a_restart_waits_for_the_old_process_to_let_go_of_its_ports() {
        let held = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = held.local_addr().unwrap().port();
        let soon = Instant::now() + Duration::from_millis(200);
        let err = wait_ports_free(Component::Etcd, &[port], soon)
            .await
            .unwrap_err();
        assert!(err.to_string().contains(&format!("[{port}]")), "{err}");

        let start = Instant::now();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(held);
        });
        let later = Instant::now() + Duration::from_secs(30);
        wait_ports_free(Component::Etcd, &[port], later)
            .await
            .unwrap();
        assert!(
            start.elapsed() >= Duration::from_millis(300),
            "returned before the port was released"
        );
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn ending_a_process_waits_until_it_has_exited() {
        // A child that ignores SIGTERM: only the SIGKILL after the grace period ends it, and
        // `end_process` returns only once it has.
        let mut child = std::process::Command::new("sh")
            .args([
                "-c",
                "trap '' TERM; echo ignoring; while :; do sleep 1; done",
            ])
            // Its `sleep`s outlive it by up to a second: they hold only this test's pipe.
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id();
        // Barrier: the trap is set once the child says so.
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(line.trim(), "ignoring");
        let handle = PidFd::open(pid).expect("pidfd_open on Linux 5.3+");
        assert!(!handle.exited());
        end_process(
            pid,
            Path::new("/bin/sh"),
            libc::SIGTERM,
            Duration::from_millis(200),
        )
        .await;
        assert!(
            handle.exited(),
            "end_process returned while {pid} still runs"
        );
        assert!(!pid_alive(pid));
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    }
}
