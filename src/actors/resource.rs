//! The resource actor: serves one managed object at a time, running its provisioner tree one
//! reconcile at a time.
//!
//! Passivation: an actor that has nothing to do for at least the policy's `idle_timeout` — no
//! reconcile due and no wake-up due sooner — hands its object back at once rather than idling (a live
//! ractor actor holds a task and its state). It first removes its route, so the feeder and the reference index
//! send anything new to the manager, then sends itself [`ResourceMsg::Passivate`]: what was
//! routed here before is handled first. Then it sends the object's [`PassiveState`] to the
//! manager ([`ManagerMsg::Passivated`]), which re-activates the object if anything came in
//! meanwhile (one run at a time holds: the object's next activation starts only after the
//! manager has its state back). The actor keeps nothing of the object and waits, idle, until
//! the manager gives it another activation ([`ResourceMsg::Adopt`]) or stops it. Its wake-up
//! tokens carry on across activations, so a timer armed for an earlier object that is delivered
//! late is stale to the next one.
//!
//! Deletion: when its object is gone from the API ([`ResourceMsg::Gone`]) the actor removes its
//! route and goes back to the manager idle the same way ([`ManagerMsg::Vacated`]), with nothing
//! to hand back: the manager forgets the object.

use std::sync::Arc;
use std::time::Duration;

use backon::ExponentialBackoff;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::TryAcquireError;
use tokio::time::Instant;
use tracing::Instrument;

use super::mailbox::Mailbox;
use super::{ManagedResource, Metrics, Shared, version_of, writes};
use crate::after_reconcile::{
    self, At, Backoff, Delays, Ended, OutcomeKey, StatusPlan, StatusWrite, Wake,
};
use crate::counters::ReconcileResult;
use crate::messages::{Activation, ManagerMsg, PassiveState, ResourceMsg, RunPermit};
use crate::provisioners::{Context, Outcome, Reason};
use crate::references::Target;
use crate::scheduling::PendingWakeUp;
use crate::scheduling::deadline as run_deadline;
use crate::status::{Phase, ReadyReason, ResourceStatus};

/// The actor behaviour; all per-object data is in [`ResourceState`].
pub(crate) struct ResourceActor<K: ManagedResource> {
    pub shared: Arc<Shared<K>>,
}

/// How the manager starts a resource actor.
pub(crate) struct ResourceArgs<K: ManagedResource> {
    /// The manager's mailbox, where the actor hands its object back when it passivates.
    pub manager: Mailbox<ManagerMsg<K>>,
    /// The object it serves first.
    pub activation: Activation<K>,
}

/// One object's actor state.
pub(crate) struct ResourceState<K: ManagedResource> {
    key: ObjectRef<K>,
    /// Newest version known (observed, or returned by our own write).
    object: Option<Arc<K>>,
    /// The newest version is one the kind's type cannot hold: what was read of it. Such an
    /// object is not reconciled; its status says why ([`ResourceActor::undecodable_pass`]).
    undecodable: Option<Arc<crate::lenient::Undecodable>>,
    /// Version the last reconcile ran on.
    last_run_version: Option<u64>,
    /// Versions our own writes produced: their watch echoes do not trigger a run.
    own_writes: Vec<u64>,
    /// Status fields the last reconcile's steps set, for its status write.
    status_fields: serde_json::Map<String, serde_json::Value>,
    /// A reconcile is due.
    dirty: bool,
    /// Since when a reconcile is due (for the due-to-start histogram).
    due_since: Option<Instant>,
    /// A `Run` self-message is queued.
    run_pending: bool,
    /// A reconcile found no free run slot and asked the timer task for one ([`ResourceMsg::Slot`]).
    queued: bool,
    wake: PendingWakeUp,
    /// The run slot the manager handed over for the first reconcile (dropped if no reconcile follows).
    permit: Option<RunPermit>,
    /// The route is removed and [`ResourceMsg::Passivate`] is on its way.
    passivating: bool,
    error_attempts: u32,
    /// Boxed: rarely set, and every live actor carries this state.
    error_backoff: Option<Box<ExponentialBackoff>>,
    /// The manager's mailbox ([`ManagerMsg::Passivated`] goes there).
    manager: Mailbox<ManagerMsg<K>>,
    /// The actor serves `key` (an activation); `false` once it passivated and handed it back.
    serving: bool,
    /// This object as a reference target (fixed for the activation).
    target: Arc<Target>,
    /// The parsed actorcile status of one object version.
    status_cache: Option<(Option<u64>, Arc<ResourceStatus>)>,
    /// The last reconcile's outcome key: the same outcome on the same version needs no status work.
    last_outcome: Option<OutcomeKey>,
    /// Readiness last reported to the reference index (`None`: not yet by this actor).
    was_ready: Option<bool>,
    /// The last provision reconcile's context, kept while a wake-up is pending.
    cx: Option<Context<K>>,
    /// The uid of the object whose deprovision this actor completed (its finalizer removed).
    /// Any later event of it that still shows the finalizer is stale (nothing can add one to
    /// an object being deleted): kube-apiserver can deliver a write made just before the
    /// removal after the removal's answer, at a higher version. Such an object is never
    /// deprovisioned again, and its actor does not passivate until it is gone.
    released: Option<String>,
    /// The uid of the object whose deprovision tree this actor ran to its end, while its
    /// finalizer's removal has not succeeded yet (the removal failed, or its answer was lost
    /// although it landed). The next reconcile retries the removal alone: the tree is not run
    /// again for one deletion. Such an actor does not passivate, so this outlives the
    /// activation only in a restarted process.
    deprovisioned: Option<String>,
}

