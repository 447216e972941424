//! A CD-managed Helm application: the [`application`] provisioner.
//!
//! ```no_run
//! use std::sync::Arc;
//! use actorcile::prelude::*;
//! use actorcile::provisioners::{AppRef, Catalog, application};
//! use actorcile::provisioners::cd::CdDriver;
//! # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
//! # #[kube(group = "example.com", version = "v1", kind = "Tenant", namespaced)]
//! # struct TenantSpec { ingress_version: String }
//!
//! fn tree(driver: Arc<dyn CdDriver>) -> impl Provisioner<Tenant> {
//!     let catalog = Catalog::new().chart(
//!         "ingress-nginx", "4.11.3",
//!         "https://kubernetes.github.io/ingress-nginx", "ingress-nginx",
//!     );
//!     application("ingress", driver, Arc::new(catalog), |t: &Tenant| {
//!         AppRef::new("ingress-nginx", &t.spec.ingress_version)
//!     })
//!     .namespace(|_t: &Tenant| "ingress-nginx".to_string())
//!     .parameters(|_t: &Tenant| Ok([("controller.replicaCount".to_string(), "2".to_string())].into()))
//! }
//! ```

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use async_trait::async_trait;
use kube::{Resource, ResourceExt};

use super::cd::{
    AppHealth, AppIdentity, AppSource, AppSpec, CdDriver, CdError, Deletion, Destination,
    IgnoreDifference,
};
use super::{BoxProvisioner, Context, Outcome, Provisioner, Reason};

/// Which application and version an object asks for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AppRef {
    /// The application's name in the catalog.
    pub name: String,
    /// The version asked for.
    pub version: String,
}

impl AppRef {
    /// Application `name` at `version`.
    pub fn new(name: impl Into<String>, version: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            version: version.into(),
        }
    }
}

/// Why an application reference did not resolve.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResolveError {
    /// No application of this name.
    #[error("application {0} is not known")]
    NotFound(String),
    /// The application has no such version.
    #[error("application {name} has no version {version}")]
    VersionNotFound {
        /// The application.
        name: String,
        /// The version asked for.
        version: String,
    },
    /// The catalog cannot be read now (retried).
    #[error("the application catalog is unavailable: {0}")]
    Unavailable(String),
}

/// Resolves what an object asks for to where its manifests are, a Helm chart or a folder of a
/// git repository (e.g. from the operator's catalog kinds, a configuration file, or a fixed
/// [`Catalog`]).
#[async_trait]
pub trait ApplicationResolver: Send + Sync {
    /// The source of `app`.
    async fn resolve(&self, app: &AppRef) -> Result<AppSource, ResolveError>;
}

/// A fixed catalog of applications and their versions, each a Helm chart or a folder of a git
/// repository.
///
/// ```
/// use actorcile::provisioners::Catalog;
///
/// let catalog = Catalog::new()
///     .chart("web", "1.2.0", "https://charts.example.com", "web")
///     .git("cni", "1.16", "https://git.example.com/platform.git", "charts/cni", "v1.16.0");
/// # let _ = catalog;
/// ```
#[derive(Clone, Debug, Default)]
pub struct Catalog {
    charts: HashMap<String, HashMap<String, AppSource>>,
}

impl Catalog {
    /// An empty catalog.
    pub fn new() -> Self {
        Self::default()
    }

    /// Application `name` at `version` is chart `chart` of repository `repo` at that version.
    pub fn chart(
        mut self,
        name: impl Into<String>,
        version: impl Into<String>,
        repo: impl Into<String>,
        chart: impl Into<String>,
    ) -> Self {
        let version = version.into();
        let source = AppSource::helm(repo, chart, version.clone());
        self.charts
            .entry(name.into())
            .or_default()
            .insert(version, source);
        self
    }

    /// Application `name` at `version` is folder `path` of git repository `repo` at
    /// `revision` (a branch, tag or commit).
    pub fn git(
        mut self,
        name: impl Into<String>,
        version: impl Into<String>,
        repo: impl Into<String>,
        path: impl Into<String>,
        revision: impl Into<String>,
    ) -> Self {
        self.charts
            .entry(name.into())
            .or_default()
            .insert(version.into(), AppSource::git(repo, path, revision));
        self
    }
}

#[async_trait]
impl ApplicationResolver for Catalog {
    async fn resolve(&self, app: &AppRef) -> Result<AppSource, ResolveError> {
        let versions = self
            .charts
            .get(&app.name)
            .ok_or_else(|| ResolveError::NotFound(app.name.clone()))?;
        versions
            .get(&app.version)
            .cloned()
            .ok_or_else(|| ResolveError::VersionNotFound {
                name: app.name.clone(),
                version: app.version.clone(),
            })
    }
}

