//! Passivation: an actor handing its object back (or vacating a deleted one), the manager keeping
//! what it needs of the passive object, idle actors kept for the next activation.

use super::*;

impl<K: ManagedResource> Manager<K> {
    /// A resource actor handed its object back ([`ManagerMsg::Passivated`]): keep the actor for
    /// the next activation (or stop it past [`Manager::idle_bound`]), and settle the object as
    /// a stopped actor's would be.
    pub(super) fn passivated(
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
    pub(super) fn vacated(
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
                // Created again under the same name.
                self.activate(myself, st, key, None, false, Trigger::Created);
            }
        }
        // An actor is at hand now for an activation that waited for one.
        self.drain(myself, st);
    }

    /// Keep `actor`, which serves nothing now, idle for the next activation, or stop it past
    /// [`Manager::idle_bound`].
    pub(super) fn keep_idle(&self, st: &mut ManagerState<K>, actor: ActorRef<ResourceMsg<K>>) {
        if st.idle.len() < self.idle_bound() {
            st.idle.push(actor);
        } else {
            actor.stop(Some("idle".into()));
        }
    }

    /// An actor stopped or failed: drop its route, and return its object's key (`None` if the
    /// actor was not one of ours). A stopped actor dropped its own timer in `post_stop`.
    pub(super) fn retire(&self, st: &mut ManagerState<K>, id: ActorId) -> Option<ObjectRef<K>> {
        let key = st.ids.remove(&id)?;
        self.shrink_if_sparse(st);
        self.shared.routes.remove_if(&key, |_, a| a.get_id() == id);
        Some(key)
    }

    /// After a wave of passivations the actor-indexed maps keep their peak capacity (about
    /// 100 bytes per slot); give it back once they are mostly empty.
    pub(super) fn shrink_if_sparse(&self, st: &mut ManagerState<K>) {
        const MIN: usize = 1024;
        if st.ids.capacity() > MIN && st.ids.capacity() > 8 * st.ids.len() {
            st.ids.shrink_to(2 * st.ids.len());
            self.shared.routes.shrink_to_fit();
        }
    }

    /// Passive or stopped actor: decide from the store whether to re-activate now.
    /// `notified`: a notification came while the actor was passivating; the next actor must run
    /// a reconcile for it (the store shows nothing new for a dependency turning Ready).
    pub(super) fn passivate_or_reactivate(
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
        if notified && !ps.reconcile_due {
            ps.reconcile_due = true;
            ps.due = Some(Cause::of(Trigger::Again));
        }
        if ps.reconcile_due || is_news(&ps, version_of(obj.as_ref())) {
            self.activate(myself, st, key, Some(ps), false, Trigger::Changed);
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
    pub(super) fn encode_later(&self, st: &mut ManagerState<K>, key: ObjectRef<K>, obj: Arc<K>) {
        if self.shared.rules.encode_passive {
            st.to_encode.push((key, obj));
        }
    }

    /// Encode the cached copies of the objects that went passive in this batch, in a task of
    /// its own (a few microseconds each, which the manager's mailbox need not wait for). One
    /// that changed meanwhile stays whole: [`KindStore::encode`](super::KindStore::encode)
    /// encodes only the version given.
    pub(super) fn encode_passive(&self, st: &mut ManagerState<K>) {
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
}