impl<K: ManagedResource> ResourceState<K> {
    fn trigger_run(&mut self, myself: &ActorRef<ResourceMsg<K>>)
    where
        K: ManagedResource,
    {
        self.mark_due();
        if !self.run_pending {
            self.run_pending = true;
            let _ = myself.cast(ResourceMsg::Run);
        }
    }

    /// A reconcile is due (from now, unless it already was).
    fn mark_due(&mut self) {
        self.mark_due_since(Instant::now);
    }

    /// A reconcile is due since `since()` (read only if it was not due already).
    fn mark_due_since(&mut self, since: impl FnOnce() -> Instant) {
        if !self.dirty {
            self.dirty = true;
            self.due_since = Some(since());
        }
    }

    /// Whether a version we have not handled yet (and did not write ourselves).
    fn is_news(&self, version: Option<u64>) -> bool {
        super::is_news(self.last_run_version, &self.own_writes, version)
    }

    /// Keep the newer of the known and the given object. Of two with the same version, one we
    /// wrote ourselves stays: kube-apiserver answers the write that removes a deleting object's
    /// last finalizer with the object as removed but the version it had before. (Whatever a
    /// later event shows of an object whose finalizer we removed, it is never deprovisioned
    /// again: see `released`.)
    fn remember(&mut self, obj: Arc<K>)
    where
        K: ManagedResource,
    {
        self.keep_newer(obj, false);
    }

    /// [`remember`](Self::remember), `ours` when `obj` is the answer to our own write.
    fn keep_newer(&mut self, obj: Arc<K>, ours: bool)
    where
        K: ManagedResource,
    {
        let newer = match (
            self.object.as_deref().and_then(version_of),
            version_of(obj.as_ref()),
        ) {
            (Some(cur), Some(v)) => {
                v > cur || (v == cur && (ours || !self.own_writes.contains(&v)))
            }
            _ => true,
        };
        if newer {
            self.object = Some(obj);
        }
    }

    /// Keeps the answer to our own write, pruned as the cache is (`prune`).
    fn record_write(&mut self, mut obj: K, prune: bool)
    where
        K: ManagedResource,
    {
        if prune {
            crate::cache::prune(&mut obj);
        }
        if let Some(v) = version_of(&obj) {
            self.own_writes.push(v);
        }
        self.keep_newer(Arc::new(obj), true);
    }
}

impl<K: ManagedResource> ResourceActor<K> {
    fn schedule_wake(
        &self,
        myself: &ActorRef<ResourceMsg<K>>,
        st: &mut ResourceState<K>,
        delay: Duration,
    ) {
        let at = Instant::now() + crate::scheduling::bounded_delay(delay);
        if let Some(token) = st.wake.schedule(at) {
            self.shared
                .timers
                .arm(myself, at, ResourceMsg::Wake(token, None));
        }
    }

    /// The next delay of the object's error backoff (a failed reconcile, or a failed status write);
    /// a success resets it.
    fn next_error_backoff(&self, st: &mut ResourceState<K>) -> Duration {
        st.error_attempts = st.error_attempts.saturating_add(1);
        let seed = self.shared.policy.seed.map(|s| s ^ key_hash(&st.key));
        let policy = &self.shared.policy.error_backoff;
        let attempts = st.error_attempts;
        st.error_backoff
            .get_or_insert_with(|| Box::new(error_backoff(policy, seed, attempts)))
            .next()
            .unwrap_or(policy.max)
    }

    fn cancel_wake(&self, myself: &ActorRef<ResourceMsg<K>>, st: &mut ResourceState<K>) {
        if st.wake.cancel() {
            self.shared.timers.cancel(myself.get_id());
        }
    }

    /// Passivate if there is nothing to do for at least the idle timeout (see the module
    /// docs): no reconcile due, no wake-up due sooner.
    fn maybe_passivate(&self, myself: &ActorRef<ResourceMsg<K>>, st: &mut ResourceState<K>) {
        let Some(idle) = self.shared.policy.idle_timeout else {
            return;
        };
        if st.passivating
            || st.dirty
            || st.run_pending
            || st.released.is_some()
            || st.deprovisioned.is_some()
        {
            return;
        }
        st.permit = None;
        let wake_soon = st
            .wake
            .deadline()
            .is_some_and(|at| at.saturating_duration_since(Instant::now()) < idle);
        if wake_soon {
            return;
        }
        self.start_passivating(myself, st);
    }

    /// Remove the route (what comes next goes to the manager) and queue the hand-back behind
    /// what was routed here before.
    fn start_passivating(&self, myself: &ActorRef<ResourceMsg<K>>, st: &mut ResourceState<K>) {
        st.passivating = true;
        let id = myself.get_id();
        self.shared
            .routes
            .remove_if(&st.key, |_, a| a.get_id() == id);
        let _ = myself.cast(ResourceMsg::Passivate);
    }

