//! References, readiness and deletion ordering between managed resources.
//!
//! [`Target`] names a resource; [`ReferenceApi`] is what a provisioner's
//! [`Context`](crate::provisioners::Context) uses to ask whether a target is Ready and to take or
//! release references. The runtime implements it with an index shared by every controller.
//!
//! A target of a kind the runtime manages is Ready when its own actor last said so. A target of
//! any other kind (another operator's custom resource, a `Deployment`) is Ready by its status
//! ([`readiness_of`], or a predicate of the provisioner's); one shared watch per such kind,
//! started when first needed and stopped when nobody waits, wakes whoever waits on its objects.
//!
//! | file | what it holds |
//! |---|---|
//! | `mod.rs` | the public types: [`Target`], [`Readiness`], [`Selection`], [`ReferenceApi`], [`ReferenceError`]; who references an object, read from its annotations ([`referrers_of`]) |
//! | `index.rs` | the runtime's index: readiness, waiters, references held (`index_tests.rs` beside it) |
//! | `index/reference_api.rs` | the reference API the contexts call, served by the index |
//! | `index/deletion.rs` | deletion ordering: foreground deletion, live referrers, cycles |
//! | `index/foreign.rs` | references on kinds the runtime does not manage: the referrer's finalizer on the target, the referrer's list of what it holds |
//! | `external.rs` | the shared watches of kinds the runtime does not manage, [`readiness_of`] |

mod external;
mod index;

/// At most this many references one referrer holds on objects of kinds this runtime does not
/// manage: they are listed in an annotation on the referrer
/// ([`OperatorNames::held_references_annotation`](crate::names::OperatorNames::held_references_annotation)),
/// which must stay well within the API server's 256 KiB of annotations.
pub const MAX_FOREIGN_REFERENCES: usize = 256;

pub use external::{ReadyWhen, readiness_of};
#[cfg(feature = "metrics")]
pub(crate) use index::IndexSizes;
pub(crate) use index::{IndexedKind, ReferenceIndex};

/// What a reference write can fail with ([`ReferenceApi`]); a step sees it as a
/// [`StepError`](crate::provisioners::StepError).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReferenceError {
    /// The API server answered with an error (other than the conflicts retried).
    #[error("kubernetes API error: {0}")]
    Kube(#[from] kube::Error),
    /// A reference to a kind this runtime does not manage, from an index that cannot reach
    /// the API server (one built without a client). The runtime's own index takes such
    /// references (a finalizer of the referrer's on the target).
    #[error("{0} is not of a kind managed by this runtime")]
    UnmanagedTarget(Target),
    /// A reference to a kind this runtime does not manage from a referrer whose controller
    /// runs without the runtime's finalizer: its deletion would not wait to remove the
    /// finalizer the reference puts on the target, which would then hold the target for good.
    #[error(
        "{0} cannot reference objects of kinds this runtime does not manage: its controller runs without a finalizer"
    )]
    ReferrerWithoutFinalizer(Target),
    /// A referrer would hold more than [`MAX_FOREIGN_REFERENCES`] references on kinds this
    /// runtime does not manage.
    #[error(
        "{0} would hold more than {MAX_FOREIGN_REFERENCES} references on kinds this runtime does not manage"
    )]
    TooManyForeignReferences(Target),
    /// A reference to a target that does not exist.
    #[error("{0} does not exist")]
    TargetMissing(Target),
    /// A reference to a target that is being deleted (no new references are accepted).
    #[error("{0} is being deleted")]
    TargetDeleting(Target),
    /// A reference write kept conflicting with other writes to the target (the runtime
    /// retries conflicts; this is what is left after its attempts).
    #[error("{0} kept changing while the reference was written")]
    Conflict(Target),
    /// The referrer could not be serialized into the target's annotation.
    #[error("cannot serialize a reference")]
    Serialize(#[from] serde_json::Error),
}

use std::collections::BTreeSet;
use std::fmt;

use async_trait::async_trait;
use kube::Resource;
use serde::{Deserialize, Serialize};

/// A resource another resource depends on or references: `apiVersion`, `kind`, namespace, name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Target {
    /// `group/version`, or `version` for the core group.
    pub api_version: String,
    /// The kind, e.g. `Database`.
    pub kind: String,
    /// The namespace, `None` for cluster-scoped kinds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The name.
    pub name: String,
}

impl Target {
    /// A target from its parts.
    pub fn new(
        api_version: impl Into<String>,
        kind: impl Into<String>,
        namespace: Option<&str>,
        name: impl Into<String>,
    ) -> Self {
        Self {
            api_version: api_version.into(),
            kind: kind.into(),
            namespace: namespace.map(str::to_string),
            name: name.into(),
        }
    }

    /// The target naming `obj`.
    pub fn of<K: Resource<DynamicType = ()>>(obj: &K) -> Self {
        Self {
            api_version: K::api_version(&()).into_owned(),
            kind: K::kind(&()).into_owned(),
            namespace: obj.meta().namespace.clone(),
            name: obj.meta().name.clone().unwrap_or_default(),
        }
    }

