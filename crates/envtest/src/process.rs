//! Spawning, watching and stopping the etcd and kube-apiserver processes.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::files::WorkDir;
use super::{EnvtestError, KubeVersion, Ports};

/// How many log lines an error carries.
const LOG_TAIL_LINES: usize = 40;
const POLL: Duration = Duration::from_millis(100);

/// One of the control-plane components.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Component {
    /// etcd.
    Etcd,
    /// kube-apiserver.
    KubeApiserver,
    /// kube-controller-manager (garbage collector and namespace controller), when asked for.
    KubeControllerManager,
}

impl Component {
    /// The component's program name: `etcd`, `kube-apiserver` or `kube-controller-manager`.
    pub fn name(self) -> &'static str {
        match self {
            Component::Etcd => "etcd",
            Component::KubeApiserver => "kube-apiserver",
            Component::KubeControllerManager => "kube-controller-manager",
        }
    }
}

/// Whether the processes belong to this process (die with it) or outlive it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SpawnMode {
    /// Killed when the `Envtest` is dropped, and (Linux) when this process exits.
    Attached,
    /// Own process group, no parent-death signal: outlives this process.
    Detached,
}

/// `N` distinct free TCP ports on 127.0.0.1 (free when asked; the components bind them shortly
/// after), below the kernel's ephemeral range when there is room: a port from that range can be
/// taken, while its component is down, as the local port of any outbound connection on the
/// machine, and a restart then cannot bind it again.
pub(crate) fn free_ports<const N: usize>() -> Result<[u16; N], EnvtestError> {
    // Hold every listener until all ports are known, so that no port is handed out twice.
    let mut listeners = Vec::with_capacity(N);
    let mut ports = [0u16; N];
    let range = fixed_ports();
    for port in &mut ports {
        let fixed = range.clone().and_then(|range| {
            (0..200).find_map(|_| {
                let p = fastrand::u16(range.clone());
                std::net::TcpListener::bind(("127.0.0.1", p)).ok()
            })
        });
        let l = match fixed {
            Some(l) => l,
            None => std::net::TcpListener::bind(("127.0.0.1", 0))
                .map_err(|e| EnvtestError::io("finding a free loopback port", e))?,
        };
        *port = l
            .local_addr()
            .map_err(|e| EnvtestError::io("finding a free loopback port", e))?
            .port();
        listeners.push(l);
    }
    Ok(ports)
}

/// The lowest port [`free_ports`] picks outside the ephemeral range (clear of the well-known
/// and most registered service ports).
const FIXED_PORTS_FROM: u16 = 20000;

/// Where [`free_ports`] picks from: [`FIXED_PORTS_FROM`] up to the kernel's ephemeral range,
/// when that leaves room for at least 1000 ports.
fn fixed_ports() -> Option<std::ops::Range<u16>> {
    ephemeral_start()
        .filter(|&low| low > FIXED_PORTS_FROM + 1000)
        .map(|low| FIXED_PORTS_FROM..low)
}

