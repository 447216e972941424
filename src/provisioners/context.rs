//! The explicit, typed context a provisioner runs with.

use std::any::Any;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::runtime::events::{Event, EventType};
use kube::{Client, Resource};

use crate::event_recorder::EventRecorder;
use crate::provisioners::{Outcome, Reason, StepError};
use crate::references::{Readiness, ReferenceApi, Selection, Target};
use crate::status::{ReadyReason, ResourceStatus};

/// Everything a provisioner may use, passed explicitly (no task-locals, no globals).
///
/// A context is cheap to clone. It carries the object being reconciled (the latest observed
/// version when the reconcile started), a [`kube::Client`] (the runtime's; [`Context::with_client`]
/// gives a copy that talks to another cluster), the reference / readiness API, the object's
/// current actorcile status, an event recorder, the controller's provider config
/// ([`Context::config`]), and the object operations: conditions of a step's own, guarded side
/// effects, owned children and extra finalizers (see `provisioners/object_ops.rs` and
/// `provisioners/guard.rs`).
pub struct Context<K> {
    inner: Arc<Inner<K>>,
    /// Behind an `Arc`: a context is cloned into every step of every reconcile, and cloning a
    /// `Client` allocates (its default namespace is a `String`).
    client: Arc<Client>,
    /// The remote cluster `client` talks to (`None`: the runtime's own cluster).
    remote: Option<Arc<RemoteScope>>,
    /// The condition type the running step owns ([`Step::attached_condition`](super::Step::attached_condition)).
    attached: Option<Arc<str>>,
}

/// The remote cluster a [`remote`](super::remote()) provisioner runs its children in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteScope {
    /// The remote's stable id ([`RemoteCluster::id`](super::RemoteCluster::id)).
    pub id: String,
    /// Whether the remote is registered with a CD driver (so applications can deploy to it).
    pub registered: bool,
}

/// What every context of one controller shares: built once per controller by the runtime.
pub(crate) struct ControllerParts {
    pub recorder: Option<Arc<EventRecorder>>,
    pub references: Option<Arc<dyn ReferenceApi>>,
    pub field_manager: Arc<str>,
    /// The annotation keys of the operator's names (the owner mark of children).
    pub keys: Arc<crate::names::Keys>,
    /// Who holds the locks this runtime takes ([`Context::guard`]): unique per runtime.
    pub holder: Arc<str>,
    /// How long a lock taken by [`Context::guard`] holds.
    pub lock_expiry: Duration,
    /// When this runtime first saw each lock held by another.
    pub locks_seen: super::guard::LockSightings,
    /// The guarded tasks this runtime ran to `Done` and has not recorded yet.
    pub unrecorded: super::guard::UnrecordedResults,
    /// The children this controller wrote, when it watches them
    /// ([`Controller::owns`](crate::runtime::Controller::owns)).
    pub own_writes: Option<Arc<OwnWrites>>,
    /// Each reconcile logs its steps' runs (the runtime's introspection is on).
    pub log_steps: bool,
}

/// What the runtime last wrote of each child it owns, so that the watch of the children
/// ([`Controller::owns`](crate::runtime::Controller::owns)) runs nothing for the echo of the
/// runtime's own write, as the watch of the objects does not for theirs: (apiVersion, kind,
/// namespace, name) → the resourceVersion written, or [`OwnWrites::DELETED`].
#[derive(Default)]
pub(crate) struct OwnWrites(dashmap::DashMap<OwnKey, String, ahash::RandomState>);

type OwnKey = (String, String, Option<String>, String);

impl OwnWrites {
    /// Marks a child the runtime deleted.
    pub(crate) const DELETED: &'static str = "";

    fn key<T: Resource<DynamicType = ()>>(namespace: Option<&str>, name: &str) -> OwnKey {
        (
            T::api_version(&()).into_owned(),
            T::kind(&()).into_owned(),
            namespace.map(str::to_string),
            name.to_string(),
        )
    }

