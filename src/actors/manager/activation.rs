//! Activation: an object queued for a live actor, admitted as reconcile slots allow, and served by an
//! idle actor adopted or a new one spawned.

use super::*;

impl<K: ManagedResource> Manager<K> {
    /// Queue `key` for a live actor (`passive`: the state its last actor handed over), behind
    /// changes if it was `listed` (see [`ActivationQueue`]). `trigger`: why, for an object
    /// without a passive state (a passive one carries its own, [`PassiveState::due`]).
    pub(super) fn activate(
        &self,
        myself: &ActorRef<MailWaiting>,
        st: &mut ManagerState<K>,
        key: ObjectRef<K>,
        passive: Option<PassiveState>,
        listed: bool,
        trigger: Trigger,
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
        let share = self.shared.share_of(&key);
        if listed {
            st.activations.push_listed(share, key);
        } else if passive.is_some() {
            st.activations.push_again(share, key);
        } else {
            st.activations.push_new(share, key);
        }
        entry.life = Life::Queued {
            passive: passive.map(Box::new),
            listed,
            trigger,
        };
        self.drain(myself, st);
    }

    /// Start queued activations while reconcile slots are free; when none is, ask the timer task for
    /// the next ([`ManagerMsg::Permit`]). Reconciles of live actors wait for slots there too, and
    /// come first, but activations get a bounded share of the slots
    /// (`SlotQueue`, [`crate::scheduling`]).
    pub(super) fn drain(&self, myself: &ActorRef<MailWaiting>, st: &mut ManagerState<K>) {
        while Self::skip_stale(st) && Self::actor_at_hand(st) && self.admit(st) {
            // A free slot is not enough while reconciles wait for slots in the timer task (the slot
            // is theirs) or activations are held back there because wake-ups run late.
            let free = if self.shared.timers.activation_may_skip_queue() {
                self.shared.slots.try_acquire()
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
    pub(super) fn actor_at_hand(st: &ManagerState<K>) -> bool {
        !st.idle.is_empty() || !st.rx.back_pending()
    }

    /// Whether the queue's head may get a live actor now: below the live-actor cap, or once
    /// per [`OVER_CAP_EVERY`] past it (a [`ManagerMsg::Drain`] is scheduled for then).
    pub(super) fn admit(&self, st: &mut ManagerState<K>) -> bool {
        if self
            .shared
            .rules
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
    pub(super) fn skip_stale(st: &mut ManagerState<K>) -> bool {
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
    pub(super) fn start(
        &self,
        myself: &ActorRef<MailWaiting>,
        st: &mut ManagerState<K>,
        key: ObjectRef<K>,
        permit: ReconcilePermit,
    ) {
        if self.shared.slots.is_closed() {
            // Shutting down: a slot handed out before the runs closed starts nothing new.
            return;
        }
        let (passive, trigger) = match st.objects.get_mut(&key).map(|s| &mut s.life) {
            Some(Life::Queued {
                passive, trigger, ..
            }) => (passive.take().map(|ps| *ps), *trigger),
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
            trigger,
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
    pub(super) fn serve(&self, st: &mut ManagerState<K>, key: ObjectRef<K>, id: ActorId) {
        if let Some(entry) = st.objects.get_mut(&key) {
            entry.life = Life::Live {
                id,
                notified: false,
            };
        }
        st.ids.insert(id, key);
    }

    /// How many idle actors are kept for the next activations: one per reconcile slot (more could not
    /// run at once), and never past the live-actor cap.
    pub(super) fn idle_bound(&self) -> usize {
        (self.shared.slots.capacity()).min(
            self.shared
                .rules
                .policy
                .max_live_actors
                .unwrap_or(usize::MAX),
        )
    }
}
