//! The Argo CD driver: applications are `argoproj.io/v1alpha1` `Application` objects, cluster
//! registrations are Argo CD's declarative cluster Secrets.
//!
//! Everything goes through the Kubernetes API of the cluster Argo CD runs in (the `client` the
//! driver is given) and its namespace; the driver needs no Argo CD API server or token.
//!
//! - **Applications** are created with `generateName` and the [`AppIdentity`] labels, and found
//!   again by those labels only: two Applications with one identity are
//!   [`CdError::Ambiguous`]. Their sync policy is automated (prune, self-heal), so Argo CD
//!   converges them without being asked; the [`AppSpec`]'s source (a Helm chart, or a path of
//!   a git repository at a revision), namespace creation and metadata, server-side apply and
//!   ignored differences are written as Argo CD reads them (`spec.rs`).
//! - **Health**: an Application is [`AppHealth::Healthy`] when Argo CD has compared the current
//!   source and destination (`status.sync.comparedTo`) and reports `status.sync.status` `Synced`
//!   and `status.health.status` `Healthy`; `Degraded` health is [`AppHealth::Degraded`]; anything
//!   else is [`AppHealth::Progressing`] with what Argo CD reports.
//! - **Deletion** first adds Argo CD's `resources-finalizer.argocd.argoproj.io` (so Argo CD
//!   removes what it deployed before the Application goes), then deletes, and reports
//!   [`Deletion::InProgress`] until the Application is gone; in the background it reports
//!   [`Deletion::Gone`] as soon as the delete is accepted.
//! - **Cluster registrations** are Secrets labelled `argocd.argoproj.io/secret-type: cluster`
//!   with `name` (the remote's id, which Applications name as their destination), `server` and
//!   `config`. Their users are kept on the Secret (annotation
//!   [`users_annotation`](ArgoCd::users_annotation), `app.<domain>/users`), so a registration
//!   survives restarts and is removed with its last user. Concurrent users are serialised by
//!   resourceVersion preconditions.
//! - **Names**: the labels and annotations are under the operator's domain
//!   ([`OperatorNames::app_label_prefix`]); those written under its
//!   [former domain](OperatorNames::former_domain) are still read, and moved to the current
//!   ones when the driver next writes the object.

use std::collections::BTreeMap;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams,
};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::cd::{
    AppHealth, AppIdentity, AppSpec, CdDriver, CdError, ClusterRegistration, Deletion, label_value,
};
use crate::names::OperatorNames;

/// The `Application` CRD (reduced: open `spec` and `status`), for clusters where Argo CD itself
/// is not installed, such as tests that play Argo CD's controller: `kubectl apply -f` it, or
/// install [`application_crd`].
pub const APPLICATION_CRD: &str = include_str!("argocd-application-crd.yaml");

/// [`APPLICATION_CRD`] as an object, e.g. for
/// [`ApiServer::install_crd`](crate::cluster::ApiServer::install_crd) or an envtest's
/// `install_crds`.
pub fn application_crd() -> CustomResourceDefinition {
    serde_saphyr::from_str(APPLICATION_CRD).expect("the bundled Application CRD is valid YAML")
}

/// The finalizer with which Argo CD deletes what an Application deployed before the Application.
pub const RESOURCES_FINALIZER: &str = "resources-finalizer.argocd.argoproj.io";

/// The label that makes a Secret an Argo CD cluster registration.
pub const SECRET_TYPE_LABEL: &str = "argocd.argoproj.io/secret-type";

/// Argo CD's name for the cluster it runs in. Registrations of it (and of the other names of
/// the same Service) are refused: they would replace Argo CD's own.
pub const IN_CLUSTER_SERVER: &str = "https://kubernetes.default.svc";

/// The Argo CD [`CdDriver`].
///
/// ```no_run
/// use std::sync::Arc;
/// use actorcile::names::OperatorNames;
/// use actorcile::provisioners::argocd::ArgoCd;
///
/// # async fn f(client: kube::Client) {
/// let names = OperatorNames::new("bucket-operator", "buckets.example.com");
/// let argo = Arc::new(ArgoCd::new(client, "argocd", &names).project("platform"));
/// # let _ = argo;
/// # }
/// ```
#[derive(Clone)]
pub struct ArgoCd {
    client: Client,
    namespace: String,
    project: String,
    field_manager: String,
    marks: Marks,
    former: Option<Marks>,
}

impl ArgoCd {
    /// A driver that keeps Applications and cluster Secrets in `namespace` (where Argo CD
    /// watches them, usually `argocd`) through `client`, in the project `default`, for the
    /// operator `names`: its writes name the operator's field manager
    /// ([`OperatorNames::field_manager`]), and its labels and annotations are under the
    /// operator's domain (and read under its former domain too).
    pub fn new(client: Client, namespace: impl Into<String>, names: &OperatorNames) -> Self {
        Self {
            client,
            namespace: namespace.into(),
            project: "default".into(),
            field_manager: names.field_manager(),
            marks: Marks::under(names),
            former: names
                .former()
                .map(|d| Marks::under(&OperatorNames::new(names.name(), d))),
        }
    }

