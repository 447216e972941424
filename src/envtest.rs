//! A real control plane for tests: etcd + kube-apiserver as child processes.
//!
//! [`Envtest`] starts an `etcd` and a `kube-apiserver` on free loopback ports, in a fresh temporary
//! directory that holds the etcd data, the apiserver's self-signed serving certificate, a generated
//! service-account key pair, a static token file (one admin token in group `system:masters` and one
//! non-admin token for the user [`Envtest::user_name`]) and an admin kubeconfig. Clients built by
//! [`Envtest::client`] and [`Envtest::user_client`] trust the apiserver's own certificate (read from
//! its `--cert-dir`); TLS verification is not disabled.
//!
//! There is no controller-manager: nothing garbage-collects by ownerReferences and namespaces never
//! finish deleting. RBAC is enforced, so a test can check that an operator's ClusterRole suffices by
//! binding it to [`Envtest::user_name`] and using [`Envtest::user_client`].
//!
//! The binaries come from [`binaries`]: `etcd` from `PATH`, `kube-apiserver` from
//! `$ACTORCILE_KUBE_APISERVER` or `~/.cache/actorcile/bin/kube-apiserver`. On Debian 12 the
//! repository's `scripts/install-test-deps.sh` installs etcd and builds kube-apiserver there.
//!
//! The child processes die with the test: [`Envtest::stop`] and `Drop` kill them and remove the
//! directory, and on Linux they also receive `SIGKILL` when the process that started them exits for any
//! reason (even when a static `Envtest` is never dropped, or the test binary is killed).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use actorcile::envtest::Envtest;
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::api::{Api, PostParams};
//!
//! let env = Envtest::start().await?;
//! let cms: Api<ConfigMap> = Api::namespaced(env.client(), "default");
//! let mut cm = ConfigMap::default();
//! cm.metadata.name = Some("hello".into());
//! cms.create(&PostParams::default(), &cm).await?;
//! env.stop().await;
//! # Ok(())
//! # }
//! ```
//!
//! Test binaries with many tests can share one control plane per process with [`Envtest::shared`]
//! (give each test its own namespace).
//!
//! For a control plane that outlives the process (the `actorcile envtest up` command), see
//! [`EnvtestBuilder::start_detached`] and [`DetachedEnvtest`].

mod detached;
mod files;
mod process;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};

pub use detached::{DetachedEnvtest, STATE_FILE};

use process::{Component, Proc, SpawnMode};

/// Name of the non-admin user whose token [`Envtest::user_client`] uses.
pub const USER_NAME: &str = "actorcile-user";
/// Name of the admin user (group `system:masters`) whose token [`Envtest::client`] uses.
pub const ADMIN_NAME: &str = "actorcile-admin";

