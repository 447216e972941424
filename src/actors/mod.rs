//! The actors: a manager supervisor per kind, a resource actor per object, the watch feeder that
//! turns kube-runtime watch events into messages.
//!
//! A resource actor serves one object at a time, and one object is served by at most one actor
//! at a time, so one object never has two runs at once. An actor with nothing due soon
//! *passivates*: it hands its object back to the manager (the object stays in the reflector
//! store, its pending wake-up and dependency waits are kept by the manager) and the next event,
//! timer or message for the object activates it again. The actor itself is not stopped: it
//! stays linked to the manager, idle, and adopts the next activation of any object of its kind
//! (a message, instead of a stop, a spawn and two supervision events; the manager keeps at most
//! one idle actor per run slot). To users it is still one actor per resource; the
//! [`MetricsSnapshot`] tells activations from spawns.
//!
//! Message types live in [`crate::messages`]; the tunables in [`crate::policy`].

mod feeder;
pub(crate) mod inbox;
mod manager;
mod passive_timers;
mod resource;
mod timer;

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource};
use ractor::ActorRef;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::Semaphore;

use crate::messages::ResourceMsg;
use crate::object_api::ObjectApi;
use crate::policy::SupervisorPolicy;
use crate::provisioners::BoxProvisioner;
use crate::references::ReferenceIndex;

pub(crate) use feeder::run_feeder;
pub(crate) use manager::{Manager, ManagerArgs};
#[doc(hidden)]
pub use timer::{RunSlot, TimerMsg, Timers, WakeSlot};

/// What a kind must be for actorcile to manage it: a typed Kubernetes resource (a
/// `#[derive(CustomResource)]` type or a k8s-openapi type).
pub trait ManagedResource:
    Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned + Send + Sync + 'static
{
}

impl<T> ManagedResource for T where
    T: Resource<DynamicType = ()>
        + Clone
        + Debug
        + Serialize
        + DeserializeOwned
        + Send
        + Sync
        + 'static
{
}

/// Hash map of per-object data (ahash: object names are hashed on every event and message).
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, ahash::RandomState>;

/// Everything the manager, its resource actors and its feeder share for one kind.
pub(crate) struct Shared<K: ManagedResource> {
    /// Shared with every provisioner `Context` the actors build (no `Client` clone per context).
    pub client: Arc<Client>,
    pub tree: BoxProvisioner<K>,
    pub policy: SupervisorPolicy,
    pub runs: Arc<Semaphore>,
    pub store: Store<K>,
    pub routes: DashMap<ObjectRef<K>, ActorRef<ResourceMsg<K>>, ahash::RandomState>,
    pub finalizer: String,
    pub field_manager: Arc<str>,
    pub recorder: Option<Arc<Recorder>>,
    /// Add the runtime finalizer (and so deprovision on deletion).
    pub use_finalizer: bool,
    /// Write the actorcile status (Ready condition, phase, observedGeneration).
    pub write_status: bool,
    pub metrics: Arc<Metrics>,
    pub references: Arc<ReferenceIndex>,
    /// Every resource actor's wake-up and idle timers.
    pub timers: Timers<ResourceMsg<K>>,
}

impl<K: ManagedResource> Shared<K> {
    /// The API for the object's namespace (or cluster scope).
    pub(crate) fn api(&self, obj: &K) -> ObjectApi<K> {
        ObjectApi::new(Client::clone(&self.client), obj.meta().namespace.as_deref())
    }
}

/// `metadata.resourceVersion` as a number. Kubernetes calls resource versions opaque, but every
/// real server (etcd revisions) and the in-process cluster use integers; the runtime only uses
/// this to tell its own writes' echoes from newer changes and never fails when it is not one.
pub(crate) fn version_of<K: Resource>(obj: &K) -> Option<u64> {
    obj.meta().resource_version.as_deref()?.parse().ok()
}