    /// The annotation on a cluster Secret that lists its users (a JSON array of strings):
    /// `app.<domain>/users`.
    pub fn users_annotation(&self) -> &str {
        &self.marks.users
    }

    /// The annotation on a cluster Secret that holds the exact id of the registration it is:
    /// `app.<domain>/cluster-id`.
    pub fn cluster_id_annotation(&self) -> &str {
        &self.marks.id
    }

    /// The Argo CD project the Applications belong to.
    pub fn project(mut self, project: impl Into<String>) -> Self {
        self.project = project.into();
        self
    }

    /// Create and replace parameters that name the driver's field manager.
    fn post_params(&self) -> PostParams {
        PostParams {
            field_manager: Some(self.field_manager.clone()),
            ..Default::default()
        }
    }

    /// Patch parameters that name the driver's field manager.
    fn patch_params(&self) -> PatchParams {
        PatchParams {
            field_manager: Some(self.field_manager.clone()),
            ..Default::default()
        }
    }

    /// The `Application` API resource.
    pub fn application_resource() -> ApiResource {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Application"),
            "applications",
        )
    }

    fn applications(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client.clone(),
            &self.namespace,
            &Self::application_resource(),
        )
    }

    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// The one Application with `identity`, if any: by its labels, else by the labels under the
    /// former domain.
    async fn find(&self, identity: &AppIdentity) -> Result<Option<DynamicObject>, CdError> {
        let by = |selector: String| async move {
            self.applications()
                .list(&ListParams::default().labels(&selector))
                .await
                .map(|l| l.items)
        };
        let mut list = by(identity.selector()).await?;
        if list.is_empty()
            && let Some(former) = identity.former_selector()
        {
            list = by(former).await?;
        }
        match list.len() {
            0 => Ok(None),
            1 => Ok(list.pop()),
            count => Err(CdError::Ambiguous {
                identity: identity.clone(),
                count,
            }),
        }
    }

    /// The name of the Secret that registers cluster `id`: `cluster-`, a readable part of the
    /// id, and a hash of the exact id (SipHash-1-3 with zero keys over `argocd-cluster` and the id,
    /// each followed by a `0xff` byte, as 16 hex digits), so ids that read alike (`team/a-x` and
    /// `team-a/x`) never share a Secret.
    pub fn cluster_secret_name(id: &str) -> String {
        let readable = dns_label(id);
        let readable = readable[..readable.len().min(40)].trim_end_matches('-');
        let hash = crate::hash::sip13(&["argocd-cluster", id]);
        format!("cluster-{readable}-{hash:016x}")
    }

    /// The `generateName` of the Application of Helm release `release`: Argo CD tracks what
    /// an Application deployed by a label holding its name, so the name (prefix and the five
    /// characters the API server adds) stays a valid label value.
    pub fn application_name_prefix(release: &str) -> String {
        let v = dns_label(release);
        let cut = v[..v.len().min(57)].trim_end_matches('-');
        format!("{cut}-")
    }
}

/// `v` as a DNS label: lowercase alphanumerics and `-`, at most 63 characters (a longer value is
/// cut and ends in a hash of the whole, as [`label_value`] does).
fn dns_label(v: &str) -> String {
    let v = label_value(&v.to_ascii_lowercase()).replace(['_', '.'], "-");
    if v.is_empty() { "unnamed".into() } else { v }
}

/// Whether `obj` carries every label of `labels`.
fn labelled(obj: &DynamicObject, labels: &BTreeMap<String, String>) -> bool {
    labels.iter().all(|(k, v)| obj.labels().get(k) == Some(v))
}

/// What Argo CD reports of `app`.
pub(crate) fn health_of(app: &DynamicObject) -> AppHealth {
    if app.metadata.deletion_timestamp.is_some() {
        return AppHealth::Deleting;
    }
    let status = app.data.get("status");
    let field = |path: &[&str]| -> Option<&str> {
        let mut v = status?;
        for p in path {
            v = v.get(p)?;
        }
        v.as_str()
    };
    let compared = status.and_then(|s| s.pointer("/sync/comparedTo"));
    let spec = app.data.get("spec");
    let current = compared.is_some_and(|c| {
        c.get("source") == spec.and_then(|s| s.get("source"))
            && c.get("destination") == spec.and_then(|s| s.get("destination"))
    });
    if !current {
        return AppHealth::Progressing("Argo CD has not compared the current spec yet".into());
    }
    let sync = field(&["sync", "status"]).unwrap_or("Unknown");
    let health = field(&["health", "status"]).unwrap_or("Unknown");
    let message = field(&["health", "message"]);
    let said = |what: String| match message {
        Some(m) if !m.is_empty() => format!("{what}: {m}"),
        _ => what,
    };
    match (sync, health) {
        ("Synced", "Healthy") => AppHealth::Healthy,
        ("Synced", "Degraded") => AppHealth::Degraded(said("sync Synced, health Degraded".into())),
        (sync, health) => AppHealth::Progressing(said(format!("sync {sync}, health {health}"))),
    }
}