/// Default bound on how long the control plane may take to become ready.
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// Everything that can go wrong while starting, driving or stopping an [`Envtest`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EnvtestError {
    /// A required binary was not found.
    #[error(
        "{name} not found ({looked}); run scripts/install-test-deps.sh from the actorcile repository \
         (Debian 12, as root) to install etcd and build kube-apiserver"
    )]
    BinaryNotFound {
        /// The binary's name (`etcd` or `kube-apiserver`).
        name: &'static str,
        /// Where it was looked for.
        looked: String,
    },
    /// A file-system or process operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Generating the service-account key pair failed.
    #[error("generating the service-account key pair: {source}")]
    ServiceAccountKey {
        /// The key library's error (boxed, so that this enum does not name the library).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A component exited or did not become ready in time.
    #[error(
        "{component} failed to start: {reason}\n--- last lines of {component}'s log ---\n{log_tail}"
    )]
    Startup {
        /// `etcd` or `kube-apiserver`.
        component: &'static str,
        /// Why starting failed.
        reason: String,
        /// The tail of the component's log.
        log_tail: String,
    },
    /// [`EnvtestBuilder::start_detached`] was called without [`EnvtestBuilder::dir`].
    #[error("start_detached needs an explicit dir (EnvtestBuilder::dir)")]
    DetachedWithoutDir,
    /// The control plane's processes are not running (when handing them over to a
    /// [`DetachedEnvtest`]).
    #[error("the control plane is not running")]
    NotRunning,
    /// A kubeconfig could not be serialized.
    #[error("serializing a kubeconfig: {source}")]
    KubeconfigYaml {
        /// The YAML error.
        #[source]
        source: crate::rbac::YamlError,
    },
    /// A client configuration could not be read or loaded from a kubeconfig file.
    #[error("client configuration from {path}: {source}")]
    Kubeconfig {
        /// The kubeconfig file.
        path: PathBuf,
        /// kube's error.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// A Kubernetes API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// A CustomResourceDefinition did not become Established in time.
    #[error("CustomResourceDefinition {name} did not become Established within {timeout:?}")]
    CrdNotEstablished {
        /// The CRD's name.
        name: String,
        /// How long was waited.
        timeout: Duration,
    },
    /// Waiting for a CustomResourceDefinition to become Established failed (before the timeout).
    #[error("waiting for CustomResourceDefinition {name}: {source}")]
    CrdWait {
        /// The CRD's name.
        name: String,
        /// kube's error.
        #[source]
        source: kube::runtime::wait::Error,
    },
    /// A CustomResourceDefinition has no `metadata.name`.
    #[error("a CustomResourceDefinition has no metadata.name")]
    CrdWithoutName,
    /// A YAML document could not be read as a CustomResourceDefinition.
    #[error("invalid CustomResourceDefinition YAML in document {document}: {source}")]
    Yaml {
        /// Which `---`-separated document, counting from 1 (empty documents count).
        document: usize,
        /// The YAML error.
        #[source]
        source: crate::rbac::YamlError,
    },
    /// The state file of a detached control plane could not be read or written as JSON.
    #[error("detached control plane state {path}: {source}")]
    State {
        /// Path of the state file.
        path: PathBuf,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
}

impl EnvtestError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        EnvtestError::Io {
            context: context.into(),
            source,
        }
    }
}

/// Paths of the two binaries a control plane needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binaries {
    /// The `etcd` server.
    pub etcd: PathBuf,
    /// The `kube-apiserver`.
    pub kube_apiserver: PathBuf,
}

/// The directory where actorcile caches built binaries and state: `$ACTORCILE_CACHE_DIR`, else
/// `$HOME/.cache/actorcile`. `None` when neither variable is set.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("ACTORCILE_CACHE_DIR").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join(".cache").join("actorcile"))
}

/// Finds `etcd` (on `PATH`) and `kube-apiserver` (`$ACTORCILE_KUBE_APISERVER`, else
/// `~/.cache/actorcile/bin/kube-apiserver`, see [`cache_dir`]).
///
/// The error names what is missing and says to run `scripts/install-test-deps.sh`.
pub fn binaries() -> Result<Binaries, EnvtestError> {
    resolve_binaries(
        std::env::var_os("PATH"),
        std::env::var_os("ACTORCILE_KUBE_APISERVER"),
        cache_dir(),
    )
}

fn resolve_binaries(
    path: Option<std::ffi::OsString>,
    apiserver_override: Option<std::ffi::OsString>,
    cache: Option<PathBuf>,
) -> Result<Binaries, EnvtestError> {
    let etcd = path
        .as_ref()
        .and_then(|p| find_on_path(p, "etcd"))
        .ok_or_else(|| EnvtestError::BinaryNotFound {
            name: "etcd",
            looked: format!(
                "searched PATH={}",
                path.as_deref()
                    .map(|p| p.to_string_lossy().into_owned())
                    .unwrap_or_default()
            ),
        })?;
    let (kube_apiserver, looked) = match apiserver_override.filter(|v| !v.is_empty()) {
        Some(p) => {
            let p = PathBuf::from(p);
            let looked = format!("$ACTORCILE_KUBE_APISERVER={}", p.display());
            (p, looked)
        }
        None => match cache {
            Some(dir) => {
                let p = dir.join("bin").join("kube-apiserver");
                let looked = format!(
                    "{} (set $ACTORCILE_KUBE_APISERVER to use another)",
                    p.display()
                );
                (p, looked)
            }
            None => {
                return Err(EnvtestError::BinaryNotFound {
                    name: "kube-apiserver",
                    looked: "neither $ACTORCILE_KUBE_APISERVER nor $HOME is set".into(),
                });
            }
        },
    };
    if !is_executable(&kube_apiserver) {
        return Err(EnvtestError::BinaryNotFound {
            name: "kube-apiserver",
            looked,
        });
    }
    Ok(Binaries {
        etcd,
        kube_apiserver,
    })
}

