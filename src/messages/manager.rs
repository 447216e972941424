//! Messages a manager supervisor receives.

use std::collections::HashSet;
use std::time::Duration;

use kube::runtime::reflector::ObjectRef;
use ractor::ActorRef;

use super::{Cause, ReconcilePermit, ResourceMsg, Trigger};

/// What a resource actor remembers across passivation (everything else is in the reflector
/// store): the versions it has already handled, so a re-activation does not redo finished work.
#[derive(Clone, Debug, Default)]
pub struct PassiveState {
    /// `metadata.resourceVersion` of the object the last reconcile ran on.
    pub last_reconciled_version: Option<u64>,
    /// Resource versions produced by the actor's own writes (their watch echoes do not re-run).
    pub own_writes: Vec<u64>,
    /// Consecutive transient failures (the error backoff position).
    pub error_attempts: u32,
    /// A pending wake-up, as a delay from the moment of passivation.
    pub wake_in: Option<Duration>,
    /// A reconcile was due when the actor passivated (re-activate at once).
    pub reconcile_due: bool,
    /// Why the reconcile is due, when it is.
    pub due: Option<Cause>,
    /// What the pending wake-up is for (with `wake_in`).
    pub wake_for: Option<Trigger>,
    /// `metadata.generation` of the object the last reconcile ran on (a re-activation tells a
    /// spec change from another change by it).
    pub last_generation: Option<i64>,
}

/// The only ractor message of a manager: its mailbox has mail (see `src/actors/mailbox.rs`).
#[derive(Debug)]
pub struct MailWaiting;

/// What a manager supervisor handles. Resource actors are its linked children; their failures
/// reach it as supervision events, not messages.
#[derive(Debug)]
#[non_exhaustive]
pub enum ManagerMsg<K: kube::Resource<DynamicType = ()>> {
    /// The feeder has an event for an object without a live actor (new, passive, restarting,
    /// quarantined): activate it if appropriate.
    Event(ObjectRef<K>),
    /// The start-up list found an object without a live actor: activate it behind changes (its
    /// first reconcile only confirms it is as it should be).
    Listed(ObjectRef<K>),
    /// An object without a live actor was deleted from the API.
    Gone(ObjectRef<K>),
    /// After a (re-)list of a namespace (`None`: of every namespace), the keys that exist;
    /// every other known key of that namespace is gone.
    Resync(HashSet<ObjectRef<K>, ahash::RandomState>, Option<String>),
    /// The restart backoff of this key elapsed.
    Restart(ObjectRef<K>),
    /// Wake this key, for this cause (dependency ready, reference released, a related object
    /// or a Secret changed, someone asked).
    Notify(ObjectRef<K>, Cause),
    /// Re-run every known object (the controller's provider config changed). Each is woken as
    /// by [`ManagerMsg::Notify`], so their reconciles wait for reconcile slots like any other.
    Broadcast,
    /// A passive key's timer fired (token guards against stale timers).
    PassiveWake(ObjectRef<K>, u64),
    /// A reconcile slot for the next queued activation (an object gets a live actor only once it can
    /// run: see the manager's activation queue).
    Permit(ReconcilePermit),
    /// A resource actor passivated: it serves no object now, and hands back what its object's
    /// next activation needs. The manager re-activates the object if anything came in
    /// meanwhile, and gives the actor the next activation (or keeps it idle, or stops it).
    Passivated(ActorRef<ResourceMsg<K>>, PassiveState),
    /// A resource actor's object is gone from the API: the actor serves nothing now. The
    /// manager forgets the object and gives the actor the next activation (or keeps it idle, or
    /// stops it), as after [`ManagerMsg::Passivated`].
    Vacated(ActorRef<ResourceMsg<K>>),
    /// Self-message: the live-actor cap lets the next queued activation start now (see
    /// [`KindPolicy::max_live_actors`](crate::policy::KindPolicy::max_live_actors)).
    Drain,
    /// This replica acquired shard `n` ([`crate::sharding`]): run every object of the shard.
    ShardAcquired(u32),
}
