//! Who controls a child: the check the runtime makes before it writes or deletes an object under
//! a name the reconciled object chose.
//!
//! A child's name and namespace often come from the object's spec (`spec.configMapName`, a
//! per-tenant Namespace), and the object's author has less privilege than the operator. Writing
//! or deleting whatever exists under that name would let the author use the operator's
//! privileges on objects they could not touch themselves (a confused deputy). So:
//!
//! - a child is the object's only when it carries the object's mark: a controller owner
//!   reference with the object's uid, or, where an owner reference cannot be used (inside a
//!   [`remote`](super::remote()), a namespaced child of another namespace, a cluster-scoped child
//!   of a namespaced object), the annotation
//!   [`owner_annotation`](crate::names::OperatorNames::owner_annotation) (`owner.<domain>/uid`)
//!   holding the object's uid;
//! - an existing object without the mark is not taken over ([`StepError::ChildNotOwned`]) unless
//!   the step opts in with [`ChildRules::adopt`], and never when another owner controls it (as
//!   controller-runtime's `SetControllerReference` refuses an object another controller owns);
//! - a delete goes out only for a child that carries the mark, with its uid as a precondition, so
//!   an object recreated under the name by someone else meanwhile is not deleted;
//! - a namespaced object's children live in its namespace: another namespace needs
//!   [`ChildRules::other_namespaces`], a cluster-scoped child [`ChildRules::cluster_scoped`]
//!   ([`StepError::ChildOutOfScope`] otherwise). A cluster-scoped object has no namespace of its
//!   own, so its children may be anywhere; inside a [`remote`](super::remote()) the object's
//!   namespace means nothing, and the remote's credentials bound where children may be.
//!
//! Between the read that finds no child and the write that creates it, an object created by
//! someone else under the name would be adopted: server-side apply has no create-only
//! precondition. The window is one round trip; the object's author cannot widen it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;

use super::StepError;
use crate::object_api::is_cluster_scoped;
use crate::references::Target;

/// What a step may do with its children beyond the default: where they may live, and whether an
/// existing object under a child's name may be taken over.
///
/// The default is the strictest: children in the object's own namespace, and only objects the
/// object already controls are written or deleted.
///
/// ```
/// use actorcile::prelude::*;
/// use k8s_openapi::api::core::v1::Namespace;
/// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
/// # #[kube(group = "example.com", version = "v1", kind = "Tenant", namespaced)]
/// # struct TenantSpec {}
/// // A Namespace per tenant: a cluster-scoped child, allowed explicitly.
/// let ns = resource("namespace", |t: &Tenant| Namespace {
///     metadata: kube::api::ObjectMeta {
///         name: Some(format!("tenant-{}", t.metadata.name.as_deref().unwrap_or_default())),
///         ..Default::default()
///     },
///     ..Default::default()
/// })
/// .rules(ChildRules::default().cluster_scoped());
/// # let _: ResourceProvisioner<Tenant, Namespace> = ns;
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChildRules {
    adopt: bool,
    other_namespaces: bool,
    cluster_scoped: bool,
}

impl ChildRules {
    /// Take over an existing object under the child's name that no owner controls (it gets the
    /// object's mark). One that another owner controls is still refused.
    pub fn adopt(mut self) -> Self {
        self.adopt = true;
        self
    }

    /// Allow namespaced children in namespaces other than the object's.
    pub fn other_namespaces(mut self) -> Self {
        self.other_namespaces = true;
        self
    }

    /// Allow cluster-scoped children of a namespaced object.
    pub fn cluster_scoped(mut self) -> Self {
        self.cluster_scoped = true;
        self
    }

    /// Whether existing objects without an owner may be taken over.
    pub fn adopts(&self) -> bool {
        self.adopt
    }
}

/// Who controls an existing object, as seen by one owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Control {
    /// It carries the owner's mark.
    Ours,
    /// Nobody's: no controller owner reference and no owner annotation.
    Nobody,
    /// Another owner's: what names it (`Kind name` of a controller owner reference, or the uid of
    /// another owner's annotation).
    Other(String),
}

/// Who controls the object with metadata `meta`, for the owner with uid `owner_uid` (its owner
/// annotation read under `keys`).
pub(crate) fn control(
    meta: &ObjectMeta,
    keys: &crate::names::Keys,
    owner_uid: Option<&str>,
) -> Control {
    let ours = |uid: &str| owner_uid.is_some_and(|o| o == uid);
    let controller = meta
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true));
    if let Some(r) = controller {
        return if ours(&r.uid) {
            Control::Ours
        } else {
            Control::Other(format!("{} {}", r.kind, r.name))
        };
    }
    match meta.annotations.as_ref().and_then(|a| keys.owner_in(a)) {
        Some(uid) if ours(uid) => Control::Ours,
        Some(uid) => Control::Other(format!("the owner with uid {}", excerpt(uid))),
        None => Control::Nobody,
    }
}

/// At most 64 characters of a value read from an object, for a message.
fn excerpt(s: &str) -> String {
    s.chars().take(64).collect()
}

/// The namespace a child of kind `C` goes to: `given` (its own), else its owner's `owner_ns`;
/// `None` for a cluster-scoped kind.
pub(crate) fn child_namespace<'a, C: Resource>(
    given: Option<&'a str>,
    owner_ns: Option<&'a str>,
) -> Option<&'a str> {
    if is_cluster_scoped::<C>() {
        None
    } else {
        given.or(owner_ns)
    }
}

