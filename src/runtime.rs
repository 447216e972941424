//! The runtime an operator embeds: register controllers, start, shut down gracefully.
//!
//! ```no_run
//! use actorcile::prelude::*;
//! # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
//! # #[kube(group = "example.com", version = "v1", kind = "App", namespaced, status = "ResourceStatus")]
//! # struct AppSpec { replicas: i32 }
//! # async fn run(client: kube::Client) -> Result<(), actorcile::Error> {
//! let tree = serial![
//!     step("validate", |_cx: Context<App>| async { Outcome::Done }),
//!     step("deploy", |_cx: Context<App>| async { Outcome::Done }),
//! ];
//! Runtime::builder(client)
//!     .policy(SupervisorPolicy::default())
//!     .controller(Controller::<App>::new(tree))
//!     .run_until(async { tokio::signal::ctrl_c().await.ok(); })
//!     .await
//! # }
//! ```

use std::future::Future;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use dashmap::DashMap;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, PartialObjectMeta};
use kube::runtime::events::Reporter;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, watcher};
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;

use crate::actors::mailbox::Mailbox;
use crate::actors::triggers::{ConfigView, SecretTrigger, StartConfigWatch};
use crate::actors::{
    KindMetrics, KindWatch, Manager, ManagerArgs, Metrics, RunSlots, ShardScope, Shared, Timers,
    run_feeder,
};
use crate::event_recorder::EventRecorder;
use crate::health::Health;
use crate::messages::{ManagerMsg, ResourceMsg};
use crate::policy::SupervisorPolicy;
use crate::provisioners::{BoxProvisioner, ControllerParts, Provisioner, new_holder_id};
use crate::references::{
    KindHandle, Readiness, ReferenceApi, ReferenceIndex, Target, referrers_in,
};
use crate::sharding::{Sharding, Shards};
use crate::status::ResourceStatus;
use crate::triggers::SecretRefs;
use crate::{Error, Escalation, ManagedResource};

pub use crate::actors::{
    DURATION_BUCKETS, HistogramSnapshot, KindMetricsSnapshot, MetricsSnapshot, RunResult,
};

/// The finalizer the runtime puts on every object it provisions (configurable).
pub const DEFAULT_FINALIZER: &str = "actorcile.dev/finalizer";

/// One managed kind: its provisioner tree and options.
pub struct Controller<K: ManagedResource> {
    tree: BoxProvisioner<K>,
    policy: Option<SupervisorPolicy>,
    watcher: watcher::Config,
    /// The namespaces it watches, sorted, without repeats (empty: the runtime's, else all).
    namespaces: Vec<String>,
    finalizer: bool,
    status: bool,
    config: Option<ConfigSpec>,
    secrets: Option<SecretRefs<K>>,
    upgrade: Option<Hook>,
    initialize: Option<Hook>,
    shard_key: Option<crate::actors::ShardKey<K>>,
    related: Vec<RelatedSpec<K>>,
    max_concurrent_runs: Option<usize>,
}

/// Starts a watch of a related kind in one namespace (`None`: in all): the client, the
/// namespace, the kind's state, the record of the runtime's own child writes, the manager.
type StartRelated<K> = Box<
    dyn Fn(
            Client,
            Option<String>,
            Arc<Shared<K>>,
            Option<Arc<crate::provisioners::context::OwnWrites>>,
            Mailbox<ManagerMsg<K>>,
        ) -> JoinHandle<()>
        + Send,
>;

/// A watch of children or related objects, its kind erased ([`Controller::owns`],
/// [`Controller::watches`]).
struct RelatedSpec<K: ManagedResource> {
    /// Children the runtime writes (the echoes of its writes run nothing).
    owned: bool,
    /// Whether the related kind is cluster-scoped: one watch, whatever the namespaces.
    cluster_scoped: bool,
    rule: k8s_openapi::api::rbac::v1::PolicyRule,
    start: StartRelated<K>,
}

/// A controller's start-up hook ([`Controller::on_upgrade`], [`Controller::on_initialize`]).
type Hook =
    Box<dyn FnOnce(Client) -> futures::future::BoxFuture<'static, Result<(), HookError>> + Send>;

fn boxed_hook<F, Fut>(hook: F) -> Hook
where
    F: FnOnce(Client) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), HookError>> + Send + 'static,
{
    Box::new(move |c| Box::pin(hook(c)))
}

/// What a hook fails with: any error; its message fails the runtime's start-up.
pub type HookError = Box<dyn std::error::Error + Send + Sync>;

/// Builds a config's view and what starts its watch ([`Controller::config`]).
type StartConfig = Box<dyn FnOnce(&Client) -> (Arc<dyn ConfigView>, StartConfigWatch) + Send>;

/// A controller's provider config, its type erased ([`Controller::config`]).
struct ConfigSpec {
    /// `kind namespace/name`, for errors.
    described: String,
    /// What is wrong with it, found when it was given.
    invalid: Option<String>,
    rules: Vec<crate::rbac::ScopedRule>,
    /// Lists the config's kind once: an API server that does not serve it is a start-up error.
    probe: Box<
        dyn FnOnce(Client) -> futures::future::BoxFuture<'static, Result<(), kube::Error>> + Send,
    >,
    start: StartConfig,
}

impl<K: ManagedResource> Controller<K> {
    /// Manage every object of kind `K` with `tree`.
    pub fn new(tree: impl Provisioner<K> + 'static) -> Self {
        Self {
            tree: Arc::new(tree),
            policy: None,
            watcher: watcher::Config::default().streaming_lists(),
            namespaces: Vec::new(),
            finalizer: true,
            status: true,
            config: None,
            secrets: None,
            upgrade: None,
            initialize: None,
            shard_key: None,
            related: Vec::new(),
            max_concurrent_runs: None,
        }
    }

    /// Re-run an object when a child it owns changes or goes: kind `C` is watched (metadata
    /// only) in the controller's namespace, and a change of a `C` re-runs the objects of kind
    /// `K` its owner references name (any owner reference, not only the controller's). The
    /// echo of the runtime's own write of a child (by [`resource`](crate::provisioners::resource())
    /// or [`Context::create_owned`](crate::provisioners::Context::create_owned)) runs nothing.
    /// Someone deletes or edits a child by hand: its owner runs at once and puts it back,
    /// without waiting for a poll. Passive owners are activated like for any change, within
    /// the run slots. The operator needs `list` and `watch` on `C` where it is watched
    /// ([`RuntimeBuilder::roles`] includes them).
    ///
    /// ```
    /// # use actorcile::prelude::*;
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
    /// # #[kube(group = "example.com", version = "v1", kind = "App", namespaced, status = "ResourceStatus")]
    /// # struct AppSpec {}
    /// let tree = resource("settings", |app: &App| ConfigMap {
    ///     metadata: kube::api::ObjectMeta {
    ///         name: app.metadata.name.clone(),
    ///         ..Default::default()
    ///     },
    ///     ..Default::default()
    /// });
    /// let controller = Controller::<App>::new(tree).owns::<ConfigMap>();
    /// ```
    pub fn owns<C: ManagedResource>(mut self) -> Self {
        self.related.push(RelatedSpec {
            owned: true,
            cluster_scoped: crate::object_api::is_cluster_scoped::<C>(),
            rule: crate::rbac::rule_for::<C>(&["list", "watch"]),
            start: Box::new(|client, namespace, shared, echoes, manager| {
                // Metadata only: the children's contents are never held.
                let api: Api<PartialObjectMeta<C>> =
                    crate::object_api::kind_api(client, namespace.as_deref());
                let events = watcher::watcher(api, watcher::Config::default()).default_backoff();
                tokio::spawn(crate::actors::triggers::watch_related(
                    shared,
                    events,
                    Arc::new(crate::actors::triggers::owners_of::<K, PartialObjectMeta<C>>),
                    echoes,
                    manager,
                ))
            }),
        });
        self
    }

