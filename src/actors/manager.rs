//! The manager supervisor: one per managed kind. Gives each object that has work a linked
//! resource actor, restarts failed ones per the
//! [`SupervisorPolicy`](crate::policy::SupervisorPolicy), keeps the state of passivated objects,
//! and forgets deleted objects. This file is the message handling; the decisions it applies are
//! plain data beside it: [`ActivationQueue`] (who gets a live actor next), [`RestartTracker`]
//! (restart intensity and backoff), [`PassiveTimers`] (passive objects' wake-ups), and the API
//! writes are in [`writes`].
//!
//! An object gets a live actor only when it can run: activations wait in the
//! [`ActivationQueue`] for a run slot, which the actor's first reconcile then uses. Many new objects
//! so make at most `max_concurrent_reconciles` actors that are waiting to run, not one each; with
//! passivation the live actors are about those that have work. Live actors are capped too
//! ([`SupervisorPolicy::max_live_actors`](crate::policy::SupervisorPolicy::max_live_actors)):
//! past the cap, activations wait for a live actor to passivate, and one still starts every
//! [`OVER_CAP_EVERY`] so that actors which stay live cannot starve new objects.
//!
//! An activation goes to an idle actor (one that passivated and handed its object back,
//! [`ManagerMsg::Passivated`], or whose object was deleted, [`ManagerMsg::Vacated`]) when there
//! is one: it *adopts* the activation. An actor is spawned only when none is idle and none is on
//! its way back (a hand-back waiting in the mailbox: the activation waits for it). Spawning and
//! stopping an actor per activation (allocations, a task, the link, and two supervision events
//! through this one serial mailbox) made the manager the bottleneck of the first reconciles;
//! adopting costs two mailbox messages. At most [`Manager::idle_bound`] idle actors are kept;
//! one past it is stopped.
//!
//! Every [`ManagerMsg`] reaches the manager through its batching [`mailbox`], not ractor's
//! message port: one ractor receive hands over a batch. Supervision events of the resource
//! actors still arrive through ractor, between batches.

use std::sync::Arc;

use kube::runtime::reflector::ObjectRef;
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::sync::TryAcquireError;
use tokio::time::Instant;

use super::mailbox::{self, MailWaiting, Mailbox};
use super::object_map::ObjectMap;
use super::passive_state::Kept;
use super::passive_timers::PassiveTimers;
use super::resource_actor::{ResourceActor, ResourceArgs, key_hash};
use super::{FastMap, ManagedResource, Metrics, Shared, version_of, writes};
use crate::messages::{Activation, ManagerMsg, PassiveState, ResourceMsg, RunPermit};
use crate::policy::Exhausted;
use crate::policy::restarts::{AfterFailure, Escalation, RestartTracker};
use crate::scheduling::ActivationQueue;

/// Past the live-actor cap, one activation still starts this often (see
/// [`SupervisorPolicy::max_live_actors`](crate::policy::SupervisorPolicy::max_live_actors)).
const OVER_CAP_EVERY: std::time::Duration = std::time::Duration::from_millis(10);

/// The manager behaviour.
pub(crate) struct Manager<K: ManagedResource> {
    pub shared: Arc<Shared<K>>,
}

/// Start-up arguments: the manager's mailbox (see [`mailbox`]).
pub(crate) struct ManagerArgs<K: ManagedResource> {
    /// Binds, in `pre_start`, the sender the manager uses to message itself.
    pub mailbox: mailbox::UnboundMailbox<ManagerMsg<K>>,
    pub rx: mailbox::Receiver<ManagerMsg<K>>,
}

/// Where one object's actor is in its life.
enum Life {
    /// In the activation queue, waiting for a run slot; with the state a passivated actor left.
    /// `listed`: queued behind changes, as a listed object (see [`ActivationQueue`]).
    Queued {
        passive: Option<Box<PassiveState>>,
        listed: bool,
    },
    /// A live actor. `notified`: a notification found no route because the actor is
    /// passivating; it re-activates at once when it has stopped.
    Live { id: ActorId, notified: bool },
    /// No actor; its state kept here, with the token of its pending wake-up, if any (held by
    /// [`PassiveTimers`]).
    Passive(Kept),
    /// Failed; a restart is scheduled.
    Restarting,
    /// Past the restart intensity; no restarts until the generation changes or it is deleted.
    Quarantined {
        generation: Option<i64>,
        deleting: bool,
    },
}