/// An error a hook returns: the application fails this reconcile (retried with backoff) with reason
/// `ApplicationHookFailed`; the error goes to logs and Events, not to status.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct AppHookError(pub String);

impl From<String> for AppHookError {
    fn from(s: String) -> Self {
        AppHookError(s)
    }
}

impl From<&str> for AppHookError {
    fn from(s: &str) -> Self {
        AppHookError(s.to_string())
    }
}

type Of<K, T> = Box<dyn Fn(&K) -> T + Send + Sync>;
type Hook<K, T> = Box<dyn Fn(&K) -> Result<T, AppHookError> + Send + Sync>;
type Customize<K> = Box<dyn Fn(&K, &mut AppSpec) -> Result<(), AppHookError> + Send + Sync>;

/// A CD-managed application; see [`application`].
pub struct Application<K> {
    name: String,
    driver: Arc<dyn CdDriver>,
    resolver: Arc<dyn ApplicationResolver>,
    app: Of<K, AppRef>,
    release_name: Option<Of<K, String>>,
    namespace: Option<Of<K, String>>,
    namespace_labels: Option<Of<K, BTreeMap<String, String>>>,
    namespace_annotations: Option<Of<K, BTreeMap<String, String>>>,
    create_namespace: bool,
    server_side_apply: bool,
    ignore_differences: Vec<IgnoreDifference>,
    parameters: Option<Hook<K, BTreeMap<String, String>>>,
    values: Option<Hook<K, serde_json::Value>>,
    customize: Option<Customize<K>>,
    post_provision: Option<BoxProvisioner<K>>,
    pre_deprovision: Option<BoxProvisioner<K>>,
    allow_degraded: bool,
    background_delete: bool,
}

/// Deploy the application `app(object)` asks for (a Helm chart or a folder of a git repository,
/// as `resolver` resolves it) through `driver`, into the current cluster scope: the driver's own cluster, or, inside a
/// [`remote`](super::remote()) registered with a driver, that remote.
///
/// Provision resolves the application (an unknown application or version is `Terminal` with
/// reason `ApplicationNotFound` / `ApplicationVersionNotFound`), builds its [`AppSpec`] (release
/// name: the application's name; namespace: the object's, or the application's name for a
/// cluster-scoped object — each changeable by a hook), creates or updates it, and yields with
/// reason `ApplicationProgressing` until the CD system reports it synced and healthy (`Degraded`
/// is accepted with [`Application::allow_degraded`], else it yields with `ApplicationDegraded`),
/// then runs the post-provision hook. Deprovision runs the pre-deprovision hook, deletes the
/// application and yields (`ApplicationDeleting`) until the CD system has removed it and what it
/// deployed, unless [`Application::background_delete`].
///
/// The application is found by its [`AppIdentity`]: the object's kind, namespace and name, this
/// provisioner's `name`, and the remote cluster. Two applications with one identity fail the reconcile
/// with `ApplicationAmbiguous` (retried), never a random pick.
pub fn application<K>(
    name: impl Into<String>,
    driver: Arc<dyn CdDriver>,
    resolver: Arc<dyn ApplicationResolver>,
    app: impl Fn(&K) -> AppRef + Send + Sync + 'static,
) -> Application<K> {
    Application {
        name: name.into(),
        driver,
        resolver,
        app: Box::new(app),
        release_name: None,
        namespace: None,
        namespace_labels: None,
        namespace_annotations: None,
        create_namespace: true,
        server_side_apply: false,
        ignore_differences: Vec::new(),
        parameters: None,
        values: None,
        customize: None,
        post_provision: None,
        pre_deprovision: None,
        allow_degraded: false,
        background_delete: false,
    }
}

impl<K> Application<K> {
    /// The Helm release name (default: the application's name in the catalog).
    pub fn release_name(mut self, f: impl Fn(&K) -> String + Send + Sync + 'static) -> Self {
        self.release_name = Some(Box::new(f));
        self
    }

    /// The namespace the release goes to.
    pub fn namespace(mut self, f: impl Fn(&K) -> String + Send + Sync + 'static) -> Self {
        self.namespace = Some(Box::new(f));
        self
    }

    /// Labels of the release's namespace, when the CD system creates it.
    pub fn namespace_labels(
        mut self,
        f: impl Fn(&K) -> BTreeMap<String, String> + Send + Sync + 'static,
    ) -> Self {
        self.namespace_labels = Some(Box::new(f));
        self
    }