    /// The state of a new activation of `activation.key`: inserts the actor's route, then reads
    /// the object (whatever the feeder stores after this read is routed here). `wake` is the
    /// actor's wake-up slot, kept across activations so that a timer armed for an earlier object
    /// never matches a token of this one.
    fn begin(
        &self,
        myself: &ActorRef<ResourceMsg<K>>,
        manager: Mailbox<ManagerMsg<K>>,
        activation: Activation<K>,
        wake: PendingWakeUp,
    ) -> ResourceState<K> {
        self.shared.metrics.actor_started();
        let Activation {
            key,
            passive,
            permit,
        } = activation;
        // The actor's own route, not the manager's: it must exist before the first pass can end
        // in a passivation that removes it.
        self.shared.routes.insert(key.clone(), myself.clone());
        let object = self.shared.store.get(&key);
        let undecodable = match object {
            None => self.shared.store.undecodable(&key),
            Some(_) => None,
        };
        let target = Arc::new(Target::new(
            K::api_version(&()),
            K::kind(&()),
            key.namespace.as_deref(),
            key.name.clone(),
        ));
        let mut st = ResourceState {
            key,
            object,
            undecodable,
            last_run_version: None,
            own_writes: Vec::new(),
            status_fields: serde_json::Map::new(),
            dirty: false,
            due_since: None,
            run_pending: false,
            queued: false,
            wake,
            permit,
            passivating: false,
            error_attempts: 0,
            error_backoff: None,
            manager,
            serving: true,
            target,
            status_cache: None,
            last_outcome: None,
            was_ready: None,
            cx: None,
            released: None,
            deprovisioned: None,
        };
        if passive.is_none() {
            self.shared.references.appeared(&st.target);
        }
        if let Some(p) = passive {
            if p.pending_run {
                st.mark_due();
            }
            st.last_run_version = p.last_run_version;
            st.own_writes = p.own_writes;
            st.error_attempts = p.error_attempts;
            if let Some(d) = p.wake_in {
                self.schedule_wake(myself, &mut st, d);
            }
        }
        st
    }

    /// An activation's first reconcile, if its object has news (or a reconcile was pending), then
    /// passivation if nothing is due soon. An object gone meanwhile vacates the actor.
    async fn first_pass(&self, myself: &ActorRef<ResourceMsg<K>>, st: &mut ResourceState<K>) {
        let version = match (&st.object, &st.undecodable) {
            (_, Some(u)) => crate::object_api::meta_version(&u.meta),
            (Some(obj), None) => version_of(obj.as_ref()),
            (None, None) => {
                self.vacate(myself, st);
                return;
            }
        };
        if st.dirty || st.is_news(version) {
            // The first pass runs right here, on the manager's run slot (no `Run` hop); what
            // arrives meanwhile coalesces into one follow-up run.
            st.mark_due();
            self.run_if_dirty(myself, st, None).await;
        }
        self.maybe_passivate(myself, st);
    }

    /// The object's shard is not held here any more ([`crate::sharding`]): drop what is due and
    /// hand the object back (the manager then forgets it), whatever the idle timeout.
    fn abandon(&self, myself: &ActorRef<ResourceMsg<K>>, st: &mut ResourceState<K>) {
        st.dirty = false;
        st.due_since = None;
        st.cx = None;
        st.last_outcome = None;
        st.permit = None;
        self.cancel_wake(myself, st);
        if !st.passivating {
            self.start_passivating(myself, st);
        }
    }

    /// Hand the object back to the manager ([`ResourceMsg::Passivate`]): its [`PassiveState`]
    /// goes in [`ManagerMsg::Passivated`], and the actor keeps nothing of it but its wake-up
    /// tokens, ready to adopt the next activation the manager gives it.
    fn hand_back(&self, myself: &ActorRef<ResourceMsg<K>>, st: &mut ResourceState<K>) {
        let state = PassiveState {
            last_run_version: st.last_run_version,
            own_writes: std::mem::take(&mut st.own_writes),
            error_attempts: st.error_attempts,
            wake_in: st
                .wake
                .deadline()
                .map(|at| at.saturating_duration_since(Instant::now())),
            pending_run: st.dirty || st.run_pending,
        };
        // The manager keeps the wake-up now (the actor's timer would reach the next object).
        self.let_go(myself, st);
        Metrics::inc(&self.shared.metrics.passivations);
        if !st
            .manager
            .send_back(ManagerMsg::Passivated(myself.clone(), state))
        {
            myself.stop(Some("the manager stopped".into()));
        }
    }

    /// The object is gone from the API: remove the route, keep nothing of the object, and hand
    /// the actor back to the manager idle ([`ManagerMsg::Vacated`]), ready to adopt the next
    /// activation. Stopping instead cost a spawn for the next activation and two supervision
    /// events through the manager's mailbox per deleted object. What was routed here before
    /// the route went is stale, and an idle actor ignores it: the manager looks at the store
    /// for an object re-created under the same name.
    fn vacate(&self, myself: &ActorRef<ResourceMsg<K>>, st: &mut ResourceState<K>) {
        let id = myself.get_id();
        self.shared
            .routes
            .remove_if(&st.key, |_, a| a.get_id() == id);
        self.let_go(myself, st);
        if !st.manager.send_back(ManagerMsg::Vacated(myself.clone())) {
            myself.stop(Some("the manager stopped".into()));
        }
    }

    /// Keep nothing of the object served (its wake-up is cancelled): the actor serves none now.
    fn let_go(&self, myself: &ActorRef<ResourceMsg<K>>, st: &mut ResourceState<K>) {
        self.cancel_wake(myself, st);
        st.serving = false;
        st.dirty = false;
        st.object = None;
        st.undecodable = None;
        st.cx = None;
        st.status_cache = None;
        st.last_outcome = None;
        st.error_backoff = None;
        st.permit = None;
        Metrics::dec(&self.shared.metrics.live_actors);
    }

    fn context(
        &self,
        obj: Arc<K>,
        status: Arc<ResourceStatus>,
        config: Option<Arc<dyn std::any::Any + Send + Sync>>,
    ) -> Context<K> {
        let client = self.shared.client_for(&obj).clone();
        let child_label = self
            .shared
            .shards
            .as_ref()
            .and_then(|s| s.child_label_of(&obj));
        Context::with_parts(
            obj,
            client,
            status,
            self.shared.parts.clone(),
            config,
            child_label,
        )
    }

