//! Provisioning into another cluster: [`RemoteCluster`], its implementations (a kubeconfig
//! Secret, a fixed client, access requested from a platform), and the [`remote`] provisioner
//! that runs its children there.
//!
//! ```no_run
//! use std::sync::Arc;
//! use actorcile::prelude::*;
//! use actorcile::provisioners::{KubeconfigSecret, remote, resource};
//! use k8s_openapi::api::core::v1::ConfigMap;
//! # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
//! # #[kube(group = "example.com", version = "v1", kind = "Tenant", namespaced)]
//! # struct TenantSpec { cluster: String }
//!
//! // Each tenant names a Cluster API cluster; its kubeconfig is the Secret `<cluster>-kubeconfig`.
//! fn tree() -> impl Provisioner<Tenant> {
//!     remote(
//!         "workload-cluster",
//!         |t: &Tenant| KubeconfigSecret::cluster_api("clusters", &t.spec.cluster),
//!         vec![boxed(resource("welcome", |_t: &Tenant| ConfigMap {
//!             metadata: kube::api::ObjectMeta {
//!                 name: Some("welcome".into()),
//!                 namespace: Some("default".into()),
//!                 ..Default::default()
//!             },
//!             ..Default::default()
//!         }))],
//!     )
//! }
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Secret;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Resource, ResourceExt};

use super::cd::{CdDriver, CdError, ClusterRegistration};
use super::context::RemoteScope;
use super::{BoxProvisioner, Context, Outcome, Provisioner, Reason, Serial, serial};

mod kubeconfig;
mod requested;

pub(crate) use kubeconfig::local_auth_field;
pub use kubeconfig::{FixedCluster, KubeconfigSecret};
#[cfg(test)]
use kubeconfig::{REMOTE_CONNECT_TIMEOUT, REMOTE_IO_TIMEOUT};
pub use requested::{AccessRequest, Grant, openmcp_grant};

/// How to reach a remote cluster now: a client configuration, or a ready client (an in-process
/// cluster has no URL), and a version that changes when the credentials do.
#[derive(Clone)]
pub struct RemoteAccess {
    connection: Connection,
    version: u64,
}

#[derive(Clone)]
enum Connection {
    Config(Box<kube::Config>),
    /// A ready client, and the configuration a CD system is given for the same cluster.
    Client(Client, Option<Box<kube::Config>>),
}

impl RemoteAccess {
    /// Access through a client configuration. `version` must change when the configuration
    /// does: the cached client is rebuilt then.
    pub fn config(config: kube::Config, version: u64) -> Self {
        Self {
            connection: Connection::Config(Box::new(config)),
            version,
        }
    }

    /// Access through a ready client (e.g. an in-process cluster's, or one with the operator's
    /// own middleware). It cannot be registered with a CD driver unless
    /// [`registered_as`](Self::registered_as) says how the CD system reaches the cluster.
    pub fn client(client: Client) -> Self {
        Self {
            connection: Connection::Client(client, None),
            version: 0,
        }
    }

    /// With access through a [`client`](Self::client): register the cluster with a CD driver
    /// as `config` (its server URL and credentials), while the children keep using the client.
    /// Without effect on access through a configuration, which registers as itself.
    pub fn registered_as(mut self, config: kube::Config) -> Self {
        if let Connection::Client(_, registration) = &mut self.connection {
            *registration = Some(Box::new(config));
        }
        self
    }

    /// The client configuration: the one access goes through, or the one given to
    /// [`registered_as`](Self::registered_as).
    pub fn kube_config(&self) -> Option<&kube::Config> {
        match &self.connection {
            Connection::Config(c) | Connection::Client(_, Some(c)) => Some(c),
            Connection::Client(_, None) => None,
        }
    }
}

impl std::fmt::Debug for RemoteAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the credentials.
        let how = match &self.connection {
            Connection::Config(c) => format!("config for {}", c.cluster_url),
            Connection::Client(..) => "client".to_string(),
        };
        f.debug_struct("RemoteAccess")
            .field("connection", &how)
            .field("version", &self.version)
            .finish()
    }
}

