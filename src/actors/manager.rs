//! The manager supervisor: one per managed kind. Gives each object that has work a linked
//! resource actor, restarts failed ones per the
//! [`SupervisorPolicy`](crate::policy::SupervisorPolicy), keeps the state of passivated objects,
//! and forgets deleted objects.
//!
//! An object gets a live actor only when it can run: activations wait in a queue for a run slot
//! (a permit of the runtime's `max_concurrent_runs` semaphore), which the actor's first pass then
//! uses. Ten thousand new objects so make at most `max_concurrent_runs` actors that are waiting
//! to run, not ten thousand; with passivation (an actor with nothing due hands its object back,
//! see [`ResourceActor`]) the live actors are about those that have work. Objects that ran before
//! (re-activated by a notification, a due timer or a change) wait in a queue of their own that
//! comes before new objects', with every [`NEW_OBJECT_EVERY`]-th start kept for a new object.
//! Live actors are capped too
//! ([`SupervisorPolicy::max_live_actors`](crate::policy::SupervisorPolicy::max_live_actors)):
//! past the cap, activations wait for a live actor to passivate, and one still starts every
//! [`OVER_CAP_EVERY`] so that actors which stay live cannot starve new objects.
//!
//! An activation goes to an idle actor — one that passivated and handed its object back
//! ([`ManagerMsg::Passivated`]) — when there is one, and spawns an actor only when there is none.
//! At 10k new objects, spawning and stopping an actor per object (allocations, a task, the link,
//! and two supervision events through this one serial mailbox) made the manager the bottleneck
//! of the first passes: ≈ 5 µs per object, where adopting costs two inbox messages. At most
//! [`Manager::idle_bound`] idle actors are kept; one past it is stopped.
//!
//! Every [`ManagerMsg`] reaches the manager through its batching [`inbox`], not ractor's message
//! port: one ractor receive hands over a batch, so a backlog does not wait a scheduler turn per
//! 128 messages (the module explains the measurement). Supervision events of the resource actors
//! still arrive through ractor, between batches.

use std::collections::VecDeque;
use std::sync::Arc;

use backon::ExponentialBackoff;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::sync::{OwnedSemaphorePermit, TryAcquireError};
use tokio::time::Instant;

use super::inbox::{self, Doorbell, Inbox};
use super::passive_timers::PassiveTimers;
use super::resource::{ResourceActor, ResourceArgs, key_hash};
use super::{FastMap, ManagedResource, Metrics, Shared, version_of};
use crate::messages::{Activation, ManagerMsg, PassiveState, ResourceMsg};
use crate::policy::Exhausted;
use crate::status::{Phase, ReadyReason, ResourceStatus};

/// Past the live-actor cap, one activation still starts this often (see
/// [`SupervisorPolicy::max_live_actors`](crate::policy::SupervisorPolicy::max_live_actors)).
const OVER_CAP_EVERY: std::time::Duration = std::time::Duration::from_millis(10);

/// While objects that ran before and new objects both wait for activation, every this-many-th
/// start goes to a new object (see [`Manager::pop_next`]).
const NEW_OBJECT_EVERY: u32 = 4;

/// The manager behaviour.
pub(crate) struct Manager<K: ManagedResource> {
    pub shared: Arc<Shared<K>>,
}

/// Start-up arguments: the manager's inbox (see [`inbox`]).
pub(crate) struct ManagerArgs<K: ManagedResource> {
    /// Binds, in `pre_start`, the sender the manager uses to message itself.
    pub inbox: inbox::Unbound<ManagerMsg<K>>,
    pub rx: inbox::Receiver<ManagerMsg<K>>,
}

