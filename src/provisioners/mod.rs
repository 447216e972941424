//! Provisioners: idempotent Provision/Deprovision steps and the combinators that compose them.
//!
//! A provisioner tree describes *what* a resource needs; the runtime's resource actor decides
//! *when* to run it. Every step is revisited on every reconcile, so it must be idempotent, and a step
//! that would wait on something external returns [`Outcome::Yield`] instead of blocking.
//!
//! Provisioners know nothing of actors: they get an explicit [`Context`] and return an
//! [`Outcome`].
//!
//! ```
//! use actorcile::prelude::*;
//! use std::time::Duration;
//! # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
//! # #[kube(group = "example.com", version = "v1", kind = "App", namespaced)]
//! # struct AppSpec { replicas: i32 }
//!
//! fn tree() -> impl Provisioner<App> {
//!     serial![
//!         step("validate", |cx: Context<App>| async move {
//!             if cx.object().spec.replicas < 1 {
//!                 return Outcome::Terminal(Reason::new("InvalidReplicas", "replicas must be >= 1"));
//!             }
//!             Outcome::Done
//!         }),
//!         concurrent![
//!             step("network", |_cx: Context<App>| async { Outcome::Done }),
//!             step("storage", |_cx: Context<App>| async {
//!                 Outcome::yield_after(Duration::from_secs(1), Reason::new("VolumeAttaching", "volume is attaching"))
//!             }),
//!         ],
//!     ]
//! }
//! ```
//!
//! # Other clusters and CD-managed applications
//!
//! [`remote`](remote()) runs its children against another cluster ([`RemoteCluster`]: a
//! kubeconfig held in a Secret, [`KubeconfigSecret`], access requested from the platform,
//! [`AccessRequest`], or a [`FixedCluster`]), and registers it
//! with a CD driver first when asked; [`application`](application()) deploys a Helm
//! application through a [`cd::CdDriver`] ([`argocd::ArgoCd`] for Argo CD) into the cluster in
//! scope. `examples/remote_app.rs` runs this tree end to end.
//!
//! ```no_run
//! use std::sync::Arc;
//! use actorcile::prelude::*;
//! use actorcile::provisioners::argocd::ArgoCd;
//! use actorcile::provisioners::{AppRef, Catalog, KubeconfigSecret, application, remote};
//! # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
//! # #[kube(group = "example.com", version = "v1", kind = "Tenant", namespaced)]
//! # struct TenantSpec { cluster: String, version: String }
//!
//! fn tree(client: kube::Client) -> impl Provisioner<Tenant> {
//!     let argo = Arc::new(ArgoCd::new(
//!         client,
//!         "argocd",
//!         &OperatorNames::new("tenant-operator", "tenants.example.com"),
//!     ));
//!     let charts = Arc::new(Catalog::new().chart("web", "1.2.0", "https://charts.example.com", "web"));
//!     remote(
//!         "workload-cluster",
//!         // The Secret is looked up in the tenant's own namespace (a remote's kubeconfig
//!         // Secret must be there, as the name comes from the object).
//!         |t: &Tenant| {
//!             let ns = t.metadata.namespace.clone().unwrap_or_default();
//!             KubeconfigSecret::cluster_api(ns, &t.spec.cluster)
//!         },
//!         vec![boxed(application("web", argo.clone(), charts, |t: &Tenant| {
//!             AppRef::new("web", &t.spec.version)
//!         }))],
//!     )
//!     .registered_with(argo)
//! }
//! ```

//!
//! # Side effects outside Kubernetes, and the object operations
//!
//! A step that changes something outside Kubernetes (a DNS record, a cloud volume) runs it
//! under [`guard`](guard()) or [`Context::guard`]: at most once per generation of the object,
//! never on a stale object, never while another replica holds the lock (which expires, so a
//! replica that dies mid-task holds nothing forever). The context's object operations serve
//! such steps (sequencer's `ProviderController`): [`Context::set_condition`] for a condition
//! of the step's own, [`Context::add_finalizer`] / [`Context::remove_finalizer`],
//! [`Context::create_owned`] / [`Context::delete_owned`], [`Context::get`] and
//! [`Context::event`]. Their writes never clobber each other or the runtime's `Ready`. The
//! kinds a step reads or writes through them are the step's to declare
//! ([`Step::needs`], see [`Provisioner::rules`]).
//!
//! ```
//! use actorcile::prelude::*;
//! use actorcile::provisioners::guard;
//! # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
//! # #[kube(group = "example.com", version = "v1", kind = "Site", namespaced, status = "ResourceStatus")]
//! # struct SiteSpec { host: String }
//!
//! fn tree() -> impl Provisioner<Site> {
//!     serial![
//!         guard("DnsRecord", |cx: Context<Site>| async move {
//!             // create the record for cx.object().spec.host (idempotently)
//!             Outcome::Done
//!         }),
//!         step("certificate", |cx: Context<Site>| async move {
//!             let issued = Reason::new("Issued", "certificate issued");
//!             if let Err(e) = cx.set_condition("Certificate", true, &issued).await {
//!                 return Outcome::failed(Reason::new("ConditionWriteFailed", "Certificate"), e);
//!             }
//!             Outcome::Done
//!         }),
//!     ]
//! }
//! ```