/// Why a remote cluster cannot be reached. The messages name where the credentials live,
/// never their content.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteClusterError {
    /// Not reachable now (its Secret is missing, the API failed): retried.
    #[error("{what}")]
    Unavailable {
        /// What is unavailable, for status (e.g. "kubeconfig Secret ns/name does not exist").
        what: String,
        /// The underlying error, for logs.
        #[source]
        source: Option<kube::Error>,
    },
    /// The credentials are unusable (a kubeconfig that does not parse): not retried until the
    /// object changes.
    #[error("{what}")]
    Invalid {
        /// What is wrong and where, for status (never the credentials themselves).
        what: String,
    },
    /// Access was asked for and refused ([`AccessRequest`] denied): someone must act.
    #[error("{what}")]
    Denied {
        /// What was refused and why, for status.
        what: String,
    },
}

/// A cluster that provisioners can run in (see [`remote`]).
#[async_trait]
pub trait RemoteCluster: Send + Sync {
    /// A stable id: the same cluster always has the same id. It names the cluster's
    /// registration with a CD driver and keys the cached client.
    fn id(&self) -> String;
    /// How to reach the cluster now. `scope` is the client of the scope the remote is declared
    /// in (the runtime's cluster, or the enclosing remote's), where its credentials live.
    async fn access(&self, scope: &Client) -> Result<RemoteAccess, RemoteClusterError>;

    /// The namespace of the Secret the credentials come from, when they come from one that must
    /// be in the reconciled object's own namespace: [`remote`] refuses (`KubeconfigInvalid`) a
    /// namespaced object whose remote names a Secret of another namespace, so that whoever
    /// writes the object cannot point the operator at credentials of a namespace they cannot
    /// read. `None` (the default): no such rule.
    fn credentials_namespace(&self) -> Option<&str> {
        None
    }

    /// How to reach the cluster to deprovision the children there: `Ok(None)` when the access
    /// is gone for good and nothing can have been made through it since (an
    /// [`AccessRequest`] that is gone or was never granted): the children's deprovision is
    /// skipped. The default is [`access`](Self::access).
    async fn access_to_deprovision(
        &self,
        scope: &Client,
    ) -> Result<Option<RemoteAccess>, RemoteClusterError> {
        self.access(scope).await.map(Some)
    }

    /// Give the access back once the children are deprovisioned (an [`AccessRequest`] deletes
    /// its request): `Ok(true)` once it is given back, `Ok(false)` while that is under way (the
    /// deprovision yields and asks again). The default has nothing to give back.
    async fn release(&self, scope: &Client) -> Result<bool, RemoteClusterError> {
        let _ = scope;
        Ok(true)
    }
}

type ClusterOf<K> = Box<dyn Fn(&K) -> Box<dyn RemoteCluster> + Send + Sync>;

/// Children run in another cluster; see [`remote`].
pub struct Remote<K> {
    name: String,
    cluster: ClusterOf<K>,
    children: Serial<K>,
    driver: Option<Arc<dyn CdDriver>>,
    /// Give up deprovisioning an unreachable remote this long after deletion began
    /// ([`Remote::abandon_after`]).
    abandon_after: Option<Duration>,
    /// Where the kubeconfig Secrets are read ([`Remote::credentials_scope`]).
    credentials_scope: crate::rbac::RuleScope,
    /// Remote id → (access version, client): one client per remote, rebuilt when its
    /// credentials change.
    clients: Mutex<HashMap<String, (u64, Client)>>,
    /// The permissions its remote clusters need in the scope cluster ([`Remote::needs_in`]).
    rules: Vec<crate::rbac::ScopedRule>,
}

/// Run `children` (in order, as [`serial`]) with [`Context::client`] talking to the cluster
/// `cluster(object)` names; [`Context::remote`] says which. Remotes nest: a remote inside a
/// remote reads its credentials from the outer remote.
///
/// - Clients are cached per remote id and rebuilt when the credentials change (a rotated
///   kubeconfig Secret takes effect at the next reconcile, without a restart).
/// - With [`Remote::registered_with`], provision registers the remote with the CD driver
///   **before** any child provisions, in every reconcile, so no child ever provisions against an
///   unregistered remote, whatever its siblings do. Each remote provisioner of each object
///   registers as its own user of the registration; deprovision deprovisions the children in
///   reverse order first, then removes this user, and the driver removes the registration once
///   no user is left (another object, or another remote provisioner of this object, still
///   using the cluster keeps it).
/// - A remote that cannot be reached now yields with reason `RemoteClusterUnavailable`, in
///   provision and in deprovision alike: an unreachable remote is never taken for one whose
///   children are gone, so deletion waits until it is reachable (remove the finalizer by hand
///   to abandon what is in a cluster that will never come back).
/// - Credentials that are unusable are `Terminal` with reason `KubeconfigInvalid`, naming where
///   they are, never what they hold.
pub fn remote<K, R>(
    name: impl Into<String>,
    cluster: impl Fn(&K) -> R + Send + Sync + 'static,
    children: Vec<BoxProvisioner<K>>,
) -> Remote<K>
where
    R: RemoteCluster + 'static,
{
    let name = name.into();
    Remote {
        children: serial(name.clone(), children),
        name,
        cluster: Box::new(move |k| Box::new(cluster(k))),
        driver: None,
        abandon_after: None,
        credentials_scope: crate::rbac::RuleScope::Object,
        clients: Mutex::default(),
        rules: Vec::new(),
    }
}

