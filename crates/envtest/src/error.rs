//! [`EnvtestError`]: what can go wrong while starting, driving or stopping a control plane.

use std::path::PathBuf;
use std::time::Duration;

/// Everything that can go wrong while starting, driving or stopping an [`Envtest`](super::Envtest).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EnvtestError {
    /// A required binary was not found.
    #[error(
        "{name} not found ({looked}); run scripts/install-test-deps.sh from the actorcile repository \
         (Debian 12, as root, Go 1.26 or newer) to build etcd, kube-apiserver and \
         kube-controller-manager, or set $KUBEBUILDER_ASSETS to a folder holding them"
    )]
    BinaryNotFound {
        /// The binary's name (`etcd`, `kube-apiserver` or `kube-controller-manager`).
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
        /// `etcd`, `kube-apiserver` or `kube-controller-manager`.
        component: &'static str,
        /// Why starting failed.
        reason: String,
        /// The tail of the component's log.
        log_tail: String,
    },
    /// [`EnvtestBuilder::start_detached`](super::EnvtestBuilder::start_detached) was called without
    /// [`EnvtestBuilder::dir`](super::EnvtestBuilder::dir).
    #[error("start_detached needs an explicit dir (EnvtestBuilder::dir)")]
    DetachedWithoutDir,
    /// What was asked of the control plane cannot be done to an existing cluster
    /// ([`EnvtestBuilder::use_existing_cluster`](super::EnvtestBuilder::use_existing_cluster)):
    /// its processes are not this test's.
    #[error("{what}: the control plane is an existing cluster, not this test's processes")]
    ExistingCluster {
        /// What was asked (`restart kube-apiserver`, `start detached`, …).
        what: &'static str,
    },
    /// The control plane's processes are not running (when handing them over to a
    /// [`DetachedEnvtest`](super::DetachedEnvtest)).
    #[error("the control plane is not running")]
    NotRunning,
    /// A kubeconfig could not be serialized.
    #[error("serializing a kubeconfig: {source}")]
    KubeconfigYaml {
        /// The YAML library's error (boxed, so that this enum does not name the library).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
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
    /// A CustomResourceDefinition was not served (its resource listed by discovery in each
    /// served version) in time.
    #[error("CustomResourceDefinition {name} was not served within {timeout:?}")]
    CrdNotEstablished {
        /// The CRD's name.
        name: String,
        /// How long was waited.
        timeout: Duration,
    },
    /// The API server's OpenAPI document did not list a CustomResourceDefinition's paths in time.
    #[error("the OpenAPI document did not list CustomResourceDefinition {name} within {timeout:?}")]
    CrdOpenApiNotPublished {
        /// The CRD's name.
        name: String,
        /// How long was waited.
        timeout: Duration,
    },
    /// The server did not classify a user's requests into the priority level made for them
    /// ([`Envtest::limit_user`](super::Envtest::limit_user)) in time.
    #[error("the API server did not send requests to priority level {name} within {timeout:?}")]
    PriorityLevelNotApplied {
        /// The priority level's name.
        name: String,
        /// How long was waited.
        timeout: Duration,
    },
    /// A CustomResourceDefinition has no `metadata.name`.
    #[error("a CustomResourceDefinition has no metadata.name")]
    CrdWithoutName,
    /// A YAML document could not be read as a CustomResourceDefinition.
    #[error("invalid CustomResourceDefinition YAML in document {document}: {source}")]
    Yaml {
        /// Which `---`-separated document, counting from 1 (empty documents do not count).
        document: usize,
        /// The YAML library's error (boxed, so that this enum does not name the library).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A file of a CRD folder ([`crds_from_dir`](crate::crds_from_dir)) holds something
    /// other than CustomResourceDefinitions.
    #[error("{}: {source}", path.display())]
    CrdFile {
        /// The file.
        path: PathBuf,
        /// What is wrong in it (a [`Yaml`](EnvtestError::Yaml) error, naming the document).
        #[source]
        source: Box<EnvtestError>,
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