    /// Re-run the objects `map` names when an object of kind `R` changes, appears or goes
    /// (`map` gets its last version): e.g. the objects that name it in their spec. `R` is
    /// watched in the controller's namespace (every namespace for a cluster-scoped `R`), and
    /// `map` is called on every version the runtime sees of every `R`: keep it cheap. Nothing
    /// re-runs for the watch's first list. The operator needs `list` and `watch` on `R` where it
    /// is watched ([`RuntimeBuilder::roles`] includes them).
    ///
    /// ```
    /// # use actorcile::prelude::*;
    /// use k8s_openapi::api::core::v1::Service;
    /// use kube::runtime::reflector::ObjectRef;
    /// use kube::ResourceExt;
    /// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
    /// # #[kube(group = "example.com", version = "v1", kind = "App", namespaced, status = "ResourceStatus")]
    /// # struct AppSpec {}
    /// # let tree = step("deploy", |_cx: Context<App>| async { Outcome::Done });
    /// // A Service labelled `app: <name>` belongs to that App.
    /// let controller = Controller::<App>::new(tree).watches(|svc: &Service| {
    ///     let ns = svc.namespace().unwrap_or_default();
    ///     svc.labels()
    ///         .get("app")
    ///         .map(|app| vec![ObjectRef::new(app).within(&ns)])
    ///         .unwrap_or_default()
    /// });
    /// ```
    pub fn watches<R: ManagedResource>(
        mut self,
        map: impl Fn(&R) -> Vec<ObjectRef<K>> + Send + Sync + 'static,
    ) -> Self {
        let map: crate::actors::triggers::RelatedMap<K, R> = Arc::new(map);
        self.related.push(RelatedSpec {
            owned: false,
            cluster_scoped: crate::object_api::is_cluster_scoped::<R>(),
            rule: crate::rbac::rule_for::<R>(&["list", "watch"]),
            start: Box::new(move |client, namespace, shared, _echoes, manager| {
                let api: Api<R> = crate::object_api::kind_api(client, namespace.as_deref());
                let events = watcher::watcher(api, watcher::Config::default()).default_backoff();
                tokio::spawn(crate::actors::triggers::watch_related(
                    shared,
                    events,
                    map.clone(),
                    None,
                    manager,
                ))
            }),
        });
        self
    }

    /// With [sharding](crate::sharding), the key an object's shard is computed from (default
    /// `namespace/name`): objects with one key are always in one shard, run by one replica,
    /// e.g. all objects of a tenant by a tenant label. Derive it from what does not change in
    /// an object's life (its namespace, a label set at creation): an object whose key changes
    /// moves to another shard, and the replica that held its old shard stops running it only
    /// when it sees the change.
    ///
    /// ```no_run
    /// # use actorcile::prelude::*;
    /// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
    /// # #[kube(group = "example.com", version = "v1", kind = "App", namespaced, status = "ResourceStatus")]
    /// # struct AppSpec {}
    /// # let tree = step("deploy", |_cx: Context<App>| async { Outcome::Done });
    /// use kube::ResourceExt;
    /// let controller = Controller::<App>::new(tree)
    ///     .shard_key(|app: &App| app.labels().get("tenant").cloned().unwrap_or_default());
    /// ```
    pub fn shard_key(mut self, key: impl Fn(&K) -> String + Send + Sync + 'static) -> Self {
        self.shard_key = Some(Arc::new(key));
        self
    }

    /// Run `hook` once at start-up, before [`Controller::on_initialize`]'s hook and before the
    /// kind is watched: migrate what an earlier version of the operator stored (labels,
    /// annotations, a finalizer's name). It gets the runtime's client. An error fails
    /// [`RuntimeBuilder::start`] with [`Error::Hook`] carrying its message.
    ///
    /// ```
    /// # use actorcile::prelude::*;
    /// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
    /// # #[kube(group = "example.com", version = "v1", kind = "App", namespaced, status = "ResourceStatus")]
    /// # struct AppSpec {}
    /// # let tree = step("noop", |_cx: Context<App>| async { Outcome::Done });
    /// use kube::api::{Api, ListParams, Patch, PatchParams};
    /// let controller = Controller::<App>::new(tree).on_upgrade(|client| async move {
    ///     // Objects of version 1 carried the finalizer `example.com/old`: drop it, the runtime
    ///     // now puts its own.
    ///     let apps: Api<App> = Api::all(client);
    ///     for app in apps.list(&ListParams::default()).await? {
    ///         if app.metadata.finalizers.iter().flatten().any(|f| f == "example.com/old") {
    ///             let ns = app.metadata.namespace.clone().unwrap_or_default();
    ///             let name = app.metadata.name.clone().unwrap_or_default();
    ///             let keep: Vec<_> = app.metadata.finalizers.iter().flatten()
    ///                 .filter(|f| *f != "example.com/old").cloned().collect();
    ///             let patch = serde_json::json!({"metadata": {"finalizers": keep}});
    ///             Api::<App>::namespaced(apps.clone().into_client(), &ns)
    ///                 .patch(&name, &PatchParams::default(), &Patch::Merge(patch)).await?;
    ///         }
    ///     }
    ///     Ok(())
    /// });
    /// ```
    pub fn on_upgrade<F, Fut>(mut self, hook: F) -> Self
    where
        F: FnOnce(Client) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), HookError>> + Send + 'static,
    {
        self.upgrade = Some(boxed_hook(hook));
        self
    }

    /// Run `hook` once at start-up, after [`Controller::on_upgrade`]'s and before the kind is
    /// watched (e.g. create the objects the tree expects to exist, or check an external
    /// service). It gets the runtime's client. An error fails [`RuntimeBuilder::start`] with
    /// [`Error::Hook`] carrying its message.
    pub fn on_initialize<F, Fut>(mut self, hook: F) -> Self
    where
        F: FnOnce(Client) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), HookError>> + Send + 'static,
    {
        self.initialize = Some(boxed_hook(hook));
        self
    }

    /// Read the provider config from the object `config` names: steps get it with
    /// [`Context::config`](crate::provisioners::Context::config), and its change (a new
    /// generation, or resourceVersion for kinds without one; its creation or deletion)
    /// re-runs every object of this controller, passive ones included, through the run slots
    /// (see [`crate::triggers`]). While it does not exist, provision passes do not run the tree:
    /// the objects say so (phase Failed, reason `ConfigMissing`) and resume when it comes back.
    /// Deprovision passes run without it. The runtime lists the config before it starts the
    /// controller; a config kind the API server does not serve fails [`RuntimeBuilder::start`].
    ///
    /// The config is watched by name (a field selector) in its namespace, so the operator needs
    /// `list` and `watch` on that object ([`RuntimeBuilder::roles`] grants them there, by
    /// `resourceNames`).
    pub fn config<C>(mut self, config: crate::triggers::ConfigRef<C>) -> Self
    where
        C: ManagedResource,
    {
        let cluster_scoped = crate::object_api::is_cluster_scoped::<C>();
        let invalid = if config.name.is_empty() {
            Some("the config object has no name".to_string())
        } else if cluster_scoped && config.namespace.is_some() {
            Some(format!(
                "{} is cluster-scoped: name it with ConfigRef::cluster",
                C::kind(&())
            ))
        } else if !cluster_scoped && config.namespace.is_none() {
            Some(format!(
                "{} is namespaced: name its namespace with ConfigRef::namespaced",
                C::kind(&())
            ))
        } else {
            None
        };
        let (name, namespace) = (config.name.clone(), config.namespace.clone());
        // Read from another cluster: its roles are granted there, not in the rendered ones.
        let elsewhere = config.client.clone();
        let scope = match &namespace {
            Some(ns) => crate::rbac::RuleScope::namespace(ns),
            None => crate::rbac::RuleScope::Cluster,
        };
        self.config = Some(ConfigSpec {
            described: format!("{} {}", C::kind(&()), config.describe()),
            invalid,
            // Listed and watched by a `metadata.name` field selector, which RBAC matches
            // against `resourceNames`.
            rules: if elsewhere.is_some() {
                Vec::new()
            } else {
                let mut rules = vec![crate::rbac::ScopedRule::new(
                    scope.clone(),
                    crate::rbac::named_rule_for::<C>(&["list", "watch"], &[&name]),
                )];
                if config.secrets_from.is_some() {
                    rules.push(crate::rbac::ScopedRule::new(
                        scope,
                        crate::rbac::rule_for::<Secret>(&["list", "watch"]),
                    ));
                }
                rules
            },
            probe: Box::new(move |client| {
                let client = elsewhere.unwrap_or(client);
                Box::pin(async move {
                    let api: Api<C> = crate::object_api::kind_api(client, namespace.as_deref());
                    let lp = kube::api::ListParams::default()
                        .fields(&format!("metadata.name={name}"))
                        .limit(1);
                    api.list_metadata(&lp).await.map(|_| ())
                })
            }),
            start: Box::new(move |client| {
                let client = config.client.clone().unwrap_or_else(|| client.clone());
                crate::actors::triggers::config_trigger(&client, config)
            }),
        });
        self
    }

    /// Re-run an object when a Secret it references changes, appears or goes: `refs` says
    /// which Secrets an object references (it is called on every version of every object the
    /// runtime sees; keep it cheap). Only those objects re-run, not the whole kind. The Secrets
    /// are watched as metadata only (their data is never held), in the controller's namespace
    /// or in all, so the operator needs `list` and `watch` on Secrets there.
    pub fn secrets(
        mut self,
        refs: impl Fn(&K) -> Vec<ObjectRef<Secret>> + Send + Sync + 'static,
    ) -> Self {
        self.secrets = Some(Box::new(refs));
        self
    }

    /// Do not put the runtime finalizer on this kind's objects. Deletion then never waits for
    /// the tree's deprovision (the object goes at once and deprovision does not run), and
    /// references cannot hold its objects back. For kinds with nothing to clean up.
    pub fn without_finalizer(mut self) -> Self {
        self.finalizer = false;
        self
    }

    /// Do not write actorcile's status (Ready condition, phase, observedGeneration) on this
    /// kind — e.g. a built-in kind whose status belongs to someone else. Readiness of its
    /// objects is then known to this runtime only in memory, from each pass's outcome.
    pub fn without_status(mut self) -> Self {
        self.status = false;
        self
    }

    /// A policy for this kind (default: the runtime's). Its runtime-wide fields are ignored:
    /// `max_concurrent_runs` (one limit shared by every kind; a kind's own is
    /// [`Controller::max_concurrent_runs`]), `dependency_watch_idle`,
    /// `shutdown_timeout` and the Lease timings (`lease_duration`, `lease_renew_deadline`,
    /// `lease_retry_period`) are always the runtime's ([`RuntimeBuilder::policy`]).
    pub fn policy(mut self, policy: SupervisorPolicy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// At most `n` passes of this kind at once, within the runtime's `max_concurrent_runs`
    /// (default: no limit of its own). A pass then holds a run slot of both limits, so a kind
    /// whose passes are slow or costly (a remote cluster's API, a cloud quota) cannot take
    /// every run slot of the runtime. Must be 1 to [`MAX_CONCURRENCY`](crate::policy::MAX_CONCURRENCY):
    /// [`RuntimeBuilder::validate`] says so.
    ///
    /// ```
    /// # use actorcile::prelude::*;
    /// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
    /// # #[kube(group = "example.com", version = "v1", kind = "App", namespaced, status = "ResourceStatus")]
    /// # struct AppSpec {}
    /// let tree = step("call-the-cloud", |_cx: Context<App>| async { Outcome::Done });
    /// // Passes of App run at most 4 at a time, whatever the runtime's limit.
    /// let controller = Controller::<App>::new(tree).max_concurrent_runs(4);
    /// ```
    pub fn max_concurrent_runs(mut self, n: usize) -> Self {
        self.max_concurrent_runs = Some(n);
        self
    }

    /// Watch options, e.g. a label selector. The config is used as given: call
    /// `.streaming_lists()` on it to keep streaming lists (see [`Controller::streaming_lists`]).
    pub fn watcher_config(mut self, config: watcher::Config) -> Self {
        self.watcher = config;
        self
    }

    /// Whether the kind's lists stream (`sendInitialEvents`, the WatchList feature: the initial
    /// list arrives as watch events, without the API server building the whole list in memory).
    /// Default `true`: the watch asks for a streaming list, and where the API server refuses it
    /// (a server without WatchList answers `400`/`422`), lists and watches instead from then on.
    /// `false` always lists and watches (so does a [`watcher_config`](Self::watcher_config)
    /// set afterwards, unless it asks for streaming lists itself).
    pub fn streaming_lists(mut self, streaming: bool) -> Self {
        if streaming {
            self.watcher = self.watcher.streaming_lists();
        } else {
            self.watcher.initial_list_strategy = watcher::InitialListStrategy::ListWatch;
        }
        self
    }

    /// Watch only one namespace (default: the runtime's [`RuntimeBuilder::namespace`], else
    /// all). The kind is then listed and watched in that namespace only (a namespaced URL), so
    /// a Role there is all the operator needs for it ([`RuntimeBuilder::roles`]). Only for a
    /// namespaced kind: [`RuntimeBuilder::validate`] refuses it on a cluster-scoped one.
    pub fn namespace(mut self, ns: impl Into<String>) -> Self {
        self.namespaces = vec![ns.into()];
        self
    }

    /// Watch these namespaces only: one watch per namespace (the kind, and its
    /// [`owns`](Self::owns), [`watches`](Self::watches) and [`secrets`](Self::secrets)
    /// watches), each with its own cache, so a Role in each is all the operator needs
    /// ([`RuntimeBuilder::roles`] renders one per namespace). A watch the server refuses in
    /// one namespace fails `/readyz` naming that namespace, while the others run. Replaces
    /// what [`namespace`](Self::namespace) set; repeats count once.
    ///
    /// ```
    /// # use actorcile::prelude::*;
    /// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
    /// # #[kube(group = "example.com", version = "v1", kind = "App", namespaced, status = "ResourceStatus")]
    /// # struct AppSpec {}
    /// # let tree = step("deploy", |_cx: Context<App>| async { Outcome::Done });
    /// let controller = Controller::<App>::new(tree).namespaces(["team-a", "team-b"]);
    /// ```
    pub fn namespaces<S: Into<String>>(mut self, namespaces: impl IntoIterator<Item = S>) -> Self {
        let mut namespaces: Vec<String> = namespaces.into_iter().map(Into::into).collect();
        namespaces.sort();
        namespaces.dedup();
        self.namespaces = namespaces;
        self
    }
}