    /// What the reconcile's steps wrote to the object: their versions are the reconcile's own writes,
    /// and the newest is where the runtime's status write builds on. `true` if a step met a
    /// write by someone else (the object runs again).
    fn take_written(st: &mut ResourceState<K>, cx: &Context<K>) -> bool {
        let written = cx.take_written();
        st.own_writes.extend(written.versions);
        st.status_fields = written.status_fields;
        if let Some(latest) = written.latest {
            st.remember(latest);
        }
        written.saw_others
    }

    /// Run a reconcile if one is due, on `slot` (delivered with the message), the slot the manager
    /// handed over for the first reconcile, or a free one. With none free, the reconcile stays due and the
    /// timer task is asked for a slot: the actor does not wait in its handler, where it could
    /// take no other message.
    async fn run_if_dirty(
        &self,
        myself: &ActorRef<ResourceMsg<K>>,
        st: &mut ResourceState<K>,
        slot: Option<RunPermit>,
    ) {
        if !st.dirty {
            return;
        }
        let slot = match slot.or_else(|| st.permit.take()) {
            Some(slot) => slot,
            None => match self.shared.runs.try_acquire() {
                Ok(slot) => slot,
                Err(TryAcquireError::NoPermits) => {
                    if !st.queued {
                        st.queued = true;
                        self.shared.timers.queue(myself, ResourceMsg::Slot(None));
                    }
                    return;
                }
                Err(TryAcquireError::Closed) => return, // the runtime is shutting down
            },
        };
        // With sharding: only while this replica holds the object's shard (see `fenced`).
        let mut fence = None;
        let shard = match (&self.shared.shards, &st.undecodable, &st.object) {
            (Some(scope), Some(u), _) => Some((scope, Some(scope.shard_of_undecodable(&u.meta)))),
            (Some(scope), None, Some(obj)) => Some((scope, scope.runnable_shard(obj))),
            _ => None,
        };
        if let Some((scope, shard)) = shard {
            match shard.and_then(|shard| scope.shards.enter(shard)) {
                Some(guard) => fence = Some(guard),
                None => {
                    drop(slot);
                    self.abandon(myself, st);
                    return;
                }
            }
        }
        st.dirty = false;
        self.cancel_wake(myself, st);
        let started = Instant::now();
        if let Some(due) = st.due_since.take() {
            self.shared
                .kind_metrics
                .due_to_start
                .observe(started.saturating_duration_since(due));
        }
        let span = tracing::info_span!(
            "reconcile",
            kind = %self.shared.kind_metrics.kind,
            namespace = st.key.namespace.as_deref().unwrap_or(""),
            name = %st.key.name,
            generation = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        if !span.is_disabled()
            && let Some(g) = st.object.as_ref().and_then(|o| o.meta().generation)
        {
            span.record("generation", g);
        }
        // Boxed: the pass's state machine is large, and inline it would make every idle
        // actor's task that large.
        let ran = {
            let mut pass = Box::pin(self.run_pass(myself, st, slot)).instrument(span.clone());
            match fence.as_mut() {
                None => Some(pass.await),
                // The shard is lost mid-pass: the pass is dropped where it is (its writes are
                // refused from the loss on, by the shard's fenced client). The fence is also
                // checked before every poll of the pass, by the clock: a replica that continues
                // after a pause past its renew deadline (or starved of CPU as long) runs no more
                // of the pass's code, outside Kubernetes included, before its keeper has caught up.
                Some(guard) => {
                    let held = guard.check();
                    let fenced = std::future::poll_fn(|cx| {
                        if !held.holds() {
                            return std::task::Poll::Ready(None);
                        }
                        std::future::Future::poll(std::pin::Pin::new(&mut pass), cx).map(Some)
                    });
                    tokio::select! {
                        biased;
                        _ = guard.lost() => None,
                        result = fenced => result,
                    }
                }
            }
        };
        drop(fence);
        let Some(result) = ran else {
            tracing::info!(object = %st.key, "shard lost: reconcile abandoned");
            self.abandon(myself, st);
            return;
        };
        if let Some(result) = result {
            span.record("outcome", result.as_str());
            self.shared.kind_metrics.ran(result, started.elapsed());
        }
    }

    /// The object's actorcile status, parsed once per object version.
    fn status_of(st: &mut ResourceState<K>, obj: &K, v: Option<u64>) -> Arc<ResourceStatus> {
        match &st.status_cache {
            Some((cv, s)) if v.is_some() && *cv == v => s.clone(),
            _ => {
                let s = Arc::new(ResourceStatus::of(obj));
                st.status_cache = Some((v, s.clone()));
                s
            }
        }
    }

    /// One provision or deprovision reconcile over the newest known object.
    ///
    /// The hot path (a provision reconcile whose status does not change, e.g. every reconcile of a yield
    /// loop) makes no API request and allocates little; the cold parts (deletion, finalizer, status
    /// write) are boxed so they do not bloat the reconcile's future.
    async fn run_pass(
        &self,
        myself: &ActorRef<ResourceMsg<K>>,
        st: &mut ResourceState<K>,
        _slot: RunPermit,
    ) -> Option<ReconcileResult> {
        let shared = &self.shared;
        if let Some(u) = st.undecodable.clone() {
            return Box::pin(self.undecodable_pass(st, u)).await;
        }
        let mut obj = st.object.clone()?;
        if crate::triggers::is_ignored(obj.meta()) {
            // The operator's brake: no pass, no write, until the annotation goes.
            st.last_run_version = version_of(obj.as_ref());
            st.own_writes.clear();
            Metrics::inc(&shared.metrics.ignored);
            return None;
        }
        let deleting = obj.meta().deletion_timestamp.is_some();
        let has_finalizer = obj.finalizers().iter().any(|f| f == &shared.finalizer);
        // Parsed once per pass: on a yield loop's pass the string is cold memory.
        let mut version = version_of(obj.as_ref());
        st.last_run_version = version;
        st.own_writes.clear();
        let released = || st.released.is_some() && st.released == obj.meta().uid;
        if deleting && (!has_finalizer || released()) {
            // Never provisioned by us, or already cleaned up: nothing of ours to undo.
            return None;
        }
        let _in_flight = shared.metrics.run_started(deleting);
        let mut status = Self::status_of(st, obj.as_ref(), version);
        let generation = obj.meta().generation;
        // The provider config as the pass starts (`None` inside: the controller has one, and
        // it does not exist).
        let config = shared.config.as_ref().map(|c| c.current());
        let mut saw_others = false;

        let Pass { outcome, desired } = if deleting {
            match Box::pin(self.deletion_pass(st, &obj, &status, config.flatten())).await {
                Some(pass) => pass,
                // deprovisioned; the object disappears and the feeder reports it
                None => return Some(ReconcileResult::Done),
            }
        } else {
            let mut pre_failure = None;
            let add_finalizer = shared.use_finalizer && !has_finalizer;
            let label = shared
                .shards
                .as_ref()
                .and_then(|s| s.missing_label(obj.as_ref()));
            if add_finalizer || label.is_some() {
                let label = label.as_ref().map(|(k, v)| (&**k, v.as_str()));
                match Box::pin(writes::claim(shared, obj.as_ref(), add_finalizer, label)).await {
                    Ok(o) => {
                        st.record_write(o, shared.prune_cache);
                        obj = st.object.clone().unwrap_or(obj);
                        version = version_of(obj.as_ref());
                    }
                    Err(e) => {
                        pre_failure = Some(Outcome::failed(
                            Reason::new(
                                "FinalizerAddFailed",
                                "could not add the finalizer (or the shard label)",
                            ),
                            e,
                        ));
                    }
                }
            }
            let outcome = match (pre_failure, config) {
                (Some(o), _) => o,
                (None, Some(None)) => Outcome::UserActionRequired(Reason::new(
                    ReadyReason::ConfigMissing.as_str(),
                    match shared
                        .config
                        .as_ref()
                        .map(|c| (c.describe(), c.unreadable()))
                    {
                        Some((config, Some(field))) => format!(
                            "the provider config {config} cannot be read: the value at `{field}` does not fit its type; provisioning resumes when it can"
                        ),
                        config => format!(
                            "the provider config {} does not exist; provisioning resumes when it does",
                            config.map_or("", |(c, _)| c)
                        ),
                    },
                )),
                (None, config) => {
                    // A yield loop runs on the same object and status pass after pass: reuse
                    // the context (building one clones the client and three Arcs). A config
                    // change re-runs every object with a new context.
                    let config = config.flatten();
                    let cx = st
                        .cx
                        .take()
                        .filter(|cx| cx.has_parts(&obj, &status) && cx.has_config(&config))
                        .unwrap_or_else(|| self.context(obj.clone(), status.clone(), config));
                    let outcome = run_deadline::within(
                        shared.policy.reconcile_timeout,
                        shared.tree.provision(&cx),
                    )
                    .await;
                    saw_others = Self::take_written(st, &cx);
                    st.cx = Some(cx);
                    outcome
                }
            };
            Pass {
                outcome,
                desired: None,
            }
        };

        // The steps' own writes (conditions, locks, finalizers) are the object now: the status
        // write builds on them.
        if let Some(latest) = st.object.clone()
            && !Arc::ptr_eq(&latest, &obj)
        {
            obj = latest;
            version = version_of(obj.as_ref());
            status = Self::status_of(st, obj.as_ref(), version);
        }

        if let Outcome::Failed { reason, errors } = &outcome {
            for e in errors {
                tracing::warn!(object = %st.target, reason = %reason, error = %e, "provisioning failed");
            }
        }

        // The status this reconcile leaves, and what follows it: decided in `after_reconcile`,
        // carried out here. The steps' status fields count only where the status does not hold
        // them yet.
        let mut fields = std::mem::take(&mut st.status_fields);
        if crate::status::holds_fields(obj.as_ref(), &fields) {
            fields.clear();
        }
        let at = At {
            generation,
            deleting,
            version,
        };
        let plan = after_reconcile::plan_status(
            st.last_outcome.as_ref(),
            &outcome,
            at,
            !fields.is_empty(),
            &status,
            desired,
            shared.write_status,
        );
        let ready = plan.ready();
        let write = match &plan {
            StatusPlan::Write { desired } => {
                Box::pin(self.write_status(st, &obj, &status, desired, &fields, &outcome)).await
            }
            StatusPlan::Unchanged | StatusPlan::Leave { .. } => StatusWrite::Written,
        };
        let next = after_reconcile::after_write(
            Ended {
                outcome: &outcome,
                ready,
                write,
                announced: st.was_ready,
                saw_others,
            },
            Delays {
                yield_delay: shared.policy.yield_delay,
                dependency_poll: shared.policy.dependency_poll,
                conflict_retry: shared
                    .policy
                    .error_backoff
                    .min
                    .max(Duration::from_millis(10)),
            },
        );
        if let Some(ready) = next.announce {
            // Ready is of the generation this reconcile reconciled: not recorded over a newer
            // one cached meanwhile (its own reconcile follows, and says so).
            let recorded = if ready {
                shared.references.mark_ready_at(&st.target, generation)
            } else {
                shared.references.mark_ready(&st.target, false);
                true
            };
            if recorded {
                st.was_ready = Some(ready);
            }
        }
        // Keyed on the version the reconcile ended with (its own status write, if any).
        match next.remember {
            Some(true) => {
                let end_version = st.object.as_deref().and_then(version_of);
                st.last_outcome = Some(OutcomeKey::of(&outcome, generation, deleting, end_version));
            }
            Some(false) => st.last_outcome = None,
            None => {}
        }
        if let Some(retry) = next.retry {
            self.schedule_wake(myself, st, retry);
        }
        match next.backoff {
            Backoff::Grow => {
                let retry = self.next_error_backoff(st);
                self.schedule_wake(myself, st, retry);
            }
            Backoff::Reset => {
                st.error_backoff = None;
                st.error_attempts = 0;
            }
            Backoff::Keep => {}
        }
        let wake = match next.wake {
            Some(Wake::After(d)) => Some(d),
            Some(Wake::Poll) => {
                let seed = shared
                    .policy
                    .seed
                    .map(|s| s ^ key_hash(&st.key) ^ st.last_run_version.unwrap_or(0));
                shared
                    .config
                    .as_ref()
                    .and_then(|c| c.poll_interval())
                    .or(shared.policy.poll_interval)
                    .map(|p| jitter(p, shared.policy.poll_jitter, seed))
            }
            None => None,
        };
        if let Some(d) = wake {
            self.schedule_wake(myself, st, d);
        }
        if next.run_again {
            // A step's write met someone else's: run again on what they wrote.
            st.trigger_run(myself);
        }
        if st.wake.deadline().is_none() {
            st.cx = None; // nothing due soon: an idle actor keeps no context
        }
        Some(ReconcileResult::of(&outcome))
    }
}

impl<K: ManagedResource> ResourceActor<K> {
    /// A deprovision reconcile: `None` once deprovisioned and the finalizer is gone.
    async fn deletion_pass(
        &self,
        st: &mut ResourceState<K>,
        obj: &Arc<K>,
        status: &Arc<ResourceStatus>,
        config: Option<Arc<dyn std::any::Any + Send + Sync>>,
    ) -> Option<Pass> {
        let shared = &self.shared;
        let target = st.target.clone();
        let generation = obj.meta().generation;
        if st.deprovisioned.is_some() && st.deprovisioned == obj.meta().uid {
            // The tree ran to its end for this deletion; only the finalizer is left to remove.
            return self
                .release(st, obj.clone(), status.clone(), generation)
                .await;
        }
        if let Some(blocked) = shared.references.deletion_blocked(&target, obj.as_ref()) {
            let desired =
                status.while_deprovisioning(blocked.reason, blocked.message.clone(), generation);
            if desired != **status {
                // What this object holds may now be blocked differently (e.g. a cycle
                // closed): let those targets re-check. Only on change, so it settles.
                shared.references.notify_held(&target);
            }
            return Some(Pass {
                outcome: Outcome::Waiting {
                    target: (*target).clone(),
                    reason: Reason::new("InUse", blocked.message),
                },
                desired: Some(desired),
            });
        }
        let cx = self.context(obj.clone(), status.clone(), config);
        let outcome = run_deadline::within(
            shared.policy.reconcile_timeout,
            shared.tree.deprovision(&cx),
        )
        .await;
        if Self::take_written(st, &cx) {
            st.mark_due(); // a step's write met someone else's: run again on theirs
        }
        // The steps' own writes (conditions, their finalizers) are the object now; its status
        // is parsed again only if they wrote.
        let (obj, status) = match st.object.clone() {
            Some(latest) if !Arc::ptr_eq(&latest, obj) => {
                let status = Arc::new(ResourceStatus::of(latest.as_ref()));
                (latest, status)
            }
            _ => (obj.clone(), status.clone()),
        };
        if !outcome.is_done() {
            let desired = status.after_deprovision(&outcome, generation);
            return Some(Pass {
                outcome,
                desired: Some(desired),
            });
        }
        st.deprovisioned = obj.meta().uid.clone();
        self.release(st, obj, status, generation).await
    }