    /// `obj` as the runtime's write left it.
    pub(crate) fn wrote<T: Resource<DynamicType = ()>>(&self, obj: &T) {
        let m = obj.meta();
        if let (Some(name), Some(rv)) = (&m.name, &m.resource_version) {
            self.0
                .insert(Self::key::<T>(m.namespace.as_deref(), name), rv.clone());
        }
    }

    /// The runtime deleted child `namespace/name` of kind `T`.
    pub(crate) fn deleted<T: Resource<DynamicType = ()>>(
        &self,
        namespace: Option<&str>,
        name: &str,
    ) {
        self.0
            .insert(Self::key::<T>(namespace, name), Self::DELETED.to_string());
    }

    /// Whether a watch event of child `namespace/name` of kind `T` at `version` (or its
    /// deletion, [`OwnWrites::DELETED`]) is the echo of the runtime's own write; it is
    /// forgotten once seen.
    pub(crate) fn is_echo<T: Resource<DynamicType = ()>>(
        &self,
        namespace: Option<&str>,
        name: &str,
        version: &str,
    ) -> bool {
        self.0
            .remove_if(&Self::key::<T>(namespace, name), |_, v| v == version)
            .is_some()
    }
}

impl ControllerParts {
    /// The parts of a context built outside the runtime (a unit test of a provisioner).
    fn standalone() -> Self {
        Self {
            recorder: None,
            references: None,
            field_manager: Arc::from(crate::names::STANDALONE_FIELD_MANAGER),
            keys: Arc::new(crate::names::Keys::standalone()),
            holder: Arc::from(new_holder_id().as_str()),
            lock_expiry: crate::policy::KindPolicy::default().lock_expiry,
            locks_seen: Default::default(),
            unrecorded: Default::default(),
            own_writes: None,
            log_steps: false,
        }
    }
}

/// A holder id for a runtime's locks: the pod's name (or the host's) and a random suffix, so two
/// runtimes in one process (or two replicas on one host) never share one.
pub(crate) fn new_holder_id() -> String {
    format!("{}-{:08x}", crate::names::replica_name(), fastrand::u32(..))
}

/// What the steps of one reconcile wrote to the object itself (conditions, locks, finalizers): the
/// newest version they left, and every version they produced (their watch echoes are the
/// reconcile's own writes, not news). The resource actor takes it when the reconcile ends.
pub(crate) struct Written<K> {
    pub latest: Option<Arc<K>>,
    pub versions: Vec<u64>,
    /// A write conflicted and the object was read again: someone else changed it during the
    /// reconcile, and the runtime runs it again.
    pub saw_others: bool,
    /// Status fields the steps set for the reconcile's status write
    /// ([`Context::set_status_field`]).
    pub status_fields: serde_json::Map<String, serde_json::Value>,
}

impl<K> Default for Written<K> {
    fn default() -> Self {
        Self {
            latest: None,
            versions: Vec::new(),
            saw_others: false,
            status_fields: serde_json::Map::new(),
        }
    }
}

struct Inner<K> {
    object: Arc<K>,
    /// The client of the cluster the object lives in (`Context::client` may be a remote's).
    home: Arc<Client>,
    status: Arc<ResourceStatus>,
    parts: Arc<ControllerParts>,
    /// The controller's provider config when the reconcile started (`Controller::config`).
    config: Option<Arc<dyn Any + Send + Sync>>,
    /// The label (key, value) naming the object's shard that its children carry, when
    /// replicas watch only their shards' children
    /// ([`Sharding::owner_label_key`](crate::sharding::Sharding::owner_label_key)).
    child_label: Option<(Arc<str>, String)>,
    written: Mutex<Written<K>>,
    /// How many [`Context::shielded`] futures of this reconcile are running: while any is, the
    /// runtime does not cut the reconcile when its object moves on.
    shield: std::sync::atomic::AtomicU32,
    /// The steps' runs, when the controller logs them.
    steps: Option<super::step_log::StepLog>,
}

impl<K> Clone for Context<K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            client: self.client.clone(),
            remote: self.remote.clone(),
            attached: self.attached.clone(),
        }
    }
}