/// The first port of the kernel's ephemeral range (`ip_local_port_range`), if readable.
fn ephemeral_start() -> Option<u16> {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

pub(crate) fn etcd_args(work: &WorkDir, ports: &Ports) -> Vec<OsString> {
    let client = format!("http://127.0.0.1:{}", ports.etcd_client);
    let peer = format!("http://127.0.0.1:{}", ports.etcd_peer);
    let mut data = OsString::from("--data-dir=");
    data.push(work.etcd_data());
    vec![
        "--name=actorcile-envtest".into(),
        data,
        format!("--listen-client-urls={client}").into(),
        format!("--advertise-client-urls={client}").into(),
        format!("--listen-peer-urls={peer}").into(),
        format!("--initial-advertise-peer-urls={peer}").into(),
        format!("--initial-cluster=actorcile-envtest={peer}").into(),
        "--log-level=warn".into(),
    ]
}

fn path_flag(flag: &str, p: PathBuf) -> OsString {
    let mut s = OsString::from(flag);
    s.push("=");
    s.push(p);
    s
}

/// kube-apiserver's flags, chosen by its version: only flags that release still has.
///
/// An unversioned build (`v0.0.0-master`, a `go build` without version stamping) is taken to be
/// a current release.
pub(crate) fn apiserver_args(
    work: &WorkDir,
    ports: &Ports,
    version: KubeVersion,
    feature_gates: &str,
) -> Vec<OsString> {
    let mut args = vec![
        format!("--etcd-servers=http://127.0.0.1:{}", ports.etcd_client).into(),
        format!("--secure-port={}", ports.apiserver).into(),
        "--bind-address=127.0.0.1".into(),
        "--advertise-address=127.0.0.1".into(),
        path_flag("--cert-dir", work.cert_dir()),
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
        path_flag("--service-account-key-file", work.sa_pub()),
        path_flag("--service-account-signing-key-file", work.sa_key()),
        path_flag("--token-auth-file", work.token_file()),
        "--authorization-mode=RBAC".into(),
        "--service-cluster-ip-range=10.0.0.0/24".into(),
        "--disable-admission-plugins=ServiceAccount".into(),
        // No `kubernetes` Service endpoints: current servers refuse to publish a loopback
        // address there (and nothing in a test routes to it), so envtest turns it off, as
        // controller-runtime's envtest does.
        "--endpoint-reconciler-type=none".into(),
    ];
    if version.major == 1 && !version.at_least(1, 24) {
        // Up to v1.23 the server also serves plain HTTP on 127.0.0.1:8080 unless told not to, and
        // two control planes would clash there; v1.24 removed the flag (and refuses it).
        args.push("--insecure-port=0".into());
    }
    if !feature_gates.is_empty() {
        args.push(format!("--feature-gates={feature_gates}").into());
    }
    args
}

/// kube-controller-manager's flags: the garbage collector and the namespace controller only
/// (what ownerReference cascades and namespace deletion need), talking to the apiserver as the
/// admin, no serving port (nothing needs its metrics or health).
pub(crate) fn controller_manager_args(work: &WorkDir) -> Vec<OsString> {
    vec![
        path_flag("--kubeconfig", work.kubeconfig_path().to_path_buf()),
        "--controllers=garbagecollector,namespace".into(),
        "--use-service-account-credentials=false".into(),
        // Leader election on, for one reason: the Lease it takes is how start-up sees that the
        // controllers run (with no serving port there is no /healthz to ask).
        "--leader-elect=true".into(),
        "--secure-port=0".into(),
    ]
}

/// A running component. Killed (and reaped) on drop unless [`Proc::detach`]ed.
#[derive(Debug)]
pub(crate) struct Proc {
    component: Component,
    child: Option<Child>,
    pid: u32,
    log: PathBuf,
}

impl Proc {
    pub(crate) fn spawn(
        component: Component,
        binary: &Path,
        args: &[OsString],
        work: &WorkDir,
        mode: SpawnMode,
    ) -> Result<Proc, EnvtestError> {
        let log = work.log_path(component);
        let open_log = || {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .map_err(|e| EnvtestError::io(format!("opening {}", log.display()), e))
        };
        let out = open_log()?;
        {
            use std::io::Write;
            let mut marker = open_log()?;
            let _ = writeln!(
                marker,
                "=== actorcile envtest: starting {} ===",
                binary.display()
            );
        }
        let err = out
            .try_clone()
            .map_err(|e| EnvtestError::io(format!("opening {}", log.display()), e))?;
        let mut cmd = Command::new(binary);
        cmd.args(args)
            .current_dir(work.path())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        #[cfg(target_os = "linux")]
        system_huge_pages(&mut cmd);
        let spawned = match mode {
            SpawnMode::Attached => spawn_attached(cmd),
            SpawnMode::Detached => {
                use std::os::unix::process::CommandExt;
                cmd.process_group(0);
                cmd.spawn()
            }
        };
        let child = spawned.map_err(|e| EnvtestError::Startup {
            component: component.name(),
            reason: format!("cannot run {}: {e}", binary.display()),
            log_tail: String::new(),
        })?;
        Ok(Proc {
            component,
            pid: child.id(),
            child: Some(child),
            log,
        })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// The exit status if the process has exited.
    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    pub(crate) fn startup_error(&self, reason: String) -> EnvtestError {
        EnvtestError::Startup {
            component: self.component.name(),
            reason,
            log_tail: log_tail(&self.log),
        }
    }

    /// Fails with the log tail if the process has exited.
    fn check_alive(&mut self) -> Result<(), EnvtestError> {
        match self.exited() {
            Some(status) => Err(self.startup_error(format!("exited with {status}"))),
            None => Ok(()),
        }
    }

    /// SIGKILL and reap.
    pub(crate) fn kill_and_wait(mut self) {
        self.kill_now();
    }

    fn kill_now(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, wait up to `grace` for the exit, then SIGKILL; always reaps.
    pub(crate) async fn terminate_and_wait(mut self, grace: Duration) {
        if let Some(c) = self.child.as_mut()
            && signal(self.pid, libc::SIGTERM)
        {
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline {
                if matches!(c.try_wait(), Ok(Some(_)) | Err(_)) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        self.kill_now();
    }

    /// Lets the process run on after this value is dropped; returns its pid.
    pub(crate) fn detach(mut self) -> u32 {
        // Dropping a std Child neither kills nor waits.
        drop(self.child.take());
        self.pid
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill_now();
    }
}

/// Sends `sig` to `pid`; `true` if it was delivered.
#[allow(unsafe_code)] // kill(2): process control of envtest's own child processes
pub(crate) fn signal(pid: u32, sig: libc::c_int) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill(2) has no memory-safety preconditions; pid is a positive process id.
    unsafe { libc::kill(pid, sig) == 0 }
}

/// Spawns `cmd` from one long-lived thread with `PR_SET_PDEATHSIG = SIGKILL`, so that the child is
/// killed when this process exits, however it exits. (The parent-death signal fires when the *thread*
/// that forked exits, hence the dedicated thread that lives as long as the process.)
fn spawn_attached(cmd: Command) -> std::io::Result<Child> {
    type Request = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<std::sync::Mutex<mpsc::Sender<Request>>> = OnceLock::new();
    let sender = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        let spawned = std::thread::Builder::new()
            .name("actorcile-envtest-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    set_parent_death_signal(&mut cmd);
                    let _ = reply.send(cmd.spawn());
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(
                "envtest: cannot start the spawner thread ({e}); children are spawned directly"
            );
        }
        std::sync::Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    let request = (cmd, reply_tx);
    let sent = match sender.lock() {
        Ok(s) => s.send(request),
        Err(poisoned) => poisoned.into_inner().send(request),
    };
    match sent {
        Ok(()) => reply_rx
            .recv()
            .unwrap_or_else(|_| Err(std::io::Error::other("envtest spawner thread is gone"))),
        // The spawner thread could not be started: spawn here (no parent-death guarantee).
        Err(mpsc::SendError((mut cmd, _))) => cmd.spawn(),
    }
}

/// Runs the component with transparent huge pages as the system sets them: a parent process
/// may have turned them off for itself (`PR_SET_THP_DISABLE`, as mimalloc does with
/// `MIMALLOC_ALLOW_THP=0`), and the flag is inherited across fork and exec.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)] // prctl(2) in the child before exec
fn system_huge_pages(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs between fork and exec and only calls prctl(2), which is
    // async-signal-safe; a kernel without the flag answers EINVAL, which changes nothing.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_THP_DISABLE, 0, 0, 0, 0);
            Ok(())
        });
    }
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)] // prctl(2) in the child before exec
fn set_parent_death_signal(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id();
    // SAFETY: the closure runs between fork and exec and only calls the async-signal-safe functions
    // prctl(2), getppid(2) and _exit(2).
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect.
            if libc::getppid() as u32 != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn set_parent_death_signal(_cmd: &mut Command) {}

/// The last lines of a log file (empty if unreadable).
pub(crate) fn log_tail(path: &Path) -> String {
    let Ok(bytes) = std::fs::read(path) else {
        return String::new();
    };
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(LOG_TAIL_LINES);
    lines[start..].join("\n")
}

/// Waits until etcd answers `GET /health` with `"health":"true"`.
pub(crate) async fn wait_etcd_healthy(
    proc: &mut Proc,
    port: u16,
    deadline: Instant,
) -> Result<(), EnvtestError> {
    loop {
        proc.check_alive()?;
        let last = match http_get_loopback(port, "/health").await {
            Ok(body) if body.contains("\"health\":\"true\"") => return Ok(()),
            Ok(body) => format!("/health answered: {body}"),
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            return Err(proc.startup_error(format!("not healthy in time (last: {last})")));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// A plain-HTTP GET on 127.0.0.1, returning the whole response (status line, headers, body).
async fn http_get_loopback(port: u16, path: &str) -> std::io::Result<String> {
    let fut = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
            .await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    };
    tokio::time::timeout(Duration::from_secs(2), fut)
        .await
        .unwrap_or_else(|_| {
            Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "timed out",
            ))
        })
}

/// Waits until the apiserver has written its serving certificate (needed to build a client).
pub(crate) async fn wait_file(
    proc: &mut Proc,
    file: &Path,
    deadline: Instant,
) -> Result<(), EnvtestError> {
    loop {
        proc.check_alive()?;
        if std::fs::metadata(file)
            .map(|m| m.len() > 0)
            .unwrap_or(false)
        {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(proc.startup_error(format!("{} was not written in time", file.display())));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until kube-controller-manager holds its leader Lease (`kube-system/kube-controller-manager`),
/// after which it starts its controllers.
pub(crate) async fn wait_controller_manager(
    proc: &mut Proc,
    config: &kube::Config,
    deadline: Instant,
) -> Result<(), EnvtestError> {
    use k8s_openapi::api::coordination::v1::Lease;
    let client = kube::Client::try_from(config.clone())?;
    let leases: kube::Api<Lease> = kube::Api::namespaced(client, "kube-system");
    loop {
        proc.check_alive()?;
        let last = match quietly(leases.get_opt("kube-controller-manager")).await {
            Ok(Some(l))
                if l.spec
                    .as_ref()
                    .and_then(|s| s.holder_identity.as_ref())
                    .is_some() =>
            {
                return Ok(());
            }
            Ok(_) => "its leader Lease is not held yet".to_string(),
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            return Err(proc.startup_error(format!("not running in time ({last})")));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Runs a start-up probe with tracing events discarded: while a server starts, kube's client
/// logs every refused connection and `500` at ERROR level, which are expected there and would
/// read as failures in the user's log. The probe's own result says what happened.
pub(crate) async fn quietly<F: std::future::Future>(probe: F) -> F::Output {
    use tracing::instrument::WithSubscriber;
    probe
        .with_subscriber(tracing::subscriber::NoSubscriber::default())
        .await
}

/// Waits until `GET /readyz` answers `ok`.
pub(crate) async fn wait_apiserver_ready(
    proc: &mut Proc,
    config: &kube::Config,
    deadline: Instant,
) -> Result<(), EnvtestError> {
    loop {
        proc.check_alive()?;
        let Err(last) = readyz(config).await else {
            return Ok(());
        };
        if Instant::now() >= deadline {
            return Err(proc.startup_error(format!("/readyz not ok in time (last: {last})")));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// `Ok` if `GET /readyz` answers `ok`, else a description of the answer.
pub(crate) async fn readyz(config: &kube::Config) -> Result<(), String> {
    let mut config = config.clone();
    config.connect_timeout = Some(Duration::from_secs(2));
    config.read_timeout = Some(Duration::from_secs(5));
    let client = kube::Client::try_from(config).map_err(|e| e.to_string())?;
    let req = http::Request::get("/readyz")
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    match quietly(client.request_text(req)).await {
        Ok(body) if body.trim() == "ok" => Ok(()),
        Ok(body) => Err(format!("/readyz answered: {body}")),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_tail_keeps_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.log");
        let text: Vec<String> = (0..100).map(|i| format!("line {i}")).collect();
        std::fs::write(&p, text.join("\n")).unwrap();
        let tail = log_tail(&p);
        assert_eq!(tail.lines().count(), LOG_TAIL_LINES);
        assert!(
            tail.starts_with("line 60\n") && tail.ends_with("line 99"),
            "{tail}"
        );
        assert_eq!(log_tail(&dir.path().join("missing")), "");
    }

    #[test]
    fn free_ports_are_distinct_and_bindable() {
        let ports = free_ports::<3>().unwrap();
        assert!(ports.iter().all(|p| *p != 0));
        assert!(ports[0] != ports[1] && ports[1] != ports[2] && ports[0] != ports[2]);
        let _held: Vec<_> = ports
            .iter()
            .map(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).unwrap())
            .collect();
        if let Some(range) = fixed_ports() {
            assert!(
                ports.iter().all(|p| range.contains(p)),
                "{ports:?} not in {range:?}, below the ephemeral range"
            );
        }
    }

    #[test]
    fn attached_children_are_spawned_and_reaped() {
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        let mut child = spawn_attached(cmd).unwrap();
        assert!(
            child.try_wait().unwrap().is_none(),
            "child should be running"
        );
        child.kill().unwrap();
        let status = child.wait().unwrap();
        assert!(!status.success());
    }

    #[test]
    fn a_missing_binary_is_a_startup_error() {
        let work = WorkDir::create(None, false).unwrap();
        let err = Proc::spawn(
            Component::Etcd,
            Path::new("/nonexistent/etcd"),
            &[],
            &work,
            SpawnMode::Attached,
        )
        .unwrap_err();
        assert!(
            matches!(
                err,
                EnvtestError::Startup {
                    component: "etcd",
                    ..
                }
            ),
            "{err}"
        );
    }
}
