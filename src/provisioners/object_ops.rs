//! The object operations: what a step may do to the object it reconciles and around it, without
//! touching raw status or metadata (the surface of sequencer's `ProviderController`).
//!
//! | method | what it does |
//! |---|---|
//! | [`Context::set_condition`] | set one named condition of the step's own (change-only) |
//! | [`Context::condition`] | read a condition as the reconcile last knows it |
//! | [`Context::set_status_field`] / [`Context::status_as`] | a field of the object's status, in the reconcile's one status write; the status read as a type |
//! | [`Context::get`] | read any object in the context's cluster |
//! | [`Context::create_owned`] / [`Context::delete_owned`] | children owned by the object, never another's (`ownership.rs`) |
//! | [`Context::add_finalizer`] / [`Context::remove_finalizer`] | an extra finalizer of the step's own |
//! | [`Context::event`] | a Kubernetes Event on the object |
//! | [`Context::guard`] | an external side effect, at most once per intent (`guard.rs`) |
//!
//! Every write to the object is optimistic: it carries the resourceVersion the reconcile knows, and
//! a conflict (someone else wrote the object meanwhile) is retried by the runtime on a fresh
//! read, never handed to the step. Several steps of one reconcile, even concurrent ones, write
//! their conditions and finalizers without clobbering each other. The runtime counts what
//! they write as the reconcile's own writes (their watch echoes run no reconcile), and its `Ready`
//! write at the end of the reconcile builds on them.

use std::fmt::Debug;
use std::sync::Arc;

use kube::Resource;
use kube::api::{DeleteParams, Patch, Preconditions};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use super::ownership::{Control, check_scope, child_namespace, not_owned};
use super::{ChildRules, Context, Reason};
use super::{Field, StepError};
use crate::ManagedResource;
use crate::object_api::{ObjectApi, patch_params, version_of};
use crate::references::Target;
use crate::status::{Condition, ConditionStatus, READY, ResourceStatus, is_valid_condition_type};

/// Attempts of one optimistic write before it gives up with [`StepError::Conflict`](super::StepError::Conflict).
const CONFLICT_ATTEMPTS: usize = 5;

/// Why an optimistic write of the object did not happen.
#[derive(Debug)]
pub(crate) enum WriteError {
    /// The object changed since the reconcile read it (only when conflicts are not retried).
    Stale,
    /// The write failed (or kept conflicting).
    Failed(StepError),
}

impl<K: ManagedResource> Context<K> {
    /// The newest version of the object this reconcile knows: the one it started on, or the one its
    /// steps' last write to the object returned.
    pub fn latest(&self) -> Arc<K> {
        self.written()
            .latest
            .clone()
            .unwrap_or_else(|| self.object().clone())
    }

    /// The condition of type `type_` on the newest version of the object this reconcile knows.
    pub fn condition(&self, type_: &str) -> Option<Condition> {
        ResourceStatus::of(self.latest().as_ref())
            .condition(type_)
            .cloned()
    }

    /// Set the condition `type_` of the object's status to `status` with `reason` (its code is
    /// the condition's reason, its message the message), for the object's current generation.
    ///
    /// Change-only: nothing is written when the condition already says exactly this. Other
    /// conditions are left as they are, whoever wrote them; `Ready` is the runtime's and cannot
    /// be set here. Conflicts are retried on a fresh read.
    ///
    /// ```no_run
    /// # use actorcile::prelude::*;
    /// # async fn f<K: ManagedResource>(cx: &Context<K>) -> Outcome {
    /// let reason = Reason::new("RecordCreated", "dns record www.example.com created");
    /// if let Err(e) = cx.set_condition("DnsRecord", true, &reason).await {
    ///     return Outcome::failed(Reason::new("ConditionWriteFailed", "cannot write DnsRecord"), e);
    /// }
    /// Outcome::Done
    /// # }
    /// ```
    pub async fn set_condition(
        &self,
        type_: &str,
        status: impl Into<ConditionStatus>,
        reason: &Reason,
    ) -> Result<(), StepError> {
        check_condition_type(type_)?;
        if !reason.has_valid_code() {
            return Err(StepError::Invalid {
                field: Field::Reason,
                problem: format!("{:?} is not a valid condition reason", reason.code()),
            });
        }
        let status = status.into();
        let generation = self.object().meta().generation;
        self.write_conditions(true, |st| {
            st.with_condition(type_, status, reason.code(), reason.message(), generation)
        })
        .await
        .map(|_| ())
        .map_err(|e| match e {
            WriteError::Stale => StepError::Conflict(self.target()),
            WriteError::Failed(e) => e,
        })
    }