/// One known object: where its actor is, and its failures.
struct Entry {
    life: Life,
    /// Only for objects whose actor failed: most never do, and idle entries should stay small.
    restarts: Option<Box<RestartTracker>>,
}

/// Manager state: every known object's entry.
pub(crate) struct ManagerState<K: ManagedResource> {
    /// Where every [`ManagerMsg`] arrives (a [`MailWaiting`] says it has some).
    rx: mailbox::Receiver<ManagerMsg<K>>,
    /// Sends to this manager (timers, restarts, run slots for activations).
    me: Mailbox<ManagerMsg<K>>,
    /// The pending wake-ups of passive objects.
    passive_timers: PassiveTimers<K>,
    objects: ObjectMap<K, Entry>,
    /// The actors serving an object, by actor.
    ids: FastMap<ActorId, ObjectRef<K>>,
    /// Actors that passivated and serve no object, ready to adopt the next activation (at most
    /// [`Manager::idle_bound`]); the last one in is the first out.
    idle: Vec<ActorRef<ResourceMsg<K>>>,
    wake_token: u64,
    /// Objects waiting for a run slot to get a live actor; an entry whose object is no longer
    /// `Queued` is skipped.
    activations: ActivationQueue<ObjectRef<K>>,
    /// The timer task was asked for a run slot for the queue's head.
    awaiting_permit: bool,
    /// When the last activation past the live-actor cap started.
    over_cap_at: Option<Instant>,
    /// A [`ManagerMsg::Drain`] is scheduled for the next activation past the cap.
    drain_scheduled: bool,
    /// Objects that went passive in this batch of messages, as the manager saw them: their
    /// cached copies are encoded ([`KindStore::encode`](super::KindStore::encode)) by a task
    /// after the batch, off the manager's mailbox.
    to_encode: Vec<(ObjectRef<K>, Arc<K>)>,
}

fn is_news(ps: &PassiveState, version: Option<u64>) -> bool {
    super::is_news(ps.last_run_version, &ps.own_writes, version)
}

impl<K: ManagedResource> Manager<K> {
    /// Queue `key` for a live actor (`passive`: the state its last actor handed over), behind
    /// changes if it was `listed` (see [`ActivationQueue`]).
    fn activate(
        &self,
        myself: &ActorRef<MailWaiting>,
        st: &mut ManagerState<K>,
        key: ObjectRef<K>,
        passive: Option<PassiveState>,
        listed: bool,
    ) {
        if !self.shared.owns(&key) {
            self.unowned(st, key);
            return;
        }
        if st.objects.len() == st.objects.capacity() {
            // A full map would double, rehash and touch fresh memory (and again at the next
            // power of two: at 10k new objects that was a third of the manager's time); grow
            // once to what the store holds, which bounds the objects there are slots for.
            let additional = self.shared.store.len().saturating_sub(st.objects.len());
            st.objects.reserve(additional.max(1));
        }
        let entry = st.objects.get_or_insert_with(&key, || Entry {
            life: Life::Restarting,
            restarts: None,
        });
        if let Life::Passive(kept) = &entry.life
            && kept.timer().is_some()
        {
            st.passive_timers.cancel(key.clone());
        }
        if listed {
            st.activations.push_listed(key);
        } else if passive.is_some() {
            st.activations.push_again(key);
        } else {
            st.activations.push_new(key);
        }
        entry.life = Life::Queued {
            passive: passive.map(Box::new),
            listed,
        };
        self.drain(myself, st);
    }

    /// Start queued activations while run slots are free; when none is, ask the timer task for
    /// the next ([`ManagerMsg::Permit`]). Reconciles of live actors wait for slots there too, and
    /// come first, but activations get a bounded share of the slots
    /// (`RunSlotQueue`, [`crate::scheduling`]).
    fn drain(&self, myself: &ActorRef<MailWaiting>, st: &mut ManagerState<K>) {
        while Self::skip_stale(st) && Self::actor_at_hand(st) && self.admit(st) {
            // A free slot is not enough while passes wait for slots in the timer task (the slot
            // is theirs) or activations are held back there because wake-ups run late.
            let free = if self.shared.timers.activation_may_skip_queue() {
                self.shared.runs.try_acquire()
            } else {
                Err(TryAcquireError::NoPermits)
            };
            match free {
                Ok(permit) => {
                    let key = st.activations.pop_next().expect("skip_stale left a head");
                    self.start(myself, st, key, permit);
                }
                Err(TryAcquireError::NoPermits) => {
                    if !st.awaiting_permit {
                        st.awaiting_permit = true;
                        let me = st.me.clone();
                        self.shared.timers.activation(Box::new(move |permit| {
                            me.send(ManagerMsg::Permit(permit));
                        }));
                    }
                    return;
                }
                Err(TryAcquireError::Closed) => return,
            }
        }
    }