impl<K> Context<K> {
    /// A context for `object`, talking to the cluster through `client`.
    ///
    /// The runtime builds contexts for you; build one yourself to unit-test a provisioner.
    pub fn new(object: Arc<K>, client: Client) -> Self {
        Self::with_parts(
            object,
            Arc::new(client),
            Arc::default(),
            Arc::new(ControllerParts::standalone()),
            None,
            None,
        )
    }

    /// Whether this context was built on exactly this object and status (the same `Arc`s).
    pub(crate) fn has_parts(&self, object: &Arc<K>, status: &Arc<ResourceStatus>) -> bool {
        Arc::ptr_eq(&self.inner.object, object) && Arc::ptr_eq(&self.inner.status, status)
    }

    /// Whether this context was built with exactly this provider config (the same `Arc`).
    pub(crate) fn has_config(&self, config: &Option<Arc<dyn Any + Send + Sync>>) -> bool {
        match (&self.inner.config, config) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// A context of the runtime: the object's current status, what the controller's contexts
    /// share, the provider config, and the owner shard label of the object's children.
    pub(crate) fn with_parts(
        object: Arc<K>,
        client: Arc<Client>,
        status: Arc<ResourceStatus>,
        parts: Arc<ControllerParts>,
        config: Option<Arc<dyn Any + Send + Sync>>,
        child_label: Option<(Arc<str>, String)>,
    ) -> Self {
        let steps = parts.log_steps.then(Default::default);
        Self {
            inner: Arc::new(Inner {
                object,
                home: client.clone(),
                status,
                parts,
                config,
                child_label,
                written: Mutex::default(),
                shield: Default::default(),
                steps,
            }),
            client,
            remote: None,
            attached: None,
        }
    }

    /// The log of this reconcile's steps, when the controller keeps one.
    pub(crate) fn step_log(&self) -> Option<&super::step_log::StepLog> {
        self.inner.steps.as_ref()
    }

    /// The count of this reconcile's running [`Context::shielded`] futures.
    pub(super) fn shield(&self) -> &std::sync::atomic::AtomicU32 {
        &self.inner.shield
    }

    /// What the reconcile's steps wrote to the object (taken: the next call returns nothing).
    pub(crate) fn take_written(&self) -> Written<K> {
        std::mem::take(&mut *self.written())
    }

    pub(crate) fn written(&self) -> std::sync::MutexGuard<'_, Written<K>> {
        // A step that panicked while holding the lock left nothing half-written in it.
        self.inner
            .written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn parts(&self) -> &ControllerParts {
        &self.inner.parts
    }

    /// Records a child the runtime wrote in the home cluster (see [`OwnWrites`]).
    pub(crate) fn wrote_child<T: Resource<DynamicType = ()>>(&self, child: &T) {
        if self.remote().is_none()
            && let Some(w) = &self.inner.parts.own_writes
        {
            w.wrote(child);
        }
    }

    /// Records a child the runtime deleted in the home cluster (see [`OwnWrites`]).
    pub(crate) fn deleted_child<T: Resource<DynamicType = ()>>(
        &self,
        namespace: Option<&str>,
        name: &str,
    ) {
        if self.remote().is_none()
            && let Some(w) = &self.inner.parts.own_writes
        {
            w.deleted::<T>(namespace, name);
        }
    }

    /// The client of the cluster the object lives in, whatever cluster the context is scoped to.
    pub(crate) fn home_client(&self) -> &Client {
        &self.inner.home
    }

    /// The object being reconciled, as the runtime's watch last saw it (or as the runtime's own
    /// last write returned it). The watch copy has `metadata.managedFields` cleared to save
    /// memory; read the object from the API if a provisioner needs them.
    pub fn object(&self) -> &Arc<K> {
        &self.inner.object
    }

    /// The controller's provider config as it was when the reconcile started (see
    /// [`Controller::config`](crate::runtime::Controller::config)), or `None` when the
    /// controller has none or `C` is not its type. Provision reconciles run only while the config
    /// exists; a deprovision reconcile runs without it too, so deprovision steps handle `None`.
    pub fn config<C: Send + Sync + 'static>(&self) -> Option<Arc<C>> {
        self.inner.config.clone()?.downcast::<C>().ok()
    }