    /// Set the condition the running step owns ([`Step::attached_condition`](super::Step::attached_condition))
    /// to `status` with `reason`, as [`Context::set_condition`] does (sequencer's
    /// `UpdateCondition`): a step that names its condition once does not repeat it at every
    /// write. A step without an attached condition gets [`StepError::Invalid`] naming
    /// [`Field::ConditionType`].
    ///
    /// ```no_run
    /// # use actorcile::prelude::*;
    /// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
    /// # #[kube(group = "example.com", version = "v1", kind = "Site", namespaced, status = "ResourceStatus")]
    /// # struct SiteSpec { host: String }
    /// let dns = step("dns", |cx: Context<Site>| async move {
    ///     if cx.attached_condition().is_some_and(|c| c.status == "True") {
    ///         return Outcome::Done; // recorded by an earlier reconcile
    ///     }
    ///     let done = Reason::new("RecordCreated", format!("{} created", cx.object().spec.host));
    ///     match cx.update_condition(true, &done).await {
    ///         Ok(()) => Outcome::Done,
    ///         Err(e) => Outcome::failed(Reason::new("ConditionWriteFailed", "cannot write DnsRecord"), e),
    ///     }
    /// })
    /// .attached_condition("DnsRecord");
    /// # let _ = dns;
    /// ```
    pub async fn update_condition(
        &self,
        status: impl Into<ConditionStatus>,
        reason: &Reason,
    ) -> Result<(), StepError> {
        let Some(type_) = self.attached_condition_type() else {
            return Err(StepError::Invalid {
                field: Field::ConditionType,
                problem: "the step has no attached condition (Step::attached_condition)".into(),
            });
        };
        let type_ = type_.to_string();
        self.set_condition(&type_, status, reason).await
    }

    /// The condition the running step owns, on the newest version of the object this
    /// reconcile knows (sequencer's `Condition()`); `None` when the step owns none or the
    /// condition was never set.
    pub fn attached_condition(&self) -> Option<Condition> {
        self.condition(self.attached_condition_type()?)
    }

    /// Set field `name` of the object's status to `value`, written by the reconcile's one status
    /// write, together with the runtime's `Ready` condition: no request of its own, none at all
    /// when the status already holds the value, and no reconcile for its echo. Set it again on every
    /// reconcile that should keep it (a status write that conflicts is retried by the next reconcile,
    /// which sets it again); `null` removes the field. The runtime's own fields
    /// ([`RUNTIME_STATUS_FIELDS`](crate::status::RUNTIME_STATUS_FIELDS)) cannot be set, and
    /// nothing is written for a controller [`without_status`](crate::runtime::Controller::without_status).
    /// The kind's CRD must declare the field in its status schema, or the API server drops it.
    ///
    /// ```no_run
    /// # use actorcile::prelude::*;
    /// # async fn f<K: ManagedResource>(cx: &Context<K>) -> Outcome {
    /// if let Err(e) = cx.set_status_field("endpoint", "10.0.0.7:6443") {
    ///     return Outcome::Terminal(Reason::new("StatusFieldInvalid", e.to_string()));
    /// }
    /// Outcome::Done
    /// # }
    /// ```
    pub fn set_status_field(&self, name: &str, value: impl Serialize) -> Result<(), StepError> {
        if name.is_empty() || crate::status::RUNTIME_STATUS_FIELDS.contains(&name) {
            return Err(StepError::Invalid {
                field: Field::StatusField(name.to_string()),
                problem: "is the runtime's own (phase, conditions, observedGeneration) or empty"
                    .into(),
            });
        }
        let value = serde_json::to_value(value)?;
        self.written().status_fields.insert(name.to_string(), value);
        Ok(())
    }

    /// The object's status as the reconcile knows it (its newest version), read as `S`: the kind's
    /// own status type, or any type of the fields a step needs. `None` without a status, or
    /// when it does not read as `S`. Fields set with [`Context::set_status_field`] in this reconcile
    /// are in it only once written.
    pub fn status_as<S: DeserializeOwned>(&self) -> Option<S> {
        serde_json::from_value(crate::status::status_json(self.latest().as_ref())?).ok()
    }

