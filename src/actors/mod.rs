//! The actors: a manager supervisor per kind, a resource actor per object, and the watch feeder
//! that turns kube-runtime watch events into messages. When reconciles start (reconcile slots, the
//! timer task, the activation queue) is [`crate::scheduling`]'s.
//!
//! # Where things are
//!
//! Follow one watch event: `kind_start.rs` starts a kind (its watches, its manager), `feeder.rs`
//! turns the event into a message, `manager/` routes it to the object's actor,
//! `resource_actor/reconcile.rs` runs the reconcile, [`crate::writes`] writes its status.
//!
//! | file | what it holds |
//! |---|---|
//! | `kind_spec.rs` | one kind as [`Controller`](crate::runtime::Controller) collects it: its tree, options and type-erased parts |
//! | `kind_start.rs` | one kind's start-up: watches, store, manager, triggers, from its `KindSpec` |
//! | `kind_view.rs` | a kind as the reference index sees it: readiness, existence, notification |
//! | `root.rs` | the root actor, parent of every manager; escalations end there |
//! | `manager/` | the manager supervisor: message handling and routing (`mod.rs`), activation, passivation, supervision |
//! | `object_map.rs` | the manager's entry per known object, by name and namespace |
//! | `passive_state.rs` | what the manager keeps of a passive object, small when nothing is pending (plain data) |
//! | `mailbox.rs` | the manager's batching mailbox, in three lanes that take turns |
//! | `resource_actor/` | the resource actor: its messages (`mod.rs`), activation and passivation (`lifecycle.rs`), one reconcile and its status (`reconcile.rs`), deletion (`deletion.rs`) |
//! | `feeder.rs` | watch events into messages, routed by a concurrent map |
//! | `inspect.rs` | what the introspection ([`crate::introspect`]) reports of an object: its last reconcile, as its actor recorded it, with what the rest of the kind knows |
//! | `watches/` | the watches behind a controller's triggers: its provider config (`config.rs`), the Secrets its objects reference (`secrets.rs`), its children and related objects (`related.rs`) |
//! | `*_tests.rs`, `test_kind.rs` | the tests of the feeder, the manager and the reconcile, beside them; `test_kind.rs` starts one kind through `kind_start.rs` on the in-process API server |
//!
//! Dependencies run one way: the actors use [`crate::messages`] (plain data),
//! [`crate::scheduling`], [`crate::policy`], [`crate::provisioners`], [`crate::references`] and [`crate::status`];
//! none of those imports the actors. [`crate::runtime`] starts them, kind by kind, through
//! `kind_start.rs`.
//!
//! # Glossary
//!
//! - **Reconcile**: one run of the provisioner tree (provision, or deprovision when deleting) for one
//!   object. One object never has two reconciles at once.
//! - **Reconcile slot**: a permit of the runtime's `max_concurrent_reconciles` semaphore; every reconcile runs on
//!   one. Due wake-ups and activations wait for slots in the timer task ([`crate::scheduling`]).
//! - **Wake-up**: a resource actor's scheduled self-message (a yield, an error backoff, a poll,
//!   a dependency's fallback re-check). At most one is pending; the earliest wins.
//! - **Activation**: an object gets a live actor to serve it (its first, after passivation, or
//!   after a restart). It waits in the manager's activation queue for a reconcile slot, and its first
//!   reconcile runs on that slot.
//! - **Passivation**: an actor with nothing due within the policy's `idle_timeout` hands its
//!   object back to the manager (the object stays in the kind's cache; its pending wake-up
//!   and what it has already handled are kept by the manager as a `PassiveState`). The next
//!   event, wake-up or notification activates it again (the virtual-actor idea of Orleans and
//!   Akka cluster sharding).
//! - **Idle actor, adopt**: an actor that passivated is not stopped: it stays linked to the
//!   manager, serving no object, and *adopts* the next activation of any object of its kind (a
//!   message instead of a spawn, a stop and two supervision events). The manager keeps at most
//!   one idle actor per reconcile slot. To users it is still one actor per resource; the metrics tell
//!   activations from spawns.
//! - **Held back**: while reconciles start well after they were due (the runtime is CPU-bound),
//!   activations get a smaller share of the reconcile slots ([`crate::scheduling`]).
//! - **Mailbox, mail waiting**: the manager's messages go through a batching channel; the one
//!   ractor message it receives, `MailWaiting`, says that the mailbox has mail (`mailbox.rs`).
//! - **Route**: the feeder's map from object key to the actor serving it. A passive object has no
//!   route; its events go to the manager.
//! - **Shard, owned** (with [`crate::sharding`]): an object is *owned* while this replica
//!   holds its shard. The manager keeps nothing of objects it does not own (it only reconciles
//!   their readiness to the reference index); a reconcile starts only on an owned object, runs
//!   through its shard's fenced client, and is abandoned (dropped) the moment the shard is
//!   lost. A shard acquired runs all its objects ([`ManagerMsg::ShardAcquired`](crate::messages::ManagerMsg)).
//! - **Own writes, echo**: the resource versions produced by the actor's own writes. Their watch
//!   events (echoes) are not news and run no reconcile.