    /// The client for the current cluster scope.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The same context against another cluster.
    pub fn with_client(&self, client: Client) -> Self {
        Self {
            inner: self.inner.clone(),
            client: Arc::new(client),
            remote: self.remote.clone(),
            attached: self.attached.clone(),
        }
    }

    /// The same context in a step that owns condition `type_`.
    pub(crate) fn with_attached(&self, type_: Arc<str>) -> Self {
        Self {
            attached: Some(type_),
            ..self.clone()
        }
    }

    /// The condition type the running step owns
    /// ([`Step::attached_condition`](super::Step::attached_condition)), if it owns one.
    pub fn attached_condition_type(&self) -> Option<&str> {
        self.attached.as_deref()
    }

    /// The same context inside remote cluster `scope`, reached through `client`.
    pub(crate) fn in_remote(&self, client: Client, scope: RemoteScope) -> Self {
        Self {
            inner: self.inner.clone(),
            client: Arc::new(client),
            remote: Some(Arc::new(scope)),
            attached: self.attached.clone(),
        }
    }

    /// The remote cluster this context's client talks to (`None`: the runtime's own cluster).
    pub fn remote(&self) -> Option<&RemoteScope> {
        self.remote.as_deref()
    }

    /// The actorcile-managed status of the object when the reconcile started.
    pub fn status(&self) -> &ResourceStatus {
        &self.inner.status
    }

    /// The field manager used for server-side apply.
    pub fn field_manager(&self) -> &str {
        &self.inner.parts.field_manager
    }

    /// The operator's names ([`RuntimeBuilder`](crate::runtime::RuntimeBuilder)'s), of which the
    /// labels and annotations the runtime writes are made.
    pub fn names(&self) -> &crate::names::OperatorNames {
        &self.inner.parts.keys.names
    }
}

impl<K: Resource<DynamicType = ()>> Context<K> {
    /// Put the object's mark on `child` (see [`ChildRules`](super::ChildRules)): a controller
    /// owner reference, so Kubernetes garbage-collects `child` with the object, and the object's
    /// shard label when replicas watch only their shards' children
    /// ([`Sharding::owner_label_key`](crate::sharding::Sharding::owner_label_key)). Where an
    /// owner reference would not be honoured, the annotation
    /// [`owner_annotation`](crate::names::OperatorNames::owner_annotation) with the object's uid instead: inside a
    /// remote (an owner reference across clusters names an object the remote's garbage
    /// collector cannot find, and it would delete the child), and for a namespaced object's
    /// children in other namespaces or cluster-scoped (the garbage collector deletes, or
    /// ignores, children whose owner reference crosses namespaces).
    pub(crate) fn own<T: Resource>(&self, child: &mut T) {
        let fits = super::ownership::owner_reference_fits::<K, T>(
            self.remote().is_some(),
            self.object().meta().namespace.as_deref(),
            child.meta().namespace.as_deref(),
        );
        if !fits {
            if let Some(uid) = &self.object().meta().uid {
                child
                    .meta_mut()
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(self.inner.parts.keys.owner().to_string(), uid.clone());
            }
            return;
        }
        if let Some(owner) = self.object().controller_owner_ref(&()) {
            let refs = child
                .meta_mut()
                .owner_references
                .get_or_insert_with(Vec::new);
            if !refs.iter().any(|r| r.uid == owner.uid) {
                refs.push(owner);
            }
            if let Some((key, value)) = &self.inner.child_label {
                child
                    .meta_mut()
                    .labels
                    .get_or_insert_with(Default::default)
                    .insert(key.to_string(), value.clone());
            }
        }
    }

