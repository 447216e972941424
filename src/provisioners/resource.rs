//! Server-side apply a child object owned by the reconciled object.

use std::fmt::Debug;
use std::time::Duration;

use async_trait::async_trait;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::ownership::{Control, check_scope, child_namespace, not_owned};
use super::{ChildRules, Context, Outcome, Provisioner, Reason};
use crate::object_api::ObjectApi;

type Build<K, C> = Box<dyn Fn(&K) -> C + Send + Sync>;
type ChildReady<C> = Box<dyn Fn(&C) -> bool + Send + Sync>;

/// A child object applied on provision and deleted on deprovision; see [`resource`].
pub struct ResourceProvisioner<K, C> {
    name: String,
    build: Build<K, C>,
    ready_when: Option<ChildReady<C>>,
    force: bool,
    rules: ChildRules,
}

/// Server-side apply the object `build(parent)` returns, with an owner reference (controller)
/// to the parent, so Kubernetes garbage-collects it if the parent vanishes (not inside a
/// [`remote`](super::remote()): the parent is in another cluster there). Namespaced children
/// without a namespace go to the parent's namespace.
///
/// The apply is forced, as Kubernetes' server-side apply documentation recommends for a
/// controller's own objects (controller-runtime's `client.ForceOwnership`): a field of the
/// child that someone else changed (a `kubectl edit`, another controller) is set back and owned
/// by the runtime's field manager again, and a Warning Event on the parent, reason
/// `ChildFieldsOverridden`, names the managers whose changes were overridden. A child whose
/// fields others may own (an autoscaler's `replicas`) says so with
/// [`ResourceProvisioner::report_conflicts`]: then the apply is not forced, and a field another
/// manager owns with a different value ends the step with the typed reason
/// `ChildFieldConflict`, whose message names each field and its manager, retried with the
/// error backoff.
///
/// The child must be the parent's (see [`ChildRules`]): before the apply, the runtime reads the
/// object under the child's name, and one that the parent does not control (made by someone
/// else, or another owner's) is neither written nor taken over: the step ends with reason
/// `ChildNotOwned` ([`Outcome::UserActionRequired`]) naming it, unless
/// [`ChildRules::adopt`] allows taking over one that no owner controls. A namespaced parent's
/// child in another namespace, or cluster-scoped, ends with `ChildOutOfScope`
/// ([`Outcome::Terminal`]) unless [`ResourceProvisioner::rules`] allow it (not inside a
/// [`remote`](super::remote()), whose credentials bound where its children may be).
///
/// Deprovision deletes the child, only when it carries the parent's mark and with its uid as a
/// precondition (an object someone else made under the name is left alone), and yields until it
/// is gone (when the delete's answer says the
/// child is gone, as kube-apiserver's does for most kinds deleted at once, it makes no further
/// request). Add
/// [`ResourceProvisioner::ready_when`] to yield until the applied child reports ready.
///
/// ```
/// use actorcile::prelude::*;
/// use k8s_openapi::api::core::v1::ConfigMap;
/// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
/// # #[kube(group = "example.com", version = "v1", kind = "App", namespaced)]
/// # struct AppSpec { replicas: i32 }
/// let cm = resource("config", |app: &App| ConfigMap {
///     metadata: kube::api::ObjectMeta {
///         name: Some(format!("{}-config", app.metadata.name.as_deref().unwrap_or_default())),
///         ..Default::default()
///     },
///     data: Some([("replicas".to_string(), app.spec.replicas.to_string())].into()),
///     ..Default::default()
/// });
/// # let _: ResourceProvisioner<App, ConfigMap> = cm;
/// ```
pub fn resource<K, C>(
    name: impl Into<String>,
    build: impl Fn(&K) -> C + Send + Sync + 'static,
) -> ResourceProvisioner<K, C> {
    ResourceProvisioner {
        name: name.into(),
        build: Box::new(build),
        ready_when: None,
        force: true,
        rules: ChildRules::default(),
    }
}