mod feeder;
#[cfg(test)]
mod feeder_tests;
mod inspect;
mod kind_spec;
mod kind_start;
pub(crate) mod mailbox;
pub use kind_spec::HookError;
pub(crate) use kind_spec::{ConfigSpec, KindSpec, RelatedSpec, boxed_hook};
pub(crate) use kind_start::{ShardClients, Start, StartCx, Started};
mod kind_view;
mod manager;
#[cfg(test)]
mod manager_tests;
mod object_map;
mod passive_state;
pub(crate) mod resource_actor;
#[cfg(test)]
mod resource_tests;
mod root;
pub(crate) use root::{ManagerFailure, Root};
#[cfg(test)]
pub(crate) mod test_kind;
pub(crate) use crate::cache::KindStore;
pub(crate) mod watches;
#[cfg(test)]
mod watches_config_tests;
#[cfg(test)]
mod watches_tests;

use std::sync::Arc;

use dashmap::DashMap;
use kube::runtime::reflector::ObjectRef;
use ractor::ActorRef;

use crate::ManagedResource;
use crate::messages::ResourceMsg;
use crate::policy::KindPolicy;
use crate::provisioners::BoxProvisioner;
use crate::references::ReferenceIndex;
use crate::sharding::ShardScope;

pub(crate) use crate::counters::{KindMetrics, Metrics};
pub(crate) use crate::object_api::version_of;
pub(crate) use crate::scheduling::{ReconcileSlots, Timers};
pub(crate) use feeder::{KindWatch, run_feeder};
pub(crate) use manager::{Manager, ManagerArgs};

pub(crate) use crate::hash::FastMap;

/// What a kind runs by, fixed when it starts: its tree and policy, and what the runtime keeps
/// for it (finalizer, status, cache).
pub(crate) struct KindRules<K: ManagedResource> {
    pub tree: BoxProvisioner<K>,
    /// The kind's part of the policy: the actors and their manager run by it alone.
    pub policy: KindPolicy,
    /// Add the runtime finalizer (and so deprovision on deletion).
    pub use_finalizer: bool,
    /// Write the actorcile status (Ready condition, phase, observedGeneration).
    pub write_status: bool,
    /// Whether cached objects are pruned ([`crate::cache::prune`]).
    pub prune_cache: bool,
    /// Whether passive objects' cached copies are held encoded ([`KindStore::encode`]).
    pub encode_passive: bool,
    /// Who each object's tenant is, for fair activation ([`crate::scheduling::fair`]).
    pub tenants: crate::scheduling::fair::Tenants<K>,
}