    /// Annotations of the release's namespace, when the CD system creates it.
    pub fn namespace_annotations(
        mut self,
        f: impl Fn(&K) -> BTreeMap<String, String> + Send + Sync + 'static,
    ) -> Self {
        self.namespace_annotations = Some(Box::new(f));
        self
    }

    /// Whether the CD system creates the namespace when it is missing (default `true`; Argo
    /// CD's `CreateNamespace` sync option).
    pub fn create_namespace(mut self, create: bool) -> Self {
        self.create_namespace = create;
        self
    }

    /// Whether the CD system applies the manifests server-side (default `false`; Argo CD's
    /// `ServerSideApply` sync option).
    pub fn server_side_apply(mut self, server_side: bool) -> Self {
        self.server_side_apply = server_side;
        self
    }

    /// A difference the CD system ignores when it compares (Argo CD's `ignoreDifferences`);
    /// may be given more than once.
    pub fn ignore_difference(mut self, difference: IgnoreDifference) -> Self {
        self.ignore_differences.push(difference);
        self
    }

    /// Helm parameters (`--set name=value`).
    pub fn parameters(
        mut self,
        f: impl Fn(&K) -> Result<BTreeMap<String, String>, AppHookError> + Send + Sync + 'static,
    ) -> Self {
        self.parameters = Some(Box::new(f));
        self
    }

    /// Helm values (an object).
    pub fn values(
        mut self,
        f: impl Fn(&K) -> Result<serde_json::Value, AppHookError> + Send + Sync + 'static,
    ) -> Self {
        self.values = Some(Box::new(f));
        self
    }

    /// Change the finished [`AppSpec`] before it is applied.
    pub fn customize(
        mut self,
        f: impl Fn(&K, &mut AppSpec) -> Result<(), AppHookError> + Send + Sync + 'static,
    ) -> Self {
        self.customize = Some(Box::new(f));
        self
    }

    /// Provision `p` once the application is healthy (e.g. read a Secret it created).
    pub fn post_provision(mut self, p: impl Provisioner<K> + 'static) -> Self {
        self.post_provision = Some(Arc::new(p));
        self
    }

    /// Provision `p` before the application is deleted (e.g. drain what it serves).
    pub fn pre_deprovision(mut self, p: impl Provisioner<K> + 'static) -> Self {
        self.pre_deprovision = Some(Arc::new(p));
        self
    }

    /// Accept a Degraded application as provisioned.
    pub fn allow_degraded(mut self, allow: bool) -> Self {
        self.allow_degraded = allow;
        self
    }

    /// Delete without waiting for the CD system to remove what it deployed.
    pub fn background_delete(mut self, background: bool) -> Self {
        self.background_delete = background;
        self
    }
}

impl<K: Resource<DynamicType = ()>> Application<K> {
    fn identity(&self, cx: &Context<K>) -> AppIdentity {
        let o = cx.object();
        AppIdentity::new(
            cx.names(),
            &K::kind(&()),
            o.meta().namespace.as_deref(),
            &o.name_any(),
            &self.name,
            cx.remote().map(|r| r.id.as_str()),
        )
    }

    fn failed(
        &self,
        code: &'static str,
        what: &str,
        e: impl std::error::Error + Send + Sync + 'static,
    ) -> Outcome {
        Outcome::failed(
            Reason::new(code, format!("application {}: {what}", self.name)),
            e,
        )
    }

    fn driver_failed(&self, what: &str, e: CdError) -> Outcome {
        let CdError::Ambiguous { identity, count } = &e else {
            return self.failed("ApplicationFailed", what, e);
        };
        let reason = Reason::new(
            "ApplicationAmbiguous",
            format!(
                "application {}: {count} {} applications carry its identity ({identity}); delete all but one",
                self.name,
                self.driver.kind()
            ),
        );
        Outcome::failed(reason, e)
    }