/// Whether an object at `version` is news to an actor that last ran on `last_run` and whose own
/// writes produced `own_writes` (their watch echoes are not news). Unreadable versions always are.
pub(crate) fn is_news(last_run: Option<u64>, own_writes: &[u64], version: Option<u64>) -> bool {
    match version {
        Some(v) => !own_writes.contains(&v) && last_run.is_none_or(|l| v > l),
        None => true,
    }
}

/// Runtime-wide counters, shared by every controller. Cheap atomics; read with
/// [`Metrics::snapshot`].
#[derive(Debug, Default)]
pub struct Metrics {
    // Every pass touches these from whichever worker runs it: no `runs` counter of its own (it
    // is the sum of the two below), and peaks are read before they are raised, so a pass makes
    // as few read-modify-writes of these shared cache lines as it can.
    provision_runs: AtomicU64,
    deprovision_runs: AtomicU64,
    restarts: AtomicU64,
    quarantined: AtomicU64,
    status_writes: AtomicU64,
    in_flight: AtomicU64,
    peak_in_flight: AtomicU64,
    live_actors: AtomicU64,
    peak_live_actors: AtomicU64,
    passivations: AtomicU64,
    activations: AtomicU64,
    spawns: AtomicU64,
}

/// A point-in-time copy of [`Metrics`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MetricsSnapshot {
    /// Provisioner passes started (provision + deprovision).
    pub runs: u64,
    /// Provision passes.
    pub provision_runs: u64,
    /// Deprovision passes.
    pub deprovision_runs: u64,
    /// Resource actors restarted after a failure or panic.
    pub restarts: u64,
    /// Resources quarantined past the restart intensity.
    pub quarantined: u64,
    /// Status patches sent (only when status changed).
    pub status_writes: u64,
    /// Passes running right now.
    pub in_flight: u64,
    /// Most passes ever running at once.
    pub peak_in_flight: u64,
    /// Resource actors alive right now.
    pub live_actors: u64,
    /// Most resource actors ever alive at once.
    pub peak_live_actors: u64,
    /// Actors stopped for being idle.
    pub passivations: u64,
    /// Activations: an actor began serving an object (its first activation, a re-activation
    /// after passivation, or a restart).
    pub activations: u64,
    /// Resource actors spawned. Most activations spawn none: an actor that passivated adopts
    /// the next activation (see the [module docs](crate::actors)).
    pub spawns: u64,
}

impl Metrics {
    /// Copy the counters.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        MetricsSnapshot {
            runs: l(&self.provision_runs) + l(&self.deprovision_runs),
            provision_runs: l(&self.provision_runs),
            deprovision_runs: l(&self.deprovision_runs),
            restarts: l(&self.restarts),
            quarantined: l(&self.quarantined),
            status_writes: l(&self.status_writes),
            in_flight: l(&self.in_flight),
            peak_in_flight: l(&self.peak_in_flight),
            live_actors: l(&self.live_actors),
            peak_live_actors: l(&self.peak_live_actors),
            passivations: l(&self.passivations),
            activations: l(&self.activations),
            spawns: l(&self.spawns),
        }
    }

    fn run_started(&self, deleting: bool) -> InFlight<'_> {
        if deleting {
            self.deprovision_runs.fetch_add(1, Ordering::Relaxed);
        } else {
            self.provision_runs.fetch_add(1, Ordering::Relaxed);
        }
        let now = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        raise_peak(&self.peak_in_flight, now);
        InFlight(self)
    }

    /// Every actor start is an activation: counts both, and the peak of live actors.
    fn actor_started(&self) {
        Self::inc(&self.activations);
        let live = self.live_actors.fetch_add(1, Ordering::Relaxed) + 1;
        raise_peak(&self.peak_live_actors, live);
    }

    fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn dec(counter: &AtomicU64) {
        counter.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Raise `peak` to `value` if it is higher (a plain load first: most calls raise nothing).
fn raise_peak(peak: &AtomicU64, value: u64) {
    if value > peak.load(Ordering::Relaxed) {
        peak.fetch_max(value, Ordering::Relaxed);
    }
}

/// Decrements the in-flight gauge when a pass ends, even by panic.
struct InFlight<'a>(&'a Metrics);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        Metrics::dec(&self.0.in_flight);
    }
}