impl<K, C> ResourceProvisioner<K, C> {
    /// Yield (reason `ChildNotReady`) until `ready(child)` holds for the applied child.
    pub fn ready_when(mut self, ready: impl Fn(&C) -> bool + Send + Sync + 'static) -> Self {
        self.ready_when = Some(Box::new(ready));
        self
    }

    /// Where the child may live and whether an existing object may be taken over (default: the
    /// parent's namespace, and only a child the parent controls).
    pub fn rules(mut self, rules: ChildRules) -> Self {
        self.rules = rules;
        self
    }

    /// Do not force the apply: a field of the child that another field manager owns with a
    /// different value is left to it, and the step ends with `ChildFieldConflict` naming each
    /// such field and its manager (retried with the error backoff), instead of taking it back.
    pub fn report_conflicts(mut self) -> Self {
        self.force = false;
        self
    }
}

/// The typed outcome of an apply refused for conflicts (`409` with `FieldManagerConflict`
/// causes): reason `ChildFieldConflict`, the message naming each field and its manager as the
/// API server reported them, retried with the error backoff.
fn field_conflict(kind: &str, name: &str, status: &kube::core::Status) -> Reason {
    let fields: Vec<String> = status
        .details
        .iter()
        .flat_map(|d| d.causes.iter())
        .map(|c| match (c.field.is_empty(), c.message.is_empty()) {
            (false, false) => format!("{} ({})", c.field, c.message),
            (false, true) => c.field.clone(),
            _ => c.message.clone(),
        })
        .filter(|m| !m.is_empty())
        .take(8)
        .collect();
    let detail = if fields.is_empty() {
        String::from("fields owned by another field manager")
    } else {
        fields.join("; ")
    };
    Reason::new(
        "ChildFieldConflict",
        format!(
            "{kind} {name}: {detail}. Another field manager owns these fields; remove them \
             from it (or let the controller force its apply)"
        ),
    )
}

/// The field managers an apply's conflicts name (`conflict with "kubectl-edit" using v1`, as
/// kube-apiserver words each cause), each once.
fn conflicting_managers(status: &kube::core::Status) -> Vec<String> {
    let mut managers = std::collections::BTreeSet::new();
    for c in status.details.iter().flat_map(|d| d.causes.iter()) {
        if let Some(rest) = c.message.split("conflict with \"").nth(1)
            && let Some(end) = rest.find('"')
        {
            managers.insert(rest[..end].to_string());
        }
    }
    managers.into_iter().collect()
}

fn child_api<K, C>(cx: &Context<K>, child: &C) -> ObjectApi<C>
where
    K: Resource<DynamicType = ()>,
    C: Resource<DynamicType = ()> + DeserializeOwned,
{
    // Cluster-scoped kinds' URLs ignore the namespace, so passing the parent's is harmless.
    let ns = child
        .meta()
        .namespace
        .clone()
        .or_else(|| cx.object().meta().namespace.clone());
    ObjectApi::new(cx.client().clone(), ns.as_deref())
}