    /// Whether an activation started now finds an actor without spawning one, or no actor is
    /// about to become idle: while actors that passivated are on their way back (their
    /// [`ManagerMsg::Passivated`] waits in the mailbox), the manager handles them first and
    /// starts the activation on one of them. Spawning instead grew, at a burst of activations,
    /// thousands of actors whose hand-backs queued behind each other (and every change behind
    /// them).
    fn actor_at_hand(st: &ManagerState<K>) -> bool {
        !st.idle.is_empty() || !st.rx.back_pending()
    }

    /// Whether the queue's head may get a live actor now: below the live-actor cap, or once
    /// per [`OVER_CAP_EVERY`] past it (a [`ManagerMsg::Drain`] is scheduled for then).
    fn admit(&self, st: &mut ManagerState<K>) -> bool {
        if self
            .shared
            .policy
            .max_live_actors
            .is_none_or(|cap| st.ids.len() < cap)
        {
            return true;
        }
        let now = Instant::now();
        let next = st.over_cap_at.map(|at| at + OVER_CAP_EVERY);
        if next.is_none_or(|next| next <= now) {
            st.over_cap_at = Some(now);
            return true;
        }
        if !st.drain_scheduled {
            st.drain_scheduled = true;
            let me = st.me.clone();
            let at = next.unwrap_or(now);
            tokio::spawn(async move {
                tokio::time::sleep_until(at).await;
                me.send(ManagerMsg::Drain);
            });
        }
        false
    }

    /// Drop activation-queue entries whose object no longer waits (deleted, or already
    /// activated through a newer entry); `true` if a waiting one is at a head.
    fn skip_stale(st: &mut ManagerState<K>) -> bool {
        let objects = &st.objects;
        st.activations.skip_stale(|key| {
            matches!(
                objects.get(key),
                Some(Entry {
                    life: Life::Queued { .. },
                    ..
                })
            )
        })
    }

    /// Spawn the actor of a queued key; its first reconcile runs on `permit`.
    fn start(
        &self,
        myself: &ActorRef<MailWaiting>,
        st: &mut ManagerState<K>,
        key: ObjectRef<K>,
        permit: RunPermit,
    ) {
        if self.shared.runs.is_closed() {
            // Shutting down: a slot handed out before the runs closed starts nothing new.
            return;
        }
        let passive = match st.objects.get_mut(&key).map(|s| &mut s.life) {
            Some(Life::Queued { passive, .. }) => passive.take().map(|ps| *ps),
            _ => return,
        };
        if !self.shared.store.contains(&key) {
            st.objects.remove(&key); // deleted while it waited
            return;
        }
        let mut activation = Activation {
            key: key.clone(),
            passive,
            permit: Some(permit),
        };
        // An idle actor adopts it if there is one: a message instead of a spawn, a stop and two
        // supervision events (see the module docs).
        while let Some(actor) = st.idle.pop() {
            match actor.cast(ResourceMsg::Adopt(Box::new(activation))) {
                Ok(()) => {
                    self.serve(st, key, actor.get_id());
                    return;
                }
                // Stopping (the runtime shuts down): try the next, or spawn.
                Err(ractor::MessagingErr::SendErr(ResourceMsg::Adopt(back))) => activation = *back,
                // Not returned by a typed `ActorRef` (it hands back what it could not send);
                // forget the object like a failed spawn does: its next event activates it.
                Err(e) => {
                    tracing::error!(object = %key, error = %e, "could not hand an activation to an idle actor");
                    st.objects.remove(&key);
                    return;
                }
            }
        }
        let args = ResourceArgs {
            manager: st.me.clone(),
            activation,
        };
        let handler = ResourceActor {
            shared: self.shared.clone(),
        };
        // `spawn_linked_instant`: the actor's cell exists at once (messages queue), and its
        // `pre_start` and linking run in its own task, not in this mailbox — the manager is the
        // one serial point every activation passes through. `ResourceActor::pre_start`
        // cannot fail, so the start handle is not watched; an actor that cannot link (the
        // manager is stopping) simply never runs.
        match ractor::ActorRuntime::spawn_linked_instant(None, handler, args, myself.get_cell()) {
            Ok((actor, _starting)) => self.serve(st, key, actor.get_id()),
            Err(e) => {
                tracing::error!(object = %key, error = %e, "could not spawn resource actor");
                st.objects.remove(&key);
            }
        }
    }

