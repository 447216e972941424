//! # actorcile
//!
//! An actor-based reconcile runtime for Kubernetes operators, on ractor, kube, kube-runtime and
//! tokio. Every managed resource gets a supervised actor that runs its provisioner tree;
//! a provisioner that would block yields, and the yield becomes a scheduled self-message.
//! Readiness, references and deletion ordering between resources are messages between
//! resource actors under a manager supervisor.
//!
//! - [`provisioners`]: the [`Provisioner`](provisioners::Provisioner) trait, outcomes and combinators.
//! - [`runtime`]: the [`Runtime`](runtime::Runtime) an operator embeds.
//! - [`policy`]: the [`SupervisorPolicy`](policy::SupervisorPolicy) tunables.
//! - [`status`]: the `Ready` condition, phases and observed generation.
//! - [`references`]: readiness and references between resources.
//! - [`cluster`]: an in-process Kubernetes API server for tests, benchmarks and simulation.

pub mod actors;
pub mod cluster;
#[cfg(feature = "envtest")]
pub mod envtest;
pub mod messages;
mod object_api;
pub mod policy;
pub mod providers;
pub mod provisioners;
pub mod rbac;
pub mod references;
pub mod runtime;
pub mod status;

/// Default field manager for server-side apply and status writes.
pub const FIELD_MANAGER: &str = "actorcile";

/// Errors of the runtime's public API.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An invalid supervisor policy.
    #[error(transparent)]
    Policy(#[from] policy::PolicyError),
    /// A Kubernetes API error.
    #[error("kubernetes API error: {0}")]
    Kube(#[from] kube::Error),
    /// A manager escalated past its restart intensity.
    #[error("a manager escalated: {0}")]
    Escalated(String),
    /// The context has no reference API (a context built outside the runtime).
    #[error("this context has no reference API (it was not built by the runtime)")]
    NoReferenceApi,
    /// A reference to a kind this runtime does not manage.
    #[error("{0} is not of a kind managed by this runtime")]
    UnmanagedTarget(references::Target),
    /// A reference to a target that does not exist.
    #[error("{0} does not exist")]
    TargetMissing(references::Target),
    /// A reference to a target that is being deleted (no new references are accepted).
    #[error("{0} is being deleted")]
    TargetDeleting(references::Target),
    /// The target changed while a reference was written; retry.
    #[error("{0} changed while the reference was written; retry")]
    Conflict(references::Target),
    /// The running identity lacks permissions the runtime needs (see [`rbac`]).
    #[error("missing RBAC permissions: {}", .0.iter().map(|m| m.to_string()).collect::<Vec<_>>().join("; "))]
    Forbidden(Vec<rbac::MissingPermission>),
    /// An internal failure (a bug, or the runtime could not start).
    #[error("internal error: {0}")]
    Internal(String),
}

#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// What most users need, in one import.
pub mod prelude {
    pub use crate::actors::ManagedResource;
    pub use crate::policy::{BackoffPolicy, Exhausted, RestartPolicy, SupervisorPolicy};
    pub use crate::provisioners::{
        BoxProvisioner, Context, Outcome, Provisioner, Reason, ResourceProvisioner, boxed,
        concurrent, conditional, resource, serial, step,
    };
    pub use crate::references::{Readiness, Target};
    pub use crate::runtime::{Controller, Runtime, RuntimeHandle};
    pub use crate::status::{Phase, ReadyReason, ResourceStatus};
    pub use crate::{concurrent, serial};
}
