//! [`EnvtestBuilder`]: the settings of a control plane, and starting it.

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

use super::process::SpawnMode;
use super::{
    Binaries, DEFAULT_STARTUP_TIMEOUT, DetachedEnvtest, Envtest, EnvtestError, KubeVersion,
    binaries, files,
};

/// Builds an [`Envtest`]; see [`Envtest::builder`].
#[derive(Debug, Clone)]
pub struct EnvtestBuilder {
    crds: Vec<CustomResourceDefinition>,
    crd_dirs: Vec<PathBuf>,
    keep_dir: bool,
    dir: Option<PathBuf>,
    binaries: Option<Binaries>,
    controller_manager: bool,
    startup_timeout: Duration,
    feature_gates: String,
    /// `None`: as `$USE_EXISTING_CLUSTER` says.
    existing: Option<bool>,
    kubeconfig: Option<PathBuf>,
}

impl Default for EnvtestBuilder {
    fn default() -> Self {
        EnvtestBuilder {
            crds: Vec::new(),
            crd_dirs: Vec::new(),
            keep_dir: false,
            dir: None,
            binaries: None,
            controller_manager: false,
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
            feature_gates: String::new(),
            existing: None,
            kubeconfig: None,
        }
    }
}

impl EnvtestBuilder {
    /// CustomResourceDefinitions to install (and wait Established) once the apiserver is ready.
    pub fn crds(mut self, crds: Vec<CustomResourceDefinition>) -> Self {
        self.crds = crds;
        self
    }

    /// Install the CustomResourceDefinitions in the YAML (or JSON) files of `dir` too, as
    /// controller-runtime's `CRDDirectoryPaths` does (read at start: [`crds_from_dir`]). May be
    /// given more than once.
    ///
    /// [`crds_from_dir`]: crate::crds_from_dir
    pub fn crd_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.crd_dirs.push(dir.into());
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

    /// Also run a kube-controller-manager with its garbage collector and namespace controller, so
    /// that ownerReference cascades (background and foreground deletion) and namespace deletion
    /// happen as on a cluster. Default `false`. Needs `kube-controller-manager` beside
    /// `kube-apiserver` (see [`binaries`](super::binaries)); without it, starting fails with
    /// [`EnvtestError::BinaryNotFound`].
    pub fn controller_manager(mut self, run: bool) -> Self {
        self.controller_manager = run;
        self
    }

    /// kube-apiserver's `--feature-gates` (e.g. `"ShardedListAndWatch=true"`, several joined by
    /// commas); default none. A gate the binary does not know makes its start-up fail with
    /// [`EnvtestError::Startup`] and the server's own message.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), actorcile_envtest::EnvtestError> {
    /// let env = actorcile_envtest::Envtest::builder()
    ///     .feature_gates("ShardedListAndWatch=true")
    ///     .start()
    ///     .await?;
    /// # drop(env); Ok(()) }
    /// ```
    pub fn feature_gates(mut self, gates: impl Into<String>) -> Self {
        self.feature_gates = gates.into();
        self
    }

    /// Use an existing cluster instead of starting one, as controller-runtime's
    /// `UseExistingCluster`: the one [`kubeconfig`](Self::kubeconfig) names, else
    /// `$KUBECONFIG`'s or `~/.kube/config`'s current context. The CRDs are installed into it;
    /// nothing is started, and stopping stops nothing (the CRDs and what the tests created
    /// stay). [`Envtest::user_client`] impersonates [`Envtest::user_name`] (the kubeconfig's
    /// identity needs the `impersonate` permission, as a cluster admin has). Restarting a
    /// component and [`start_detached`](Self::start_detached) are
    /// [`EnvtestError::ExistingCluster`]. Default: what `$USE_EXISTING_CLUSTER`
    /// ([`USE_EXISTING_CLUSTER`](crate::USE_EXISTING_CLUSTER)) says, so that a suite written
    /// for envtest runs against a real cluster unchanged.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), actorcile_envtest::EnvtestError> {
    /// let env = actorcile_envtest::Envtest::builder()
    ///     .use_existing_cluster(true)
    ///     .kubeconfig("/home/me/.kube/staging")
    ///     .start()
    ///     .await?;
    /// assert!(env.is_existing_cluster());
    /// # Ok(()) }
    /// ```
    pub fn use_existing_cluster(mut self, existing: bool) -> Self {
        self.existing = Some(existing);
        self
    }

    /// The kubeconfig of the [existing cluster](Self::use_existing_cluster) (default:
    /// `$KUBECONFIG`, else `~/.kube/config`).
    pub fn kubeconfig(mut self, path: impl Into<PathBuf>) -> Self {
        self.kubeconfig = Some(path.into());
        self
    }

    /// Bound on start-up (etcd healthy, apiserver ready, `default` namespace present), and on each
    /// restart and each wait for CRDs to be Established (default 30 s).
    pub fn startup_timeout(mut self, timeout: Duration) -> Self {
        self.startup_timeout = timeout;
        self
    }

    /// Starts etcd and kube-apiserver, waits until `/readyz` answers `ok` and the `default` namespace
    /// exists, then installs the CRDs given with [`crds`](Self::crds) and
    /// [`crd_dir`](Self::crd_dir).
    pub async fn start(self) -> Result<Envtest, EnvtestError> {
        self.launch(SpawnMode::Attached).await
    }

    /// Starts a control plane whose processes outlive this process (own process group, no
    /// parent-death signal) in [`dir`](Self::dir) (required: without it
    /// [`EnvtestError::DetachedWithoutDir`] is returned), and records its state there (see [`DetachedEnvtest::load`]). Stop it with
    /// [`DetachedEnvtest::stop`].
    pub async fn start_detached(self) -> Result<DetachedEnvtest, EnvtestError> {
        if self.wants_existing() {
            return Err(EnvtestError::ExistingCluster {
                what: "start detached",
            });
        }
        if self.dir.is_none() {
            return Err(EnvtestError::DetachedWithoutDir);
        }
        let env = self.launch(SpawnMode::Detached).await?;
        env.into_detached()
    }

    async fn launch(mut self, mode: SpawnMode) -> Result<Envtest, EnvtestError> {
        // Read before anything starts: a bad file is an error, not a half-set-up cluster.
        for dir in &self.crd_dirs {
            self.crds.extend(crate::crds_from_dir(dir)?);
        }
        if self.wants_existing() {
            let existing = crate::existing::connect(
                self.kubeconfig.as_deref(),
                self.dir.clone(),
                self.keep_dir,
            )
            .await?;
            let env = Envtest::of_existing(existing, self.startup_timeout);
            if !self.crds.is_empty() {
                env.install_crds(&self.crds).await?;
            }
            return Ok(env);
        }
        let binaries = match self.binaries.clone() {
            Some(b) => b,
            None => binaries()?,
        };
        let version = KubeVersion::of_binary(&binaries.kube_apiserver)?;
        // A port picked as free can be taken before the component binds it; retry on that.
        let mut attempt = 0;
        let env = loop {
            attempt += 1;
            let work = files::WorkDir::create(self.dir.clone(), self.keep_dir)?;
            let launched = Envtest::launch_in(
                work,
                &binaries,
                version,
                self.controller_manager,
                mode,
                self.startup_timeout,
                &self.feature_gates,
            );
            match launched.await {
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

impl EnvtestBuilder {
    fn wants_existing(&self) -> bool {
        self.existing.unwrap_or_else(crate::existing::asked_by_env)
    }
}

fn is_port_clash(e: &EnvtestError) -> bool {
    matches!(e, EnvtestError::Startup { log_tail, .. } if log_tail.contains("address already in use"))
}
