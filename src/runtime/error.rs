//! [`Error`]: what building, starting and running a runtime fails with, and the [`Setting`] an
//! invalid one names.

use std::fmt;

/// What building, starting and running a [`Runtime`](super::Runtime) can fail with.
///
/// A step's own calls on its context fail with [`StepError`](crate::provisioners::StepError) instead.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An invalid supervisor policy.
    #[error(transparent)]
    Policy(#[from] crate::policy::PolicyError),
    /// A Kubernetes API error.
    #[error("kubernetes API error: {0}")]
    Kube(#[from] kube::Error),
    /// A manager escalated: one object's actor failed past the restart intensity and the
    /// policy says [`Exhausted::Escalate`](crate::policy::Exhausted::Escalate).
    #[error("the {} manager escalated", .0.kind)]
    Escalated(#[source] super::Escalation),
    /// A manager failed on its own (a bug in the runtime: a manager only fails by escalating).
    #[error("a manager failed")]
    ManagerFailed(#[source] std::sync::Arc<dyn std::error::Error + Send + Sync>),
    /// The running identity lacks permissions the runtime needs (see [`rbac`](crate::rbac)).
    #[error("missing RBAC permissions: {}", .0.iter().map(|m| m.to_string()).collect::<Vec<_>>().join("; "))]
    Forbidden(Vec<crate::rbac::MissingPermission>),
    /// The runtime could not start one of its actors.
    #[error("cannot start the {actor}")]
    Spawn {
        /// Which actor (for example `Database manager`).
        actor: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A setting given to the runtime is missing, malformed or contradicts another: `field`
    /// names it.
    #[error("invalid {field}: {problem}")]
    Invalid {
        /// Which setting.
        field: Setting,
        /// Why.
        problem: String,
    },
    /// A controller's initialize or upgrade hook failed
    /// ([`Controller::on_initialize`](super::Controller::on_initialize),
    /// [`Controller::on_upgrade`](super::Controller::on_upgrade)).
    #[error("the {hook} hook of the {controller} controller failed: {message}")]
    Hook {
        /// The controller's kind.
        controller: String,
        /// `initialize` or `upgrade`.
        hook: &'static str,
        /// The hook's error, as it said it.
        message: String,
    },
    /// The admin server could not listen on its address.
    #[error("the admin server cannot listen on {addr}: {source}")]
    Admin {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// This replica led (see [`leader`](crate::leader)) and could not renew its Lease within the renew
    /// deadline, or another replica took it: every run was stopped at once. Exit and start
    /// again as a candidate.
    #[error("leadership lost: the Lease was not renewed in time")]
    LeadershipLost,
    /// A second SIGTERM or SIGINT came during graceful shutdown: the runtime stopped at once,
    /// aborting the reconciles still running.
    #[error("interrupted again during shutdown; stopped at once")]
    Interrupted,
}

/// The setting an [`Error::Invalid`] names: which of the runtime's options, a controller's or
/// a policy section's. Its `Display` is how the error message names it.
///
/// ```
/// use actorcile::runtime::{ControllerPart, Setting};
///
/// let s = Setting::Controller { kind: "App".into(), part: ControllerPart::Namespace };
/// assert_eq!(s.to_string(), "namespace of the App controller");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Setting {
    /// The controllers registered ([`RuntimeBuilder::controller`](super::RuntimeBuilder::controller)).
    Controllers,
    /// The operator's names ([`OperatorNames`](crate::names::OperatorNames)).
    OperatorNames,
    /// The client (none: [`Runtime::offline_builder`](super::Runtime::offline_builder)).
    Client,
    /// [`RuntimeBuilder::finalizer`](super::RuntimeBuilder::finalizer).
    Finalizer,
    /// [`RuntimeBuilder::migrate_finalizer`](super::RuntimeBuilder::migrate_finalizer).
    FormerFinalizer,
    /// [`RuntimeBuilder::field_manager`](super::RuntimeBuilder::field_manager).
    FieldManager,
    /// A part of one controller's setup.
    Controller {
        /// The controller's kind.
        kind: String,
        /// Which part.
        part: ControllerPart,
    },
    /// The policy's `[kinds.<kind>]` section.
    PolicySection {
        /// The section's kind.
        kind: String,
    },
    /// Sharding ([`Sharding`](crate::sharding::Sharding)): `option` names its
    /// field, or the policy's Lease timing; empty for sharding as a whole.
    Sharding {
        /// The field.
        option: &'static str,
    },
    /// Leader election ([`LeaderElection`](crate::leader::LeaderElection)): `option` names its
    /// field, or the policy's Lease timing; empty for leader election as a whole.
    LeaderElection {
        /// The field.
        option: &'static str,
    },
    /// The CRDs the runtime was asked to install.
    Crds,
    /// The kubeconfig the flags name.
    Kubeconfig,
    /// The log filter (`RUST_LOG` syntax).
    LogFilter,
    /// The process's tracing subscriber (one is installed already).
    TracingSubscriber,
    /// The OTLP endpoint.
    OtlpEndpoint,
    /// The CA certificates an `https` OTLP endpoint is checked against.
    OtlpCaFile,
    /// The OTLP exporter, flushed or shut down.
    OtlpExport,
    /// The process's signal handlers.
    SignalHandling,
}

/// The part of a controller's setup a [`Setting::Controller`] names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ControllerPart {
    /// The controller as a whole (its kind registered twice).
    Whole,
    /// [`Controller::max_concurrent_reconciles`](super::Controller::max_concurrent_reconciles).
    MaxConcurrentReconciles,
    /// A namespace it watches.
    Namespace,
    /// Its provider config.
    Config,
    /// Its policy.
    Policy,
    /// Its shard key.
    ShardKey,
}

impl fmt::Display for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Setting::Controllers => f.write_str("controllers"),
            Setting::OperatorNames => f.write_str("operator names"),
            Setting::Client => f.write_str("client"),
            Setting::Finalizer => f.write_str("finalizer"),
            Setting::FormerFinalizer => f.write_str("migrate_finalizer"),
            Setting::FieldManager => f.write_str("field_manager"),
            Setting::Controller { kind, part } => {
                let part = match part {
                    ControllerPart::Whole => return write!(f, "controller {kind}"),
                    ControllerPart::MaxConcurrentReconciles => "max_concurrent_reconciles",
                    ControllerPart::Namespace => "namespace",
                    ControllerPart::Config => "config",
                    ControllerPart::Policy => "policy",
                    ControllerPart::ShardKey => "shard key",
                };
                write!(f, "{part} of the {kind} controller")
            }
            Setting::PolicySection { kind } => write!(f, "policy section kinds.{kind}"),
            Setting::Sharding { option } => named(f, "sharding", option),
            Setting::LeaderElection { option } => named(f, "leader election", option),
            Setting::Crds => f.write_str("CRDs"),
            Setting::Kubeconfig => f.write_str("kubeconfig"),
            Setting::LogFilter => f.write_str("log filter"),
            Setting::TracingSubscriber => f.write_str("tracing subscriber"),
            Setting::OtlpEndpoint => f.write_str("OTLP endpoint"),
            Setting::OtlpCaFile => f.write_str("OTLP CA file"),
            Setting::OtlpExport => f.write_str("OTLP export"),
            Setting::SignalHandling => f.write_str("signal handling"),
        }
    }
}

/// `what`, then `option` if there is one.
fn named(f: &mut fmt::Formatter<'_>, what: &str, option: &str) -> fmt::Result {
    if option.is_empty() {
        f.write_str(what)
    } else {
        write!(f, "{what} {option}")
    }
}