fn find_on_path(path: &std::ffi::OsStr, name: &str) -> Option<PathBuf> {
    std::env::split_paths(path)
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}
fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Builds an [`Envtest`]; see [`Envtest::builder`].
#[derive(Debug, Clone)]
pub struct EnvtestBuilder {
    crds: Vec<CustomResourceDefinition>,
    keep_dir: bool,
    dir: Option<PathBuf>,
    binaries: Option<Binaries>,
    startup_timeout: Duration,
}

impl Default for EnvtestBuilder {
    fn default() -> Self {
        EnvtestBuilder {
            crds: Vec::new(),
            keep_dir: false,
            dir: None,
            binaries: None,
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
        }
    }
}

impl EnvtestBuilder {
    /// CustomResourceDefinitions to install (and wait Established) once the apiserver is ready.
    pub fn crds(mut self, crds: Vec<CustomResourceDefinition>) -> Self {
        self.crds = crds;
        self
    }

    /// Keep the working directory (etcd data, certificates, logs, kubeconfig) after stopping, for
    /// debugging. Default `false`.
    pub fn keep_dir(mut self, keep: bool) -> Self {
        self.keep_dir = keep;
        self
    }

    /// Use this directory (created if missing; it should be empty) instead of a fresh temporary one.
    /// It is removed on stop unless [`keep_dir`](Self::keep_dir) is set.
    pub fn dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dir = Some(dir.into());
        self
    }

    /// Use these binaries instead of looking them up with [`binaries`].
    pub fn binaries(mut self, binaries: Binaries) -> Self {
        self.binaries = Some(binaries);
        self
    }

    /// Bound on start-up (etcd healthy, apiserver ready, `default` namespace present), and on each
    /// restart and each wait for CRDs to be Established (default 30 s).
    pub fn startup_timeout(mut self, timeout: Duration) -> Self {
        self.startup_timeout = timeout;
        self
    }

    /// Starts etcd and kube-apiserver, waits until `/readyz` answers `ok` and the `default` namespace
    /// exists, then installs the CRDs given with [`crds`](Self::crds).
    pub async fn start(self) -> Result<Envtest, EnvtestError> {
        self.launch(SpawnMode::Attached).await
    }

    /// Starts a control plane whose processes outlive this process (own process group, no
    /// parent-death signal) in [`dir`](Self::dir) (required: without it
    /// [`EnvtestError::DetachedWithoutDir`] is returned), and records its state there (see [`DetachedEnvtest::load`]). Stop it with
    /// [`DetachedEnvtest::stop`].
    pub async fn start_detached(self) -> Result<DetachedEnvtest, EnvtestError> {
        if self.dir.is_none() {
            return Err(EnvtestError::DetachedWithoutDir);
        }
        let env = self.launch(SpawnMode::Detached).await?;
        env.into_detached()
    }

    async fn launch(self, mode: SpawnMode) -> Result<Envtest, EnvtestError> {
        let binaries = match self.binaries.clone() {
            Some(b) => b,
            None => binaries()?,
        };
        // A port picked as free can be taken before the component binds it; retry on that.
        let mut attempt = 0;
        let env = loop {
            attempt += 1;
            let work = files::WorkDir::create(self.dir.clone(), self.keep_dir)?;
            match Envtest::launch_in(work, &binaries, mode, self.startup_timeout).await {
                Ok(env) => break env,
                Err(e) if attempt < 3 && is_port_clash(&e) => continue,
                Err(e) => return Err(e),
            }
        };
        if !self.crds.is_empty() {
            env.install_crds(&self.crds).await?;
        }
        Ok(env)
    }
}

fn is_port_clash(e: &EnvtestError) -> bool {
    matches!(e, EnvtestError::Startup { log_tail, .. } if log_tail.contains("address already in use"))
}