    /// Record that actor `id` serves `key` now (it inserts its route itself, as it starts).
    fn serve(&self, st: &mut ManagerState<K>, key: ObjectRef<K>, id: ActorId) {
        if let Some(entry) = st.objects.get_mut(&key) {
            entry.life = Life::Live {
                id,
                notified: false,
            };
        }
        st.ids.insert(id, key);
    }

    /// How many idle actors are kept for the next activations: one per run slot (more could not
    /// run at once), and never past the live-actor cap.
    fn idle_bound(&self) -> usize {
        let policy = &self.shared.policy;
        policy
            .max_concurrent_reconciles
            .min(policy.max_live_actors.unwrap_or(usize::MAX))
    }

    /// A resource actor handed its object back ([`ManagerMsg::Passivated`]): keep the actor for
    /// the next activation (or stop it past [`Manager::idle_bound`]), and settle the object as
    /// a stopped actor's would be.
    fn passivated(
        &self,
        myself: &ActorRef<MailWaiting>,
        st: &mut ManagerState<K>,
        actor: ActorRef<ResourceMsg<K>>,
        ps: PassiveState,
    ) {
        let id = actor.get_id();
        let key = self.retire(st, id);
        self.keep_idle(st, actor);
        if let Some(key) = key {
            let notified = match st.objects.get(&key).map(|s| &s.life) {
                Some(Life::Live { id: live, notified }) if *live == id => Some(*notified),
                _ => None,
            };
            if let Some(notified) = notified {
                self.passivate_or_reactivate(myself, st, key, ps, notified);
            }
        }
        // An actor is at hand now for an activation that waited for one.
        self.drain(myself, st);
    }

    /// A resource actor's object is gone ([`ManagerMsg::Vacated`]): forget the object, keep the
    /// actor for the next activation (or stop it past [`Manager::idle_bound`]). An object
    /// re-created under the same name meanwhile is in the store: it is activated (its events
    /// may have been routed to the actor before it vacated, which ignores them).
    fn vacated(
        &self,
        myself: &ActorRef<MailWaiting>,
        st: &mut ManagerState<K>,
        actor: ActorRef<ResourceMsg<K>>,
    ) {
        let id = actor.get_id();
        let key = self.retire(st, id);
        self.keep_idle(st, actor);
        if let Some(key) = key {
            if matches!(
                st.objects.get(&key).map(|s| &s.life),
                Some(Life::Live { id: live, .. }) if *live == id
            ) {
                st.objects.remove(&key);
            }
            if !st.objects.contains_key(&key) && self.shared.store.contains(&key) {
                self.activate(myself, st, key, None, false);
            }
        }
        // An actor is at hand now for an activation that waited for one.
        self.drain(myself, st);
    }

    /// Keep `actor`, which serves nothing now, idle for the next activation, or stop it past
    /// [`Manager::idle_bound`].
    fn keep_idle(&self, st: &mut ManagerState<K>, actor: ActorRef<ResourceMsg<K>>) {
        if st.idle.len() < self.idle_bound() {
            st.idle.push(actor);
        } else {
            actor.stop(Some("idle".into()));
        }
    }

    /// An actor stopped or failed: drop its route, and return its object's key (`None` if the
    /// actor was not one of ours). A stopped actor dropped its own timer in `post_stop`.
    fn retire(&self, st: &mut ManagerState<K>, id: ActorId) -> Option<ObjectRef<K>> {
        let key = st.ids.remove(&id)?;
        self.shrink_if_sparse(st);
        self.shared.routes.remove_if(&key, |_, a| a.get_id() == id);
        Some(key)
    }

    /// After a wave of passivations the actor-indexed maps keep their peak capacity (about
    /// 100 bytes per slot); give it back once they are mostly empty.
    fn shrink_if_sparse(&self, st: &mut ManagerState<K>) {
        const MIN: usize = 1024;
        if st.ids.capacity() > MIN && st.ids.capacity() > 8 * st.ids.len() {
            st.ids.shrink_to(2 * st.ids.len());
            self.shared.routes.shrink_to_fit();
        }
    }