/// Where one object's actor is in its life.
enum Life {
    /// In the activation queue, waiting for a run slot; with the state a passivated actor left.
    Queued(Option<PassiveState>),
    /// A live actor. `notified`: a notification found no route because the actor is
    /// passivating; it re-activates at once when it has stopped.
    Live { id: ActorId, notified: bool },
    /// No actor; its state kept here, and the token of its pending wake-up, if any (held by
    /// [`PassiveTimers`]).
    Passive(PassiveState, Option<u64>),
    /// Failed; a restart is scheduled.
    Restarting,
    /// Past the restart intensity; no restarts until the generation changes or it is deleted.
    Quarantined {
        generation: Option<i64>,
        deleting: bool,
    },
}

#[derive(Default)]
struct Restarts {
    failures: VecDeque<Instant>,
    backoff: Option<ExponentialBackoff>,
    last: Option<Instant>,
}

struct Slot {
    life: Life,
    /// Only for objects whose actor failed: most never do, and idle slots should stay small.
    restarts: Option<Box<Restarts>>,
}

/// Manager state: every known object's slot.
pub(crate) struct ManagerState<K: ManagedResource> {
    /// Where every [`ManagerMsg`] arrives (a [`Doorbell`] says it has some).
    rx: inbox::Receiver<ManagerMsg<K>>,
    /// Sends to this manager (timers, restarts, run slots for activations).
    me: Inbox<ManagerMsg<K>>,
    /// The pending wake-ups of passive objects.
    passive_timers: PassiveTimers<K>,
    slots: FastMap<ObjectRef<K>, Slot>,
    /// The actors serving an object, by actor.
    ids: FastMap<ActorId, ObjectRef<K>>,
    /// Actors that passivated and serve no object, ready to adopt the next activation (at most
    /// [`Manager::idle_bound`]); the last one in is the first out.
    idle: Vec<ActorRef<ResourceMsg<K>>>,
    wake_token: u64,
    /// New objects waiting for a run slot (their first activation), oldest first. In both
    /// queues a key whose slot is no longer `Queued` is skipped.
    queue: VecDeque<ObjectRef<K>>,
    /// Objects that ran before and passivated, waiting for a run slot to run again (notified,
    /// timer due, changed), oldest first. They come before new objects: see [`Manager::pop_next`].
    wakes: VecDeque<ObjectRef<K>>,
    /// Starts taken while both queues waited (every [`NEW_OBJECT_EVERY`]-th goes to `queue`).
    turn: u32,
    /// The timer task was asked for a run slot for the queue's head.
    awaiting_permit: bool,
    /// When the last activation past the live-actor cap started.
    over_cap_at: Option<Instant>,
    /// A [`ManagerMsg::Drain`] is scheduled for the next activation past the cap.
    drain_scheduled: bool,
}

fn is_news(ps: &PassiveState, version: Option<u64>) -> bool {
    super::is_news(ps.last_run_version, &ps.own_writes, version)
}

impl<K: ManagedResource> Manager<K> {
    /// Queue `key` for a live actor (`passive`: the state its last actor handed over).
    fn activate(
        &self,
        myself: &ActorRef<Doorbell>,
        st: &mut ManagerState<K>,
        key: ObjectRef<K>,
        passive: Option<PassiveState>,
    ) {
        if st.slots.len() == st.slots.capacity() {
            // A full map would double, rehash and touch fresh memory (and again at the next
            // power of two: at 10k new objects that was a third of the manager's time); grow
            // once to what the store holds, which bounds the objects there are slots for.
            let additional = self.shared.store.len().saturating_sub(st.slots.len());
            st.slots.reserve(additional.max(1));
        }
        let slot = st.slots.entry(key.clone()).or_insert_with(|| Slot {
            life: Life::Restarting,
            restarts: None,
        });
        if let Life::Passive(_, Some(_)) = &slot.life {
            st.passive_timers.cancel(key.clone());
        }
        if passive.is_some() {
            st.wakes.push_back(key);
        } else {
            st.queue.push_back(key);
        }
        slot.life = Life::Queued(passive);
        self.drain(myself, st);
    }