    /// Read an object of kind `T` in the context's cluster (a remote's, inside
    /// [`remote`](super::remote())); `None` if it does not exist. `namespace` is ignored for
    /// cluster-scoped kinds.
    pub async fn get<T>(&self, namespace: Option<&str>, name: &str) -> Result<Option<T>, StepError>
    where
        T: Resource<DynamicType = ()> + DeserializeOwned,
    {
        Ok(ObjectApi::<T>::new(self.client().clone(), namespace)
            .get_opt(name)
            .await?)
    }

    /// Create `child` in the context's cluster, owned by the object (a controller owner
    /// reference, so Kubernetes garbage-collects it with the object; the annotation
    /// [`owner_annotation`](crate::names::OperatorNames::owner_annotation) where an owner reference cannot be used,
    /// see [`ChildRules`]). A namespaced child without a namespace goes to the object's.
    /// Idempotent: a child of the object's that exists already is returned as it is.
    ///
    /// An existing object under the name that the object does not control is
    /// [`StepError::ChildNotOwned`]; a child in another namespace or cluster-scoped is
    /// [`StepError::ChildOutOfScope`]. [`Context::create_owned_with`] allows either.
    ///
    /// ```no_run
    /// # use actorcile::prelude::*;
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// # async fn f<K: ManagedResource>(cx: &Context<K>) -> Result<(), actorcile::provisioners::StepError> {
    /// let cm = ConfigMap {
    ///     metadata: kube::api::ObjectMeta { name: Some("settings".into()), ..Default::default() },
    ///     ..Default::default()
    /// };
    /// cx.create_owned(cm).await?;
    /// # Ok(()) }
    /// ```
    pub async fn create_owned<T>(&self, child: T) -> Result<T, StepError>
    where
        T: Resource<DynamicType = ()> + Serialize + DeserializeOwned,
    {
        self.create_owned_with(child, ChildRules::default()).await
    }