impl<K: ManagedResource> Controller<K> {
    /// The namespaces this controller's objects are watched in, one watch each: its own,
    /// else the runtime's `default`; `[None]` for every namespace, and always for a
    /// cluster-scoped kind.
    fn objects_namespaces(&self, default: Option<&str>) -> Vec<Option<String>> {
        if crate::object_api::is_cluster_scoped::<K>() {
            return vec![None];
        }
        if self.namespaces.is_empty() {
            return vec![default.map(str::to_string)];
        }
        self.namespaces.iter().cloned().map(Some).collect()
    }
}

/// Type-erased controller, started by the runtime.
#[async_trait]
trait Start: Send {
    async fn start(self: Box<Self>, cx: &StartCx) -> Result<Started, Error>;
    /// What the runtime needs for this controller, with the runtime's namespace `default`.
    fn rules(&self, default: Option<&str>) -> Vec<crate::rbac::ScopedRule>;
    /// What its tree's steps need besides, their [`RuleScope::Object`] resolved.
    ///
    /// [`RuleScope::Object`]: crate::rbac::RuleScope::Object
    fn step_rules(&self, default: Option<&str>) -> Vec<crate::rbac::StepRule>;
    /// The kind, as (apiVersion, kind).
    fn kind(&self) -> (String, String);
    /// Whether its settings are valid (the first problem, naming the field).
    fn validate(&self) -> Result<(), Error>;
    /// Watch only `ns`, unless the controller names its own namespace.
    fn default_namespace(&mut self, ns: &str);
}

struct StartCx {
    client: Client,
    policy: SupervisorPolicy,
    runs: Arc<Semaphore>,
    metrics: Arc<Metrics>,
    references: Arc<ReferenceIndex>,
    finalizer: String,
    field_manager: String,
    reporter: Option<Reporter>,
    root: ActorCell,
    holder: Arc<str>,
    health: Arc<Health>,
    /// With sharding: the shards held, a fenced client per shard, and the shard label's key
    /// when each replica watches only its shards ([`crate::sharding::ShardWatch::HeldShards`]).
    shards: Option<(Arc<Shards>, ShardClients, Option<Arc<str>>)>,
}

/// A fenced client per shard, in shard order.
type ShardClients = Arc<[Arc<Client>]>;

struct Started {
    kind: String,
    manager: ActorCell,
    /// The watch tasks: the kind's feeder, and its triggers' watches.
    tasks: Vec<JoinHandle<()>>,
}

/// The per-kind handle the reference index uses.
struct Handle<K: ManagedResource> {
    shared: Arc<Shared<K>>,
    synced: Arc<AtomicBool>,
    manager: OnceLock<Mailbox<ManagerMsg<K>>>,
}

fn key_of<K: ManagedResource>(t: &Target) -> ObjectRef<K> {
    let r = ObjectRef::<K>::new(&t.name);
    match &t.namespace {
        Some(ns) => r.within(ns),
        None => r,
    }
}

