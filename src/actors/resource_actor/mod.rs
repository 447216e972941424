//! The resource actor: serves one managed object at a time, running its provisioner tree one
//! reconcile at a time. Its messages are handled here; `lifecycle.rs` holds activation and
//! passivation, `reconcile.rs` one reconcile and its status, `deletion.rs` the deprovision
//! reconcile and the release of what a deleted object held.
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
use super::{ManagedResource, Metrics, Shared, version_of};
use crate::after_reconcile::{
    self, At, Backoff, Delays, Ended, OutcomeKey, StatusPlan, StatusWrite, Wake,
};
use crate::counters::ReconcileResult;
use crate::messages::{
    Activation, Cause, ManagerMsg, PassiveState, ReconcilePermit, ResourceMsg, Trigger,
};
use crate::provisioners::{Context, Outcome, Reason};
use crate::references::Target;
use crate::scheduling::PendingWakeUp;
use crate::scheduling::deadline;
use crate::status::{Phase, ReadyReason, ResourceStatus};
use crate::writes;

mod deletion;
mod lifecycle;
mod reconcile;

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
    /// object is not reconciled; its status says why ([`ResourceActor::undecodable_reconcile`]).
    undecodable: Option<Arc<crate::lenient::Undecodable>>,
    /// Version the last reconcile ran on.
    last_reconciled_version: Option<u64>,
    /// Versions our own writes produced: their watch echoes do not trigger a run.
    own_writes: Vec<u64>,
    /// Status fields the last reconcile's steps set, for its status write.
    status_fields: serde_json::Map<String, serde_json::Value>,
    /// A reconcile is due.
    dirty: bool,
    /// Since when a reconcile is due (for the due-to-start histogram).
    due_since: Option<Instant>,
    /// Why the reconcile is due: the first cause since the last one started.
    cause: Option<Cause>,
    /// What the pending wake-up is for.
    wake_for: Option<Trigger>,
    /// `metadata.generation` of the object before the newest known one, or of the object the
    /// last reconcile of a passivated activation ran on: a change of it is a spec change.
    generation: Option<i64>,
    /// A `Reconcile` self-message is queued.
    reconcile_queued: bool,
    /// A reconcile found no free reconcile slot and asked the timer task for one ([`ResourceMsg::Slot`]).
    queued: bool,
    wake: PendingWakeUp,
    /// The reconcile slot the manager handed over for the first reconcile (dropped if no reconcile follows).
    permit: Option<ReconcilePermit>,
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
    fn trigger_reconcile(&mut self, myself: &ActorRef<ResourceMsg<K>>, cause: Cause)
    where
        K: ManagedResource,
    {
        self.mark_due(cause);
        if !self.reconcile_queued {
            self.reconcile_queued = true;
            let _ = myself.cast(ResourceMsg::Reconcile);
        }
    }

    /// A reconcile is due, for `cause` (from now, unless it already was).
    fn mark_due(&mut self, cause: Cause) {
        self.mark_due_since(cause, Instant::now);
    }

    /// A reconcile is due since `since()`, for `cause` (both kept only if it was not due
    /// already: the first cause is the reconcile's).
    fn mark_due_since(&mut self, cause: Cause, since: impl FnOnce() -> Instant) {
        if !self.dirty {
            self.dirty = true;
            self.due_since = Some(since());
        }
        if self.cause.is_none() {
            self.cause = Some(cause);
        }
    }

    /// Why `obj`, a version not handled yet, makes a reconcile due: its deletion, a spec
    /// change, or another change (against the newest version known before it).
    fn change_of(&self, obj: &K) -> Trigger
    where
        K: ManagedResource,
    {
        let was_deleting = self
            .object
            .as_ref()
            .is_some_and(|o| o.meta().deletion_timestamp.is_some());
        let generation = self
            .object
            .as_ref()
            .and_then(|o| o.meta().generation)
            .or(self.generation);
        change_since(obj, generation, was_deleting)
    }

    /// Whether a version we have not handled yet (and did not write ourselves).
    fn is_news(&self, version: Option<u64>) -> bool {
        super::is_news(self.last_reconciled_version, &self.own_writes, version)
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
        wake_for: Trigger,
    ) {
        st.wake_for = Some(wake_for);
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
        let seed = self.shared.rules.policy.seed.map(|s| s ^ key_hash(&st.key));
        let policy = &self.shared.rules.policy.error_backoff;
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
}

/// What a reconcile produced, and the status it computed on the way (deletion computes its own).
struct Reconciled {
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

/// Why `obj` needs a reconcile, against what was known before it (`generation`, and whether it
/// was already being deleted): its deletion began, its spec changed, or something else did.
fn change_since<K: kube::Resource>(
    obj: &K,
    generation: Option<i64>,
    was_deleting: bool,
) -> Trigger {
    let meta = obj.meta();
    if meta.deletion_timestamp.is_some() && !was_deleting {
        Trigger::Deletion
    } else if meta.generation.is_some() && meta.generation != generation {
        Trigger::Spec
    } else {
        Trigger::Changed
    }
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
        Metrics::inc(&self.shared.io.metrics.spawns);
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
        self.first_reconcile(&myself, st).await;
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
            Metrics::dec(&self.shared.io.metrics.live_actors);
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
                let change = news.then(|| st.change_of(&obj));
                st.undecodable = None;
                st.remember(obj);
                if let Some(change) = change {
                    st.trigger_reconcile(&myself, Cause::of(change));
                }
            }
            ResourceMsg::Undecodable => {
                if let Some(u) = self.shared.store.undecodable(&st.key) {
                    let news = st.is_news(crate::object_api::meta_version(&u.meta));
                    st.undecodable = Some(u);
                    if news {
                        st.trigger_reconcile(&myself, Cause::of(Trigger::Changed));
                    }
                }
            }
            ResourceMsg::Gone => {
                self.vacate(&myself, st);
                return Ok(());
            }
            ResourceMsg::Reconcile => {
                st.reconcile_queued = false;
                self.reconcile_if_due(&myself, st, None).await;
            }
            ResourceMsg::Wake(token, slot) => {
                // A due timer runs the reconcile at once, on the slot it brought (no extra `Reconcile`
                // hop); anything that arrives meanwhile still coalesces into one follow-up run.
                // A stale timer's slot still serves a reconcile that is due.
                let due = st.wake.deadline();
                if st.wake.fire(token) {
                    if let Some(due) = due {
                        let sent = slot.as_ref().map_or(due, |s| s.given_at);
                        self.shared.timers.woke(sent);
                    }
                    let wake_for = st.wake_for.take().unwrap_or(Trigger::Requeue);
                    st.mark_due_since(Cause::of(wake_for), || due.unwrap_or_else(Instant::now));
                }
                self.reconcile_if_due(&myself, st, slot.map(|s| s.permit))
                    .await;
            }
            ResourceMsg::Slot(slot) => {
                st.queued = false;
                self.reconcile_if_due(&myself, st, slot.map(|s| s.permit))
                    .await;
            }
            ResourceMsg::Notify(cause) => st.trigger_reconcile(&myself, cause),
            ResourceMsg::Passivate => {
                self.hand_back(&myself, st);
                return Ok(());
            }
            ResourceMsg::Adopt(activation) => {
                let wake = std::mem::take(&mut st.wake);
                let manager = st.manager.clone();
                *st = self.begin(&myself, manager, *activation, wake);
                self.first_reconcile(&myself, st).await;
                return Ok(());
            }
        }
        self.maybe_passivate(&myself, st);
        Ok(())
    }
}
