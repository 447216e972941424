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
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;

use crate::actors::mailbox::Mailbox;
use crate::actors::{Manager, ManagerArgs, Metrics, Shared, Timers, run_feeder};
use crate::messages::{ManagerMsg, ResourceMsg};
use crate::policy::SupervisorPolicy;
use crate::provisioners::{BoxProvisioner, Provisioner};
use crate::references::{KindHandle, Readiness, ReferenceIndex, Target, referrers_in};
use crate::status::ResourceStatus;
use crate::{Error, Escalation, ManagedResource};

pub use crate::actors::MetricsSnapshot;

/// The finalizer the runtime puts on every object it provisions (configurable).
pub const DEFAULT_FINALIZER: &str = "actorcile.dev/finalizer";

/// One managed kind: its provisioner tree and options.
pub struct Controller<K: ManagedResource> {
    tree: BoxProvisioner<K>,
    policy: Option<SupervisorPolicy>,
    watcher: watcher::Config,
    namespace: Option<String>,
    finalizer: bool,
    status: bool,
}

impl<K: ManagedResource> Controller<K> {
    /// Manage every object of kind `K` with `tree`.
    pub fn new(tree: impl Provisioner<K> + 'static) -> Self {
        Self {
            tree: Arc::new(tree),
            policy: None,
            watcher: watcher::Config::default(),
            namespace: None,
            finalizer: true,
            status: true,
        }
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

    /// A policy for this kind (default: the runtime's). The concurrency limit is always the
    /// runtime's, shared by every kind.
    pub fn policy(mut self, policy: SupervisorPolicy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// Watch options, e.g. a label selector.
    pub fn watcher_config(mut self, config: watcher::Config) -> Self {
        self.watcher = config;
        self
    }

    /// Watch only one namespace (default: all).
    pub fn namespace(mut self, ns: impl Into<String>) -> Self {
        self.namespace = Some(ns.into());
        self
    }
}

/// Type-erased controller, started by the runtime.
#[async_trait]
trait Start: Send {
    async fn start(self: Box<Self>, cx: &StartCx) -> Result<Started, Error>;
    fn rules(&self) -> Vec<k8s_openapi::api::rbac::v1::PolicyRule>;
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
}

struct Started {
    kind: String,
    manager: ActorCell,
    feeder: JoinHandle<()>,
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
    fn rules(&self) -> Vec<k8s_openapi::api::rbac::v1::PolicyRule> {
        crate::rbac::rules_for::<K>()
    }

    async fn start(self: Box<Self>, cx: &StartCx) -> Result<Started, Error> {
        let mut policy = self.policy.unwrap_or_else(|| cx.policy.clone());
        policy.validate()?;
        policy.max_concurrent_runs = cx.policy.max_concurrent_runs;
        let (store, writer) = reflector::store::<K>();
        let recorder = cx
            .reporter
            .clone()
            .map(|r| Arc::new(Recorder::new(cx.client.clone(), r)));
        let shared = Arc::new(Shared {
            client: Arc::new(cx.client.clone()),
            tree: self.tree,
            policy,
            runs: cx.runs.clone(),
            store,
            routes: DashMap::default(),
            finalizer: cx.finalizer.clone(),
            field_manager: Arc::from(cx.field_manager.as_str()),
            recorder,
            use_finalizer: self.finalizer,
            write_status: self.status,
            metrics: cx.metrics.clone(),
            references: cx.references.clone(),
            timers: Timers::with_run_slots(cx.runs.clone()),
        });
        let synced = Arc::new(AtomicBool::new(false));
        let handle = Arc::new(Handle {
            shared: shared.clone(),
            synced: synced.clone(),
            manager: OnceLock::new(),
        });
        let kind = K::kind(&()).into_owned();
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
        let mailbox = mailbox.bind(manager.clone());
        let _ = handle.manager.set(mailbox.clone());
        let api: Api<K> = Api::all(cx.client.clone());
        let mut watch_config = self.watcher;
        if let Some(ns) = &self.namespace {
            // A field selector rather than a namespaced URL: kube 5 builds namespaced `Api`s
            // only for statically namespaced kinds.
            let sel = format!("metadata.namespace={ns}");
            watch_config.field_selector = Some(match watch_config.field_selector.take() {
                Some(existing) => format!("{existing},{sel}"),
                None => sel,
            });
        }
        // Mark the kind synced (and rebuild its part of the reference index from the persisted
        // annotations) once the first list is in the store, before references are trusted.
        let store = shared.store.clone();
        let references = cx.references.clone();
        let (listed_tx, listed) = tokio::sync::oneshot::channel();
        let (api_version, kind_name) = (K::api_version(&()).into_owned(), kind.clone());
        tokio::spawn(async move {
            if listed.await.is_ok() {
                for obj in store.state() {
                    if let Some(a) = obj.meta().annotations.as_ref() {
                        references.learn(&Target::of(obj.as_ref()), &referrers_in(a));
                    }
                }
                synced.store(true, Ordering::Release);
                references.kind_synced(&api_version, &kind_name);
            }
        });
        let feeder = tokio::spawn(run_feeder(
            shared,
            api,
            watch_config,
            writer,
            mailbox,
            listed_tx,
        ));
        Ok(Started {
            kind,
            manager: manager.get_cell(),
            feeder,
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

    /// Check at start-up (with SelfSubjectAccessReviews) that the running identity has every
    /// permission of [`RuntimeBuilder::cluster_role`]; `start` fails with [`Error::Forbidden`]
    /// naming what is missing instead of failing later, object by object.
    pub fn preflight_rbac(mut self, check: bool) -> Self {
        self.preflight = check;
        self
    }

    /// The ClusterRole this runtime needs for its registered kinds (print it with
    /// [`rbac::to_yaml`](crate::rbac::to_yaml)). Add what your provisioners touch themselves.
    pub fn cluster_role(&self, name: &str) -> k8s_openapi::api::rbac::v1::ClusterRole {
        crate::rbac::cluster_role(
            name,
            self.controllers.iter().flat_map(|c| c.rules()).collect(),
        )
    }

    /// Start every controller; returns a handle to observe and stop the runtime.
    pub async fn start(self) -> Result<RuntimeHandle, Error> {
        self.policy.validate()?;
        if self.preflight {
            let role = self.cluster_role("preflight");
            let missing = crate::rbac::missing_permissions(
                &self.client,
                role.rules.as_deref().unwrap_or_default(),
            )
            .await?;
            if !missing.is_empty() {
                return Err(Error::Forbidden(missing));
            }
        }
        let (tx, escalated) = watch::channel(None);
        let (root, root_task) = Actor::spawn(None, Root, tx)
            .await
            .map_err(|e| Error::Spawn {
                actor: "root supervisor".into(),
                source: Box::new(e),
            })?;
        let metrics = Arc::new(Metrics::default());
        let references = ReferenceIndex::for_runtime(
            &self.field_manager,
            self.client.clone(),
            self.policy.dependency_watch_idle,
        );
        let cx = StartCx {
            client: self.client,
            runs: Arc::new(Semaphore::new(self.policy.max_concurrent_runs)),
            policy: self.policy.clone(),
            metrics: metrics.clone(),
            references,
            finalizer: self.finalizer,
            field_manager: self.field_manager,
            reporter: self.reporter,
            root: root.get_cell(),
        };
        let mut started = Vec::new();
        for c in self.controllers {
            started.push(c.start(&cx).await?);
        }
        Ok(RuntimeHandle {
            started,
            runs: cx.runs.clone(),
            metrics,
            escalated,
            references: cx.references.clone(),
            root,
            root_task,
            shutdown_timeout: self.policy.shutdown_timeout,
        })
    }

    /// Start, run until `shutdown` completes (e.g. SIGTERM) or a manager escalates, then shut
    /// down gracefully.
    pub async fn run_until(self, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
        let mut handle = self.start().await?;
        let result = tokio::select! {
            _ = shutdown => Ok(()),
            e = handle.escalated() => Err(e),
        };
        handle.shutdown().await;
        result
    }
}

/// A running runtime.
pub struct RuntimeHandle {
    started: Vec<Started>,
    /// The run slots; closed at shutdown, so no new pass or activation starts.
    runs: Arc<Semaphore>,
    metrics: Arc<Metrics>,
    escalated: watch::Receiver<Option<ManagerFailure>>,
    references: Arc<ReferenceIndex>,
    root: ActorRef<()>,
    root_task: JoinHandle<()>,
    shutdown_timeout: std::time::Duration,
}

impl RuntimeHandle {
    /// Runtime-wide counters.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.metrics.snapshot()
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
            match self.escalated.borrow().clone() {
                Some(ManagerFailure::Escalated(e)) => return Error::Escalated(e),
                Some(ManagerFailure::Other(e)) => return Error::ManagerFailed(e),
                None => {}
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
        for s in &self.started {
            s.feeder.abort();
        }
        self.runs.close();
        for s in &self.started {
            s.manager
                .stop_children_and_wait(Some("shutdown".into()), Some(self.shutdown_timeout))
                .await;
            for child in s.manager.get_children() {
                tracing::warn!(kind = %s.kind, "run did not finish within the shutdown timeout; aborting it");
                child.kill();
            }
            let _ = s.manager.stop_and_wait(Some("shutdown".into()), None).await;
        }
        let _ = self.root.stop_and_wait(None, None).await;
        let _ = self.root_task.await;
        self.references.unregister_kinds();
    }
}