impl<K> Remote<K> {
    /// Register the remote with `driver` before its children provision, and unregister it
    /// after they deprovisioned (see [`remote`]); applications in this remote deploy to it.
    pub fn registered_with(mut self, driver: Arc<dyn CdDriver>) -> Self {
        self.driver = Some(driver);
        self
    }

    /// Give up on a remote that cannot be cleaned up: once the object's deletion began more
    /// than `after` ago and its deprovision still does not finish (the remote is unreachable,
    /// its kubeconfig Secret is gone, its children fail), the remote's deprovision is taken
    /// as done, and a Warning Event `RemoteAbandoned` names the remote and says that what its
    /// children made there may remain. Without it (the default) deletion waits for the remote
    /// for as long as it takes: an unreachable remote is never taken for a clean one.
    /// The time is counted from the object's `deletionTimestamp`, so a restart does not reset it.
    pub fn abandon_after(mut self, after: Duration) -> Self {
        self.abandon_after = Some(after.min(crate::policy::MAX_DURATION));
        self
    }

    /// Where the remotes' kubeconfig Secrets are, for the rendered RBAC (`get` on Secrets
    /// there): default [`RuleScope::Object`](crate::rbac::RuleScope::Object), the namespace of
    /// the object, as [`KubeconfigSecret`] requires unless
    /// [`from_any_namespace`](KubeconfigSecret::from_any_namespace).
    pub fn credentials_scope(mut self, scope: crate::rbac::RuleScope) -> Self {
        self.credentials_scope = scope;
        self
    }

    /// Declare a permission its remote clusters need in `scope` of the cluster the remote is
    /// declared in, for the rendered RBAC: e.g. an [`AccessRequest`]'s `get`, `create`,
    /// `patch` and `delete` on its request kind.
    pub fn needs_in(
        mut self,
        scope: crate::rbac::RuleScope,
        rule: k8s_openapi::api::rbac::v1::PolicyRule,
    ) -> Self {
        self.rules.push(crate::rbac::ScopedRule::new(scope, rule));
        self
    }

    /// The client for `id`: cached, or built from `access` (rebuilt when its version changed).
    fn client_for(&self, id: &str, access: &RemoteAccess) -> Result<Client, String> {
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((version, client)) = clients.get(id)
            && *version == access.version
        {
            return Ok(client.clone());
        }
        let client = match &access.connection {
            Connection::Client(c, _) => c.clone(),
            Connection::Config(config) => bounded_client((**config).clone())
                .map_err(|_| format!("no client can be built for remote cluster {id}"))?,
        };
        clients.insert(id.to_string(), (access.version, client.clone()));
        Ok(client)
    }

    fn forget_client(&self, id: &str) {
        self.clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
    }
}

/// The most of a remote server's error answer that is read: kube reads an error's whole body
/// to decode its `Status`, and a server of a tenant's choosing could send any amount.
pub(crate) const REMOTE_ERROR_BODY_LIMIT: usize = 64 * 1024;

/// A client for a remote cluster's `config` whose error answers are read to
/// [`REMOTE_ERROR_BODY_LIMIT`] at most (a longer one fails as a body error); successful ones
/// (lists, watches) are not cut.
fn bounded_client(config: kube::Config) -> Result<Client, kube::Error> {
    let bound =
        tower::util::MapResponseLayer::new(|answer: http::Response<Box<kube::client::DynBody>>| {
            let limit = if answer.status().is_client_error() || answer.status().is_server_error() {
                REMOTE_ERROR_BODY_LIMIT
            } else {
                usize::MAX
            };
            answer.map(|body| http_body_util::Limited::new(body, limit))
        });
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&bound)
        .build())
}