/// A running etcd + kube-apiserver pair owned by the test; see the [module documentation](self).
///
/// Stopping ([`stop`](Self::stop), or dropping) kills both processes and removes the working
/// directory (unless [`EnvtestBuilder::keep_dir`] was set).
#[derive(Debug)]
pub struct Envtest {
    // Field order matters for Drop: the processes are killed before the directory is removed.
    apiserver: Option<Proc>,
    etcd: Option<Proc>,
    work: files::WorkDir,
    binaries: Binaries,
    mode: SpawnMode,
    ports: Ports,
    config: kube::Config,
    user_config: kube::Config,
    startup_timeout: Duration,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Ports {
    pub(crate) etcd_client: u16,
    pub(crate) etcd_peer: u16,
    pub(crate) apiserver: u16,
}

impl Envtest {
    /// Starts a control plane with default settings (`Envtest::builder().start()`).
    pub async fn start() -> Result<Envtest, EnvtestError> {
        Self::builder().start().await
    }

    /// A builder to set CRDs, the working directory, binaries or timeouts.
    pub fn builder() -> EnvtestBuilder {
        EnvtestBuilder::default()
    }

    /// One control plane per process, started on first use with default settings and shared by every
    /// caller (each test binary's tests, for example; give each test its own namespace).
    ///
    /// It is never dropped: when the process exits its processes are killed and its directory removed
    /// (an exit handler), and if the process is killed instead, the parent-death signal still kills
    /// them. A failed start is returned to the caller and retried by the next one. Install CRDs with
    /// [`install_crds`](Self::install_crds) (idempotent). Build clients per test with
    /// [`client`](Self::client).
    pub async fn shared() -> Result<&'static Envtest, EnvtestError> {
        static SHARED: tokio::sync::OnceCell<Envtest> = tokio::sync::OnceCell::const_new();
        SHARED
            .get_or_try_init(|| async {
                let env = Envtest::start().await?;
                shared_cleanup::register(&env);
                Ok(env)
            })
            .await
    }

    async fn launch_in(
        work: files::WorkDir,
        binaries: &Binaries,
        mode: SpawnMode,
        startup_timeout: Duration,
    ) -> Result<Envtest, EnvtestError> {
        let [etcd_client, etcd_peer, apiserver] = process::free_ports::<3>()?;
        let ports = Ports {
            etcd_client,
            etcd_peer,
            apiserver,
        };
        files::prepare(&work, ports.apiserver)?;
        let deadline = Instant::now() + startup_timeout;
        // On any error below, dropping `etcd`/`api` kills them, and dropping `work` removes the
        // directory unless it is kept.
        let etcd = spawn_etcd(&work, &binaries.etcd, &ports, mode, deadline).await?;
        let mut api = Proc::spawn(
            Component::KubeApiserver,
            &binaries.kube_apiserver,
            &process::apiserver_args(&work, &ports),
            &work,
            mode,
        )?;
        // The client trusts the certificate the apiserver generates in its --cert-dir.
        process::wait_file(&mut api, &work.serving_cert(), deadline).await?;
        let config = load_config_retrying(work.kubeconfig_path(), deadline).await?;
        let user_config = load_config_retrying(work.user_kubeconfig_path(), deadline).await?;
        process::wait_apiserver_ready(&mut api, &config, deadline).await?;
        wait_default_namespace(&api, &config, deadline).await?;
        Ok(Envtest {
            apiserver: Some(api),
            etcd: Some(etcd),
            work,
            binaries: binaries.clone(),
            mode,
            ports,
            config,
            user_config,
            startup_timeout,
        })
    }

    fn client_checked(&self) -> Result<kube::Client, EnvtestError> {
        kube::Client::try_from(self.config.clone()).map_err(EnvtestError::from)
    }

    /// A client authenticated as the admin (group `system:masters`).
    ///
    /// Build it inside the Tokio runtime that uses it (each `#[tokio::test]` has its own runtime,
    /// so a shared `Envtest` hands each test a fresh client).
    ///
    /// # Panics
    /// If called outside a Tokio runtime, or if kube cannot build a client from the configuration
    /// that [`start`](Self::start) already used successfully (which does not happen).
    pub fn client(&self) -> kube::Client {
        kube::Client::try_from(self.config.clone())
            .expect("envtest admin configuration was validated at start")
    }

    /// A client authenticated as the non-admin user [`user_name`](Self::user_name), which has no
    /// RBAC permissions until a test grants some.
    ///
    /// # Panics
    /// As [`client`](Self::client).
    pub fn user_client(&self) -> kube::Client {
        kube::Client::try_from(self.user_config.clone())
            .expect("envtest user configuration was validated at start")
    }

    /// The non-admin user's name (`"actorcile-user"`), for RoleBinding subjects.
    pub fn user_name(&self) -> &str {
        USER_NAME
    }

