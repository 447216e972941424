//! What the calls a step makes on its [`Context`](super::Context) can fail with.

use super::{Outcome, Reason};
use crate::references::{ReferenceError, Target};

/// What a step's calls on its [`Context`](super::Context) can fail with: its writes to the
/// object (conditions, finalizers, owned children) and its references.
///
/// Conflicts with other writers are retried by the runtime before any of these is returned.
/// Every such call is idempotent: a step returns the error as a failed outcome
/// ([`Outcome::failed`](super::Outcome::failed)) and the next reconcile completes what this one did
/// not.
///
/// ```no_run
/// # use actorcile::prelude::*;
/// use actorcile::provisioners::StepError;
/// use actorcile::references::ReferenceError;
///
/// # async fn f<K: ManagedResource>(cx: &Context<K>, network: Target) -> Outcome {
/// match cx.add_reference(&network).await {
///     Ok(()) => Outcome::Done,
///     Err(StepError::Reference(ReferenceError::TargetMissing(t))) => {
///         Outcome::dependency_not_found(t, "not created yet", std::time::Duration::from_secs(30))
///     }
///     Err(e) => Outcome::failed(Reason::new("NetworkReference", "cannot reference the network"), e),
/// }
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StepError {
    /// The API server answered with an error (other than the conflicts the runtime retries).
    #[error("kubernetes API error: {0}")]
    Kube(#[from] kube::Error),
    /// Something the step passed is malformed: `field` names it.
    #[error("invalid {field}: {problem}")]
    Invalid {
        /// What is invalid.
        field: Field,
        /// Why.
        problem: String,
    },
    /// The context has no reference API (a context built outside the runtime).
    #[error("this context has no reference API (it was not built by the runtime)")]
    NoReferenceApi,
    /// A reference could not be added, released or read.
    #[error(transparent)]
    Reference(#[from] ReferenceError),
    /// The object written does not exist (any more).
    #[error("{0} does not exist")]
    TargetMissing(Target),
    /// A write kept conflicting with other writes to the object (the runtime retries
    /// conflicts; this is what is left after its attempts).
    #[error("{0} kept changing while it was written")]
    Conflict(Target),
    /// A value the runtime writes could not be serialized.
    #[error("cannot serialize a value the runtime writes")]
    Serialize(#[from] serde_json::Error),
    /// An object exists under a child's name that the reconciled object does not control: it is
    /// neither written nor deleted (see [`ChildRules`](super::ChildRules)).
    #[error(
        "{child} exists and is not controlled by this object{}",
        .controller.as_deref().map(|c| format!(" (it is controlled by {c})")).unwrap_or_default()
    )]
    ChildNotOwned {
        /// The existing object.
        child: Target,
        /// What controls it, when something does (`Kind name` of its controller).
        controller: Option<String>,
    },
    /// A child outside the places the step allows (another namespace, or cluster-scoped; see
    /// [`ChildRules`](super::ChildRules)).
    #[error("{child} {problem}")]
    ChildOutOfScope {
        /// The child as the step built it.
        child: Target,
        /// Why it is out of scope.
        problem: String,
    },
}

impl StepError {
    /// The outcome a step returns for this error: [`Outcome::UserActionRequired`] with reason
    /// `ChildNotOwned` for [`StepError::ChildNotOwned`] (someone must remove the object, or the
    /// owner choose another name), [`Outcome::Terminal`] with reason `ChildOutOfScope` for
    /// [`StepError::ChildOutOfScope`] (only a change of the object can fix it), and otherwise a
    /// transient failure with `otherwise` as its reason.
    ///
    /// ```no_run
    /// # use actorcile::prelude::*;
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// # async fn f<K: ManagedResource>(cx: &Context<K>, cm: ConfigMap) -> Outcome {
    /// match cx.create_owned(cm).await {
    ///     Ok(_) => Outcome::Done,
    ///     Err(e) => e.outcome(Reason::new("SettingsFailed", "cannot create the settings")),
    /// }
    /// # }
    /// ```
    pub fn outcome(self, otherwise: Reason) -> Outcome {
        match &self {
            StepError::ChildNotOwned { .. } => {
                Outcome::UserActionRequired(Reason::new("ChildNotOwned", self.to_string()))
            }
            StepError::ChildOutOfScope { .. } => {
                Outcome::Terminal(Reason::new("ChildOutOfScope", self.to_string()))
            }
            _ => Outcome::failed(otherwise, self),
        }
    }
}

/// What a [`StepError::Invalid`] names: the part of a step's call that is malformed. Its
/// `Display` is how the error message names it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Field {
    /// A condition type ([`Context::set_condition`](super::Context::set_condition)).
    ConditionType,
    /// A condition's reason code.
    Reason,
    /// A finalizer name.
    Finalizer,
    /// A field of the status ([`Context::set_status_field`](super::Context::set_status_field)),
    /// by its name.
    StatusField(String),
    /// The name of a child to create (`metadata.name`).
    ChildName,
}

impl std::fmt::Display for Field {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Field::ConditionType => f.write_str("condition type"),
            Field::Reason => f.write_str("reason"),
            Field::Finalizer => f.write_str("finalizer"),
            Field::StatusField(name) => write!(f, "status.{name}"),
            Field::ChildName => f.write_str("metadata.name"),
        }
    }
}
