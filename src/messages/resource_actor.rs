//! Messages a resource actor receives.

use std::sync::Arc;

use kube::runtime::reflector::ObjectRef;

use super::{Cause, PassiveState, ReconcilePermit, ReconcileSlot, TimerMsg, Trigger};

/// What a resource actor handles, one at a time, so one object never has two runs at once.
#[derive(Debug)]
#[non_exhaustive]
pub enum ResourceMsg<K: kube::Resource<DynamicType = ()>> {
    /// The watch feeder observed a new version of the object.
    Observed(Arc<K>),
    /// The watch feeder observed a new version of the object that the kind's type cannot hold
    /// (cached as undecodable: the actor reads it from the store).
    Undecodable,
    /// The object is gone from the API: keep nothing of it and go back to the manager idle
    /// ([`ManagerMsg::Vacated`](super::ManagerMsg::Vacated)).
    Gone,
    /// Self-message: run a reconcile now if one is due (coalesces any number of triggers).
    Reconcile,
    /// The pending timer with this token fired (stale tokens are ignored), with the reconcile slot the
    /// timer task acquired for the reconcile.
    Wake(u64, Option<ReconcileSlot>),
    /// The reconcile slot a reconcile that found none free asked the timer task for.
    Slot(Option<ReconcileSlot>),
    /// Run now, for this cause: a dependency became Ready, a referrer released this object, a
    /// related object or a Secret changed, the config changed, or someone asked.
    Notify(Cause),
    /// Self-message, sent once the actor has removed its route (so nothing new is routed here):
    /// hand the object back to the manager now, as a [`PassiveState`](super::PassiveState) in
    /// [`ManagerMsg::Passivated`](super::ManagerMsg::Passivated). Everything routed here before
    /// it is handled first.
    Passivate,
    /// From the manager, to an actor that passivated and now serves no object: serve this one
    /// (an activation, as if the actor had just been spawned for it).
    Adopt(Box<Activation<K>>),
}

/// One activation of an object: what an actor is given to serve it, when spawned for it or when
/// it adopts it ([`ResourceMsg::Adopt`]).
#[derive(Debug)]
pub struct Activation<K: kube::Resource<DynamicType = ()>> {
    /// The object.
    pub key: ObjectRef<K>,
    /// State handed back at passivation (`None` for a first activation or a restart).
    pub passive: Option<PassiveState>,
    /// The reconcile slot the manager acquired for the first reconcile.
    pub permit: Option<ReconcilePermit>,
    /// Why the object was activated, when it has no passive state (a new object, a listed
    /// one, a restart, a shard acquired); a passive one says in its [`PassiveState::due`].
    pub trigger: Trigger,
}

/// Timer deliveries ([`ResourceMsg::Wake`]) and reconcile slots asked for ([`ResourceMsg::Slot`])
/// carry the reconcile slot the timer task acquired.
impl<K> TimerMsg for ResourceMsg<K>
where
    K: kube::Resource<DynamicType = ()> + std::fmt::Debug + Send + Sync + 'static,
{
    fn give_slot(&mut self, slot: ReconcileSlot) {
        if let ResourceMsg::Wake(_, s) | ResourceMsg::Slot(s) = self {
            *s = Some(slot);
        }
    }
}