impl<K: Resource<DynamicType = ()>> Remote<K> {
    /// This provisioner's user key on a registration: the object and the provisioner.
    fn user(&self, cx: &Context<K>) -> String {
        let o = cx.object();
        format!(
            "{} {}/{} {}",
            K::kind(&()),
            o.namespace().unwrap_or_default(),
            o.name_any(),
            self.name
        )
    }

    /// `outcome` (a deprovision not done), or `Done` with a Warning Event when the object's
    /// deletion began longer ago than [`Remote::abandon_after`].
    async fn abandon_or(&self, cx: &Context<K>, outcome: Outcome) -> Outcome {
        let Some(after) = self.abandon_after else {
            return outcome;
        };
        let Some(since) = cx.object().meta().deletion_timestamp.as_ref() else {
            return outcome;
        };
        let elapsed = k8s_openapi::jiff::Timestamp::now().duration_since(since.0);
        let after_signed = k8s_openapi::jiff::SignedDuration::try_from(after)
            .unwrap_or(k8s_openapi::jiff::SignedDuration::MAX);
        if elapsed < after_signed {
            return outcome;
        }
        let id = (self.cluster)(cx.object()).id();
        let why = outcome
            .reason()
            .map(|r| format!("{}: {}", r.code(), r.message()))
            .unwrap_or_default();
        let note = format!(
            "remote cluster {id} abandoned by step {} {}s after deletion began ({why}); \
             what its children made there may remain",
            self.name,
            elapsed.as_secs()
        );
        tracing::warn!(remote = %id, step = %self.name, "{note}");
        cx.event(
            kube::runtime::events::EventType::Warning,
            "RemoteAbandoned",
            "Deprovision",
            Some(note),
        )
        .await;
        self.forget_client(&id);
        Outcome::Done
    }

    /// Reach the remote: its id and the context to run the children in, or the outcome that
    /// says why not.
    async fn enter(&self, cx: &Context<K>) -> Result<(String, RemoteAccess, Context<K>), Outcome> {
        let cluster = (self.cluster)(cx.object());
        let id = cluster.id();
        if let Some(refused) = self.check_credentials(cx, cluster.as_ref(), &id) {
            return Err(refused);
        }
        let access = cluster
            .access(cx.client())
            .await
            .map_err(|e| unreachable(&id, e))?;
        let inner = self.inner(cx, &id, &access).map_err(invalid)?;
        Ok((id, access, inner))
    }

    /// In the runtime's own cluster (not inside another remote, whose namespaces are not the
    /// object's), a namespaced object's credentials come from its own namespace: the outcome
    /// that refuses them otherwise.
    fn check_credentials(
        &self,
        cx: &Context<K>,
        cluster: &dyn RemoteCluster,
        id: &str,
    ) -> Option<Outcome> {
        if cx.remote().is_none()
            && let (Some(own), Some(theirs)) =
                (cx.object().namespace(), cluster.credentials_namespace())
            && own != theirs
        {
            return Some(Outcome::Terminal(Reason::new(
                "KubeconfigInvalid",
                format!(
                    "remote cluster {id}: its kubeconfig Secret is in namespace {theirs}, not in \
                     the object's own namespace {own}"
                ),
            )));
        }
        None
    }

    /// The context the children run in, through `access` (`Err`: why no client can be built).
    fn inner(
        &self,
        cx: &Context<K>,
        id: &str,
        access: &RemoteAccess,
    ) -> Result<Context<K>, String> {
        let client = self.client_for(id, access)?;
        let scope = RemoteScope {
            id: id.to_string(),
            registered: self.driver.is_some(),
        };
        Ok(cx.in_remote(client, scope))
    }
}

/// The outcome of credentials no client can be built from.
fn invalid(why: String) -> Outcome {
    Outcome::Terminal(Reason::new("KubeconfigInvalid", why))
}

/// The outcome of a remote that cannot be reached: a yield while it may become reachable,
/// `Terminal` for unusable credentials, `UserActionRequired` for refused access.
fn unreachable(id: &str, e: RemoteClusterError) -> Outcome {
    match e {
        RemoteClusterError::Unavailable { what, source } => {
            if let Some(e) = &source {
                tracing::debug!(remote = %id, error = %e, "remote cluster unavailable");
            }
            Outcome::yield_now(Reason::new(
                "RemoteClusterUnavailable",
                format!("remote cluster {id}: {what}"),
            ))
        }
        RemoteClusterError::Invalid { what } => Outcome::Terminal(Reason::new(
            "KubeconfigInvalid",
            format!("remote cluster {id}: {what}"),
        )),
        RemoteClusterError::Denied { what } => Outcome::UserActionRequired(Reason::new(
            "RemoteAccessDenied",
            format!("remote cluster {id}: {what}"),
        )),
    }
}