mod application;
pub mod argocd;
pub mod cd;
mod combinators;
pub(crate) mod context;
mod guard;
mod nodes;
mod object_ops;
mod outcome;
mod ownership;
mod remote;
mod resource;
mod shield;
mod step;
mod step_error;
pub(crate) mod step_log;

use async_trait::async_trait;

pub use application::{
    AppHookError, AppRef, Application, ApplicationResolver, Catalog, ResolveError, application,
};
pub use combinators::{
    Concurrent, Conditional, PerReconcile, Serial, concurrent, conditional, per_reconcile, serial,
};
pub use context::{Context, RemoteScope};
pub(crate) use context::{ControllerParts, new_holder_id};
pub use guard::{DeprovisionTask, Guard, Lock, NoTask, guard};
pub use nodes::{NodeSet, Nodes, nodes};
pub use outcome::{InvalidReason, Outcome, ProvisionError, Reason};
pub use ownership::ChildRules;
pub use remote::{
    AccessRequest, FixedCluster, Grant, KubeconfigSecret, Remote, RemoteAccess, RemoteCluster,
    RemoteClusterError, openmcp_grant, remote,
};
pub use resource::{ResourceProvisioner, resource};
pub use step::{Step, step};
pub use step_error::{Field, StepError};
pub use step_log::StepRun;

/// One idempotent step of a resource's provisioning.
///
/// `provision` drives the world towards the object's spec; `deprovision` undoes it when the
/// object is deleted. Both are called again on every reconcile until they return [`Outcome::Done`].
#[async_trait]
pub trait Provisioner<K>: Send + Sync {
    /// A short name for the step, for the tree's own diagnostics and logs. Status messages do
    /// not carry it: the `Ready` condition shows the outcome's [`Reason`] verbatim, so name the
    /// step in the reason's message where the owner should see it.
    fn name(&self) -> &str;
    /// Bring this step to its desired state, or say why not yet.
    async fn provision(&self, cx: &Context<K>) -> Outcome;
    /// Undo this step, or say why not yet.
    async fn deprovision(&self, cx: &Context<K>) -> Outcome;
    /// The RBAC permissions this step (and its children) need beyond what the runtime needs
    /// for the managed kind: [`RuntimeBuilder::roles`](crate::runtime::RuntimeBuilder::roles)
    /// includes them, and the RBAC preflight checks them, naming the step. Combinators collect
    /// their children's; [`resource`] declares its child's kind; a [`step`] declares what it
    /// touches with [`Step::needs`]. Default: none.
    fn rules(&self) -> Vec<crate::rbac::StepRule> {
        Vec::new()
    }
}

/// A shared, type-erased provisioner (what combinators hold).
pub type BoxProvisioner<K> = std::sync::Arc<dyn Provisioner<K>>;

/// Turn a provisioner into a [`BoxProvisioner`] (used by the combinator macros).
pub fn boxed<K, P: Provisioner<K> + 'static>(p: P) -> BoxProvisioner<K> {
    std::sync::Arc::new(p)
}

// Forwards the inner provisioner's boxed future as it is (`#[async_trait]` would box it again).
impl<K: Send + Sync> Provisioner<K> for BoxProvisioner<K> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn rules(&self) -> Vec<crate::rbac::StepRule> {
        (**self).rules()
    }
    fn provision<'a, 'b, 'r>(
        &'a self,
        cx: &'b Context<K>,
    ) -> futures::future::BoxFuture<'r, Outcome>
    where
        'a: 'r,
        'b: 'r,
        Self: 'r,
    {
        (**self).provision(cx)
    }
    fn deprovision<'a, 'b, 'r>(
        &'a self,
        cx: &'b Context<K>,
    ) -> futures::future::BoxFuture<'r, Outcome>
    where
        'a: 'r,
        'b: 'r,
        Self: 'r,
    {
        (**self).deprovision(cx)
    }
}

/// `serial![a, b, c]`: provision in order, stopping at the first non-done child; deprovision in
/// reverse order. See [`serial`].
#[macro_export]
macro_rules! serial {
    ($($p:expr),* $(,)?) => {
        $crate::provisioners::serial("serial", vec![$($crate::provisioners::boxed($p)),*])
    };
}

/// `concurrent![a, b, c]`: run every child in the same reconcile and merge outcomes. See [`concurrent`].
#[macro_export]
macro_rules! concurrent {
    ($($p:expr),* $(,)?) => {
        $crate::provisioners::concurrent("concurrent", vec![$($crate::provisioners::boxed($p)),*])
    };
}