    /// Passive or stopped actor: decide from the store whether to re-activate now.
    /// `notified`: a notification came while the actor was passivating; the next actor must run
    /// a reconcile for it (the store shows nothing new for a dependency turning Ready).
    fn passivate_or_reactivate(
        &self,
        myself: &ActorRef<MailWaiting>,
        st: &mut ManagerState<K>,
        key: ObjectRef<K>,
        mut ps: PassiveState,
        notified: bool,
    ) {
        let Some(obj) = self.shared.store.get(&key) else {
            st.objects.remove(&key);
            return;
        };
        if !self.shared.owns(&key) {
            self.unowned(st, key);
            return;
        }
        ps.pending_run |= notified;
        if ps.pending_run || is_news(&ps, version_of(obj.as_ref())) {
            self.activate(myself, st, key, Some(ps), false);
            return;
        }
        let timer = ps.wake_in.map(|d| {
            st.wake_token += 1;
            st.passive_timers.arm(key.clone(), st.wake_token, d);
            st.wake_token
        });
        if let Some(entry) = st.objects.get_mut(&key) {
            entry.life = Life::Passive(Kept::keep(ps, version_of(obj.as_ref()), timer));
            self.encode_later(st, key, obj);
        }
    }

    /// `key` is passive with `obj` cached: have its cached copy encoded after this batch.
    fn encode_later(&self, st: &mut ManagerState<K>, key: ObjectRef<K>, obj: Arc<K>) {
        if self.shared.encode_passive {
            st.to_encode.push((key, obj));
        }
    }

    /// Encode the cached copies of the objects that went passive in this batch, in a task of
    /// its own (a few microseconds each, which the manager's mailbox need not wait for). One
    /// that changed meanwhile stays whole: [`KindStore::encode`](super::KindStore::encode)
    /// encodes only the version given.
    fn encode_passive(&self, st: &mut ManagerState<K>) {
        if st.to_encode.is_empty() {
            return;
        }
        let (store, batch) = (self.shared.store.clone(), std::mem::take(&mut st.to_encode));
        tokio::spawn(async move {
            for (key, obj) in batch {
                store.encode(&key, &obj);
            }
        });
    }

    /// `key` is in a shard another replica runs ([`crate::sharding`]): keep nothing of it (the
    /// replica that acquires its shard runs it), and tell the reference index its readiness as
    /// its status says, so those here that wait on it are woken by its watch events.
    fn unowned(&self, st: &mut ManagerState<K>, key: ObjectRef<K>) {
        if let Some(entry) = st.objects.remove(&key)
            && let Life::Passive(kept) = entry.life
            && kept.timer().is_some()
        {
            st.passive_timers.cancel(key.clone());
        }
        if let Some(obj) = self.shared.store.get(&key) {
            if let Some(scope) = &self.shared.shards
                && let Some((held, label, value)) = scope.misplaced(&obj)
            {
                // Through the labelled shard's client: refused if that shard is lost meanwhile.
                let client = kube::Client::clone(&scope.clients[held as usize]);
                let params = self.shared.patch_params();
                tokio::spawn(super::writes::relabel(
                    client,
                    params,
                    self.shared.policy.write_timeout,
                    self.shared.metrics.clone(),
                    obj.clone(),
                    label,
                    value,
                ));
            }
            let ready = obj.meta().deletion_timestamp.is_none()
                && crate::status::ResourceStatus::of(obj.as_ref()).is_ready();
            let target = crate::references::Target::new(
                K::api_version(&()),
                K::kind(&()),
                key.namespace.as_deref(),
                key.name.clone(),
            );
            if ready {
                self.shared
                    .references
                    .mark_ready_at(&target, obj.meta().generation);
            } else {
                self.shared.references.mark_ready(&target, false);
            }
        }
    }

    /// Run every object of `shard`, just acquired: each is activated (or woken, if it has a
    /// live actor) as by a notification. An object labelled for the shard whose key moved it
    /// to another is moved there (through [`Manager::unowned`]).
    fn shard_acquired(&self, myself: &ActorRef<MailWaiting>, st: &mut ManagerState<K>, shard: u32) {
        let Some(scope) = &self.shared.shards else {
            return;
        };
        for obj in self.shared.store.state() {
            if scope.shard_of(&obj) != shard && scope.labelled_shard_of(obj.meta()) != Some(shard) {
                continue;
            }
            let mut key = ObjectRef::from_obj(obj.as_ref());
            key.extra = Default::default(); // as the feeder's keys: nothing reads it
            if st.objects.contains_key(&key) {
                self.notify(myself, st, key);
            } else {
                self.activate(myself, st, key, None, true);
            }
        }
    }