/// Everything the manager, its resource actors and its feeder share for one kind, in three
/// parts: the rules it runs by (fixed at start), what its writes go through, and its state.
pub(crate) struct Shared<K: ManagedResource> {
    /// What the kind runs by.
    pub rules: KindRules<K>,
    /// What the kind's writes go through: clients (with sharding, per shard), field manager,
    /// event recorder, finalizer, counters.
    pub io: Arc<crate::writes::Io<K>>,
    /// The kind's share of the reconcile slots.
    pub slots: ReconcileSlots,
    /// The kind's objects as last seen.
    pub store: KindStore<K>,
    /// The live actors, by object.
    pub routes: DashMap<ObjectRef<K>, ActorRef<ResourceMsg<K>>, ahash::RandomState>,
    /// The provision reconciles that run now, cancelled by the feeder when their object moves on.
    pub in_flight: crate::scheduling::moved_on::InFlight<K>,
    /// What each object's last reconcile recorded, while the runtime's introspection is on.
    pub reports: Option<inspect::Reports<K>>,
    /// What the runtime found out about the kind's status subresource (served at all, and
    /// keeping what the runtime writes).
    pub status_checks: crate::writes::StatusChecks,
    pub references: Arc<ReferenceIndex>,
    /// Every resource actor's wake-up and idle timers.
    pub timers: Timers<ResourceMsg<K>>,
    /// The controller's provider config, if it has one.
    pub config: Option<Arc<dyn watches::ConfigView>>,
    /// The controller's Secrets trigger, if it has one.
    pub secrets: Option<watches::SecretTrigger<K>>,
}

impl<K: ManagedResource> Shared<K> {
    /// The tenant share `key`'s activation queues under.
    pub(crate) fn share_of(&self, key: &ObjectRef<K>) -> crate::scheduling::fair::Share {
        let tenants = &self.rules.tenants;
        let obj = tenants
            .needs_object()
            .then(|| self.store.get(key))
            .flatten();
        tenants.share(key.namespace.as_deref(), obj.as_deref())
    }

    /// Whether this replica runs the object at `key` now: always without sharding; with it,
    /// when it holds the object's shard (an object not in the store counts as run here: there
    /// is nothing of it to run, and its removal is handled as usual).
    pub(crate) fn owns(&self, key: &ObjectRef<K>) -> bool {
        let Some(scope) = &self.io.shards else {
            return true;
        };
        let obj = scope.needs_object().then(|| self.store.get(key)).flatten();
        if let Some(obj) = &obj {
            return scope
                .runnable_shard(obj)
                .is_some_and(|s| scope.shards.holds(s));
        }
        match scope.shard_of_key(key, None) {
            Some(shard) => scope.shards.holds(shard),
            None => true,
        }
    }

    /// Whether this replica's view of the object at `key` is current: always, unless it
    /// watches only its shards (by label, [`crate::sharding::ShardWatch::HeldShards`], or
    /// selected by the server, [`crate::sharding::ShardWatch::ServerSide`]) and does not hold
    /// the object's shard (then readiness and existence are asked elsewhere).
    pub(crate) fn in_view(&self, key: &ObjectRef<K>) -> bool {
        let Some(scope) = self.io.shards.as_ref().filter(|s| s.selective()) else {
            return true;
        };
        let obj = scope.needs_object().then(|| self.store.get(key)).flatten();
        scope
            .shard_of_key(key, obj.as_deref())
            .is_some_and(|s| scope.shards.holds(s))
    }
}

/// Whether an object at `version` is news to an actor that last ran on `last_reconciled` and whose own
/// writes produced `own_writes` (their watch echoes are not news). Unreadable versions always are.
pub(crate) fn is_news(
    last_reconciled: Option<u64>,
    own_writes: &[u64],
    version: Option<u64>,
) -> bool {
    match version {
        Some(v) => !own_writes.contains(&v) && last_reconciled.is_none_or(|l| v > l),
        None => true,
    }
}