#[async_trait]
impl<K, C> Provisioner<K> for ResourceProvisioner<K, C>
where
    K: Resource<DynamicType = ()> + Send + Sync + 'static,
    C: Resource<DynamicType = ()>
        + Clone
        + Debug
        + Serialize
        + DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    fn name(&self) -> &str {
        &self.name
    }

    fn rules(&self) -> Vec<crate::rbac::StepRule> {
        let scope = crate::rbac::RuleScope::of_kind::<C>();
        crate::rbac::StepRule::scoped(
            &self.name,
            crate::rbac::child_rules_for::<C>()
                .into_iter()
                .map(|r| crate::rbac::ScopedRule::new(scope.clone(), r)),
        )
    }

    async fn provision(&self, cx: &Context<K>) -> Outcome {
        let mut child = (self.build)(cx.object());
        let Some(name) = child.meta().name.clone() else {
            return Outcome::Terminal(Reason::new(
                "ChildInvalid",
                format!("step {}: the child object has no name", self.name),
            ));
        };
        let api = child_api(cx, &child);
        let owner_ns = cx.object().meta().namespace.as_deref();
        // Inside a remote the parent's namespace means nothing: the remote's credentials bound
        // where the child may be.
        if cx.remote().is_none()
            && let Err(e) = check_scope::<K, C>(
                owner_ns,
                child_namespace::<C>(child.meta().namespace.as_deref(), owner_ns),
                &name,
                &self.rules,
            )
        {
            return e.outcome(Reason::new("ChildOutOfScope", "the child is out of scope"));
        }
        let before = match api.get_opt(&name).await {
            Ok(None) => None,
            Ok(Some(existing)) => match cx.control_of(&existing) {
                Control::Ours => Some(existing),
                Control::Nobody if self.rules.adopts() => Some(existing),
                by => {
                    return not_owned(&existing, by)
                        .outcome(Reason::new("ChildNotOwned", "the child is not ours"));
                }
            },
            Err(e) => {
                return Outcome::failed(
                    Reason::new(
                        "ApplyFailed",
                        format!("could not read {} {name}", C::kind(&())),
                    ),
                    e,
                );
            }
        };
        cx.own(&mut child);
        let mut value = match serde_json::to_value(&child) {
            Ok(v) => v,
            Err(e) => {
                return Outcome::failed(
                    Reason::new(
                        "ChildInvalid",
                        format!("step {}: child not serializable", self.name),
                    ),
                    e,
                );
            }
        };
        // Server-side apply needs apiVersion/kind in the body.
        value["apiVersion"] = C::api_version(&()).into();
        value["kind"] = C::kind(&()).into();
        // Applied without force first: a conflict is the server's own word, atomic with the
        // write, on which fields another manager changed and who (a diff of the child read
        // before would miss an edit made between that read and the apply). Then, for a forced
        // child, the apply is forced and the managers it overrode are named in an Event.
        let params = PatchParams::apply(cx.field_manager());
        let mut result = api.patch(&name, &params, &Patch::Apply(&value)).await;
        if self.force
            && let Err(kube::Error::Api(status)) = &result
            && status.code == 409
        {
            let managers = conflicting_managers(status);
            result = api
                .patch(&name, &params.clone().force(), &Patch::Apply(&value))
                .await;
            if result.is_ok() && before.is_some() {
                let who = if managers.is_empty() {
                    "another field manager".to_string()
                } else {
                    managers.join(", ")
                };
                cx.event(
                    EventType::Warning,
                    "ChildFieldsOverridden",
                    "Apply",
                    Some(format!(
                        "{} {name}: set back the fields that {who} changed",
                        C::kind(&())
                    )),
                )
                .await;
            }
        }
        match result {
            Ok(applied) => {
                cx.wrote_child(&applied);
                match &self.ready_when {
                    Some(ready) if !ready(&applied) => Outcome::yield_now(Reason::new(
                        "ChildNotReady",
                        format!("{} {} is not ready yet", C::kind(&()), applied.name_any()),
                    )),
                    _ => Outcome::Done,
                }
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                let reason = field_conflict(C::kind(&()).as_ref(), &name, &status);
                Outcome::failed(reason, kube::Error::Api(status))
            }
            Err(e) => Outcome::failed(
                Reason::new(
                    "ApplyFailed",
                    format!("could not apply {} {name}", C::kind(&())),
                ),
                e,
            ),
        }
    }

    async fn deprovision(&self, cx: &Context<K>) -> Outcome {
        let child = (self.build)(cx.object());
        let Some(name) = child.meta().name.clone() else {
            return Outcome::Done;
        };
        let kind = C::kind(&());
        match cx
            .delete_owned::<C>(child.meta().namespace.as_deref(), &name)
            .await
        {
            Ok(true) => Outcome::Done,
            Ok(false) => Outcome::yield_after(
                Duration::from_millis(500),
                Reason::new(
                    "ChildDeleting",
                    format!("waiting for {kind} {name} to be deleted"),
                ),
            ),
            Err(e) => Outcome::failed(
                Reason::new("DeleteFailed", format!("could not delete {kind} {name}")),
                e,
            ),
        }
    }
}