    /// A linked resource actor stopped or failed.
    fn supervise(
        &self,
        event: SupervisionEvent,
        st: &mut ManagerState<K>,
    ) -> Result<(), ActorProcessingErr> {
        match event {
            SupervisionEvent::ActorTerminated(cell, _, _) => {
                let id = cell.get_id();
                let Some(key) = self.retire(st, id) else {
                    // An idle actor (stopped at shutdown): it serves nothing.
                    st.idle.retain(|a| a.get_id() != id);
                    return Ok(());
                };
                // A serving actor stops only at shutdown, or when the manager's mailbox is
                // closed: forget the object. (Passivation and a deleted object hand the actor
                // back without stopping.)
                if matches!(
                    st.objects.get(&key).map(|s| &s.life),
                    Some(Life::Live { id: live, .. }) if *live == id
                ) {
                    st.objects.remove(&key);
                }
            }
            SupervisionEvent::ActorFailed(cell, err) => {
                // A failed actor ran no `post_stop`: drop its timer here.
                self.shared.timers.cancel(cell.get_id());
                let Some(key) = self.retire(st, cell.get_id()) else {
                    return Ok(());
                };
                Metrics::dec(&self.shared.metrics.live_actors);
                self.on_failure(st, key, err)?;
            }
            _ => {}
        }
        Ok(())
    }

    /// The object was deleted from the API.
    fn gone(&self, st: &mut ManagerState<K>, key: ObjectRef<K>) {
        if let Some(entry) = st.objects.get_mut(&key) {
            match &mut entry.life {
                Life::Live { .. } => {
                    // Not routed if it is passivating: then it finds the object gone from the
                    // store when it has stopped.
                    self.forward(&key, ResourceMsg::Gone);
                }
                Life::Passive(kept) if kept.timer().is_some() => {
                    st.objects.remove(&key);
                    st.passive_timers.cancel(key);
                }
                _ => {
                    st.objects.remove(&key);
                }
            }
        }
    }

    fn forward(&self, key: &ObjectRef<K>, msg: ResourceMsg<K>) -> bool {
        match self.shared.routes.get(key) {
            Some(actor) => actor.cast(msg).is_ok(),
            None => false,
        }
    }

