//! A real Kubernetes control plane for tests: etcd + kube-apiserver (+ kube-controller-manager)
//! as child processes of the test.
//!
//! It knows nothing of the actorcile runtime: any kube-rs user can start one. The runtime
//! re-exports it as `actorcile::envtest` (feature `envtest`).
//!
//! [`Envtest`] starts an `etcd` and a `kube-apiserver` on free loopback ports, in a fresh temporary
//! directory that holds the etcd data, the apiserver's self-signed serving certificate, a generated
//! service-account key pair, a static token file (one admin token in group `system:masters` and one
//! non-admin token for the user [`Envtest::user_name`]) and an admin kubeconfig. Clients built by
//! [`Envtest::client`] and [`Envtest::user_client`] trust the apiserver's own certificate (read from
//! its `--cert-dir`); TLS verification is not disabled.
//!
//! The apiserver's flags are chosen by the version its binary reports ([`Envtest::version`]):
//! v1.24 removed `--insecure-port`, for example. It is tested with v1.34 and v1.37, the oldest
//! and newest releases the repository builds.
//! RBAC is enforced, so a test can check that an operator's ClusterRole suffices by binding it to
//! [`Envtest::user_name`] and using [`Envtest::user_client`]. API Priority and Fairness is on,
//! as in any cluster: [`Envtest::limit_user`] gives one user a small priority level of its own,
//! so that a test meets the queueing and the 429s of a busy server.
//!
//! By default there is no controller-manager: nothing garbage-collects by ownerReferences and
//! namespaces never finish deleting. [`EnvtestBuilder::controller_manager`] adds one that runs the
//! garbage collector and the namespace controller, for tests of cascading and foreground deletion.
//!
//! The binaries come from [`binaries`]: the folder in `$KUBEBUILDER_ASSETS` (controller-runtime's
//! layout, so `setup-envtest` downloads work), else `$ACTORCILE_KUBE_ASSETS`, else the cache that
//! the repository's `scripts/install-test-deps.sh` fills by building the newest Kubernetes release
//! from its Go modules (`~/.cache/actorcile/k8s/<version>/bin`), else the newest release in
//! setup-envtest's own store ([`setup_envtest_store`]). CRDs are installed from values
//! ([`EnvtestBuilder::crds`]) or from a folder of files ([`EnvtestBuilder::crd_dir`]).
//!
//! With `USE_EXISTING_CLUSTER=true` ([`USE_EXISTING_CLUSTER`], or
//! [`EnvtestBuilder::use_existing_cluster`]) nothing is started: the tests run against the
//! cluster of the current kubeconfig, as with controller-runtime's envtest.
//!
//! The child processes die with the test: [`Envtest::stop`] and `Drop` kill them and remove the
//! directory, and on Linux they also receive `SIGKILL` when the process that started them exits for any
//! reason (even when a static `Envtest` is never dropped, or the test binary is killed).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use actorcile_envtest::Envtest;
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
//! For a control plane that outlives the process, see [`EnvtestBuilder::start_detached`] and
//! [`DetachedEnvtest`]; the `actorcile-envtest` binary (feature `cli`: `cargo install
//! actorcile-envtest --features cli`) runs one from the command line: `actorcile-envtest up`,
//! `status`, `restart`, `down`.

// No unsafe code, but the control of its own child processes (kill, pidfd, atexit), each
// allowed where it is, with its SAFETY note.
#![deny(unsafe_code)]

mod apf;
mod builder;
#[cfg(feature = "cli")]
pub mod cli;
mod control_plane;
mod crds;
mod detached;
mod error;
mod existing;
mod files;
mod lookup;
mod process;
mod procs;

use std::time::Duration;

pub use apf::PriorityLevel;
pub use builder::EnvtestBuilder;
pub use control_plane::Envtest;
pub use crds::{FIELD_MANAGER, crds_from_dir, crds_from_yaml, install_crds, wait_for_openapi};
pub use detached::{DetachedEnvtest, STATE_FILE};
pub use error::EnvtestError;
pub use existing::USE_EXISTING_CLUSTER;
pub use lookup::{
    ACTORCILE_KUBE_ASSETS, Binaries, KUBEBUILDER_ASSETS, KubeVersion, binaries, cache_dir,
    setup_envtest_store,
};
pub use process::Component;

/// Name of the non-admin user whose token [`Envtest::user_client`] uses.
pub const USER_NAME: &str = "actorcile-user";
/// Name of the admin user (group `system:masters`) whose token [`Envtest::client`] uses.
pub const ADMIN_NAME: &str = "actorcile-admin";

/// Default bound on how long the control plane may take to become ready.
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// The loopback ports a control plane listens on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ports {
    pub(crate) etcd_client: u16,
    pub(crate) etcd_peer: u16,
    pub(crate) apiserver: u16,
}

#[cfg(test)]
mod real_tests;

#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