    /// After a deprovision tree that ran to its end: the finalizer's removal, then the
    /// references' release. `None` once the finalizer is gone.
    async fn release(
        &self,
        st: &mut ResourceState<K>,
        obj: Arc<K>,
        status: Arc<ResourceStatus>,
        generation: Option<i64>,
    ) -> Option<Pass> {
        let shared = &self.shared;
        let target = st.target.clone();
        // The finalizer goes first, the references after: a target this object referenced can
        // only proceed once this object is gone (when ours was its last finalizer), so the API
        // never shows a referenced object vanish before its referrers. A crash in between
        // leaves references of an object that no longer exists, which block nothing.
        // Other finalizers will hold the object once ours is gone: its status says it is
        // deprovisioned, not what it said while it lived. (With ours the last, the object goes
        // at once, and nothing needs saying.)
        let mut obj = obj;
        let others: Vec<&String> = obj
            .finalizers()
            .iter()
            .filter(|f| **f != shared.finalizer)
            .collect();
        if shared.write_status && !others.is_empty() {
            let message = format!(
                "deprovisioned; waiting for the other finalizers: {}",
                others
                    .iter()
                    .map(|f| f.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            let desired =
                status.while_deprovisioning(ReadyReason::Deprovisioned, message, generation);
            if desired != *status {
                match writes::patch_status(shared, obj.as_ref(), &desired, &Default::default())
                    .await
                {
                    Ok(o) => {
                        st.record_write(o, shared.prune_cache);
                        if let Some(latest) = st.object.clone() {
                            obj = latest;
                        }
                    }
                    // Not worth holding the finalizer for: the deletion goes on, and the
                    // status says Deprovisioning meanwhile.
                    Err(e) => {
                        tracing::debug!(object = %target, error = %e, "could not write the deprovisioned status")
                    }
                }
            }
        }
        let held = shared.references.take_held(&target);
        match writes::remove_finalizer(shared, obj.as_ref()).await {
            Ok(left) => {
                st.released = obj.meta().uid.clone();
                st.deprovisioned = None;
                shared
                    .references
                    .release_all(
                        &target,
                        held,
                        shared.policy.write_timeout,
                        &shared.metrics.write_timeouts,
                    )
                    .await;
                writes::publish_released(shared, obj.as_ref()).await;
                // Remember the object without our finalizer (and its version as our own write),
                // so no later event or notification can make a pass deprovision it again.
                match left {
                    Some(o) => st.record_write(o, shared.prune_cache),
                    None => st.object = None,
                }
                st.error_backoff = None;
                st.error_attempts = 0;
                None
            }
            Err(e) => {
                shared.references.restore_held(&target, held);
                Some(Pass {
                    outcome: Outcome::failed(
                        Reason::new("FinalizerRemovalFailed", "could not remove the finalizer"),
                        e,
                    ),
                    desired: Some(status.while_deprovisioning(
                        ReadyReason::Errored,
                        "retrying finalizer removal",
                        generation,
                    )),
                })
            }
        }
    }

    /// The pass of an object that the kind's type cannot hold: no provisioner runs (they need
    /// the spec), and its status says why: phase Failed, Ready `False` with reason
    /// `Undecodable` and a message naming the field (never its value), written when it is not
    /// already so, with a Warning Event on the transition. Deleting, it keeps its finalizer and
    /// says so: deprovisioning needs the spec, and removing the finalizer without it would
    /// abandon what the object provisioned. It stays a referrer all along (what it holds stays
    /// held). The object's next change runs it again: a decodable one as usual.
    async fn undecodable_pass(
        &self,
        st: &mut ResourceState<K>,
        u: Arc<crate::lenient::Undecodable>,
    ) -> Option<ReconcileResult> {
        let shared = &self.shared;
        st.last_run_version = crate::object_api::meta_version(&u.meta);
        st.own_writes.clear();
        st.cx = None;
        st.last_outcome = None;
        if crate::triggers::is_ignored(&u.meta) {
            Metrics::inc(&shared.metrics.ignored);
            return None;
        }
        let deleting = u.meta.deletion_timestamp.is_some();
        let ours = u
            .meta
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == &shared.finalizer);
        if deleting && !ours {
            return None; // never provisioned by us: nothing of ours to undo
        }
        if st.was_ready != Some(false) {
            shared.references.mark_ready(&st.target, false);
            shared.store.set_ready(&st.key, false);
            st.was_ready = Some(false);
        }
        let mut message = u.message();
        if deleting {
            message.push_str(&format!(
                "; its deletion waits: deprovisioning needs the object's spec (change the object to one the operator can read, or remove the finalizer {} by hand to abandon what it provisioned)",
                shared.finalizer
            ));
        }
        let current = u.status.clone().unwrap_or_default();
        let desired = current.with_ready(
            Phase::Failed,
            false,
            ReadyReason::Undecodable,
            message.clone(),
            u.meta.generation,
        );
        let transition =
            current.ready().map(|c| c.reason.as_str()) != Some(ReadyReason::Undecodable.as_str());
        if shared.write_status && desired != current {
            match writes::patch_undecodable_status(shared, &u, &desired).await {
                Ok(written) => {
                    if let Some(v) = version_of(&written) {
                        st.own_writes.push(v);
                    }
                }
                Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
                    // Changed (its event runs it again) or gone.
                    return Some(ReconcileResult::Terminal);
                }
                Err(e) => {
                    tracing::warn!(object = %st.target, error = %e, "could not write the status of an object the operator cannot read");
                }
            }
        }
        if transition {
            writes::publish_undecodable(shared, &u, message).await;
        }
        Some(ReconcileResult::Terminal)
    }