    /// The spec of the application, or the outcome that says why there is none.
    async fn spec(&self, cx: &Context<K>) -> Result<AppSpec, Outcome> {
        let object = cx.object().as_ref();
        let wanted = (self.app)(object);
        let source = match self.resolver.resolve(&wanted).await {
            Ok(c) => c,
            Err(e @ ResolveError::NotFound(_)) => {
                return Err(Outcome::Terminal(Reason::new(
                    "ApplicationNotFound",
                    e.to_string(),
                )));
            }
            Err(e @ ResolveError::VersionNotFound { .. }) => {
                return Err(Outcome::Terminal(Reason::new(
                    "ApplicationVersionNotFound",
                    e.to_string(),
                )));
            }
            Err(e @ ResolveError::Unavailable(_)) => {
                return Err(self.failed(
                    "ApplicationResolveFailed",
                    "cannot resolve its source",
                    e,
                ));
            }
        };
        let destination = match cx.remote() {
            None => Destination::InCluster,
            Some(r) if r.registered => Destination::Registered(r.id.clone()),
            Some(r) => {
                return Err(Outcome::Terminal(Reason::new(
                    "RemoteNotRegistered",
                    format!(
                        "application {} deploys to remote cluster {}, which is not registered with a CD driver (use remote(..).registered_with(driver))",
                        self.name, r.id
                    ),
                )));
            }
        };
        let hook = |name: &str, e: AppHookError| {
            self.failed("ApplicationHookFailed", &format!("hook {name} failed"), e)
        };
        let parameters = match &self.parameters {
            Some(f) => f(object).map_err(|e| hook("parameters", e))?,
            None => BTreeMap::new(),
        };
        let values = match &self.values {
            Some(f) => Some(f(object).map_err(|e| hook("values", e))?),
            None => None,
        };
        let namespace = match &self.namespace {
            Some(f) => f(object),
            None => object
                .meta()
                .namespace
                .clone()
                .unwrap_or_else(|| wanted.name.clone()),
        };
        let mut spec = AppSpec {
            identity: self.identity(cx),
            source,
            release: self
                .release_name
                .as_ref()
                .map(|f| f(object))
                .unwrap_or_else(|| wanted.name.clone()),
            namespace,
            create_namespace: self.create_namespace,
            namespace_labels: self
                .namespace_labels
                .as_ref()
                .map(|f| f(object))
                .unwrap_or_default(),
            namespace_annotations: self
                .namespace_annotations
                .as_ref()
                .map(|f| f(object))
                .unwrap_or_default(),
            server_side_apply: self.server_side_apply,
            ignore_differences: self.ignore_differences.clone(),
            parameters,
            values,
            destination,
            allow_degraded: self.allow_degraded,
        };
        if let Some(f) = &self.customize {
            f(object, &mut spec).map_err(|e| hook("customize", e))?;
        }
        Ok(spec)
    }
}

#[async_trait]
impl<K> Provisioner<K> for Application<K>
where
    K: Resource<DynamicType = ()> + Send + Sync + 'static,
{
    fn name(&self) -> &str {
        &self.name
    }

    fn rules(&self) -> Vec<crate::rbac::StepRule> {
        crate::rbac::StepRule::scoped(&self.name, self.driver.rules())
    }

    async fn provision(&self, cx: &Context<K>) -> Outcome {
        let spec = match self.spec(cx).await {
            Ok(s) => s,
            Err(outcome) => return outcome,
        };
        if let Err(e) = self.driver.apply(&spec).await {
            return self.driver_failed("cannot be created or updated", e);
        }
        let yielding = |code: &'static str, message: String| {
            Outcome::yield_now(Reason::new(
                code,
                format!("application {}: {message}", self.name),
            ))
        };
        match self.driver.health(&spec.identity).await {
            Err(e) => self.driver_failed("its health cannot be read", e),
            Ok(AppHealth::Healthy) => self.after_healthy(cx).await,
            Ok(AppHealth::Degraded(_)) if spec.allow_degraded => self.after_healthy(cx).await,
            Ok(AppHealth::Degraded(m)) => yielding("ApplicationDegraded", m),
            Ok(AppHealth::Progressing(m)) => yielding("ApplicationProgressing", m),
            Ok(AppHealth::Missing) => yielding("ApplicationProgressing", "created".into()),
            Ok(AppHealth::Deleting) => yielding("ApplicationDeleting", "being deleted".into()),
        }
    }

    async fn deprovision(&self, cx: &Context<K>) -> Outcome {
        if let Some(p) = &self.pre_deprovision {
            let outcome = p.provision(cx).await;
            if !outcome.is_done() {
                return outcome;
            }
        }
        match self
            .driver
            .delete(&self.identity(cx), self.background_delete)
            .await
        {
            Ok(Deletion::Gone) => Outcome::Done,
            Ok(Deletion::InProgress) => Outcome::yield_now(Reason::new(
                "ApplicationDeleting",
                format!(
                    "application {}: waiting for {} to remove it",
                    self.name,
                    self.driver.kind()
                ),
            )),
            Err(e) => self.driver_failed("cannot be deleted", e),
        }
    }
}

impl<K: Send + Sync + 'static> Application<K> {
    async fn after_healthy(&self, cx: &Context<K>) -> Outcome {
        match &self.post_provision {
            Some(p) => p.provision(cx).await,
            None => Outcome::Done,
        }
    }
}