    /// Who controls `existing`, an object under a child's name, as seen by the object. Inside a
    /// remote, a child without any mark that the runtime's field manager applied counts as the
    /// object's: children written into remotes before the mark existed carry none, and a remote
    /// is reached with the credentials its registration gave, not the operator's own.
    pub(crate) fn control_of<T: Resource>(&self, existing: &T) -> super::ownership::Control {
        use super::ownership::{Control, control};
        let meta = existing.meta();
        match control(
            meta,
            &self.inner.parts.keys,
            self.object().meta().uid.as_deref(),
        ) {
            Control::Nobody
                if self.remote().is_some()
                    && meta.managed_fields.iter().flatten().any(|f| {
                        f.manager.as_deref() == Some(self.field_manager())
                            && f.operation.as_deref() == Some("Apply")
                    }) =>
            {
                Control::Ours
            }
            c => c,
        }
    }

    /// A reference to the object, for Events and owner references.
    pub fn target(&self) -> Target {
        Target::of(self.object().as_ref())
    }

    /// Publish a Kubernetes Event about the object (best effort: failures are logged, not
    /// returned). It takes from the object's Event budget, as the runtime's own Events do (25 at
    /// once, then one every 5 minutes: a spent budget publishes nothing), and its note is cut to
    /// 1 KiB with quoted text and control characters masked (a note that embeds an error's text
    /// would otherwise carry the values it quotes).
    pub async fn event(&self, type_: EventType, reason: &str, action: &str, note: Option<String>) {
        let Some(recorder) = &self.inner.parts.recorder else {
            return;
        };
        let reference = self.object().object_ref(&());
        if !recorder.admit(&reference) {
            tracing::debug!(object = %self.target(), reason, "Event budget spent; not published");
            return;
        }
        let ev = Event {
            type_,
            reason: reason.to_string(),
            note: note.map(|n| crate::event_recorder::sanitise(&n)),
            action: action.to_string(),
            secondary: None,
        };
        if let Err(e) = recorder.publish(&ev, &reference).await {
            tracing::debug!(error = %e, "could not publish event");
        }
    }

    /// Proceed only if `target` is Ready.
    ///
    /// Returns `None` when the target is Ready, so the caller continues; otherwise the outcome
    /// to return, an [`Outcome::Waiting`] on the target (this resource's actor is woken by a
    /// message the moment the target changes) whose reason says why, naming the target:
    ///
    /// | target | reason | phase |
    /// |---|---|---|
    /// | exists, not Ready | `DependencyNotReady` | Progressing |
    /// | being deleted | `DependencyDeleting` | Progressing |
    /// | does not exist (it may be created later) | `DependencyNotFound` | Progressing |
    /// | has failed ([`Readiness::Failed`]) | `DependencyFailed` | Failed |
    ///
    /// The target may be of a kind this runtime manages (Ready when its own actor says so) or
    /// of any other kind (Ready by its status: see [`readiness_of`](crate::references::readiness_of);
    /// [`Context::require_ready_when`] takes a predicate instead). For a kind the runtime does not
    /// manage, one watch of that kind, shared by every waiter, wakes the waiters when the
    /// object changes; it lists and watches the kind in every namespace, so the operator needs
    /// `list` and `watch` on it cluster-wide: declare them on the step
    /// ([`Step::needs`](super::Step::needs) with
    /// [`rbac::rule_for`](crate::rbac::rule_for)`(&["get", "list", "watch"])`), so the
    /// ClusterRole and the preflight include them.
    ///
    /// Use [`Context::readiness`] to treat a case differently, e.g. a missing target as
    /// Terminal.
    ///
    /// ```no_run
    /// # use actorcile::prelude::*;
    /// # async fn f<K: kube::Resource<DynamicType = ()>>(cx: &Context<K>) -> Outcome {
    /// let db = Target::new("example.com/v1", "Database", Some("default"), "main");
    /// if let Some(wait) = cx.require_ready(&db).await {
    ///     return wait;
    /// }
    /// // ... the database is Ready here
    /// Outcome::Done
    /// # }
    /// ```
    pub async fn require_ready(&self, target: &Target) -> Option<Outcome> {
        let readiness = self.readiness(target).await;
        waiting_on(target, readiness)
    }