    /// Patch the status subresource to `desired`; on a reason change, publish an Event (and
    /// a Warning Event when the outcome's reason code was invalid and the runtime's stood in).
    async fn write_status(
        &self,
        st: &mut ResourceState<K>,
        obj: &Arc<K>,
        status: &ResourceStatus,
        desired: &ResourceStatus,
        fields: &serde_json::Map<String, serde_json::Value>,
        outcome: &Outcome,
    ) -> StatusWrite {
        let shared = &self.shared;
        let transition = desired.ready().map(|c| &c.reason) != status.ready().map(|c| &c.reason);
        match writes::patch_status(shared, obj, desired, fields).await {
            Ok(o) => {
                if !shared.status_checks.kept(desired, &o) {
                    writes::publish_status_pruned(shared, &o).await;
                }
                if !crate::status::holds_fields(&o, fields) {
                    let names: Vec<&str> = fields.keys().map(String::as_str).collect();
                    tracing::warn!(object = %st.target, fields = ?names, "the API server dropped status fields a step set: declare them in the CRD's status schema");
                }
                st.record_write(o, shared.prune_cache);
            }
            // The object is gone (nothing to write), or the kind has no status subresource.
            Err(kube::Error::Api(s)) if s.code == 404 => {
                if shared.status_checks.served::<K>(&shared.client).await {
                    return StatusWrite::Written;
                }
                writes::publish_status_not_served(shared, obj.as_ref()).await;
                return StatusWrite::Failed;
            }
            // Someone else wrote the object since this pass read it: its watch event runs the
            // object again, and that pass writes on what they wrote instead of over it.
            Err(kube::Error::Api(s)) if s.code == 409 => {
                tracing::debug!(object = %st.target, "status write conflicted; running again");
                Metrics::inc(&shared.metrics.status_conflicts);
                return StatusWrite::Conflicted;
            }
            // Invalid: a validation rule or the schema refuses it. Writing it again unchanged
            // would be refused again, so it backs off (as any failed write) and says why.
            Err(kube::Error::Api(s)) if s.code == 422 => {
                Metrics::inc(&shared.metrics.status_rejected);
                writes::publish_status_rejected(shared, obj.as_ref(), &s.message).await;
                return StatusWrite::Failed;
            }
            Err(e) => {
                tracing::warn!(object = %st.target, error = %e, "status write failed; retrying");
                return StatusWrite::Failed;
            }
        }
        if transition {
            let reason = desired.ready().map_or("", |c| c.reason.as_str());
            if let Some(r) = outcome.reason().filter(|r| !r.has_valid_code()) {
                writes::publish_invalid_reason(shared, obj.as_ref(), r.code(), reason).await;
            }
            let message = desired.ready().map(|c| c.message.as_str());
            writes::publish_transition(shared, obj.as_ref(), outcome, reason, message).await;
        }
        StatusWrite::Written
    }
}

/// What a reconcile produced, and the status it computed on the way (deletion computes its own).
struct Pass {
    outcome: Outcome,
    desired: Option<ResourceStatus>,
}

/// An object's error backoff after `attempts` failures (the one now included): a fresh
/// sequence, or, after a passivation (which keeps only the count), one resumed where the
/// object's backoff was rather than at its start. 64 doublings are past any `max`.
pub(crate) fn error_backoff(
    policy: &crate::policy::BackoffPolicy,
    seed: Option<u64>,
    attempts: u32,
) -> ExponentialBackoff {
    let mut sequence = policy.sequence(seed);
    for _ in 1..attempts.min(64) {
        sequence.next();
    }
    sequence
}

pub(crate) fn key_hash<K>(key: &ObjectRef<K>) -> u64
where
    K: kube::Resource,
    K::DynamicType: std::hash::Hash + Eq,
{
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    BuildHasherDefault::<DefaultHasher>::default().hash_one(key)
}

/// `d` stretched by up to `fraction`; reproducible when seeded (the policy's `seed`).
fn jitter(d: Duration, fraction: f64, seed: Option<u64>) -> Duration {
    if fraction <= 0.0 {
        return d;
    }
    let r = match seed {
        Some(s) => fastrand::Rng::with_seed(s).f64(),
        None => fastrand::f64(),
    };
    Duration::try_from_secs_f64(d.as_secs_f64() * (1.0 + r * fraction)).unwrap_or(d)
}

impl<K: ManagedResource> Actor for ResourceActor<K> {
    type Msg = ResourceMsg<K>;
    type State = ResourceState<K>;
    type Arguments = ResourceArgs<K>;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Metrics::inc(&self.shared.metrics.spawns);
        Ok(self.begin(
            &myself,
            args.manager,
            args.activation,
            PendingWakeUp::default(),
        ))
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        self.first_pass(&myself, st).await;
        Ok(())
    }