impl<K: ManagedResource> KindHandle for Handle<K> {
    fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }
    fn in_view(&self, target: &Target) -> bool {
        self.shared.in_view(&key_of::<K>(target))
    }
    fn readiness(&self, target: &Target) -> Readiness {
        match self.shared.store.get(&key_of::<K>(target)) {
            // Not in the store before the kind's first list is complete: it may not be listed
            // yet. Missing is only said once the list is in (`ReferenceIndex::kind_synced`
            // wakes the waiters then, so they see it).
            None if !self.synced() => Readiness::NotReady,
            None => Readiness::Missing,
            Some(o) if o.meta().deletion_timestamp.is_some() => Readiness::Deleting,
            Some(o) => {
                let status = ResourceStatus::of(o.as_ref());
                if status.is_ready() {
                    Readiness::Ready
                } else if status.phase == Some(crate::status::Phase::Failed) {
                    Readiness::Failed
                } else {
                    Readiness::NotReady
                }
            }
        }
    }
    fn exists(&self, target: &Target) -> bool {
        self.shared.store.get(&key_of::<K>(target)).is_some()
    }
    fn deleting(&self, target: &Target) -> bool {
        self.shared
            .store
            .get(&key_of::<K>(target))
            .is_some_and(|o| o.meta().deletion_timestamp.is_some())
    }
    fn referrers(&self, target: &Target) -> Vec<Target> {
        self.shared
            .store
            .get(&key_of::<K>(target))
            .and_then(|o| o.meta().annotations.as_ref().map(referrers_in))
            .unwrap_or_default()
    }
    fn notify(&self, target: &Target) {
        let key = key_of::<K>(target);
        if let Some(a) = self.shared.routes.get(&key)
            && a.cast(ResourceMsg::Notify).is_ok()
        {
            return;
        }
        if let Some(m) = self.manager.get() {
            m.send(ManagerMsg::Notify(key));
        }
    }
    fn dynamic_api(&self, target: &Target) -> Api<DynamicObject> {
        let ar = ApiResource::erase::<K>(&());
        match &target.namespace {
            Some(ns) => Api::namespaced_with(Client::clone(&self.shared.client), ns, &ar),
            None => Api::all_with(Client::clone(&self.shared.client), &ar),
        }
    }
}

#[async_trait]
impl<K: ManagedResource> Start for Controller<K> {
    fn rules(&self, default: Option<&str>) -> Vec<crate::rbac::ScopedRule> {
        use crate::rbac::{RuleScope, ScopedRule};
        let mut rules = Vec::new();
        if let Some(c) = &self.config {
            rules.extend(c.rules.iter().cloned());
        }
        for ns in self.objects_namespaces(default) {
            let objects = RuleScope::Object.resolve(ns.as_deref());
            let in_objects = |rule| ScopedRule::new(objects.clone(), rule);
            rules.extend(crate::rbac::rules_for::<K>().into_iter().map(in_objects));
            if self.secrets.is_some() {
                rules.push(in_objects(crate::rbac::rule_for::<Secret>(&[
                    "list", "watch",
                ])));
            }
            for r in &self.related {
                // A cluster-scoped related kind is watched once, cluster-wide.
                let scope = if r.cluster_scoped {
                    RuleScope::Cluster
                } else {
                    objects.clone()
                };
                rules.push(ScopedRule::new(scope, r.rule.clone()));
            }
            // Events go to the object's namespace; those of cluster-scoped objects to `default`.
            let events = if crate::object_api::is_cluster_scoped::<K>() {
                RuleScope::namespace("default")
            } else {
                objects.clone()
            };
            rules.extend(
                crate::rbac::common_rules()
                    .into_iter()
                    .map(|r| ScopedRule::new(events.clone(), r)),
            );
        }
        rules
    }

    fn kind(&self) -> (String, String) {
        (K::api_version(&()).into_owned(), K::kind(&()).into_owned())
    }

    fn step_rules(&self, default: Option<&str>) -> Vec<crate::rbac::StepRule> {
        let mut rules = Vec::new();
        for r in self.tree.rules() {
            if r.scope == crate::rbac::RuleScope::Object {
                // Once in each namespace the objects are in.
                for ns in self.objects_namespaces(default) {
                    let mut r = r.clone();
                    r.scope = crate::rbac::RuleScope::Object.resolve(ns.as_deref());
                    rules.push(r);
                }
            } else {
                rules.push(r);
            }
        }
        rules
    }

    fn default_namespace(&mut self, ns: &str) {
        if self.namespaces.is_empty() && !crate::object_api::is_cluster_scoped::<K>() {
            self.namespaces = vec![ns.to_string()];
        }
    }

    fn validate(&self) -> Result<(), Error> {
        if let Some(p) = &self.policy {
            p.validate()?;
        }
        if let Some(n) = self.max_concurrent_runs
            && !(1..=crate::policy::MAX_CONCURRENCY).contains(&n)
        {
            return Err(Error::Invalid {
                field: format!("max_concurrent_runs of the {} controller", K::kind(&())),
                problem: format!("{n}: must be 1 to {}", crate::policy::MAX_CONCURRENCY),
            });
        }
        for ns in &self.namespaces {
            if crate::object_api::is_cluster_scoped::<K>() {
                return Err(Error::Invalid {
                    field: format!("namespace of the {} controller", K::kind(&())),
                    problem: format!(
                        "{} is cluster-scoped: its objects are in no namespace",
                        K::kind(&())
                    ),
                });
            }
            if !crate::names::is_dns_label(ns) {
                return Err(Error::Invalid {
                    field: format!("namespace of the {} controller", K::kind(&())),
                    problem: format!("{ns:?} is not a valid namespace name"),
                });
            }
        }
        if let Some(c) = &self.config
            && let Some(problem) = &c.invalid
        {
            return Err(Error::Invalid {
                field: format!("config of the {} controller", K::kind(&())),
                problem: format!("{}: {problem}", c.described),
            });
        }
        Ok(())
    }

