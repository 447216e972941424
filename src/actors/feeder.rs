//! The watch feeder: kube-runtime's `watcher` + reflector, turned into messages.
//!
//! Events for objects with a live actor go straight to that actor's mailbox through the shared
//! route map (a `DashMap`), so routing never serializes through one mailbox; only objects
//! without a live actor (new, passive, restarting, quarantined, deleted) go through the manager.

use std::collections::HashSet;
use std::sync::Arc;

use futures::StreamExt;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher::{self, Event};
use ractor::ActorRef;

use super::{ManagedResource, Shared};
use crate::messages::{ManagerMsg, ResourceMsg};

/// The object's key, without `extra` (resource version, uid): the manager keeps a key per object
/// for as long as the object exists and clones it into every message about it, and nothing reads
/// those fields from a key (equality and hashing ignore them).
fn key_of<K: ManagedResource>(obj: &K) -> ObjectRef<K> {
    let mut key = ObjectRef::from_obj(obj);
    key.extra = Default::default();
    key
}

/// Route one applied object to its actor, or to the manager when it has none.
fn route<K: ManagedResource>(
    shared: &Shared<K>,
    manager: &ActorRef<ManagerMsg<K>>,
    key: ObjectRef<K>,
) {
    let Some(obj) = shared.store.get(&key) else {
        return;
    };
    if let Some(actor) = shared.routes.get(&key)
        && actor.cast(ResourceMsg::Observed(obj)).is_ok()
    {
        return;
    }
    let _ = manager.cast(ManagerMsg::Event(key));
}

fn route_gone<K: ManagedResource>(
    shared: &Shared<K>,
    manager: &ActorRef<ManagerMsg<K>>,
    key: ObjectRef<K>,
) {
    if let Some(actor) = shared.routes.get(&key)
        && actor.cast(ResourceMsg::Gone).is_ok()
    {
        return;
    }
    let _ = manager.cast(ManagerMsg::Gone(key));
}

/// Run the watch for one kind until the task is aborted. Updates the reflector store behind
/// `shared.store` (through `writer`) before routing, so actors always find the object there.
pub(crate) async fn run_feeder<K: ManagedResource>(
    shared: Arc<Shared<K>>,
    api: Api<K>,
    config: watcher::Config,
    writer: reflector::store::Writer<K>,
    manager: ActorRef<ManagerMsg<K>>,
) {
    // managedFields are dropped from the runtime's copy (the kube-rs memory advice): on a real
    // API server they are often the largest part of a small object, and nothing here reads them.
    let events = watcher::watcher(api, config)
        .default_backoff()
        .modify(|o| o.managed_fields_mut().clear());
    let stream = reflector::reflector(writer, events);
    futures::pin_mut!(stream);
    // The keys of a (re-)list, in the order the API server listed them.
    let mut relisting: Option<Vec<ObjectRef<K>>> = None;
    while let Some(event) = stream.next().await {
        match event {
            Ok(Event::Apply(obj)) => route(&shared, &manager, key_of(&obj)),
            Ok(Event::Delete(obj)) => route_gone(&shared, &manager, key_of(&obj)),
            Ok(Event::Init) => relisting = Some(Vec::new()),
            // The reflector buffers a (re-)list and swaps it into the store only at `InitDone`,
            // so listed objects are routed then, when actors can find them in the store.
            Ok(Event::InitApply(obj)) => {
                if let Some(seen) = &mut relisting {
                    seen.push(key_of(&obj));
                }
            }
            Ok(Event::InitDone) => {
                if let Some(listed) = relisting.take() {
                    // In list order, like the watch delivered them (first passes start in it).
                    for key in &listed {
                        route(&shared, &manager, key.clone());
                    }
                    let existing: HashSet<ObjectRef<K>, ahash::RandomState> =
                        listed.into_iter().collect();
                    let _ = manager.cast(ManagerMsg::Resync(existing));
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, kind = %K::kind(&()), "watch error; retrying with backoff")
            }
        }
    }
}