    /// Path of the admin kubeconfig file (valid while this `Envtest` lives).
    pub fn kubeconfig_path(&self) -> &Path {
        self.work.kubeconfig_path()
    }

    /// Path of a kubeconfig file for the non-admin user.
    pub fn user_kubeconfig_path(&self) -> &Path {
        self.work.user_kubeconfig_path()
    }

    /// The working directory (`etcd/` data, `certs/`, `etcd.log`, `kube-apiserver.log`, kubeconfigs).
    pub fn dir(&self) -> &Path {
        self.work.path()
    }

    /// The admin client configuration.
    pub fn config(&self) -> kube::Config {
        self.config.clone()
    }

    /// The non-admin user's client configuration.
    pub fn user_config(&self) -> kube::Config {
        self.user_config.clone()
    }

    /// The apiserver's URL (`https://127.0.0.1:PORT`).
    pub fn server_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.ports.apiserver)
    }

    /// Creates or updates (server-side apply) each CRD, then waits until each is Established (bounded
    /// by the startup timeout).
    pub async fn install_crds(
        &self,
        crds: &[CustomResourceDefinition],
    ) -> Result<(), EnvtestError> {
        let client = self.client_checked()?;
        install_crds(client, crds, self.startup_timeout).await
    }

    /// Kills and restarts kube-apiserver with the same etcd, port, certificates and tokens, and waits
    /// until it is ready again. Existing clients keep working once it is back.
    pub async fn restart_apiserver(&mut self) -> Result<(), EnvtestError> {
        if let Some(p) = self.apiserver.take() {
            p.kill_and_wait();
        }
        let deadline = Instant::now() + self.startup_timeout;
        let mut api = Proc::spawn(
            Component::KubeApiserver,
            &self.binaries.kube_apiserver,
            &process::apiserver_args(&self.work, &self.ports),
            &self.work,
            self.mode,
        )?;
        process::wait_apiserver_ready(&mut api, &self.config, deadline).await?;
        self.apiserver = Some(api);
        Ok(())
    }

    /// Kills and restarts etcd with the same data directory and ports, and waits until the apiserver
    /// reports ready again.
    pub async fn restart_etcd(&mut self) -> Result<(), EnvtestError> {
        if let Some(p) = self.etcd.take() {
            p.kill_and_wait();
        }
        let deadline = Instant::now() + self.startup_timeout;
        let etcd = spawn_etcd(
            &self.work,
            &self.binaries.etcd,
            &self.ports,
            self.mode,
            deadline,
        )
        .await?;
        self.etcd = Some(etcd);
        match self.apiserver.as_mut() {
            Some(api) => process::wait_apiserver_ready(api, &self.config, deadline).await,
            None => self.restart_apiserver().await,
        }
    }

    /// The process ids of etcd and kube-apiserver, when running.
    pub fn pids(&self) -> (Option<u32>, Option<u32>) {
        (
            self.etcd.as_ref().map(Proc::pid),
            self.apiserver.as_ref().map(Proc::pid),
        )
    }

    /// Stops both processes (SIGTERM, then SIGKILL after a 5 s grace period), reaps them, and removes
    /// the working directory unless [`EnvtestBuilder::keep_dir`] was set.
    pub async fn stop(mut self) {
        let api = self.apiserver.take();
        let etcd = self.etcd.take();
        for p in [api, etcd].into_iter().flatten() {
            p.terminate_and_wait(Duration::from_secs(5)).await;
        }
        // Dropping `self` removes the directory.
    }

    fn into_detached(mut self) -> Result<DetachedEnvtest, EnvtestError> {
        let (Some(etcd), Some(api)) = (self.etcd.take(), self.apiserver.take()) else {
            return Err(EnvtestError::NotRunning);
        };
        self.work.set_remove_on_drop(false);
        let state = DetachedEnvtest {
            dir: self.work.path().to_path_buf(),
            etcd_pid: etcd.detach(),
            apiserver_pid: api.detach(),
            etcd_port: self.ports.etcd_client,
            apiserver_port: self.ports.apiserver,
            server_url: self.server_url(),
            kubeconfig: self.work.kubeconfig_path().to_path_buf(),
            user_kubeconfig: self.work.user_kubeconfig_path().to_path_buf(),
            etcd_binary: self.binaries.etcd.clone(),
            apiserver_binary: self.binaries.kube_apiserver.clone(),
        };
        state.save()?;
        Ok(state)
    }
}