    /// [`Context::require_ready`] where `ready` decides whether an object of a kind this
    /// runtime does not manage is Ready. The predicate sees the object's metadata (without
    /// `managedFields` and annotations) and its `status`; deletion, absence and failure
    /// ([`readiness_of`](crate::references::readiness_of)) are decided as for `require_ready`.
    /// For a kind the runtime manages, the predicate is not used.
    ///
    /// ```no_run
    /// # use actorcile::prelude::*;
    /// # async fn f<K: kube::Resource<DynamicType = ()>>(cx: &Context<K>) -> Outcome {
    /// let deploy = Target::new("apps/v1", "Deployment", Some("default"), "web");
    /// let available = |d: &kube::api::DynamicObject| {
    ///     d.data["status"]["availableReplicas"].as_i64().unwrap_or(0) >= 2
    /// };
    /// if let Some(wait) = cx.require_ready_when(&deploy, available).await {
    ///     return wait;
    /// }
    /// Outcome::Done
    /// # }
    /// ```
    pub async fn require_ready_when(
        &self,
        target: &Target,
        ready: impl Fn(&kube::api::DynamicObject) -> bool + Send + Sync,
    ) -> Option<Outcome> {
        let readiness = match &self.inner.parts.references {
            Some(r) => r.readiness_when(&self.target(), target, &ready).await,
            None => Readiness::Missing,
        };
        waiting_on(target, readiness)
    }

    /// Whether `target` is Ready, not Ready, being deleted, failed or missing, registering this
    /// resource as a waiter when it is not Ready.
    ///
    /// Reconciles start while the runtime is still listing a kind's objects at start-up. Until
    /// that list is complete, a target of the kind that is not listed yet reads as not Ready,
    /// never as missing; once it is complete, a resource waiting on a target that does not
    /// exist is woken, and reads it as missing. (The first question about a kind the runtime
    /// does not manage starts its watch and waits for its first list, up to 10 seconds.)
    pub async fn readiness(&self, target: &Target) -> Readiness {
        match &self.inner.parts.references {
            Some(r) => r.readiness(&self.target(), target).await,
            None => Readiness::Missing,
        }
    }

    /// Record that this resource references `target`: the target's deletion waits until every
    /// referrer released it. Persisted on the target (an annotation), so it survives restarts;
    /// on a target of a kind this runtime does not manage also as a finalizer of this
    /// resource's own, which that kind's controller honours (see the guide's references
    /// chapter).
    ///
    /// Conflicting writes (other referrers changing the target at the same moment) are retried
    /// by the runtime;
    /// [`ReferenceError::Conflict`](crate::references::ReferenceError::Conflict) means they kept
    /// conflicting. A target being deleted refuses new references
    /// ([`ReferenceError::TargetDeleting`](crate::references::ReferenceError::TargetDeleting)).
    ///
    /// Every reference this resource holds is released automatically once its deprovision is
    /// done (when it is deleted): nothing to do by hand then. A resource that stops needing a
    /// target while it lives releases it with [`Context::release_reference`], or states the
    /// references it holds with [`Context::hold_references`] (which releases the others).
    pub async fn add_reference(&self, target: &Target) -> Result<(), StepError> {
        match &self.inner.parts.references {
            Some(r) => Ok(r.add_reference(&self.target(), target).await?),
            None => Err(StepError::NoReferenceApi),
        }
    }

