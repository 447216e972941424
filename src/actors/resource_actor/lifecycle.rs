//! The resource actor's life: an activation begun, passivation, abandoning an object whose
//! shard is lost, going back to the manager idle.

use super::*;

impl<K: ManagedResource> ResourceActor<K> {
    /// Passivate if there is nothing to do for at least the idle timeout (see the module
    /// docs): no reconcile due, no wake-up due sooner.
    pub(super) fn maybe_passivate(
        &self,
        myself: &ActorRef<ResourceMsg<K>>,
        st: &mut ResourceState<K>,
    ) {
        let Some(idle) = self.shared.rules.policy.idle_timeout else {
            return;
        };
        if st.passivating
            || st.dirty
            || st.reconcile_queued
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
    pub(super) fn start_passivating(
        &self,
        myself: &ActorRef<ResourceMsg<K>>,
        st: &mut ResourceState<K>,
    ) {
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
    pub(super) fn begin(
        &self,
        myself: &ActorRef<ResourceMsg<K>>,
        manager: Mailbox<ManagerMsg<K>>,
        activation: Activation<K>,
        wake: PendingWakeUp,
    ) -> ResourceState<K> {
        self.shared.io.metrics.actor_started();
        let Activation {
            key,
            passive,
            permit,
            trigger,
        } = activation;
        // The actor's own route, not the manager's: it must exist before the first reconcile can end
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
            last_reconciled_version: None,
            own_writes: Vec::new(),
            status_fields: serde_json::Map::new(),
            dirty: false,
            due_since: None,
            cause: None,
            wake_for: None,
            generation: None,
            reconcile_queued: false,
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
        match passive {
            Some(p) => {
                if p.reconcile_due {
                    st.mark_due(p.due.unwrap_or(Cause::of(Trigger::Again)));
                }
                st.last_reconciled_version = p.last_reconciled_version;
                st.own_writes = p.own_writes;
                st.error_attempts = p.error_attempts;
                st.generation = p.last_generation;
                if let Some(d) = p.wake_in {
                    let wake_for = p.wake_for.unwrap_or(Trigger::Requeue);
                    self.schedule_wake(myself, &mut st, d, wake_for);
                }
            }
            None => st.cause = Some(Cause::of(trigger)),
        }
        st
    }

    /// An activation's first reconcile, if its object has news (or a reconcile was pending), then
    /// passivation if nothing is due soon. An object gone meanwhile vacates the actor.
    pub(super) async fn first_reconcile(
        &self,
        myself: &ActorRef<ResourceMsg<K>>,
        st: &mut ResourceState<K>,
    ) {
        let version = match (&st.object, &st.undecodable) {
            (_, Some(u)) => crate::object_api::meta_version(&u.meta),
            (Some(obj), None) => version_of(obj.as_ref()),
            (None, None) => {
                self.vacate(myself, st);
                return;
            }
        };
        if st.dirty || st.is_news(version) {
            // The first reconcile runs right here, on the manager's reconcile slot (no `Reconcile` hop); what
            // arrives meanwhile coalesces into one follow-up run. Why: the activation's, or a
            // passivated object's change since its last reconcile.
            let cause = st.cause.take().unwrap_or_else(|| {
                Cause::of(match (&st.object, &st.undecodable) {
                    (Some(obj), None) => change_since(obj.as_ref(), st.generation, false),
                    _ => Trigger::Changed,
                })
            });
            st.mark_due(cause);
            self.reconcile_if_due(myself, st, None).await;
        }
        self.maybe_passivate(myself, st);
    }

    /// The object's shard is not held here any more ([`crate::sharding`]): drop what is due and
    /// hand the object back (the manager then forgets it), whatever the idle timeout.
    pub(super) fn abandon(&self, myself: &ActorRef<ResourceMsg<K>>, st: &mut ResourceState<K>) {
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
    pub(super) fn hand_back(&self, myself: &ActorRef<ResourceMsg<K>>, st: &mut ResourceState<K>) {
        let state = PassiveState {
            last_reconciled_version: st.last_reconciled_version,
            own_writes: std::mem::take(&mut st.own_writes),
            error_attempts: st.error_attempts,
            wake_in: st
                .wake
                .deadline()
                .map(|at| at.saturating_duration_since(Instant::now())),
            reconcile_due: st.dirty || st.reconcile_queued,
            due: st.cause.take(),
            wake_for: st.wake_for,
            last_generation: st.object.as_ref().and_then(|o| o.meta().generation),
        };
        // The manager keeps the wake-up now (the actor's timer would reach the next object).
        self.let_go(myself, st);
        Metrics::inc(&self.shared.io.metrics.passivations);
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
    pub(super) fn vacate(&self, myself: &ActorRef<ResourceMsg<K>>, st: &mut ResourceState<K>) {
        if let Some(reports) = &self.shared.reports {
            reports.gone(&st.key);
        }
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
    pub(super) fn let_go(&self, myself: &ActorRef<ResourceMsg<K>>, st: &mut ResourceState<K>) {
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
        Metrics::dec(&self.shared.io.metrics.live_actors);
    }
}