#[async_trait]
impl CdDriver for ArgoCd {
    /// Applications (argoproj.io) and cluster Secrets, in its namespace.
    fn rules(&self) -> Vec<crate::rbac::ScopedRule> {
        // Applications are found by their identity's labels (list), created, replaced when
        // their spec changes (update), asked to refresh (patch) and deleted; cluster Secrets
        // are read, written and deleted by name, and listed by their type label (a server
        // registered by another Secret is refused).
        let here = crate::rbac::RuleScope::namespace(&self.namespace);
        let verbs = |v: &[&str]| v.iter().map(|v| v.to_string()).collect();
        vec![
            crate::rbac::ScopedRule::new(
                here.clone(),
                k8s_openapi::api::rbac::v1::PolicyRule {
                    api_groups: Some(vec!["argoproj.io".into()]),
                    resources: Some(vec!["applications".into()]),
                    verbs: verbs(&["list", "create", "update", "patch", "delete"]),
                    ..Default::default()
                },
            ),
            crate::rbac::ScopedRule::new(
                here,
                crate::rbac::rule_for::<Secret>(&["get", "list", "create", "update", "delete"]),
            ),
        ]
    }

    fn kind(&self) -> &str {
        "argocd"
    }

    async fn health(&self, identity: &AppIdentity) -> Result<AppHealth, CdError> {
        Ok(match self.find(identity).await? {
            None => AppHealth::Missing,
            Some(app) => health_of(&app),
        })
    }

    async fn apply(&self, app: &AppSpec) -> Result<(), CdError> {
        let spec = spec::application_spec(app, &self.project);
        match self.find(&app.identity).await? {
            None => {
                let mut obj = DynamicObject::new("", &Self::application_resource())
                    .within(&self.namespace)
                    .data(json!({ "spec": spec }));
                obj.metadata.name = None;
                obj.metadata.generate_name = Some(Self::application_name_prefix(&app.release));
                obj.metadata.labels = Some(app.identity.labels().clone());
                self.applications()
                    .create(&self.post_params(), &obj)
                    .await?;
            }
            Some(current)
                if current.data.get("spec") == Some(&spec)
                    && labelled(&current, app.identity.labels()) => {}
            Some(mut current) => {
                // Replace the whole spec (a merge patch would keep parameters and values that
                // were removed), guarded by the resourceVersion read; one found by the former
                // domain's labels gets the current ones.
                let name = current.name_any();
                if !labelled(&current, app.identity.labels()) {
                    let labels = current.labels_mut();
                    for k in app
                        .identity
                        .former_labels()
                        .into_iter()
                        .flat_map(|f| f.keys())
                    {
                        labels.remove(k);
                    }
                    labels.extend(app.identity.labels().clone());
                }
                current.data["spec"] = spec;
                self.applications()
                    .replace(&name, &self.post_params(), &current)
                    .await?;
            }
        }
        Ok(())
    }

    async fn delete(&self, identity: &AppIdentity, background: bool) -> Result<Deletion, CdError> {
        let Some(app) = self.find(identity).await? else {
            return Ok(Deletion::Gone);
        };
        let name = app.name_any();
        let api = self.applications();
        if app.metadata.deletion_timestamp.is_none() {
            if !app.finalizers().iter().any(|f| f == RESOURCES_FINALIZER) {
                let mut finalizers = app.finalizers().to_vec();
                finalizers.push(RESOURCES_FINALIZER.to_string());
                let patch = json!({ "metadata": {
                    "resourceVersion": app.resource_version(),
                    "finalizers": finalizers,
                }});
                api.patch(&name, &self.patch_params(), &Patch::Merge(&patch))
                    .await?;
            }
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Deletion::Gone),
                Err(e) => return Err(e.into()),
            }
        }
        if background {
            return Ok(Deletion::Gone);
        }
        Ok(match self.find(identity).await? {
            None => Deletion::Gone,
            Some(_) => Deletion::InProgress,
        })
    }

    async fn register_cluster(
        &self,
        registration: &ClusterRegistration,
        user: &str,
    ) -> Result<(), CdError> {
        self.update_registration(&registration.id, Some(registration), |users| {
            users.insert(user.to_string());
        })
        .await
    }

    async fn unregister_cluster(&self, id: &str, user: &str) -> Result<(), CdError> {
        self.update_registration(id, None, |users| {
            users.remove(user);
        })
        .await
    }
}

mod registration;
use registration::Marks;
mod spec;
#[cfg(test)]
mod tests;