    /// Make exactly the objects of `selection` named in `names` carry this resource's
    /// reference: the named ones get it ([`Context::add_reference`]), every other selected one
    /// that carries it is released. A name not in the selection is an error naming it
    /// ([`ReferenceError::TargetMissing`](crate::references::ReferenceError::TargetMissing)), and then nothing is written;
    /// a target being deleted refuses a new reference
    /// ([`ReferenceError::TargetDeleting`](crate::references::ReferenceError::TargetDeleting)). Every write is idempotent:
    /// return the error as a failed outcome and the next reconcile completes what this one did not.
    ///
    /// ```no_run
    /// # use actorcile::prelude::*;
    /// # use actorcile::references::Selection;
    /// # async fn f<K: kube::Resource<DynamicType = ()>>(cx: &Context<K>) -> Outcome {
    /// let groups = Selection::new("example.com/v1", "SecurityGroup", Some("default"), "app=web");
    /// if let Err(e) = cx.set_references(&groups, ["ssh", "https"]).await {
    ///     return Outcome::failed(Reason::new("SecurityGroupReferences", "cannot reference the security groups"), e);
    /// }
    /// Outcome::Done
    /// # }
    /// ```
    pub async fn set_references(
        &self,
        selection: &Selection,
        names: impl IntoIterator<Item = impl Into<String>>,
    ) -> Result<(), StepError> {
        let names = names.into_iter().map(Into::into).collect();
        match &self.inner.parts.references {
            Some(r) => Ok(r.set_references(&self.target(), selection, &names).await?),
            None => Err(StepError::NoReferenceApi),
        }
    }

    /// Hold references on exactly `targets` from this reconcile on: take the ones not held yet
    /// ([`Context::add_reference`]), and release every other one this resource holds, e.g.
    /// the target its spec named before it changed. State every reference on every reconcile (an
    /// empty list releases them all), including those [`Context::set_references`] took: use
    /// one or the other for a resource. What a resource holds is known from the targets'
    /// annotations (for kinds this runtime manages) and from the resource's own list of the
    /// targets of other kinds it holds, so a reference taken before a restart is released too.
    ///
    /// ```no_run
    /// # use actorcile::prelude::*;
    /// # async fn f<K: kube::Resource<DynamicType = ()>>(cx: &Context<K>, network: &str) -> Outcome {
    /// let net = Target::new("example.com/v1", "Network", Some("default"), network);
    /// if let Err(e) = cx.hold_references(&[net]).await {
    ///     return Outcome::failed(Reason::new("NetworkReference", "cannot reference the network"), e);
    /// }
    /// Outcome::Done
    /// # }
    /// ```
    pub async fn hold_references(&self, targets: &[Target]) -> Result<(), StepError> {
        match &self.inner.parts.references {
            Some(r) => Ok(r.hold_references(&self.target(), targets).await?),
            None => Err(StepError::NoReferenceApi),
        }
    }

    /// Release this resource's reference from every object of `selection` (the same as
    /// [`Context::set_references`] with no names).
    pub async fn clear_references(&self, selection: &Selection) -> Result<(), StepError> {
        self.set_references(selection, std::iter::empty::<String>())
            .await
    }

    /// Release a reference taken with [`Context::add_reference`]. Releasing one that was not
    /// taken is a no-op.
    pub async fn release_reference(&self, target: &Target) -> Result<(), StepError> {
        match &self.inner.parts.references {
            Some(r) => Ok(r.release_reference(&self.target(), target).await?),
            None => Err(StepError::NoReferenceApi),
        }
    }
}

/// The outcome of waiting on `target` with `readiness` (`None`: Ready, go on).
fn waiting_on(target: &Target, readiness: Readiness) -> Option<Outcome> {
    let (reason, message) = match readiness {
        Readiness::Ready => return None,
        Readiness::NotReady => (
            ReadyReason::DependencyNotReady,
            format!("waiting for {target} to become Ready"),
        ),
        Readiness::Deleting => (
            ReadyReason::DependencyDeleting,
            format!("{target} is being deleted"),
        ),
        Readiness::Missing => (
            ReadyReason::DependencyNotFound,
            format!("waiting for {target}, which does not exist"),
        ),
        Readiness::Failed => (
            ReadyReason::DependencyFailed,
            format!("{target} has failed; waiting for it to become Ready"),
        ),
    };
    Some(Outcome::Waiting {
        target: target.clone(),
        reason: Reason::new(reason.as_str(), message),
    })
}