    /// Start queued activations while run slots are free; when none is, ask the timer task for
    /// the next ([`ManagerMsg::Permit`]). Passes of live actors wait for slots there too, and
    /// come first, but activations get a bounded share of the slots
    /// ([`ACTIVATION_EVERY`](super::timer::ACTIVATION_EVERY)).
    fn drain(&self, myself: &ActorRef<Doorbell>, st: &mut ManagerState<K>) {
        while self.skip_stale(st) && self.admit(st) {
            // A free slot is not enough while passes wait for slots in the timer task (the slot
            // is theirs) or activations are held back there because wake-ups run late.
            let free = if self.shared.timers.activation_may_skip_queue() {
                self.shared.runs.clone().try_acquire_owned()
            } else {
                Err(TryAcquireError::NoPermits)
            };
            match free {
                Ok(permit) => {
                    let key = Self::pop_next(st).expect("skip_stale left a head");
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

    /// Drop entries at the queues' heads whose object no longer waits (deleted, or already
    /// activated through a newer entry); `true` if a waiting one is at either head.
    fn skip_stale(&self, st: &mut ManagerState<K>) -> bool {
        let waits = |slots: &FastMap<ObjectRef<K>, Slot>, key: &ObjectRef<K>| {
            matches!(
                slots.get(key),
                Some(Slot {
                    life: Life::Queued(_),
                    ..
                })
            )
        };
        for queue in [&mut st.wakes, &mut st.queue] {
            while queue.front().is_some_and(|key| !waits(&st.slots, key)) {
                queue.pop_front();
            }
        }
        !(st.wakes.is_empty() && st.queue.is_empty())
    }

    /// The next key to activate (after [`Manager::skip_stale`]). Objects that ran before come
    /// first: they are making progress (a dependency turned Ready, a timer is due, the object
    /// changed), like the passes of live actors, which also come before activations. A burst
    /// of new objects — every object of a kind at start-up — would otherwise delay each step
    /// of the ones already going by the whole burst (a readiness hop down a dependency chain
    /// waited for every first pass queued before it). While both wait, every
    /// [`NEW_OBJECT_EVERY`]-th start is a new object, so neither side starves.
    fn pop_next(st: &mut ManagerState<K>) -> Option<ObjectRef<K>> {
        let new_object = match (st.wakes.is_empty(), st.queue.is_empty()) {
            (true, true) => return None,
            (false, true) => false,
            (true, false) => true,
            (false, false) => {
                st.turn = st.turn.wrapping_add(1);
                st.turn.is_multiple_of(NEW_OBJECT_EVERY)
            }
        };
        if new_object {
            st.queue.pop_front()
        } else {
            st.wakes.pop_front()
        }
    }

    /// Spawn the actor of a queued key; its first pass runs on `permit`.
    fn start(
        &self,
        myself: &ActorRef<Doorbell>,
        st: &mut ManagerState<K>,
        key: ObjectRef<K>,
        permit: OwnedSemaphorePermit,
    ) {
        let passive = match st.slots.get_mut(&key).map(|s| &mut s.life) {
            Some(Life::Queued(passive)) => passive.take(),
            _ => return,
        };
        if self.shared.store.get(&key).is_none() {
            st.slots.remove(&key); // deleted while it waited
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
                    st.slots.remove(&key);
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
                st.slots.remove(&key);
            }
        }
    }

    /// Record that actor `id` serves `key` now (it inserts its route itself, as it starts).
    fn serve(&self, st: &mut ManagerState<K>, key: ObjectRef<K>, id: ActorId) {
        if let Some(slot) = st.slots.get_mut(&key) {
            slot.life = Life::Live {
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
            .max_concurrent_runs
            .min(policy.max_live_actors.unwrap_or(usize::MAX))
    }

    /// A resource actor handed its object back ([`ManagerMsg::Passivated`]): keep the actor for
    /// the next activation (or stop it past [`Manager::idle_bound`]), and settle the object as
    /// a stopped actor's would be.
    fn passivated(
        &self,
        myself: &ActorRef<Doorbell>,
        st: &mut ManagerState<K>,
        actor: ActorRef<ResourceMsg<K>>,
        ps: PassiveState,
    ) {
        let id = actor.get_id();
        let key = self.retire(st, id);
        if st.idle.len() < self.idle_bound() {
            st.idle.push(actor);
        } else {
            actor.stop(Some("idle".into()));
        }
        let Some(key) = key else { return };
        let notified = match st.slots.get(&key).map(|s| &s.life) {
            Some(Life::Live { id: live, notified }) if *live == id => *notified,
            _ => return,
        };
        self.settle_passive(myself, st, key, ps, notified);
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
    /// a pass for it (the store shows nothing new for a dependency turning Ready).
    fn settle_passive(
        &self,
        myself: &ActorRef<Doorbell>,
        st: &mut ManagerState<K>,
        key: ObjectRef<K>,
        mut ps: PassiveState,
        notified: bool,
    ) {
        let Some(obj) = self.shared.store.get(&key) else {
            st.slots.remove(&key);
            return;
        };
        ps.pending_run |= notified;
        if ps.pending_run || is_news(&ps, version_of(obj.as_ref())) {
            self.activate(myself, st, key, Some(ps));
            return;
        }
        let timer = ps.wake_in.map(|d| {
            st.wake_token += 1;
            st.passive_timers.arm(key.clone(), st.wake_token, d);
            st.wake_token
        });
        if let Some(slot) = st.slots.get_mut(&key) {
            slot.life = Life::Passive(ps, timer);
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
                // A serving actor stops only when its object is gone (or at shutdown): forget
                // the object. (Passivation hands the object back without stopping.)
                if matches!(
                    st.slots.get(&key).map(|s| &s.life),
                    Some(Life::Live { id: live, .. }) if *live == id
                ) {
                    st.slots.remove(&key);
                }
            }
            SupervisionEvent::ActorFailed(cell, err) => {
                // A failed actor ran no `post_stop`: drop its timer here.
                self.shared.timers.cancel(cell.get_id());
                let Some(key) = self.retire(st, cell.get_id()) else {
                    return Ok(());
                };
                Metrics::dec(&self.shared.metrics.live_actors);
                self.on_failure(st, key, err.to_string())?;
            }
            _ => {}
        }
        Ok(())
    }

    /// The object was deleted from the API.
    fn gone(&self, st: &mut ManagerState<K>, key: ObjectRef<K>) {
        if let Some(slot) = st.slots.get_mut(&key) {
            match &mut slot.life {
                Life::Live { .. } => {
                    // Not routed if it is passivating: then it finds the object gone from the
                    // store when it has stopped.
                    self.forward(&key, ResourceMsg::Gone);
                }
                Life::Passive(_, Some(_)) => {
                    st.slots.remove(&key);
                    st.passive_timers.cancel(key);
                }
                _ => {
                    st.slots.remove(&key);
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

    fn on_failure(
        &self,
        st: &mut ManagerState<K>,
        key: ObjectRef<K>,
        error: String,
    ) -> Result<(), ActorProcessingErr> {
        let policy = &self.shared.policy.restart;
        let now = Instant::now();
        let slot = st.slots.entry(key.clone()).or_insert_with(|| Slot {
            life: Life::Restarting,
            restarts: None,
        });
        let r = slot.restarts.get_or_insert_default();
        if r.last
            .is_some_and(|l| now.duration_since(l) >= policy.backoff.reset_after)
        {
            r.backoff = None;
        }
        r.last = Some(now);
        r.failures.push_back(now);
        while r
            .failures
            .front()
            .is_some_and(|t| now.duration_since(*t) > policy.window)
        {
            r.failures.pop_front();
        }
        tracing::warn!(object = %key, error = %error, failures = r.failures.len(), "resource actor failed");
        if r.failures.len() as u32 > policy.max_restarts {
            match policy.on_exhausted {
                Exhausted::Escalate => {
                    return Err(format!(
                        "restart intensity exceeded for {key} ({} failures within {:?}): {error}",
                        r.failures.len(),
                        policy.window
                    )
                    .into());
                }
                Exhausted::Quarantine => {
                    let obj = self.shared.store.get(&key);
                    slot.life = Life::Quarantined {
                        generation: obj.as_ref().and_then(|o| o.meta().generation),
                        deleting: obj
                            .as_ref()
                            .is_some_and(|o| o.meta().deletion_timestamp.is_some()),
                    };
                    Metrics::inc(&self.shared.metrics.quarantined);
                    if let Some(obj) = obj {
                        let message = format!(
                            "the resource's actor failed {} times within {}s; not restarted until the resource changes",
                            r.failures.len(),
                            policy.window.as_secs()
                        );
                        quarantine_status(self.shared.clone(), obj, message);
                    }
                    return Ok(());
                }
            }
        }
        let seed = self.shared.policy.seed.map(|s| s ^ key_hash(&key));
        let delay = r
            .backoff
            .get_or_insert_with(|| policy.backoff.sequence(seed))
            .next()
            .unwrap_or(policy.backoff.max);
        slot.life = Life::Restarting;
        let me = st.me.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            me.send(ManagerMsg::Restart(key));
        });
        Ok(())
    }

    /// Handle one message from the inbox.
    fn handle_msg(
        &self,
        myself: &ActorRef<Doorbell>,
        msg: ManagerMsg<K>,
        st: &mut ManagerState<K>,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ManagerMsg::Event(key) => {
                let Some(slot) = st.slots.get_mut(&key) else {
                    // New: the feeder stored it before routing it here. (Deleted since, it is
                    // dropped from the queue when its turn comes: `start` reads the store.)
                    self.activate(myself, st, key, None);
                    return Ok(());
                };
                match &mut slot.life {
                    Life::Live { .. } => {
                        // No route: it is passivating, and looks at the store once stopped.
                        if let Some(obj) = self.shared.store.get(&key) {
                            self.forward(&key, ResourceMsg::Observed(obj));
                        }
                    }
                    Life::Passive(ps, _) => {
                        // Most such events are the watch echoes of the actor's own last writes:
                        // nothing to run, and its timer stays armed as it was (settling again
                        // would re-arm it later, and leave the old timer task sleeping).
                        let news = self
                            .shared
                            .store
                            .get(&key)
                            .is_none_or(|obj| is_news(ps, version_of(obj.as_ref())));
                        if news {
                            let ps = std::mem::take(ps);
                            self.settle_passive(myself, st, key, ps, false);
                        }
                    }
                    // The actor to come reads the store.
                    Life::Queued(_) | Life::Restarting => {}
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
                            slot.restarts = None;
                            self.activate(myself, st, key, None);
                        }
                    }
                }
            }
            ManagerMsg::Gone(key) => self.gone(st, key),
            ManagerMsg::Resync(existing) => {
                let gone: Vec<ObjectRef<K>> = st
                    .slots
                    .keys()
                    .filter(|k| !existing.contains(*k))
                    .cloned()
                    .collect();
                for key in gone {
                    self.gone(st, key);
                }
            }
            ManagerMsg::Restart(key) => {
                if matches!(st.slots.get(&key).map(|s| &s.life), Some(Life::Restarting)) {
                    if self.shared.store.get(&key).is_some() {
                        Metrics::inc(&self.shared.metrics.restarts);
                        self.activate(myself, st, key, None);
                    } else {
                        st.slots.remove(&key);
                    }
                }
            }
            ManagerMsg::Notify(key) => {
                if let Some(slot) = st.slots.get_mut(&key) {
                    match &mut slot.life {
                        Life::Live { notified, .. } => {
                            if !self.forward(&key, ResourceMsg::Notify) {
                                *notified = true; // passivating: run again once stopped
                            }
                        }
                        Life::Passive(ps, _) => {
                            let mut ps = std::mem::take(ps);
                            ps.pending_run = true;
                            self.activate(myself, st, key, Some(ps));
                        }
                        // A first activation runs anyway; a re-activation is told to.
                        Life::Queued(ps) => {
                            if let Some(ps) = ps {
                                ps.pending_run = true;
                            }
                        }
                        Life::Restarting | Life::Quarantined { .. } => {}
                    }
                }
            }
            ManagerMsg::PassiveWake(key, token) => {
                if let Some(Slot {
                    life: Life::Passive(ps, timer @ Some(_)),
                    ..
                }) = st.slots.get_mut(&key)
                    && *timer == Some(token)
                {
                    *timer = None; // fired: nothing to cancel
                    let mut ps = std::mem::take(ps);
                    ps.pending_run = true;
                    ps.wake_in = None;
                    self.activate(myself, st, key, Some(ps));
                }
            }
            ManagerMsg::Passivated(actor, ps) => self.passivated(myself, st, actor, ps),
            ManagerMsg::Drain => {
                st.drain_scheduled = false;
                self.drain(myself, st);
            }
            ManagerMsg::Permit(permit) => {
                st.awaiting_permit = false;
                if self.skip_stale(st) {
                    let key = Self::pop_next(st).expect("skip_stale left a head");
                    self.start(myself, st, key, permit);
                }
                self.drain(myself, st);
            }
        }
        Ok(())
    }
}

/// Write phase Failed / reason Quarantined (best effort, off the manager's mailbox).
fn quarantine_status<K: ManagedResource>(shared: Arc<Shared<K>>, obj: Arc<K>, message: String) {
    tokio::spawn(async move {
        let status = ResourceStatus::of(obj.as_ref()).with_ready(
            Phase::Failed,
            false,
            ReadyReason::Quarantined,
            message,
            obj.meta().generation,
        );
        let api = shared.api(&obj);
        match api
            .patch_status(
                &obj.name_any(),
                &PatchParams::default(),
                &Patch::Merge(status.patch()),
            )
            .await
        {
            Ok(_) => Metrics::inc(&shared.metrics.status_writes),
            Err(e) => tracing::warn!(error = %e, "could not write quarantine status"),
        }
    });
}

impl<K: ManagedResource> Actor for Manager<K> {
    type Msg = Doorbell;
    type State = ManagerState<K>;
    type Arguments = ManagerArgs<K>;

    async fn pre_start(
        &self,
        myself: ActorRef<Doorbell>,
        args: ManagerArgs<K>,
    ) -> Result<Self::State, ActorProcessingErr> {
        let me = args.inbox.bind(myself);
        Ok(ManagerState {
            rx: args.rx,
            passive_timers: PassiveTimers::start(me.clone()),
            me,
            slots: FastMap::default(),
            ids: FastMap::default(),
            idle: Vec::new(),
            wake_token: 0,
            queue: VecDeque::new(),
            wakes: VecDeque::new(),
            turn: 0,
            awaiting_permit: false,
            over_cap_at: None,
            drain_scheduled: false,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Doorbell>,
        _: Doorbell,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        st.rx.open();
        let mut handled = 0;
        while handled < inbox::BATCH
            && let Some(msg) = st.rx.next()
        {
            handled += 1;
            if let Err(e) = self.handle_msg(&myself, msg, st) {
                st.passive_timers.flush();
                return Err(e);
            }
        }
        st.passive_timers.flush();
        if handled == inbox::BATCH {
            // More may be queued: ring again, so supervision events queued meanwhile go first.
            st.me.ring();
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
        result
    }
}