    async fn start(mut self: Box<Self>, cx: &StartCx) -> Result<Started, Error> {
        let mut policy = self.policy.take().unwrap_or_else(|| cx.policy.clone());
        policy.validate()?;
        for (name, hook) in [
            ("upgrade", self.upgrade.take()),
            ("initialize", self.initialize.take()),
        ] {
            if let Some(hook) = hook {
                tracing::info!(controller = %K::kind(&()), hook = name, "running start-up hook");
                hook(cx.client.clone()).await.map_err(|e| Error::Hook {
                    controller: K::kind(&()).into_owned(),
                    hook: name,
                    message: e.to_string(),
                })?;
            }
        }
        // The runtime-wide fields are the runtime's, whatever the kind's policy says: one
        // limit of runs for all kinds, one watch of unmanaged kinds, one shutdown, one set of
        // Lease timings (the keeper and elector read the runtime's, and so must the feeder).
        policy.max_concurrent_runs = cx.policy.max_concurrent_runs;
        policy.dependency_watch_idle = cx.policy.dependency_watch_idle;
        policy.shutdown_timeout = cx.policy.shutdown_timeout;
        policy.lease_duration = cx.policy.lease_duration;
        policy.lease_renew_deadline = cx.policy.lease_renew_deadline;
        policy.lease_retry_period = cx.policy.lease_retry_period;
        // One watch, and one store, per namespace (the runtime's default is applied already).
        let namespaces = self.objects_namespaces(None);
        let (store, writers) = crate::actors::KindStore::<K>::new(&namespaces);
        let recorder = cx
            .reporter
            .clone()
            .map(|r| Arc::new(EventRecorder::new(cx.client.clone(), r)));
        let related = std::mem::take(&mut self.related);
        let own_writes = related
            .iter()
            .any(|r| r.owned)
            .then(|| Arc::new(crate::provisioners::context::OwnWrites::default()));
        let parts = Arc::new(ControllerParts {
            own_writes: own_writes.clone(),
            recorder,
            references: Some(cx.references.clone() as Arc<dyn ReferenceApi>),
            field_manager: Arc::from(cx.field_manager.as_str()),
            holder: cx.holder.clone(),
            lock_expiry: policy.lock_expiry,
        });
        let kind = K::kind(&()).into_owned();
        let (config, start_config) = match self.config {
            Some(spec) => {
                if let Err(e) = (spec.probe)(cx.client.clone()).await
                    && matches!(&e, kube::Error::Api(s) if s.code == 404)
                {
                    return Err(Error::Invalid {
                        field: format!("config of the {kind} controller"),
                        problem: format!("the API server does not serve {}: {e}", spec.described),
                    });
                }
                let (view, start) = (spec.start)(&cx.client);
                (Some(view), Some(start))
            }
            None => (None, None),
        };
        let runs = RunSlots::new(cx.runs.clone(), self.max_concurrent_runs);
        let timers = Timers::with_run_slots(&runs);
        cx.health.add_task(
            &format!("the {kind} timers"),
            crate::health::TaskCheck(Box::new(timers.liveness())),
        );
        let kind_metrics = Arc::new(KindMetrics::new(&kind, {
            let (store, timers) = (store.clone(), timers.gauges());
            Box::new(move || (store.len() as u64, timers.armed(), timers.waiting()))
        }));
        cx.metrics.add_kind(kind_metrics.clone());
        let shared = Arc::new(Shared {
            client: Arc::new(cx.client.clone()),
            tree: self.tree,
            policy,
            runs,
            store,
            routes: DashMap::default(),
            finalizer: cx.finalizer.clone(),
            use_finalizer: self.finalizer,
            write_status: self.status,
            metrics: cx.metrics.clone(),
            kind_metrics: kind_metrics.clone(),
            event_budget: Default::default(),
            status_checks: Default::default(),
            references: cx.references.clone(),
            timers,
            parts,
            config,
            secrets: self.secrets.map(SecretTrigger::new),
            shards: cx
                .shards
                .as_ref()
                .map(|(shards, clients, label)| ShardScope {
                    shards: shards.clone(),
                    clients: clients.clone(),
                    key: self.shard_key.take(),
                    label: label.clone(),
                }),
        });
        let synced = Arc::new(AtomicBool::new(false));
        // What `/readyz` checks for each watch: whether its first list is in (the kind's, with
        // one watch), and why the server refuses it; named by the kind, and its namespace with
        // several watches.
        let watches: Vec<(Arc<AtomicBool>, crate::health::WatchRefusal)> = namespaces
            .iter()
            .map(|ns| {
                let refused = crate::health::WatchRefusal::default();
                let (name, listed) = match ns {
                    Some(ns) if namespaces.len() > 1 => {
                        (format!("{kind} in {ns}"), Arc::new(AtomicBool::new(false)))
                    }
                    _ => (kind.clone(), synced.clone()),
                };
                cx.health.add_kind(&name, listed.clone(), refused.clone());
                (listed, refused)
            })
            .collect();
        let handle = Arc::new(Handle {
            shared: shared.clone(),
            synced: synced.clone(),
            manager: OnceLock::new(),
        });
        cx.references
            .register_kind(&K::api_version(&()), &kind, handle.clone());
        let (mailbox, rx) = crate::actors::mailbox::channel();
        let (manager, _) = Actor::spawn_linked(
            None,
            Manager {
                shared: shared.clone(),
            },
            ManagerArgs {
                mailbox: mailbox.clone(),
                rx,
            },
            cx.root.clone(),
        )
        .await
        .map_err(|e| Error::Spawn {
            actor: format!("{kind} manager"),
            source: Box::new(e),
        })?;
        cx.health.add_supervisor(manager.get_cell());
        let mailbox = mailbox.bind(manager.clone());
        let _ = handle.manager.set(mailbox.clone());
        if let Some((shards, _, _)) = &cx.shards {
            // A shard acquired: run its objects (the previous holder's work is not known here).
            let m = mailbox.clone();
            shards.on_acquired(Box::new(move |shard| {
                m.send(ManagerMsg::ShardAcquired(shard));
            }));
        }
        let mut tasks = Vec::new();
        if let Some(start) = start_config {
            let (listed_tx, listed) = tokio::sync::oneshot::channel();
            let m = mailbox.clone();
            tasks.push(start(
                Arc::new(move || {
                    m.send(ManagerMsg::Broadcast);
                }),
                listed_tx,
            ));
            // Passes must see the config as it is, not as missing because it is not listed yet.
            let _ = listed.await;
        }
        for r in related {
            let scopes = if r.cluster_scoped {
                &[None][..]
            } else {
                &namespaces[..]
            };
            for ns in scopes {
                tasks.push((r.start)(
                    cx.client.clone(),
                    ns.clone(),
                    shared.clone(),
                    own_writes.clone(),
                    mailbox.clone(),
                ));
            }
        }
        if shared.secrets.is_some() {
            for ns in &namespaces {
                let api: Api<PartialObjectMeta<Secret>> = match ns {
                    Some(ns) => Api::namespaced(cx.client.clone(), ns),
                    None => Api::all(cx.client.clone()),
                };
                tasks.push(tokio::spawn(crate::actors::triggers::watch_secrets(
                    shared.clone(),
                    api,
                    mailbox.clone(),
                )));
            }
        }
        // Mark the kind synced (and rebuild its part of the reference index from the persisted
        // annotations) once the first list of every watch is in the store, before references
        // are trusted.
        let store = shared.store.clone();
        let references = cx.references.clone();
        let mut lists = Vec::new();
        for ((ns, writer), (flag, refused)) in namespaces.iter().zip(writers).zip(watches) {
            let api: Api<K> = crate::object_api::kind_api(cx.client.clone(), ns.as_deref());
            let (listed_tx, listed) = tokio::sync::oneshot::channel::<()>();
            let several = namespaces.len() > 1;
            lists.push(async move {
                let done = listed.await.is_ok();
                if done && several {
                    flag.store(true, Ordering::Release);
                }
                done
            });
            let watch = KindWatch {
                api,
                config: self.watcher.clone(),
                namespace: ns.clone(),
                refused,
            };
            tasks.push(tokio::spawn(run_feeder(
                shared.clone(),
                watch,
                writer,
                mailbox.clone(),
                listed_tx,
            )));
        }
        let (api_version, kind_name) = (K::api_version(&()).into_owned(), kind.clone());
        tokio::spawn(async move {
            let all_listed = futures::future::join_all(lists).await;
            if all_listed.into_iter().all(|listed| listed) {
                for obj in store.state() {
                    if let Some(a) = obj.meta().annotations.as_ref() {
                        references.learn(&Target::of(obj.as_ref()), &referrers_in(a));
                    }
                }
                synced.store(true, Ordering::Release);
                references.kind_synced(&api_version, &kind_name);
            }
        });
        Ok(Started {
            kind,
            manager: manager.get_cell(),
            tasks,
        })
    }
}

/// Why a manager stopped the runtime.
#[derive(Clone, Debug)]
enum ManagerFailure {
    Escalated(Escalation),
    Other(Arc<dyn std::error::Error + Send + Sync>),
}

/// The root actor: parent of every manager; past-intensity escalations end up here.
struct Root;

impl Actor for Root {
    type Msg = ();
    type State = watch::Sender<Option<ManagerFailure>>;
    type Arguments = watch::Sender<Option<ManagerFailure>>;

    async fn pre_start(
        &self,
        _myself: ActorRef<()>,
        tx: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(tx)
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<()>,
        event: SupervisionEvent,
        tx: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let SupervisionEvent::ActorFailed(_, err) = event {
            tracing::error!(error = %err, "a manager escalated; the runtime stops");
            let failure = match err.downcast::<Escalation>() {
                Ok(escalation) => ManagerFailure::Escalated(*escalation),
                Err(other) => ManagerFailure::Other(Arc::from(other)),
            };
            let _ = tx.send(Some(failure));
        }
        Ok(())
    }
}

/// Builds a [`Runtime`].
pub struct RuntimeBuilder {
    client: Client,
    policy: SupervisorPolicy,
    controllers: Vec<Box<dyn Start>>,
    finalizer: String,
    field_manager: String,
    reporter: Option<Reporter>,
    preflight: bool,
    namespace: Option<String>,
    crds: Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>,
    #[cfg(feature = "operator")]
    admin: Option<std::net::SocketAddr>,
    #[cfg(feature = "operator")]
    metrics_addr: Option<std::net::SocketAddr>,
    #[cfg(feature = "operator")]
    registry: Option<crate::metrics::Registry>,
    #[cfg(feature = "operator")]
    leader: Option<crate::leader::LeaderElection>,
    /// What [`RuntimeBuilder::run`] sets up before it waits for the Lease.
    early: Option<Early>,
    /// Start with no run slot: watch and cache, run nothing ([`RuntimeHandle::lead`]).
    gated: bool,
    sharding: Option<Sharding>,
}

/// A replica waiting for the Lease: its controllers started and gated, or not yet started.
#[cfg(feature = "operator")]
enum Standby {
    Warm(Box<RuntimeHandle>),
    Cold(Box<RuntimeBuilder>),
}

/// The admin servers: the one of [`RuntimeBuilder::admin`], and the one of
/// [`RuntimeBuilder::metrics_addr`] when metrics are served apart.
#[cfg(feature = "operator")]
#[derive(Default)]
struct AdminServers {
    main: Option<crate::admin::AdminServer>,
    metrics: Option<crate::admin::AdminServer>,
}

/// What serves the probes and metrics, set up before the controllers start.
struct Early {
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    #[cfg(feature = "operator")]
    admin: AdminServers,
    #[cfg(feature = "operator")]
    registry: Arc<crate::metrics::Registry>,
}

/// The runtime: every registered controller, under one root supervisor.
pub struct Runtime;

impl Runtime {
    /// Start building a runtime that talks to the cluster through `client`.
    pub fn builder(client: Client) -> RuntimeBuilder {
        RuntimeBuilder {
            client,
            policy: SupervisorPolicy::default(),
            controllers: Vec::new(),
            finalizer: DEFAULT_FINALIZER.to_string(),
            field_manager: crate::FIELD_MANAGER.to_string(),
            reporter: None,
            preflight: false,
            namespace: None,
            crds: Vec::new(),
            #[cfg(feature = "operator")]
            admin: None,
            #[cfg(feature = "operator")]
            metrics_addr: None,
            #[cfg(feature = "operator")]
            registry: None,
            #[cfg(feature = "operator")]
            leader: None,
            early: None,
            gated: false,
            sharding: None,
        }
    }
}