/// Whether a child of kind `C` in `child_ns` (its namespace after defaulting) may be written for
/// an owner of kind `K` in `owner_ns` under `rules`.
pub(crate) fn check_scope<K: Resource, C: Resource<DynamicType = ()>>(
    owner_ns: Option<&str>,
    child_ns: Option<&str>,
    name: &str,
    rules: &ChildRules,
) -> Result<(), StepError> {
    let Some(owner_ns) = owner_ns.filter(|_| !is_cluster_scoped::<K>()) else {
        return Ok(());
    };
    let child = || Target::new(C::api_version(&()), C::kind(&()), child_ns, name);
    if is_cluster_scoped::<C>() {
        if !rules.cluster_scoped {
            return Err(StepError::ChildOutOfScope {
                child: Target::new(C::api_version(&()), C::kind(&()), None, name),
                problem: "is cluster-scoped, and the step does not allow cluster-scoped children"
                    .into(),
            });
        }
    } else if child_ns.is_some_and(|ns| ns != owner_ns) && !rules.other_namespaces {
        return Err(StepError::ChildOutOfScope {
            child: child(),
            problem: format!(
                "is outside the owner's namespace {owner_ns}, and the step does not allow \
                 children in other namespaces"
            ),
        });
    }
    Ok(())
}

/// Whether the owner can mark a child with a controller owner reference: in its own cluster,
/// with the child in the owner's namespace, or the owner cluster-scoped (the garbage collector
/// ignores, or deletes, children whose owner reference crosses namespaces).
pub(crate) fn owner_reference_fits<K: Resource, C: Resource>(
    in_remote: bool,
    owner_ns: Option<&str>,
    child_ns: Option<&str>,
) -> bool {
    if in_remote {
        return false;
    }
    if is_cluster_scoped::<K>() {
        return true;
    }
    !is_cluster_scoped::<C>() && (child_ns.is_none() || child_ns == owner_ns)
}

/// The error for an existing object the owner does not control.
pub(crate) fn not_owned<C: Resource<DynamicType = ()>>(existing: &C, by: Control) -> StepError {
    StepError::ChildNotOwned {
        child: Target::of(existing),
        controller: match by {
            Control::Other(who) => Some(who),
            _ => None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn owner_ref(uid: &str, controller: bool) -> OwnerReference {
        OwnerReference {
            api_version: "example.com/v1".into(),
            kind: "App".into(),
            name: "a".into(),
            uid: uid.into(),
            controller: Some(controller),
            ..Default::default()
        }
    }

    #[test]
    fn only_the_owners_mark_makes_a_child_ours() {
        let keys = crate::names::Keys::standalone();
        let control = |meta: &ObjectMeta, uid| control(meta, &keys, uid);
        let mut meta = ObjectMeta::default();
        assert_eq!(control(&meta, Some("u1")), Control::Nobody);
        // A non-controller owner reference with our uid is not control.
        meta.owner_references = Some(vec![owner_ref("u1", false)]);
        assert_eq!(control(&meta, Some("u1")), Control::Nobody);
        meta.owner_references = Some(vec![owner_ref("u1", true)]);
        assert_eq!(control(&meta, Some("u1")), Control::Ours);
        assert_eq!(control(&meta, None), Control::Other("App a".into()));
        assert_eq!(control(&meta, Some("u2")), Control::Other("App a".into()));
        // The annotation marks where an owner reference cannot; another controller wins over it.
        meta.annotations = Some([(keys.owner().to_string(), "u2".to_string())].into());
        assert_eq!(control(&meta, Some("u2")), Control::Other("App a".into()));
        meta.owner_references = None;
        assert_eq!(control(&meta, Some("u2")), Control::Ours);
        assert!(matches!(control(&meta, Some("u1")), Control::Other(w) if w.contains("u2")));
    }

    #[test]
    fn a_namespaced_owners_children_stay_in_its_namespace_unless_allowed() {
        type Owner = ConfigMap;
        let strict = ChildRules::default();
        check_scope::<Owner, ConfigMap>(Some("a"), Some("a"), "c", &strict).unwrap();
        check_scope::<Owner, ConfigMap>(Some("a"), None, "c", &strict).unwrap();
        let e = check_scope::<Owner, ConfigMap>(Some("a"), Some("b"), "c", &strict).unwrap_err();
        assert!(
            matches!(&e, StepError::ChildOutOfScope { child, .. } if child.namespace.as_deref() == Some("b"))
        );
        check_scope::<Owner, ConfigMap>(Some("a"), Some("b"), "c", &strict.other_namespaces())
            .unwrap();
        let e = check_scope::<Owner, Namespace>(Some("a"), None, "n", &strict).unwrap_err();
        assert!(e.to_string().contains("cluster-scoped"), "{e}");
        check_scope::<Owner, Namespace>(Some("a"), None, "n", &strict.cluster_scoped()).unwrap();
        // A cluster-scoped owner has no namespace of its own.
        check_scope::<Namespace, ConfigMap>(None, Some("b"), "c", &strict).unwrap();
        check_scope::<Namespace, Namespace>(None, None, "n", &strict).unwrap();
    }

    #[test]
    fn owner_references_only_where_the_garbage_collector_honours_them() {
        assert!(owner_reference_fits::<ConfigMap, ConfigMap>(
            false,
            Some("a"),
            Some("a")
        ));
        assert!(!owner_reference_fits::<ConfigMap, ConfigMap>(
            false,
            Some("a"),
            Some("b")
        ));
        assert!(!owner_reference_fits::<ConfigMap, ConfigMap>(
            true,
            Some("a"),
            Some("a")
        ));
        assert!(!owner_reference_fits::<ConfigMap, Namespace>(
            false,
            Some("a"),
            None
        ));
        assert!(owner_reference_fits::<Namespace, ConfigMap>(
            false,
            None,
            Some("b")
        ));
    }
}