/// Cleans up the [`Envtest::shared`] control plane when the process exits.
mod shared_cleanup {
    use std::path::PathBuf;
    use std::sync::Mutex;

    struct Leftovers {
        pids: Vec<u32>,
        dir: PathBuf,
    }

    static LEFTOVERS: Mutex<Option<Leftovers>> = Mutex::new(None);

    pub(super) fn register(env: &super::Envtest) {
        let (etcd, api) = env.pids();
        let pids = [api, etcd].into_iter().flatten().collect();
        let mut guard = LEFTOVERS.lock().unwrap_or_else(|p| p.into_inner());
        *guard = Some(Leftovers {
            pids,
            dir: env.dir().to_path_buf(),
        });
        drop(guard);
        // SAFETY: registering a plain `extern "C"` function with no arguments is always sound.
        unsafe {
            libc::atexit(at_exit);
        }
    }

    extern "C" fn at_exit() {
        let Some(left) = LEFTOVERS.lock().ok().and_then(|mut g| g.take()) else {
            return;
        };
        for pid in left.pids {
            if super::process::signal(pid, libc::SIGKILL) {
                // SAFETY: waitpid on our own child's pid with a null status pointer is sound.
                unsafe {
                    libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), 0);
                }
            }
        }
        let _ = std::fs::remove_dir_all(&left.dir);
    }
}

async fn spawn_etcd(
    work: &files::WorkDir,
    binary: &Path,
    ports: &Ports,
    mode: SpawnMode,
    deadline: Instant,
) -> Result<Proc, EnvtestError> {
    let mut proc = Proc::spawn(
        Component::Etcd,
        binary,
        &process::etcd_args(work, ports),
        work,
        mode,
    )?;
    process::wait_etcd_healthy(&mut proc, ports.etcd_client, deadline).await?;
    Ok(proc)
}