    /// A live actor failed with `error`: restart it after the backoff, or past the restart
    /// intensity quarantine the object or escalate (the manager fails with an [`Escalation`]).
    fn on_failure(
        &self,
        st: &mut ManagerState<K>,
        key: ObjectRef<K>,
        error: ActorProcessingErr,
    ) -> Result<(), ActorProcessingErr> {
        let policy = &self.shared.policy.restart;
        let now = Instant::now();
        let entry = st.objects.get_or_insert_with(&key, || Entry {
            life: Life::Restarting,
            restarts: None,
        });
        let seed = self.shared.policy.seed.map(|s| s ^ key_hash(&key));
        let after = entry
            .restarts
            .get_or_insert_default()
            .failed(policy, now, seed);
        let delay = match after {
            AfterFailure::Restart { failures, delay } => {
                tracing::warn!(object = %key, error = %error, failures, "resource actor failed");
                if self.shared.parts.recorder.is_some()
                    && let Some(obj) = self.shared.store.get(&key)
                {
                    let (shared, error) = (self.shared.clone(), error.to_string());
                    tokio::spawn(async move {
                        writes::publish_restarted(&shared, obj.as_ref(), failures, &error).await;
                    });
                }
                delay
            }
            AfterFailure::Exhausted { failures } => {
                tracing::warn!(object = %key, error = %error, failures, "resource actor failed past the restart intensity");
                match policy.on_exhausted {
                    Exhausted::Escalate => {
                        return Err(Box::new(Escalation {
                            kind: K::kind(&()).into_owned(),
                            object: key.to_string(),
                            failures,
                            window: policy.window,
                            cause: Arc::from(error),
                        }));
                    }
                    Exhausted::Quarantine => {
                        let obj = self.shared.store.get(&key);
                        let deleting = obj
                            .as_ref()
                            .is_some_and(|o| o.meta().deletion_timestamp.is_some());
                        entry.life = Life::Quarantined {
                            generation: obj.as_ref().and_then(|o| o.meta().generation),
                            deleting,
                        };
                        Metrics::inc(&self.shared.metrics.quarantined);
                        // A deleting object cannot change its way out (its deletion is the
                        // change), and waiting forever would leave its finalizer: it is tried
                        // again after the longest error backoff, each time until it fails past
                        // the intensity again.
                        let retry = deleting.then_some(self.shared.policy.error_backoff.max);
                        if let Some(obj) = obj {
                            let message = match retry {
                                None => format!(
                                    "the resource's actor failed {failures} times within {}s; not restarted until the resource changes",
                                    policy.window.as_secs()
                                ),
                                Some(retry) => format!(
                                    "the resource's actor failed {failures} times within {}s while deleting; tried again in {}s",
                                    policy.window.as_secs(),
                                    retry.as_secs()
                                ),
                            };
                            writes::quarantine_status(self.shared.clone(), obj, message);
                        }
                        let Some(retry) = retry else {
                            return Ok(());
                        };
                        entry.life = Life::Restarting;
                        let me = st.me.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(retry).await;
                            me.send(ManagerMsg::Restart(key));
                        });
                        return Ok(());
                    }
                }
            }
        };
        entry.life = Life::Restarting;
        let me = st.me.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            me.send(ManagerMsg::Restart(key));
        });
        Ok(())
    }

    /// Wake `key`: its live actor runs a reconcile, a passive one is re-activated (through the
    /// activation queue, so it waits for a run slot).
    fn notify(&self, myself: &ActorRef<MailWaiting>, st: &mut ManagerState<K>, key: ObjectRef<K>) {
        if let Some(entry) = st.objects.get_mut(&key) {
            match &mut entry.life {
                Life::Live { notified, .. } => {
                    if !self.forward(&key, ResourceMsg::Notify) {
                        *notified = true; // passivating: run again once stopped
                    }
                }
                Life::Passive(kept) => {
                    let mut ps = kept.take();
                    ps.pending_run = true;
                    self.activate(myself, st, key, Some(ps), false);
                }
                // A first activation runs anyway; a re-activation is told to.
                Life::Queued { passive, .. } => {
                    if let Some(ps) = passive {
                        ps.pending_run = true;
                    }
                }
                Life::Restarting | Life::Quarantined { .. } => {}
            }
        }
    }

    /// Handle one message from the mailbox.
    fn handle_msg(
        &self,
        myself: &ActorRef<MailWaiting>,
        msg: ManagerMsg<K>,
        st: &mut ManagerState<K>,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ManagerMsg::Listed(key) => {
                if !st.objects.contains_key(&key) {
                    self.activate(myself, st, key, None, true);
                }
            }
            ManagerMsg::Event(key) => {
                let Some(entry) = st.objects.get_mut(&key) else {
                    // New: the feeder stored it before routing it here. (Deleted since, it is
                    // dropped from the queue when its turn comes: `start` reads the store.)
                    self.activate(myself, st, key, None, false);
                    return Ok(());
                };
                match &mut entry.life {
                    Life::Live { .. } => {
                        // No route: it is passivating, and looks at the store once stopped.
                        if let Some(obj) = self.shared.store.get(&key) {
                            self.forward(&key, ResourceMsg::Observed(obj));
                        }
                    }
                    Life::Passive(kept) => {
                        // Most such events are the watch echoes of the actor's own last writes:
                        // nothing to run, and its timer stays armed as it was (settling again
                        // would re-arm it later, and leave the old timer task sleeping).
                        match self.shared.store.get(&key) {
                            Some(obj) if !kept.is_news(version_of(obj.as_ref())) => {
                                self.encode_later(st, key, obj);
                            }
                            _ => {
                                let ps = kept.take();
                                self.passivate_or_reactivate(myself, st, key, ps, false);
                            }
                        }
                    }
                    // Changed while it waited behind changes as a listed object: it is a change
                    // now (its entry in the listed queue goes stale once it starts).
                    Life::Queued { listed, .. } if *listed => {
                        *listed = false;
                        st.activations.push_again(key);
                        self.drain(myself, st);
                    }
                    // The actor to come reads the store.
                    Life::Queued { .. } | Life::Restarting => {}
                    Life::Quarantined {
                        generation,
                        deleting,
                    } => {
                        let Some(obj) = self.shared.store.get(&key) else {
                            return Ok(());
                        };
                        let changed = obj.meta().generation != *generation
                            || (obj.meta().deletion_timestamp.is_some() && !*deleting);
                        if changed {
                            entry.restarts = None;
                            self.activate(myself, st, key, None, false);
                        }
                    }
                }
            }
            ManagerMsg::Gone(key) => self.gone(st, key),
            ManagerMsg::Resync(existing, namespace) => {
                let listed = |k: &ObjectRef<K>| {
                    namespace.is_none() || k.namespace.as_deref() == namespace.as_deref()
                };
                let gone: Vec<ObjectRef<K>> = st
                    .objects
                    .keys()
                    .filter(|k| listed(k) && !existing.contains(k))
                    .collect();
                for key in gone {
                    self.gone(st, key);
                }
            }
            ManagerMsg::Restart(key) => {
                if matches!(
                    st.objects.get(&key).map(|s| &s.life),
                    Some(Life::Restarting)
                ) {
                    if self.shared.store.contains(&key) {
                        Metrics::inc(&self.shared.metrics.restarts);
                        self.activate(myself, st, key, None, false);
                    } else {
                        st.objects.remove(&key);
                    }
                }
            }
            ManagerMsg::Notify(key) => self.notify(myself, st, key),
            ManagerMsg::Broadcast => {
                let keys: Vec<ObjectRef<K>> = st.objects.keys().collect();
                for key in keys {
                    self.notify(myself, st, key);
                }
            }
            ManagerMsg::PassiveWake(key, token) => {
                if let Some(Entry {
                    life: Life::Passive(kept),
                    ..
                }) = st.objects.get_mut(&key)
                    && let Some(ps) = kept.fired(token)
                {
                    self.activate(myself, st, key, Some(ps), false);
                }
            }
            ManagerMsg::Passivated(actor, ps) => self.passivated(myself, st, actor, ps),
            ManagerMsg::Vacated(actor) => self.vacated(myself, st, actor),
            ManagerMsg::Drain => {
                st.drain_scheduled = false;
                self.drain(myself, st);
            }
            ManagerMsg::ShardAcquired(shard) => self.shard_acquired(myself, st, shard),
            ManagerMsg::Permit(permit) => {
                st.awaiting_permit = false;
                // (Without an actor at hand the slot goes back; the hand-back drains again.)
                if Self::skip_stale(st) && Self::actor_at_hand(st) {
                    let key = st.activations.pop_next().expect("skip_stale left a head");
                    self.start(myself, st, key, permit);
                }
                self.drain(myself, st);
            }
        }
        Ok(())
    }
}