impl RuntimeBuilder {
    /// The default policy of every controller, and the runtime-wide concurrency limit.
    pub fn policy(mut self, policy: SupervisorPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Register a kind.
    pub fn controller<K: ManagedResource>(mut self, controller: Controller<K>) -> Self {
        self.controllers.push(Box::new(controller));
        self
    }

    /// The finalizer put on provisioned objects (default [`DEFAULT_FINALIZER`]).
    pub fn finalizer(mut self, name: impl Into<String>) -> Self {
        self.finalizer = name.into();
        self
    }

    /// The field manager for server-side apply (default `actorcile`).
    pub fn field_manager(mut self, name: impl Into<String>) -> Self {
        self.field_manager = name.into();
        self
    }

    /// Publish Kubernetes Events on status transitions, as this controller.
    pub fn events(mut self, controller_name: impl Into<String>) -> Self {
        self.reporter = Some(Reporter {
            controller: controller_name.into(),
            instance: std::env::var("POD_NAME").ok(),
        });
        self
    }

    /// Install (or update) these CRDs as the runtime starts, before any controller, and wait
    /// until they are Established ([`crds::install`](crate::crds::install), as the runtime's
    /// field manager; waits at most a minute). A failure fails
    /// [`RuntimeBuilder::start`]. The ClusterRole then includes the CRD permissions.
    pub fn install_crds(
        mut self,
        crds: impl IntoIterator<
            Item = k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        >,
    ) -> Self {
        self.crds.extend(crds);
        self
    }

    /// Watch only namespace `ns` with every namespaced controller that does not name its own
    /// ([`Controller::namespace`]).
    pub fn namespace(mut self, ns: impl Into<String>) -> Self {
        self.namespace = Some(ns.into());
        self
    }

    /// Serve `/metrics`, `/healthz` and `/readyz` on `addr` (see [`crate::admin`]). The
    /// server is bound before any controller starts; an address that cannot be bound fails
    /// [`RuntimeBuilder::start`] with [`Error::Admin`].
    #[cfg(feature = "operator")]
    pub fn admin(mut self, addr: std::net::SocketAddr) -> Self {
        self.admin = Some(addr);
        self
    }

    /// Serve `/metrics` on `addr` instead of on the [`admin`](RuntimeBuilder::admin) address,
    /// which then serves the probes only. Bound before any controller starts, like it.
    #[cfg(feature = "operator")]
    pub fn metrics_addr(mut self, addr: std::net::SocketAddr) -> Self {
        self.metrics_addr = Some(addr);
        self
    }

    /// The Prometheus registry the runtime adds its metrics to and `/metrics` serves (default:
    /// an empty one). Register the operator's own metrics in it first. See [`crate::metrics`]
    /// for the runtime's metric names.
    #[cfg(feature = "operator")]
    pub fn metrics_registry(mut self, registry: crate::metrics::Registry) -> Self {
        self.registry = Some(registry);
        self
    }

    /// Elect a leader among the operator's replicas on a Lease ([`crate::leader`]):
    /// [`RuntimeBuilder::run`] and [`RuntimeBuilder::run_until`] honour it (they wait for the
    /// Lease, standing by, before they start the controllers); [`RuntimeBuilder::start`]
    /// refuses a builder that has it. The policy's
    /// `lease_duration`, `lease_renew_deadline` and `lease_retry_period` set the timings.
    #[cfg(feature = "operator")]
    pub fn leader_election(mut self, election: crate::leader::LeaderElection) -> Self {
        self.leader = Some(election);
        self
    }

    /// Split the objects of every controller across the operator's replicas by Leases
    /// ([`crate::sharding`]): this replica runs only the objects of the shards it holds, and
    /// releases them when it shuts down. Works with [`RuntimeBuilder::start`] and
    /// [`RuntimeBuilder::run`]; not together with
    /// [leader election](RuntimeBuilder::leader_election) (sharding with one replica is the
    /// same as leading). The policy's `lease_duration`, `lease_renew_deadline` and
    /// `lease_retry_period` set the timings.
    pub fn sharding(mut self, sharding: Sharding) -> Self {
        self.sharding = Some(sharding);
        self
    }

    /// The health state, the metrics and the admin server (bound now: a bind failure is a
    /// start-up error).
    async fn prepare(&mut self) -> Result<Early, Error> {
        let health = Arc::new(Health::default());
        let metrics = Arc::new(Metrics::default());
        #[cfg(feature = "operator")]
        let (admin, registry) = {
            let mut registry = self.registry.take().unwrap_or_default();
            registry.register_collector(Box::new(crate::metrics::RuntimeCollector {
                metrics: metrics.clone(),
                health: health.clone(),
                max_concurrent_runs: self.policy.max_concurrent_runs as u64,
            }));
            let registry = Arc::new(registry);
            use crate::admin::{AdminLimits, AdminServer, Endpoints};
            let bind = |addr, endpoints| {
                AdminServer::bind_with(
                    addr,
                    registry.clone(),
                    health.clone(),
                    endpoints,
                    AdminLimits::default(),
                )
            };
            let main_endpoints = if self.metrics_addr.is_some() {
                Endpoints::Probes
            } else {
                Endpoints::All
            };
            let admin = AdminServers {
                main: match self.admin {
                    Some(addr) => Some(bind(addr, main_endpoints).await?),
                    None => None,
                },
                metrics: match self.metrics_addr {
                    Some(addr) => Some(bind(addr, Endpoints::Metrics).await?),
                    None => None,
                },
            };
            (admin, registry)
        };
        Ok(Early {
            health,
            metrics,
            #[cfg(feature = "operator")]
            admin,
            #[cfg(feature = "operator")]
            registry,
        })
    }

    /// Check at start-up (with SelfSubjectAccessReviews) that the running identity has every
    /// permission of [`RuntimeBuilder::roles`], each where they grant it; `start` fails with [`Error::Forbidden`]
    /// naming what is missing instead of failing later, object by object.
    pub fn preflight_rbac(mut self, check: bool) -> Self {
        self.preflight = check;
        self
    }

    /// The roles this runtime needs, named `name` (print them with
    /// [`Roles::to_yaml`](crate::rbac::Roles::to_yaml), bind them with
    /// [`Roles::bindings`](crate::rbac::Roles::bindings)). For each controller: its kind
    /// (list, watch, get, patch, and patch of its status), its config object (by name), the
    /// Secrets it watches, Events, and what its tree's steps declare ([`Provisioner::rules`]: the
    /// children kinds of [`resource`](crate::provisioners::resource()), a CD driver's, a step's
    /// [`needs`](crate::provisioners::Step::needs)) — in a Role in the namespace it watches, or
    /// in the ClusterRole when it watches all or its kind is cluster-scoped. Besides: the CRDs it
    /// installs (by name), and the Leases of its leader election (by name) or sharding, in a Role
    /// in their namespace.
    pub fn roles(&self, name: &str) -> crate::rbac::Roles {
        let mut rules = self.own_rules();
        rules.extend(
            self.step_rules()
                .into_iter()
                .map(|s| crate::rbac::ScopedRule::new(s.scope, s.rule)),
        );
        crate::rbac::Roles::new(name, rules)
    }

    /// What the trees' steps declare they need, in the scopes they need it.
    fn step_rules(&self) -> Vec<crate::rbac::StepRule> {
        let default = self.namespace.as_deref();
        self.controllers
            .iter()
            .flat_map(|c| c.step_rules(default))
            .collect()
    }

    /// What the runtime itself needs: its kinds (their configs, Secrets and Events), installing
    /// its CRDs, and the Leases of its leader election or sharding.
    fn own_rules(&self) -> Vec<crate::rbac::ScopedRule> {
        use crate::rbac::{RuleScope, ScopedRule, named_rule_for, rule_for};
        use k8s_openapi::api::coordination::v1::Lease;
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        let default = self.namespace.as_deref();
        let mut rules: Vec<_> = self
            .controllers
            .iter()
            .flat_map(|c| c.rules(default))
            .collect();
        if !self.crds.is_empty() {
            // Applied by name (server-side apply: a patch, which Kubernetes authorizes as a
            // `create` of that name when the CRD does not exist yet), then watched by name until
            // Established.
            let names: Vec<&str> = self
                .crds
                .iter()
                .filter_map(|c| c.metadata.name.as_deref())
                .collect();
            rules.push(ScopedRule::new(
                RuleScope::Cluster,
                named_rule_for::<CustomResourceDefinition>(
                    &["create", "patch", "list", "watch"],
                    &names,
                ),
            ));
        }
        #[cfg(feature = "operator")]
        if let Some(election) = &self.leader {
            let here = RuleScope::namespace(&election.namespace);
            rules.push(ScopedRule::new(
                here.clone(),
                rule_for::<Lease>(&["create"]),
            ));
            rules.push(ScopedRule::new(
                here,
                named_rule_for::<Lease>(&["get", "update"], &[&election.lease]),
            ));
        }
        if let Some(sharding) = &self.sharding {
            // Shard and member Leases: members are named after replicas, and found by a label.
            rules.push(ScopedRule::new(
                RuleScope::namespace(&sharding.namespace),
                rule_for::<Lease>(&["get", "list", "create", "update", "delete"]),
            ));
        }
        rules
    }

    /// Check everything given to the builder, without starting anything: the policies, that
    /// there is a controller and no kind has two, the finalizer name, the field manager, and
    /// each controller's config. The first problem is an [`Error::Invalid`] naming its field
    /// (or an [`Error::Policy`] naming the policy's).
    pub fn validate(&self) -> Result<(), Error> {
        self.policy.validate()?;
        if self.controllers.is_empty() {
            return Err(Error::Invalid {
                field: "controllers".into(),
                problem: "no controller is registered (add one with RuntimeBuilder::controller)"
                    .into(),
            });
        }
        if !crate::names::is_prefixed_qualified_name(&self.finalizer) {
            return Err(Error::Invalid {
                field: "finalizer".into(),
                problem: format!(
                    "{:?} is not a qualified name with a prefix, like example.com/finalizer",
                    self.finalizer
                ),
            });
        }
        if self.field_manager.is_empty() || self.field_manager.len() > 128 {
            return Err(Error::Invalid {
                field: "field_manager".into(),
                problem: "must be 1 to 128 characters".into(),
            });
        }
        let mut kinds = std::collections::HashSet::new();
        for c in &self.controllers {
            let (api_version, kind) = c.kind();
            if !kinds.insert((api_version.clone(), kind.clone())) {
                return Err(Error::Invalid {
                    field: format!("controller {kind}"),
                    problem: format!(
                        "{api_version} {kind} is registered twice; one controller per kind"
                    ),
                });
            }
            c.validate()?;
        }
        if let Some(sharding) = &self.sharding {
            sharding.validate(&self.policy)?;
            #[cfg(feature = "operator")]
            if self.leader.is_some() {
                return Err(Error::Invalid {
                    field: "sharding".into(),
                    problem: "sharding and leader election exclude each other (one shard is the same as leading)".into(),
                });
            }
        }
        Ok(())
    }

    /// Start every controller; returns a handle to observe and stop the runtime. Fails
    /// without starting anything when [`RuntimeBuilder::validate`] does.
    pub async fn start(mut self) -> Result<RuntimeHandle, Error> {
        self.validate()?;
        #[cfg(feature = "operator")]
        if self.leader.is_some() {
            return Err(Error::Invalid {
                field: "leader election".into(),
                problem: "only RuntimeBuilder::run and run_until elect a leader; start() would run unelected"
                    .into(),
            });
        }
        if let Some(ns) = &self.namespace {
            for c in &mut self.controllers {
                c.default_namespace(ns);
            }
        }
        if self.preflight {
            let own = self.own_rules();
            let steps = self.step_rules();
            let missing = crate::rbac::missing_step_permissions(&self.client, &own, &steps).await?;
            if !missing.is_empty() {
                return Err(Error::Forbidden(missing));
            }
        }
        let Early {
            health,
            metrics,
            #[cfg(feature = "operator")]
            admin,
            #[cfg(feature = "operator")]
            registry,
        } = match self.early.take() {
            Some(early) => early,
            None => self.prepare().await?,
        };
        if !self.crds.is_empty() {
            crate::crds::install(
                self.client.clone(),
                &self.crds,
                &self.field_manager,
                std::time::Duration::from_secs(60),
            )
            .await
            .map_err(|e| Error::Invalid {
                field: "CRDs".into(),
                problem: e.to_string(),
            })?;
        }
        let (tx, escalated) = watch::channel(None);
        let (root, root_task) = Actor::spawn(None, Root, tx)
            .await
            .map_err(|e| Error::Spawn {
                actor: "root supervisor".into(),
                source: Box::new(e),
            })?;
        health.add_supervisor(root.get_cell());
        let references = ReferenceIndex::for_runtime(
            &self.field_manager,
            self.client.clone(),
            self.policy.dependency_watch_idle,
        );
        let shards = self.sharding.as_ref().map(|s| {
            let shards = Arc::new(Shards::new(s.shards));
            let clients: ShardClients =
                crate::sharding::fenced_clients(&self.client, &shards).into();
            health.set_shards(shards.clone());
            let label = (s.watch == crate::sharding::ShardWatch::HeldShards)
                .then(|| Arc::from(s.label_key()));
            (shards, clients, label)
        });
        let cx = StartCx {
            client: self.client,
            // Gated (a warm standby): no slot, so no pass and no activation, until it leads.
            runs: Arc::new(Semaphore::new(if self.gated {
                0
            } else {
                self.policy.max_concurrent_runs
            })),
            policy: self.policy.clone(),
            metrics: metrics.clone(),
            references,
            finalizer: self.finalizer,
            field_manager: self.field_manager,
            reporter: self.reporter,
            root: root.get_cell(),
            holder: Arc::from(new_holder_id().as_str()),
            health: health.clone(),
            shards,
        };
        let mut handle = RuntimeHandle {
            holder: cx.holder.clone(),
            started: Vec::new(),
            runs: cx.runs.clone(),
            metrics,
            escalated,
            references: cx.references.clone(),
            root,
            root_task,
            shutdown_timeout: self.policy.shutdown_timeout,
            health: health.clone(),
            keeper: None,
            #[cfg(feature = "operator")]
            admin,
            #[cfg(feature = "operator")]
            registry,
        };
        for c in self.controllers {
            match c.start(&cx).await {
                Ok(s) => handle.started.push(s),
                Err(e) => {
                    // Stop what already started (a hook or a config probe failed).
                    handle.shutdown().await;
                    return Err(e);
                }
            }
        }
        // The keeper starts once every manager listens for the shards it acquires.
        if let (Some(sharding), Some((shards, _, _))) = (self.sharding, &cx.shards) {
            let keeper = crate::sharding::keeper::Keeper::new(
                cx.client.clone(),
                sharding,
                shards.clone(),
                &cx.policy,
            );
            let (stop, stopped) = watch::channel(false);
            handle.keeper = Some((stop, tokio::spawn(keeper.run(stopped))));
        }
        health.set_started();
        Ok(handle)
    }

    /// Start, run until SIGTERM or SIGINT (or a manager escalates), then shut down gracefully
    /// ([`RuntimeHandle::shutdown`]): no new passes, in-flight passes finish within the
    /// policy's shutdown timeout, timers and waiters dropped; `Ok(())`. A second signal during
    /// the shutdown stops everything at once and returns [`Error::Interrupted`]. It never
    /// exits the process: `main` decides.
    ///
    /// ```no_run
    /// # use actorcile::prelude::*;
    /// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
    /// # #[kube(group = "example.com", version = "v1", kind = "App", namespaced, status = "ResourceStatus")]
    /// # struct AppSpec {}
    /// # async fn run(client: kube::Client) -> Result<(), actorcile::Error> {
    /// let tree = step("deploy", |_cx: Context<App>| async { Outcome::Done });
    /// Runtime::builder(client)
    ///     .controller(Controller::<App>::new(tree))
    ///     .admin("127.0.0.1:8080".parse().unwrap())
    ///     .run()
    ///     .await
    /// # }
    /// ```
    #[cfg(feature = "operator")]
    pub async fn run(self) -> Result<(), Error> {
        // Listening before the start: a signal during start-up is not lost.
        let signals = crate::signals::Signals::new()?;
        let result = self
            .run_stopping_on(crate::signals::Stop::<std::future::Pending<()>>::Signals(
                signals,
            ))
            .await;
        // The last spans of the exporter the flags installed, if any.
        #[cfg(feature = "otel")]
        if let Ok(Err(e)) = tokio::task::spawn_blocking(crate::telemetry::shutdown_otlp).await {
            tracing::warn!(error = %e, "the last spans were not exported");
        }
        result
    }

    /// [`RuntimeBuilder::run`], stopped by `signals`.
    #[cfg(feature = "operator")]
    async fn run_stopping_on<F: Future<Output = ()>>(
        mut self,
        mut signals: crate::signals::Stop<F>,
    ) -> Result<(), Error> {
        let Some(election) = self.leader.take() else {
            let handle = self.start().await?;
            return run_with(handle, &mut signals, None).await;
        };
        self.validate()?;
        election.validate(&self.policy)?;
        // Probes and metrics answer while this replica stands by.
        let early = self.prepare().await?;
        let health = early.health.clone();
        health.set_standby(true);
        self.early = Some(early);
        let warm = election.warm_standby;
        let slots = self.policy.max_concurrent_runs;
        let mut elector = crate::leader::Elector::new(self.client.clone(), election, &self.policy);
        // A warm standby watches and caches while it waits: its takeover starts with the
        // objects in hand, not with a list.
        let standby = if warm {
            self.gated = true;
            Standby::Warm(Box::new(self.start().await?))
        } else {
            Standby::Cold(Box::new(self))
        };
        let elected = tokio::select! {
            _ = elector.acquire() => true,
            signal = signals.next() => {
                tracing::info!(signal, "stopping while standing by");
                false
            }
        };
        let handle = match (elected, standby) {
            (false, Standby::Warm(handle)) => {
                handle.shutdown().await;
                return Ok(());
            }
            (false, Standby::Cold(_)) => return Ok(()),
            (true, Standby::Warm(handle)) => {
                handle.lead(slots);
                *handle
            }
            (true, Standby::Cold(builder)) => builder.start().await?,
        };
        health.set_standby(false);
        let result = run_with(handle, &mut signals, Some(&mut elector)).await;
        if !matches!(result, Err(Error::LeadershipLost)) {
            elector.release().await;
        }
        result
    }

    /// Start, run until `shutdown` completes (e.g. SIGTERM) or a manager escalates, then shut
    /// down gracefully. With [leader election](RuntimeBuilder::leader_election), as
    /// [`RuntimeBuilder::run`]: stand by until the Lease is held (`shutdown` ends the wait), run,
    /// and return [`Error::LeadershipLost`] if it is lost.
    pub async fn run_until(self, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
        #[cfg(feature = "operator")]
        if self.leader.is_some() {
            let stop = crate::signals::Stop::Until(Some(Box::pin(shutdown)));
            return self.run_stopping_on(stop).await;
        }
        let mut handle = self.start().await?;
        let result = tokio::select! {
            _ = shutdown => Ok(()),
            e = handle.escalated() => Err(e),
        };
        handle.shutdown().await;
        result
    }
}

/// [`RuntimeBuilder::run`] once it runs the controllers: until a signal, an escalation or the
/// loss of the Lease, then stop.
#[cfg(feature = "operator")]
async fn run_with<F: Future<Output = ()>>(
    mut handle: RuntimeHandle,
    signals: &mut crate::signals::Stop<F>,
    elector: Option<&mut crate::leader::Elector>,
) -> Result<(), Error> {
    let abort = handle.aborter();
    // Resolves when leadership is lost: every run must stop at once (fencing).
    let lost = async {
        match elector {
            Some(e) => e.hold().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(lost);
    let result = tokio::select! {
        signal = signals.next() => {
            tracing::info!(signal, "shutting down gracefully (again to stop at once)");
            Ok(())
        }
        e = handle.escalated() => Err(e),
        _ = &mut lost => {
            abort.abort();
            return Err(Error::LeadershipLost);
        }
    };
    // The Lease is still renewed while the shutdown waits for the runs in flight.
    tokio::select! {
        _ = handle.shutdown() => result,
        signal = signals.next() => {
            tracing::warn!(signal, "second signal: stopping at once");
            abort.abort();
            Err(Error::Interrupted)
        }
        _ = &mut lost => {
            abort.abort();
            Err(Error::LeadershipLost)
        }
    }
}

/// A running runtime.
pub struct RuntimeHandle {
    holder: Arc<str>,
    started: Vec<Started>,
    /// The run slots; closed at shutdown, so no new pass or activation starts.
    runs: Arc<Semaphore>,
    metrics: Arc<Metrics>,
    escalated: watch::Receiver<Option<ManagerFailure>>,
    references: Arc<ReferenceIndex>,
    root: ActorRef<()>,
    root_task: JoinHandle<()>,
    shutdown_timeout: std::time::Duration,
    health: Arc<Health>,
    /// With sharding: stops the shard keeper, which hands itself back to release the shards.
    keeper: Option<(
        watch::Sender<bool>,
        JoinHandle<crate::sharding::keeper::Keeper>,
    )>,
    #[cfg(feature = "operator")]
    admin: AdminServers,
    #[cfg(feature = "operator")]
    registry: Arc<crate::metrics::Registry>,
}

/// Stops a runtime at once, from outside its shutdown ([`RuntimeBuilder::run`] on a second
/// signal).
#[cfg(feature = "operator")]
struct Aborter {
    managers: Vec<ActorCell>,
    tasks: Vec<tokio::task::AbortHandle>,
    root: ActorCell,
}

#[cfg(feature = "operator")]
impl Aborter {
    fn abort(self) {
        for t in &self.tasks {
            t.abort();
        }
        for m in &self.managers {
            for child in m.get_children() {
                child.kill();
            }
            m.kill();
        }
        self.root.kill();
    }
}

impl RuntimeHandle {
    #[cfg(feature = "operator")]
    fn aborter(&self) -> Aborter {
        Aborter {
            managers: self.started.iter().map(|s| s.manager.clone()).collect(),
            tasks: self
                .started
                .iter()
                .flat_map(|s| s.tasks.iter().map(|t| t.abort_handle()))
                .chain(self.keeper.iter().map(|(_, k)| k.abort_handle()))
                .collect(),
            root: self.root.get_cell(),
        }
    }

    /// Give a gated runtime (a warm standby) its `slots` run slots: it starts running.
    #[cfg(feature = "operator")]
    fn lead(&self, slots: usize) {
        self.runs.add_permits(slots);
    }

    /// With [sharding](RuntimeBuilder::sharding), the shards this replica holds now (runs the
    /// objects of), in order; without, empty.
    pub fn shards_held(&self) -> Vec<u32> {
        self.health.shards_held()
    }

    /// What the health probes answer ([`crate::health`]).
    pub fn health(&self) -> Arc<Health> {
        self.health.clone()
    }

    /// The address the admin server listens on (with [`RuntimeBuilder::admin`]).
    #[cfg(feature = "operator")]
    pub fn admin_addr(&self) -> Option<std::net::SocketAddr> {
        self.admin.main.as_ref().map(|a| a.local_addr())
    }

    /// The address metrics are served on apart (with [`RuntimeBuilder::metrics_addr`]).
    #[cfg(feature = "operator")]
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.admin.metrics.as_ref().map(|a| a.local_addr())
    }

    /// The Prometheus registry with the runtime's metrics (and the operator's own, given
    /// with [`RuntimeBuilder::metrics_registry`]), e.g. to serve it elsewhere.
    #[cfg(feature = "operator")]
    pub fn metrics_registry(&self) -> Arc<crate::metrics::Registry> {
        self.registry.clone()
    }

    /// This runtime's holder id: the holder its guarded steps' locks name
    /// ([`Context::guard`](crate::provisioners::Context::guard)). Unique per runtime.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Runtime-wide counters.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.metrics.snapshot()
    }

    /// Each controller's own figures: passes by result, pass durations, the wait from due to
    /// start, objects cached, Events.
    pub fn kind_metrics(&self) -> Vec<KindMetricsSnapshot> {
        self.metrics.kinds()
    }

    /// The kinds this runtime does not manage whose objects it watches now, as
    /// (apiVersion, kind): each started by a provisioner waiting on one of its objects
    /// ([`Context::require_ready`](crate::provisioners::Context::require_ready)) and stopped
    /// once nobody waited on it for the policy's `dependency_watch_idle`.
    pub fn dependency_watches(&self) -> Vec<(String, String)> {
        self.references.watched_external_kinds()
    }

    /// Resolves when a manager escalates (restart intensity exceeded with `escalate`).
    pub async fn escalated(&mut self) -> Error {
        loop {
            let failure = self.escalated.borrow().clone();
            if let Some(failure) = failure {
                self.health.set_failed();
                return match failure {
                    ManagerFailure::Escalated(e) => Error::Escalated(e),
                    ManagerFailure::Other(e) => Error::ManagerFailed(e),
                };
            }
            if self.escalated.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Stop watching, start no new runs, let in-flight runs finish within the policy's shutdown
    /// timeout (then abort them), stop every actor, and release the controllers (their
    /// provisioner trees are dropped once nothing of the runtime runs any more).
    pub async fn shutdown(self) {
        self.health.set_stopping();
        for s in &self.started {
            for task in &s.tasks {
                task.abort();
            }
        }
        self.runs.close();
        for s in &self.started {
            s.manager
                .stop_children_and_wait(Some("shutdown".into()), Some(self.shutdown_timeout))
                .await;
            // Past the timeout (or started while the others stopped): killed, mid-run or not.
            let left = s.manager.get_children();
            if !left.is_empty() {
                tracing::warn!(
                    kind = %s.kind,
                    actors = left.len(),
                    "resource actors had not stopped when shutdown ended their wait; killing them"
                );
            }
            for child in left {
                child.kill();
            }
            let _ = s.manager.stop_and_wait(Some("shutdown".into()), None).await;
        }
        // No pass runs any more: give the shards up, so the other replicas take them at once.
        if let Some((stop, keeper)) = self.keeper {
            let _ = stop.send(true);
            if let Ok(keeper) = keeper.await {
                keeper.release_all().await;
            }
        }
        let _ = self.root.stop_and_wait(None, None).await;
        let _ = self.root_task.await;
        self.references.unregister_kinds();
    }
}