/// Loads a kubeconfig, retrying while the certificate it names may still be half-written.
async fn load_config_retrying(
    path: &Path,
    deadline: Instant,
) -> Result<kube::Config, EnvtestError> {
    loop {
        match files::client_config(path).await {
            Ok(c) => return Ok(c),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

async fn wait_default_namespace(
    proc: &Proc,
    config: &kube::Config,
    deadline: Instant,
) -> Result<(), EnvtestError> {
    use k8s_openapi::api::core::v1::Namespace;
    let client = kube::Client::try_from(config.clone())?;
    let api: Api<Namespace> = Api::all(client);
    loop {
        let last = match api.get_opt("default").await {
            Ok(Some(_)) => return Ok(()),
            Ok(None) => "not created yet".to_string(),
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            return Err(proc.startup_error(format!("the default namespace is missing ({last})")));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates or updates (server-side apply, field manager `actorcile-envtest`) each CRD with `client`,
/// then waits up to `timeout` for each to be Established. Works against any cluster.
pub async fn install_crds(
    client: kube::Client,
    crds: &[CustomResourceDefinition],
    timeout: Duration,
) -> Result<(), EnvtestError> {
    let api: Api<CustomResourceDefinition> = Api::all(client);
    let pp = PatchParams::apply("actorcile-envtest").force();
    let mut names = Vec::with_capacity(crds.len());
    for crd in crds {
        let name = crd
            .metadata
            .name
            .clone()
            .ok_or(EnvtestError::CrdWithoutName)?;
        let mut body = crd.clone();
        body.metadata.resource_version = None;
        body.metadata.managed_fields = None;
        body.status = None;
        api.patch(&name, &pp, &Patch::Apply(&body)).await?;
        names.push(name);
    }
    for name in names {
        let wait = await_condition(api.clone(), &name, conditions::is_crd_established());
        match tokio::time::timeout(timeout, wait).await {
            Ok(Ok(_)) => {}
            Ok(Err(source)) => return Err(EnvtestError::CrdWait { name, source }),
            Err(_) => return Err(EnvtestError::CrdNotEstablished { name, timeout }),
        }
    }
    Ok(())
}

/// Reads CustomResourceDefinitions from YAML text holding one or more documents (separated by
/// `---`); empty documents are skipped.
pub fn crds_from_yaml(text: &str) -> Result<Vec<CustomResourceDefinition>, EnvtestError> {
    use serde::Deserialize;
    let mut out = Vec::new();
    for (index, doc) in serde_norway::Deserializer::from_str(text).enumerate() {
        let invalid = |e| EnvtestError::Yaml {
            document: index + 1,
            source: crate::rbac::YamlError::new(e),
        };
        let value = serde_norway::Value::deserialize(doc).map_err(invalid)?;
        if value.is_null() {
            continue;
        }
        let crd: CustomResourceDefinition = serde_norway::from_value(value).map_err(invalid)?;
        out.push(crd);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CRD_YAML: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  names: {kind: Widget, plural: widgets, singular: widget, listKind: WidgetList}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
---
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gadgets.example.com
spec:
  group: example.com
  names: {kind: Gadget, plural: gadgets}
  scope: Cluster
  versions: []
"#;

    #[test]
    fn crds_from_yaml_reads_every_document() {
        let crds = crds_from_yaml(CRD_YAML).unwrap();
        let names: Vec<_> = crds
            .iter()
            .map(|c| c.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["widgets.example.com", "gadgets.example.com"]);
        assert_eq!(crds[1].spec.scope, "Cluster");
    }

    #[test]
    fn crds_from_yaml_rejects_garbage() {
        let err = crds_from_yaml("apiVersion: v1\nkind: [unclosed").unwrap_err();
        assert!(
            matches!(err, EnvtestError::Yaml { document: 1, .. }),
            "{err:?}"
        );
        let err = crds_from_yaml("metadata: 7").unwrap_err();
        assert!(
            matches!(err, EnvtestError::Yaml { document: 1, .. }),
            "{err:?}"
        );
        // Empty documents count (the first `---` opens document 1), and the cause is the source.
        let err = crds_from_yaml("---\n---\nmetadata: 7\n").unwrap_err();
        assert!(
            matches!(err, EnvtestError::Yaml { document: 2, .. }),
            "{err:?}"
        );
        let source = std::error::Error::source(&err).expect("a YAML error");
        assert!(err.to_string().ends_with(&source.to_string()), "{err}");
    }

    fn fake_executable(dir: &Path, name: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join(name);
        std::fs::write(&p, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn binaries_are_found_on_path_and_in_the_cache() {
        let bin = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let etcd = fake_executable(bin.path(), "etcd");
        std::fs::create_dir(cache.path().join("bin")).unwrap();
        let api = fake_executable(&cache.path().join("bin"), "kube-apiserver");
        let path = std::env::join_paths(["/nonexistent-dir".as_ref(), bin.path()]).unwrap();
        let b = resolve_binaries(Some(path.clone()), None, Some(cache.path().into())).unwrap();
        assert_eq!(
            b,
            Binaries {
                etcd: etcd.clone(),
                kube_apiserver: api
            }
        );
        // The override wins over the cache.
        let other = fake_executable(bin.path(), "my-apiserver");
        let b = resolve_binaries(
            Some(path),
            Some(other.clone().into()),
            Some(cache.path().into()),
        )
        .unwrap();
        assert_eq!(b.kube_apiserver, other);
    }

    #[test]
    fn missing_binaries_name_the_installer() {
        let bin = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let err =
            resolve_binaries(Some(bin.path().into()), None, Some(cache.path().into())).unwrap_err();
        assert!(
            matches!(err, EnvtestError::BinaryNotFound { name: "etcd", .. }),
            "{err}"
        );
        assert!(
            err.to_string().contains("scripts/install-test-deps.sh"),
            "{err}"
        );

        fake_executable(bin.path(), "etcd");
        // A non-executable file does not count.
        std::fs::create_dir(cache.path().join("bin")).unwrap();
        std::fs::write(cache.path().join("bin/kube-apiserver"), "x").unwrap();
        let err =
            resolve_binaries(Some(bin.path().into()), None, Some(cache.path().into())).unwrap_err();
        assert!(
            matches!(
                err,
                EnvtestError::BinaryNotFound {
                    name: "kube-apiserver",
                    ..
                }
            ),
            "{err}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains("scripts/install-test-deps.sh") && msg.contains("kube-apiserver"),
            "{msg}"
        );
    }
}

#[cfg(test)]
mod real_tests;