impl<K: ManagedResource> Actor for Manager<K> {
    type Msg = MailWaiting;
    type State = ManagerState<K>;
    type Arguments = ManagerArgs<K>;

    async fn pre_start(
        &self,
        myself: ActorRef<MailWaiting>,
        args: ManagerArgs<K>,
    ) -> Result<Self::State, ActorProcessingErr> {
        let me = args.mailbox.bind(myself);
        Ok(ManagerState {
            rx: args.rx,
            passive_timers: PassiveTimers::start(me.clone()),
            me,
            objects: ObjectMap::default(),
            ids: FastMap::default(),
            idle: Vec::new(),
            wake_token: 0,
            activations: ActivationQueue::default(),
            awaiting_permit: false,
            over_cap_at: None,
            drain_scheduled: false,
            to_encode: Vec::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<MailWaiting>,
        _: MailWaiting,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        st.rx.open();
        let mut handled = 0;
        while handled < mailbox::BATCH
            && let Some(msg) = st.rx.next()
        {
            handled += 1;
            if let Err(e) = self.handle_msg(&myself, msg, st) {
                st.passive_timers.flush();
                self.encode_passive(st);
                return Err(e);
            }
        }
        st.passive_timers.flush();
        self.encode_passive(st);
        if handled == mailbox::BATCH {
            // More may be queued: signal again, so supervision events queued meanwhile go first.
            st.me.signal();
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let result = self.supervise(event, st);
        // A stopped actor's run slot is free now: start the next queued activation on it here,
        // one hop sooner than through the permit waiter.
        self.drain(&myself, st);
        st.passive_timers.flush();
        self.encode_passive(st);
        result
    }
}