    async fn post_stop(
        &self,
        myself: ActorRef<Self::Msg>,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // A pending timer is dropped here; after a panic (no `post_stop`), by the manager.
        if st.wake.deadline().is_some() {
            self.shared.timers.cancel(myself.get_id());
        }
        if st.serving {
            Metrics::dec(&self.shared.metrics.live_actors);
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if !st.serving && !matches!(msg, ResourceMsg::Adopt(_)) {
            // Idle: routed here for the object it served, or a stale timer or slot (a slot's
            // permit is released as it drops).
            return Ok(());
        }
        match msg {
            ResourceMsg::Observed(obj) => {
                let news = st.is_news(version_of(obj.as_ref()));
                st.undecodable = None;
                st.remember(obj);
                if news {
                    st.trigger_run(&myself);
                }
            }
            ResourceMsg::Undecodable => {
                if let Some(u) = self.shared.store.undecodable(&st.key) {
                    let news = st.is_news(crate::object_api::meta_version(&u.meta));
                    st.undecodable = Some(u);
                    if news {
                        st.trigger_run(&myself);
                    }
                }
            }
            ResourceMsg::Gone => {
                self.vacate(&myself, st);
                return Ok(());
            }
            ResourceMsg::Run => {
                st.run_pending = false;
                self.run_if_dirty(&myself, st, None).await;
            }
            ResourceMsg::Wake(token, slot) => {
                // A due timer runs the pass at once, on the slot it brought (no extra `Run`
                // hop); anything that arrives meanwhile still coalesces into one follow-up run.
                // A stale timer's slot still serves a pass that is due.
                let due = st.wake.deadline();
                if st.wake.fire(token) {
                    if let Some(due) = due {
                        let sent = slot.as_ref().map_or(due, |s| s.given_at);
                        self.shared.timers.woke(sent);
                    }
                    st.mark_due_since(|| due.unwrap_or_else(Instant::now));
                }
                self.run_if_dirty(&myself, st, slot.map(|s| s.permit)).await;
            }
            ResourceMsg::Slot(slot) => {
                st.queued = false;
                self.run_if_dirty(&myself, st, slot.map(|s| s.permit)).await;
            }
            ResourceMsg::Notify => st.trigger_run(&myself),
            ResourceMsg::Passivate => {
                self.hand_back(&myself, st);
                return Ok(());
            }
            ResourceMsg::Adopt(activation) => {
                let wake = std::mem::take(&mut st.wake);
                let manager = st.manager.clone();
                *st = self.begin(&myself, manager, *activation, wake);
                self.first_pass(&myself, st).await;
                return Ok(());
            }
        }
        self.maybe_passivate(&myself, st);
        Ok(())
    }
}