    /// [`Context::create_owned`] under `rules`: children in other namespaces or cluster-scoped,
    /// and taking over an existing object that no owner controls ([`ChildRules::adopt`]: the
    /// object gets the object's mark, with its resourceVersion as a precondition).
    pub async fn create_owned_with<T>(
        &self,
        mut child: T,
        rules: ChildRules,
    ) -> Result<T, StepError>
    where
        T: Resource<DynamicType = ()> + Serialize + DeserializeOwned,
    {
        let name = child
            .meta()
            .name
            .clone()
            .ok_or_else(|| StepError::Invalid {
                field: Field::ChildName,
                problem: format!("the {} to create has no name", T::kind(&())),
            })?;
        let owner_ns = self.object().meta().namespace.as_deref();
        let child_ns = child_namespace::<T>(child.meta().namespace.as_deref(), owner_ns);
        if self.remote().is_none() {
            check_scope::<K, T>(owner_ns, child_ns, &name, &rules)?;
        }
        self.own(&mut child);
        let api = self.child_api::<T>(child.meta().namespace.as_deref());
        let mut body = serde_json::to_value(&child)?;
        body["apiVersion"] = T::api_version(&()).into();
        body["kind"] = T::kind(&()).into();
        match api.create(&body).await {
            Ok(created) => {
                self.wrote_child(&created);
                Ok(created)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => match api.get_opt(&name).await? {
                Some(existing) => match self.control_of(&existing) {
                    Control::Ours => Ok(existing),
                    Control::Nobody if rules.adopts() => self.adopt(&api, existing).await,
                    by => Err(not_owned(&existing, by)),
                },
                // Deleted between the two requests: the next reconcile creates it again.
                None => Err(StepError::Kube(kube::Error::Api(s))),
            },
            Err(e) => Err(e.into()),
        }
    }

    /// Put the object's mark on `existing`, an object no owner controls, with its
    /// resourceVersion as a precondition (a conflict is returned: the next reconcile looks again).
    async fn adopt<T>(&self, api: &ObjectApi<T>, mut existing: T) -> Result<T, StepError>
    where
        T: Resource<DynamicType = ()> + Serialize + DeserializeOwned,
    {
        self.own(&mut existing);
        let meta = existing.meta();
        let patch = json!({
            "metadata": {
                "resourceVersion": meta.resource_version,
                "ownerReferences": meta.owner_references,
                "annotations": meta.annotations,
                "labels": meta.labels,
            },
        });
        let name = existing.meta().name.clone().unwrap_or_default();
        let adopted = api
            .patch(
                &name,
                &patch_params(self.field_manager()),
                &Patch::Merge(&patch),
            )
            .await?;
        self.wrote_child(&adopted);
        Ok(adopted)
    }

    /// Put finalizer `name` (a qualified name with a prefix, `example.com/volume`) on the
    /// object, so its deletion also waits for this step to [`remove_finalizer`] it, typically
    /// in its deprovision. Idempotent; conflicts are retried on a fresh read.
    ///
    /// [`remove_finalizer`]: Context::remove_finalizer
    pub async fn add_finalizer(&self, name: &str) -> Result<(), StepError> {
        check_finalizer(name)?;
        self.write_finalizers(|fs| {
            (!fs.iter().any(|f| f == name)).then(|| {
                let mut fs = fs.to_vec();
                fs.push(name.to_string());
                fs
            })
        })
        .await
    }

    /// Remove finalizer `name` from the object (a no-op when it does not carry it).
    pub async fn remove_finalizer(&self, name: &str) -> Result<(), StepError> {
        check_finalizer(name)?;
        self.write_finalizers(|fs| {
            fs.iter()
                .any(|f| f == name)
                .then(|| fs.iter().filter(|f| *f != name).cloned().collect())
        })
        .await
    }

    /// The object's own API, in the cluster it lives in.
    fn own_api(&self) -> ObjectApi<K> {
        ObjectApi::new(
            self.home_client().clone(),
            self.object().meta().namespace.as_deref(),
        )
    }

    /// Record an object one of the reconcile's writes returned.
    fn record(&self, obj: K) -> Arc<K> {
        let obj = Arc::new(obj);
        let mut w = self.written();
        if let Some(v) = version_of(obj.as_ref()) {
            w.versions.push(v);
        }
        let newer = match (
            w.latest.as_deref().and_then(version_of),
            version_of(obj.as_ref()),
        ) {
            (Some(cur), Some(v)) => v >= cur,
            _ => true,
        };
        if newer {
            w.latest = Some(obj.clone());
        }
        obj
    }

    /// A fresh read after a conflict: the newest version. When it is not one the reconcile's own
    /// steps wrote (concurrent steps conflict with each other too), someone else changed the
    /// object, and the runtime runs it again after the reconcile.
    async fn reread(&self) -> Result<Arc<K>, StepError> {
        let name = self.object().meta().name.clone().unwrap_or_default();
        let fresh = self
            .own_api()
            .get_opt(&name)
            .await?
            .ok_or_else(|| StepError::TargetMissing(self.target()))?;
        let fresh = Arc::new(fresh);
        let mut w = self.written();
        let ours = version_of(fresh.as_ref()).is_some_and(|v| w.versions.contains(&v));
        w.saw_others |= !ours;
        w.latest = Some(fresh.clone());
        Ok(fresh)
    }

    /// Write the object's conditions to what `change` makes of its status (`None`: nothing to
    /// change), with the resourceVersion of the newest version known as a precondition. On a
    /// conflict: [`WriteError::Stale`], or with `retry` a fresh read and `change` again.
    /// Returns the object as written (`None` when nothing needed writing).
    pub(crate) async fn write_conditions(
        &self,
        retry: bool,
        change: impl Fn(&ResourceStatus) -> Option<ResourceStatus>,
    ) -> Result<Option<Arc<K>>, WriteError> {
        let mut obj = self.latest();
        let params = patch_params(self.field_manager());
        for _ in 0..CONFLICT_ATTEMPTS {
            let Some(next) = change(&ResourceStatus::of(obj.as_ref())) else {
                return Ok(None);
            };
            let patch = json!({
                "metadata": {"resourceVersion": obj.meta().resource_version},
                "status": {"conditions": next.conditions},
            });
            let name = obj.meta().name.clone().unwrap_or_default();
            match self
                .own_api()
                .patch_status(&name, &params, &Patch::Merge(&patch))
                .await
            {
                Ok(written) => return Ok(Some(self.record(written))),
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    if !retry {
                        return Err(WriteError::Stale);
                    }
                    obj = self.reread().await.map_err(WriteError::Failed)?;
                }
                Err(e) => return Err(WriteError::Failed(e.into())),
            }
        }
        Err(WriteError::Failed(StepError::Conflict(self.target())))
    }

