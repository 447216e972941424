//! The manager supervisor: one per managed kind. Gives each object that has work a linked
//! resource actor, restarts failed ones per the
//! [`KindPolicy`](crate::policy::KindPolicy), keeps the state of passivated objects,
//! and forgets deleted objects. This file is the message handling and routing; `activation.rs`,
//! `passivation.rs` and `supervision.rs` hold those steps. The decisions it applies are
//! plain data beside it: [`ActivationQueue`] (who gets a live actor next), [`RestartTracker`]
//! (restart intensity and backoff), [`PassiveTimers`] (passive objects' wake-ups), and the API
//! writes are in [`writes`].
//!
//! An object gets a live actor only when it can run: activations wait in the
//! [`ActivationQueue`] for a reconcile slot, which the actor's first reconcile then uses. Many new objects
//! so make at most `max_concurrent_reconciles` actors that are waiting to run, not one each; with
//! passivation the live actors are about those that have work. Live actors are capped too
//! ([`KindPolicy::max_live_actors`](crate::policy::KindPolicy::max_live_actors)):
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
use super::resource_actor::{ResourceActor, ResourceArgs, key_hash};
use super::{FastMap, ManagedResource, Metrics, Shared, version_of};
use crate::messages::{
    Activation, Cause, ManagerMsg, PassiveState, ReconcilePermit, ResourceMsg, Trigger,
};
use crate::policy::Exhausted;
use crate::policy::restarts::{AfterFailure, Escalation, RestartTracker};
use crate::scheduling::ActivationQueue;
use crate::scheduling::PassiveTimers;
use crate::writes;

mod activation;
mod passivation;
mod supervision;

/// Past the live-actor cap, one activation still starts this often (see
/// [`KindPolicy::max_live_actors`](crate::policy::KindPolicy::max_live_actors)).
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
    /// In the activation queue, waiting for a reconcile slot; with the state a passivated actor left.
    /// `listed`: queued behind changes, as a listed object (see [`ActivationQueue`]).
    Queued {
        passive: Option<Box<PassiveState>>,
        listed: bool,
        /// Why, without a passive state (see [`Activation::trigger`]).
        trigger: Trigger,
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
    /// Sends to this manager (timers, restarts, reconcile slots for activations).
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
    /// Objects waiting for a reconcile slot to get a live actor; an entry whose object is no longer
    /// `Queued` is skipped.
    activations: ActivationQueue<ObjectRef<K>>,
    /// The timer task was asked for a reconcile slot for the queue's head.
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
    super::is_news(ps.last_reconciled_version, &ps.own_writes, version)
}

impl<K: ManagedResource> Manager<K> {
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
            if let Some(scope) = &self.shared.io.shards
                && let Some((held, label, value)) = scope.misplaced(&obj)
            {
                // Through the labelled shard's client: refused if that shard is lost meanwhile.
                let client = kube::Client::clone(&scope.clients[held as usize]);
                let params = self.shared.io.patch_params();
                tokio::spawn(writes::relabel(
                    client,
                    params,
                    self.shared.rules.policy.write_timeout,
                    self.shared.io.metrics.clone(),
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
        let Some(scope) = &self.shared.io.shards else {
            return;
        };
        for obj in self.shared.store.state() {
            if scope.shard_of(&obj) != shard && scope.labelled_shard_of(obj.meta()) != Some(shard) {
                continue;
            }
            let mut key = ObjectRef::from_obj(obj.as_ref());
            key.extra = Default::default(); // as the feeder's keys: nothing reads it
            if st.objects.contains_key(&key) {
                self.notify(myself, st, key, Cause::of(Trigger::Shard));
            } else {
                self.activate(myself, st, key, None, true, Trigger::Shard);
            }
        }
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

    /// Wake `key`: its live actor runs a reconcile, a passive one is re-activated (through the
    /// activation queue, so it waits for a reconcile slot).
    fn notify(
        &self,
        myself: &ActorRef<MailWaiting>,
        st: &mut ManagerState<K>,
        key: ObjectRef<K>,
        cause: Cause,
    ) {
        if let Some(entry) = st.objects.get_mut(&key) {
            match &mut entry.life {
                Life::Live { notified, .. } => {
                    if !self.forward(&key, ResourceMsg::Notify(cause)) {
                        *notified = true; // passivating: run again once stopped
                    }
                }
                Life::Passive(kept) => {
                    let mut ps = kept.take();
                    due_for(&mut ps, cause);
                    self.activate(myself, st, key, Some(ps), false, Trigger::Again);
                }
                // A first activation runs anyway; a re-activation is told to.
                Life::Queued { passive, .. } => {
                    if let Some(ps) = passive {
                        due_for(ps, cause);
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
                    self.activate(myself, st, key, None, true, Trigger::Listed);
                }
            }
            ManagerMsg::Event(key) => {
                let Some(entry) = st.objects.get_mut(&key) else {
                    // New: the feeder stored it before routing it here. (Deleted since, it is
                    // dropped from the queue when its turn comes: `start` reads the store.)
                    self.activate(myself, st, key, None, false, Trigger::Created);
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
                        let share = self.shared.share_of(&key);
                        st.activations.push_again(share, key);
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
                        let deletion = obj.meta().deletion_timestamp.is_some() && !*deleting;
                        if deletion || obj.meta().generation != *generation {
                            entry.restarts = None;
                            let trigger = if deletion {
                                Trigger::Deletion
                            } else {
                                Trigger::Spec
                            };
                            self.activate(myself, st, key, None, false, trigger);
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
                        Metrics::inc(&self.shared.io.metrics.restarts);
                        self.activate(myself, st, key, None, false, Trigger::Restart);
                    } else {
                        st.objects.remove(&key);
                    }
                }
            }
            ManagerMsg::Notify(key, cause) => self.notify(myself, st, key, cause),
            ManagerMsg::Broadcast => {
                let keys: Vec<ObjectRef<K>> = st.objects.keys().collect();
                for key in keys {
                    self.notify(myself, st, key, Cause::of(Trigger::Config));
                }
            }
            ManagerMsg::PassiveWake(key, token) => {
                if let Some(Entry {
                    life: Life::Passive(kept),
                    ..
                }) = st.objects.get_mut(&key)
                    && let Some(ps) = kept.fired(token)
                {
                    self.activate(myself, st, key, Some(ps), false, Trigger::Again);
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
            passive_timers: PassiveTimers::start({
                let me = me.clone();
                move |key, token| me.send(ManagerMsg::PassiveWake(key, token))
            }),
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
        // A stopped actor's reconcile slot is free now: start the next queued activation on it here,
        // one hop sooner than through the permit waiter.
        self.drain(&myself, st);
        st.passive_timers.flush();
        self.encode_passive(st);
        result
    }
}

/// A passive object's reconcile is due, for `cause` (unless it already was, for another).
fn due_for(ps: &mut PassiveState, cause: Cause) {
    if !ps.reconcile_due || ps.due.is_none() {
        ps.due = Some(cause);
    }
    ps.reconcile_due = true;
}