#[async_trait]
impl<K> Provisioner<K> for Remote<K>
where
    K: Resource<DynamicType = ()> + Send + Sync + 'static,
{
    fn name(&self) -> &str {
        &self.name
    }

    /// Reading kubeconfig Secrets, and what its CD driver needs; not its children's: they run
    /// against the remote cluster, whose RBAC is another's.
    fn rules(&self) -> Vec<crate::rbac::StepRule> {
        let mut rules = vec![crate::rbac::ScopedRule::new(
            self.credentials_scope.clone(),
            crate::rbac::rule_for::<Secret>(&["get"]),
        )];
        rules.extend(self.rules.iter().cloned());
        if let Some(d) = &self.driver {
            rules.extend(d.rules());
        }
        crate::rbac::StepRule::scoped(&self.name, rules)
    }

    async fn provision(&self, cx: &Context<K>) -> Outcome {
        let (id, access, inner) = match self.enter(cx).await {
            Ok(entered) => entered,
            Err(outcome) => return outcome,
        };
        if let Some(driver) = &self.driver {
            let registration = match access.kube_config() {
                Some(config) => ClusterRegistration::from_config(&id, config),
                None => Err(CdError::NotRegistrable {
                    id: id.clone(),
                    why: "it is reached through a client, not a configuration".into(),
                }),
            };
            let registration = match registration {
                Ok(r) => r,
                Err(e) => {
                    return Outcome::Terminal(Reason::new(
                        "RemoteNotRegistrable",
                        format!(
                            "remote cluster {id} cannot be registered with {}: {e}",
                            driver.kind()
                        ),
                    ));
                }
            };
            if let Err(e) = driver.register_cluster(&registration, &self.user(cx)).await {
                if let CdError::NotOurs { .. } | CdError::NotRegistrable { .. } = e {
                    // Retrying cannot help: someone must remove what is in the way, or the
                    // owner name another cluster.
                    return Outcome::UserActionRequired(Reason::new(
                        "RemoteNotRegistrable",
                        format!(
                            "remote cluster {id} cannot be registered with {}: {e}",
                            driver.kind()
                        ),
                    ));
                }
                return Outcome::failed(
                    Reason::new(
                        "RemoteRegistrationFailed",
                        format!(
                            "could not register remote cluster {id} with {}",
                            driver.kind()
                        ),
                    ),
                    e,
                );
            }
        }
        self.children.provision(&inner).await
    }

    async fn deprovision(&self, cx: &Context<K>) -> Outcome {
        let cluster = (self.cluster)(cx.object());
        let id = cluster.id();
        if let Some(refused) = self.check_credentials(cx, cluster.as_ref(), &id) {
            return self.abandon_or(cx, refused).await;
        }
        let access = match cluster.access_to_deprovision(cx.client()).await {
            Ok(access) => access,
            Err(e) => return self.abandon_or(cx, unreachable(&id, e)).await,
        };
        // No access any more (a request that is gone or was never granted): nothing can be
        // reached, or can have been made, through it.
        if let Some(access) = access {
            let inner = match self.inner(cx, &id, &access) {
                Ok(inner) => inner,
                Err(why) => return self.abandon_or(cx, invalid(why)).await,
            };
            let outcome = self.children.deprovision(&inner).await;
            if !outcome.is_done() {
                return self.abandon_or(cx, outcome).await;
            }
        }
        if let Some(driver) = &self.driver
            && let Err(e) = driver.unregister_cluster(&id, &self.user(cx)).await
        {
            return Outcome::failed(
                Reason::new(
                    "RemoteRegistrationFailed",
                    format!(
                        "could not unregister remote cluster {id} from {}",
                        driver.kind()
                    ),
                ),
                e,
            );
        }
        match cluster.release(cx.client()).await {
            Ok(true) => {}
            Ok(false) => {
                return Outcome::yield_now(Reason::new(
                    "RemoteReleasing",
                    format!("remote cluster {id}: waiting for its access to be given back"),
                ));
            }
            Err(e) => return self.abandon_or(cx, unreachable(&id, e)).await,
        }
        self.forget_client(&id);
        Outcome::Done
    }
}

#[cfg(test)]
mod tests;