    /// Write the object's finalizers to what `change` makes of them (`None`: nothing to
    /// change), optimistically, retrying conflicts on a fresh read.
    async fn write_finalizers(
        &self,
        change: impl Fn(&[String]) -> Option<Vec<String>>,
    ) -> Result<(), StepError> {
        let mut obj = self.latest();
        let params = patch_params(self.field_manager());
        for _ in 0..CONFLICT_ATTEMPTS {
            let Some(next) = change(obj.meta().finalizers.as_deref().unwrap_or_default()) else {
                return Ok(());
            };
            let patch = json!({
                "metadata": {
                    "resourceVersion": obj.meta().resource_version,
                    "finalizers": next,
                },
            });
            let name = obj.meta().name.clone().unwrap_or_default();
            match self
                .own_api()
                .patch(&name, &params, &Patch::Merge(&patch))
                .await
            {
                Ok(written) => {
                    self.record(written);
                    return Ok(());
                }
                Err(kube::Error::Api(s)) if s.code == 409 => obj = self.reread().await?,
                Err(e) => return Err(e.into()),
            }
        }
        Err(StepError::Conflict(self.target()))
    }
}

impl<K: Resource<DynamicType = ()>> Context<K> {
    /// Delete a child of kind `T` (in the object's namespace when `namespace` is `None`).
    /// `Ok(true)` once it is gone (or never existed); `Ok(false)` while it is still being
    /// deleted (finalizers): yield and call again.
    ///
    /// Only a child the object controls is deleted, with its uid as a precondition: an object
    /// under the name that is not the object's (someone else's, made after ours was deleted) is
    /// left alone, and the answer is `Ok(true)`, since the object's own child is gone.
    /// [`resource`](super::resource())'s deprovision deletes its child through here.
    pub async fn delete_owned<T>(
        &self,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<bool, StepError>
    where
        T: Resource<DynamicType = ()> + DeserializeOwned,
    {
        let api = self.child_api::<T>(namespace);
        let Some(existing) = api.get_opt(name).await? else {
            return Ok(true);
        };
        let by = self.control_of(&existing);
        if by != Control::Ours {
            tracing::warn!(
                child = %Target::of(&existing), controller = ?by,
                "not deleting a child the object does not control"
            );
            return Ok(true);
        }
        let uid = existing.meta().uid.clone();
        // Its deletion's watch echo runs nothing (see `OwnWrites`).
        let recorded_ns =
            child_namespace::<T>(namespace, self.object().meta().namespace.as_deref());
        self.deleted_child::<T>(recorded_ns, name);
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::background()
        };
        match api.delete(name, &params).await {
            Ok(true) => Ok(true),
            Ok(false) => Ok(api.get_opt(name).await?.is_none_or(|o| o.meta().uid != uid)),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(true),
            Err(e) => Err(e.into()),
        }
    }

    /// The API of kind `T` in the context's cluster, in `namespace` or else the object's.
    fn child_api<T>(&self, namespace: Option<&str>) -> ObjectApi<T>
    where
        T: Resource<DynamicType = ()> + DeserializeOwned,
    {
        let ns = namespace.or(self.object().meta().namespace.as_deref());
        ObjectApi::new(self.client().clone(), ns)
    }
}

fn check_condition_type(type_: &str) -> Result<(), StepError> {
    if type_ == READY {
        return Err(StepError::Invalid {
            field: Field::ConditionType,
            problem: "Ready is the runtime's condition; name the step's own".into(),
        });
    }
    if !is_valid_condition_type(type_) {
        return Err(StepError::Invalid {
            field: Field::ConditionType,
            problem: format!("{type_:?} is not a valid condition type"),
        });
    }
    Ok(())
}

/// A finalizer name the API server accepts for a custom finalizer: `prefix/name`.
pub(crate) fn check_finalizer(name: &str) -> Result<(), StepError> {
    if crate::names::is_prefixed_qualified_name(name) {
        Ok(())
    } else {
        Err(StepError::Invalid {
            field: Field::Finalizer,
            problem: format!(
                "{name:?} is not a qualified name with a prefix, like example.com/cleanup"
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_and_malformed_condition_types_are_refused() {
        assert!(check_condition_type("DnsRecord").is_ok());
        assert!(matches!(
            check_condition_type("Ready"),
            Err(StepError::Invalid {
                field: Field::ConditionType,
                ..
            })
        ));
        assert!(check_condition_type("dns record").is_err());
        assert!(check_finalizer("example.com/volume").is_ok());
        assert!(matches!(
            check_finalizer("volume"),
            Err(StepError::Invalid {
                field: Field::Finalizer,
                ..
            })
        ));
    }
}
