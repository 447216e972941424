//! [`Envtest`]: the handle of a running etcd + kube-apiserver pair, and the one shared per process.

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;

use super::process::{self, Component, Proc, SpawnMode};
use super::{
    Binaries, DetachedEnvtest, EnvtestBuilder, EnvtestError, KubeVersion, Ports, USER_NAME, files,
    install_crds,
};

/// A running etcd + kube-apiserver pair owned by the test; see the [module documentation](super).
///
/// Stopping ([`stop`](Self::stop), or dropping) kills both processes and removes the working
/// directory (unless [`EnvtestBuilder::keep_dir`] was set).
#[derive(Debug)]
pub struct Envtest {
    // Field order matters for Drop: the processes are killed before the directory is removed.
    controller_manager: Option<Proc>,
    apiserver: Option<Proc>,
    etcd: Option<Proc>,
    work: files::WorkDir,
    /// `None`: an existing cluster ([`EnvtestBuilder::use_existing_cluster`]), none of whose
    /// processes are this test's.
    pub(super) binaries: Option<Binaries>,
    version: KubeVersion,
    mode: SpawnMode,
    ports: Ports,
    config: kube::Config,
    user_config: kube::Config,
    pub(super) startup_timeout: Duration,
    feature_gates: String,
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

    pub(super) async fn launch_in(
        work: files::WorkDir,
        binaries: &Binaries,
        version: KubeVersion,
        controller_manager: bool,
        mode: SpawnMode,
        startup_timeout: Duration,
        feature_gates: &str,
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
            &process::apiserver_args(&work, &ports, version, feature_gates),
            &work,
            mode,
        )?;
        // The client trusts the certificate the apiserver generates in its --cert-dir.
        process::wait_file(&mut api, &work.serving_cert(), deadline).await?;
        let config = load_config_retrying(work.kubeconfig_path(), deadline).await?;
        let user_config = load_config_retrying(work.user_kubeconfig_path(), deadline).await?;
        process::wait_apiserver_ready(&mut api, &config, deadline).await?;
        wait_default_namespace(&api, &config, deadline).await?;
        let controller_manager = if controller_manager {
            let binary = binaries.kube_controller_manager.as_ref().ok_or_else(|| {
                EnvtestError::BinaryNotFound {
                    name: "kube-controller-manager",
                    looked: format!(
                        "not beside {} (the controller manager was asked for)",
                        binaries.kube_apiserver.display()
                    ),
                }
            })?;
            let mut proc = Proc::spawn(
                Component::KubeControllerManager,
                binary,
                &process::controller_manager_args(&work),
                &work,
                mode,
            )?;
            process::wait_controller_manager(&mut proc, &config, deadline).await?;
            Some(proc)
        } else {
            None
        };
        Ok(Envtest {
            controller_manager,
            apiserver: Some(api),
            etcd: Some(etcd),
            work,
            binaries: Some(binaries.clone()),
            version,
            mode,
            ports,
            config,
            user_config,
            startup_timeout,
            feature_gates: feature_gates.to_string(),
        })
    }

    /// An existing cluster's handle ([`EnvtestBuilder::use_existing_cluster`]): no process of
    /// its own.
    pub(super) fn of_existing(
        existing: crate::existing::Existing,
        startup_timeout: Duration,
    ) -> Envtest {
        Envtest {
            controller_manager: None,
            apiserver: None,
            etcd: None,
            work: existing.work,
            binaries: None,
            version: existing.version,
            mode: SpawnMode::Attached,
            ports: Ports {
                etcd_client: 0,
                etcd_peer: 0,
                apiserver: 0,
            },
            config: existing.config,
            user_config: existing.user_config,
            startup_timeout,
            feature_gates: String::new(),
        }
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

    /// The apiserver's URL (`https://127.0.0.1:PORT`; an existing cluster's as its kubeconfig
    /// names it).
    pub fn server_url(&self) -> String {
        if self.binaries.is_none() {
            return self
                .config
                .cluster_url
                .to_string()
                .trim_end_matches('/')
                .to_string();
        }
        format!("https://127.0.0.1:{}", self.ports.apiserver)
    }

    /// Whether this is an existing cluster ([`EnvtestBuilder::use_existing_cluster`]) rather
    /// than processes this test started.
    pub fn is_existing_cluster(&self) -> bool {
        self.binaries.is_none()
    }

    /// The binaries, or [`EnvtestError::ExistingCluster`] for `what`.
    fn own_binaries(&self, what: &'static str) -> Result<&Binaries, EnvtestError> {
        self.binaries
            .as_ref()
            .ok_or(EnvtestError::ExistingCluster { what })
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
    /// until it is ready again. Existing clients keep working once it is back. An existing
    /// cluster's is not restarted: [`EnvtestError::ExistingCluster`].
    pub async fn restart_apiserver(&mut self) -> Result<(), EnvtestError> {
        let binary = self
            .own_binaries("restart kube-apiserver")?
            .kube_apiserver
            .clone();
        if let Some(p) = self.apiserver.take() {
            p.kill_and_wait();
        }
        let deadline = Instant::now() + self.startup_timeout;
        let mut api = Proc::spawn(
            Component::KubeApiserver,
            &binary,
            &process::apiserver_args(&self.work, &self.ports, self.version, &self.feature_gates),
            &self.work,
            self.mode,
        )?;
        process::wait_apiserver_ready(&mut api, &self.config, deadline).await?;
        self.apiserver = Some(api);
        Ok(())
    }

    /// Kills and restarts etcd with the same data directory and ports, and waits until the apiserver
    /// reports ready again. An existing cluster's is not restarted:
    /// [`EnvtestError::ExistingCluster`].
    pub async fn restart_etcd(&mut self) -> Result<(), EnvtestError> {
        let binary = self.own_binaries("restart etcd")?.etcd.clone();
        if let Some(p) = self.etcd.take() {
            p.kill_and_wait();
        }
        let deadline = Instant::now() + self.startup_timeout;
        let etcd = spawn_etcd(&self.work, &binary, &self.ports, self.mode, deadline).await?;
        self.etcd = Some(etcd);
        match self.apiserver.as_mut() {
            Some(api) => process::wait_apiserver_ready(api, &self.config, deadline).await,
            None => self.restart_apiserver().await,
        }
    }

    /// The Kubernetes release of the running kube-apiserver (as its binary reports it; an
    /// existing cluster's as its `/version` does).
    pub fn version(&self) -> KubeVersion {
        self.version
    }

    /// Whether a kube-controller-manager runs beside the apiserver (see
    /// [`EnvtestBuilder::controller_manager`]); an existing cluster is taken to run one.
    pub fn has_controller_manager(&self) -> bool {
        self.binaries.is_none() || self.controller_manager.is_some()
    }

    /// The process ids of etcd and kube-apiserver, when running.
    pub fn pids(&self) -> (Option<u32>, Option<u32>) {
        (
            self.etcd.as_ref().map(Proc::pid),
            self.apiserver.as_ref().map(Proc::pid),
        )
    }

    /// Stops the processes (SIGTERM, then SIGKILL after a 5 s grace period), reaps them, and
    /// removes the working directory unless [`EnvtestBuilder::keep_dir`] was set. When it
    /// returns, no process of this control plane runs.
    pub async fn stop(mut self) {
        let cm = self.controller_manager.take();
        let api = self.apiserver.take();
        let etcd = self.etcd.take();
        for p in [cm, api, etcd].into_iter().flatten() {
            p.terminate_and_wait(Duration::from_secs(5)).await;
        }
        // Dropping `self` removes the directory.
    }

    pub(super) fn into_detached(mut self) -> Result<DetachedEnvtest, EnvtestError> {
        let binaries = self.own_binaries("start detached")?.clone();
        let (Some(etcd), Some(api)) = (self.etcd.take(), self.apiserver.take()) else {
            return Err(EnvtestError::NotRunning);
        };
        let controller_manager_pid = self.controller_manager.take().map(Proc::detach);
        self.work.set_remove_on_drop(false);
        let state = DetachedEnvtest {
            version: self.version.to_string(),
            controller_manager_pid,
            // Recorded only for a controller manager that was started.
            controller_manager_binary: controller_manager_pid
                .and(binaries.kube_controller_manager.clone()),
            dir: self.work.path().to_path_buf(),
            etcd_pid: etcd.detach(),
            apiserver_pid: api.detach(),
            etcd_port: self.ports.etcd_client,
            etcd_peer_port: self.ports.etcd_peer,
            apiserver_port: self.ports.apiserver,
            server_url: self.server_url(),
            kubeconfig: self.work.kubeconfig_path().to_path_buf(),
            user_kubeconfig: self.work.user_kubeconfig_path().to_path_buf(),
            etcd_binary: binaries.etcd.clone(),
            apiserver_binary: binaries.kube_apiserver.clone(),
            feature_gates: self.feature_gates.clone(),
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

    #[allow(unsafe_code)] // atexit(3)
    pub(super) fn register(env: &super::Envtest) {
        let (etcd, api) = env.pids();
        let cm = env.controller_manager.as_ref().map(super::Proc::pid);
        let pids = [cm, api, etcd].into_iter().flatten().collect();
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

    #[allow(unsafe_code)] // waitpid(2) on envtest's own children
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
        let last = match process::quietly(api.get_opt("default")).await {
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