    /// The target of kind `K` with this namespace and name.
    pub fn for_kind<K: Resource<DynamicType = ()>>(namespace: Option<&str>, name: &str) -> Self {
        Self::new(K::api_version(&()), K::kind(&()), namespace, name)
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {}/{}", self.kind, ns, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

/// Whether a target is Ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// The target exists and its Ready condition is True.
    Ready,
    /// The target exists but is not Ready.
    NotReady,
    /// The target exists and is being deleted (it is not Ready, whatever its status says).
    Deleting,
    /// The target exists and has failed: phase `Failed` (a managed target that is terminal,
    /// needs a user's action or is quarantined), or, for a kind this runtime does not manage,
    /// condition `Stalled=True` or `status.phase: Failed` (see [`readiness_of`]). It may still
    /// recover; waiters are woken when it becomes Ready.
    Failed,
    /// No such target is known.
    Missing,
}

/// A set of objects of one managed kind, chosen by a label selector: what
/// [`Context::set_references`](crate::provisioners::Context::set_references) makes carry a
/// reference.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Selection {
    /// `group/version` of the kind.
    pub api_version: String,
    /// The kind, e.g. `SecurityGroup`.
    pub kind: String,
    /// The namespace (`None`: every namespace, or a cluster-scoped kind).
    pub namespace: Option<String>,
    /// A label selector, e.g. `app=web,tier!=db` (empty: every object of the kind).
    pub labels: String,
}

impl Selection {
    /// The objects of `kind` in `namespace` whose labels match `labels`.
    pub fn new(
        api_version: impl Into<String>,
        kind: impl Into<String>,
        namespace: Option<&str>,
        labels: impl Into<String>,
    ) -> Self {
        Self {
            api_version: api_version.into(),
            kind: kind.into(),
            namespace: namespace.map(str::to_string),
            labels: labels.into(),
        }
    }

    /// The target of the object `name` of this selection's kind, in `namespace`.
    fn target(&self, namespace: Option<&str>, name: &str) -> Target {
        Target::new(&self.api_version, &self.kind, namespace, name)
    }
}

/// What provisioners use to coordinate with other resources (implemented by the runtime).
#[async_trait]
pub trait ReferenceApi: Send + Sync {
    /// Readiness of `target`; when not Ready, `from` is registered to be woken when it becomes Ready.
    async fn readiness(&self, from: &Target, target: &Target) -> Readiness;
    /// As [`ReferenceApi::readiness`], with Ready decided by `when` for a target of a kind the
    /// runtime does not manage. (The default ignores `when`.)
    async fn readiness_when(
        &self,
        from: &Target,
        target: &Target,
        when: &ReadyWhen<'_>,
    ) -> Readiness {
        let _ = when;
        self.readiness(from, target).await
    }
    /// `from` takes a reference on `target`, blocking the target's deletion until released.
    async fn add_reference(&self, from: &Target, target: &Target) -> Result<(), ReferenceError>;
    /// `from` releases its reference on `target`.
    async fn release_reference(&self, from: &Target, target: &Target)
    -> Result<(), ReferenceError>;
    /// Exactly the objects of `selection` named in `names` carry `from`'s reference after this.
    async fn set_references(
        &self,
        from: &Target,
        selection: &Selection,
        names: &BTreeSet<String>,
    ) -> Result<(), ReferenceError>;
    /// `from` holds references on exactly `targets` after this: it takes the ones it does not
    /// hold yet, and releases every other one it holds. The default only takes them (an
    /// implementation that does not know what `from` holds cannot release).
    async fn hold_references(
        &self,
        from: &Target,
        targets: &[Target],
    ) -> Result<(), ReferenceError> {
        for t in targets {
            self.add_reference(from, t).await?;
        }
        Ok(())
    }
}

/// Who references `obj`, for the operator `names`: the referrers persisted on it (a reference taken with
/// [`Context::add_reference`](crate::provisioners::Context::add_reference),
/// [`Context::set_references`](crate::provisioners::Context::set_references) or
/// [`Context::hold_references`](crate::provisioners::Context::hold_references) and not released
/// yet). An object with referrers is not deprovisioned until they release it or are gone.
/// References are the annotations under the names'
/// [`reference_prefix`](crate::names::OperatorNames::reference_prefix) (and their former
/// domain's): no other annotation, and no finalizer, counts.
///
/// ```
/// use actorcile::names::OperatorNames;
/// use actorcile::references::referrers_of;
/// use k8s_openapi::api::core::v1::ConfigMap;
///
/// let names = OperatorNames::new("bucket-operator", "buckets.example.com");
/// assert!(referrers_of(&ConfigMap::default(), &names).is_empty());
/// ```
pub fn referrers_of<K: Resource>(obj: &K, names: &crate::names::OperatorNames) -> Vec<Target> {
    obj.meta()
        .annotations
        .as_ref()
        .map(|a| referrers_in(&names.keys(), a))
        .unwrap_or_default()
}

/// The referrers persisted in a set of annotations, under `keys` (each once: a referrer
/// upgraded from the former domain holds its reference under both until it releases it).
pub(crate) fn referrers_in(
    keys: &crate::names::Keys,
    annotations: &std::collections::BTreeMap<String, String>,
) -> Vec<Target> {
    let mut referrers: Vec<Target> = annotations
        .iter()
        .filter(|(k, _)| keys.is_reference(k))
        .filter_map(|(_, v)| serde_json::from_str(v).ok())
        .collect();
    if keys.has_former() {
        referrers.sort_unstable();
        referrers.dedup();
    }
    referrers
}
