//! A kind's cache: the objects of each namespace the controller watches (one table for a
//! controller that watches one namespace or all). Each watch's re-list replaces its own store
//! only, so a namespace whose watch restarts leaves the others' objects in place.
//!
//! | file | what it holds |
//! |---|---|
//! | `mod.rs` | [`KindStore`]: a kind's stores, by watched namespace; what the actors read; [`prune`] |
//! | `table.rs` | one watch's table: objects found by namespace and name, each held whole, encoded or undecodable, with what its actor said of its readiness |
//! | `writer.rs` | [`Writer`]: one watch's events into its table, a re-list swapped in whole |
//! | `encoded.rs` | the encoding of a passive object's copy, its name readable without a decoder |

mod encoded;
mod table;
#[cfg(test)]
mod tests;
mod writer;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use kube::runtime::reflector::ObjectRef;

use crate::ManagedResource;
use crate::lenient::Undecodable;
use crate::references::Readiness;
use crate::status::ResourceStatus;
use encoded::Encoded;
use table::{Cache, Held, Objects, Slot};
pub(crate) use writer::Writer;

/// The stores of one kind, by watched namespace (`None`: every namespace, or cluster-scoped).
pub(crate) struct KindStore<K: ManagedResource> {
    stores: Arc<[(Option<String>, Cache<K>)]>,
    /// Cleared when an object of the kind did not encode and decode again: the kind's objects
    /// are held whole from then on (not tried, and failed, on every passivation).
    encodes: Arc<AtomicBool>,
}

impl<K: ManagedResource> Clone for KindStore<K> {
    fn clone(&self) -> Self {
        Self {
            stores: self.stores.clone(),
            encodes: self.encodes.clone(),
        }
    }
}

impl<K: ManagedResource> KindStore<K> {
    /// One store per entry of `namespaces`, with the writer each watch fills it through.
    pub(crate) fn new(namespaces: &[Option<String>]) -> (Self, Vec<Writer<K>>) {
        let (stores, writers): (Vec<_>, Vec<_>) = namespaces
            .iter()
            .map(|ns| {
                let cache = Cache(Arc::new(RwLock::new(Objects::new(
                    ahash::RandomState::new(),
                    0,
                ))));
                let writer = Writer {
                    cache: cache.clone(),
                    relist: None,
                };
                ((ns.clone(), cache), writer)
            })
            .unzip();
        (
            Self {
                stores: stores.into(),
                encodes: Arc::new(AtomicBool::new(true)),
            },
            writers,
        )
    }

    /// A writer of the `at`th store (as [`KindStore::new`] handed out), for a watch started
    /// again: it fills the store as it is, its next list replacing it whole.
    pub(crate) fn writer_at(&self, at: usize) -> Writer<K> {
        Writer {
            cache: self.stores[at].1.clone(),
            relist: None,
        }
    }

    /// Whether one store holds every namespace (a watch of all, or a cluster-scoped kind).
    pub(crate) fn every_namespace(&self) -> bool {
        self.stores.iter().any(|(ns, _)| ns.is_none())
    }

    /// The store that holds `key`'s namespace.
    fn store_of(&self, key: &ObjectRef<K>) -> Option<&Cache<K>> {
        match &*self.stores {
            [(_, only)] => Some(only),
            stores => stores
                .iter()
                .find(|(ns, _)| ns.is_none() || *ns == key.namespace)
                .map(|(_, s)| s),
        }
    }

    /// The object at `key`, if cached (decoded if it is held encoded: see
    /// [`KindStore::encode`]).
    pub(crate) fn get(&self, key: &ObjectRef<K>) -> Option<Arc<K>> {
        self.store_of(key)?.read().get(key)?.object()
    }

    /// Whether `key` is cached.
    pub(crate) fn contains(&self, key: &ObjectRef<K>) -> bool {
        self.store_of(key)
            .is_some_and(|store| store.read().get(key).is_some())
    }

    /// The `metadata.resourceVersion` of the object at `key`, if it is cached (read without
    /// decoding an encoded object whole).
    pub(crate) fn resource_version(&self, key: &ObjectRef<K>) -> Option<Option<String>> {
        let store = self.store_of(key)?.read();
        Some(match &store.get(key)?.obj {
            Held::Whole(obj) => obj.meta().resource_version.clone(),
            Held::Encoded(e) => e.metadata().and_then(|m| m.resource_version),
            Held::Undecodable(u) => u.meta.resource_version.clone(),
        })
    }

    /// Whether the object at `key` is being deleted, if it is cached (an encoded object is read
    /// without decoding it whole).
    pub(crate) fn deleting(&self, key: &ObjectRef<K>) -> Option<bool> {
        let store = self.store_of(key)?.read();
        Some(match &store.get(key)?.obj {
            Held::Whole(obj) => obj.meta().deletion_timestamp.is_some(),
            Held::Encoded(e) => e.metadata().is_some_and(|m| m.deletion_timestamp.is_some()),
            Held::Undecodable(u) => u.meta.deletion_timestamp.is_some(),
        })
    }

    /// Whether the object at `key` is being deleted, and its status as [`ResourceStatus::of`]
    /// reads it, if it is cached (an encoded object is read without decoding it whole: the
    /// reference index asks this of passive objects).
    pub(crate) fn readiness(
        &self,
        key: &ObjectRef<K>,
    ) -> Option<(bool, ResourceStatus, Option<i64>)> {
        let store = self.store_of(key)?.read();
        match &store.get(key)?.obj {
            Held::Whole(obj) => Some((
                obj.meta().deletion_timestamp.is_some(),
                ResourceStatus::of(obj.as_ref()),
                obj.meta().generation,
            )),
            Held::Encoded(e) => e.readiness(),
            Held::Undecodable(u) => Some((
                u.meta.deletion_timestamp.is_some(),
                u.status.clone().unwrap_or_default(),
                u.meta.generation,
            )),
        }
    }

    /// What was read of the object at `key`, if it is cached and its kind's type cannot hold
    /// it ([`Undecodable`]).
    pub(crate) fn undecodable(&self, key: &ObjectRef<K>) -> Option<Arc<Undecodable>> {
        match &self.store_of(key)?.read().get(key)?.obj {
            Held::Undecodable(u) => Some(u.clone()),
            _ => None,
        }
    }

    /// Holds the object at `key` encoded, if the cache still holds `obj` there whole: called
    /// when its actor is passive, so nothing reads it until its next activation or event.
    /// The encoding happens outside the lock; an object that does not encode and decode again
    /// stays whole. Returns whether the object is held encoded now.
    pub(crate) fn encode(&self, key: &ObjectRef<K>, obj: &Arc<K>) -> bool {
        let Some(store) = self.store_of(key) else {
            return false;
        };
        if !self.encodes.load(Ordering::Relaxed)
            || !store.read().get(key).is_some_and(|s| s.holds(obj))
        {
            return false;
        }
        let Some(encoded) = Encoded::new(obj.as_ref()) else {
            if self.encodes.swap(false, Ordering::Relaxed) {
                tracing::warn!(kind = %K::kind(&()), object = %key, "the object does not decode from its own JSON encoding; this kind's passive objects are cached whole from now on");
            }
            return false;
        };
        let mut objects = store.write();
        match objects.get_mut(key) {
            Some(slot) if slot.holds(obj) => {
                slot.obj = Held::Encoded(encoded);
                true
            }
            _ => false,
        }
    }

    /// Records what `key`'s actor last reported of its readiness (`None`: nothing, the status
    /// says). Nothing is recorded if it is not cached: then it has been deleted, and what was
    /// said of it with it.
    pub(crate) fn set_said(&self, key: &ObjectRef<K>, said: Option<Readiness>) {
        if let Some(store) = self.store_of(key)
            && let Some(slot) = store.read().get(key)
        {
            slot.said.set(said);
        }
    }

    /// Records whether `key`'s actor last reported it Ready ([`KindStore::set_said`] with Ready,
    /// or nothing).
    pub(crate) fn set_ready(&self, key: &ObjectRef<K>, ready: bool) {
        self.set_said(key, ready.then_some(Readiness::Ready));
    }

    /// Records that `key`'s actor reported it Ready for `generation`, if the cached object is
    /// of that generation (not a newer one cached since the reconcile read it). Whether it was
    /// recorded.
    pub(crate) fn set_ready_at(&self, key: &ObjectRef<K>, generation: Option<i64>) -> bool {
        let Some(store) = self.store_of(key) else {
            return false;
        };
        let objects = store.read();
        match objects.get(key) {
            Some(slot) if slot.obj.identity().1 == generation => {
                slot.said.set(Some(Readiness::Ready));
                true
            }
            _ => false,
        }
    }

    /// What `key`'s actor last reported of its readiness, if it is cached and said anything.
    pub(crate) fn said(&self, key: &ObjectRef<K>) -> Option<Readiness> {
        self.store_of(key)
            .and_then(|store| store.read().get(key).and_then(|s| s.said.get()))
    }

    /// Whether `key` is cached and its actor last reported it Ready.
    #[cfg(test)]
    pub(crate) fn is_ready(&self, key: &ObjectRef<K>) -> bool {
        self.said(key) == Some(Readiness::Ready)
    }

    /// Every cached object the kind's type holds.
    pub(crate) fn state(&self) -> Vec<Arc<K>> {
        self.stores
            .iter()
            .flat_map(|(_, s)| {
                s.read()
                    .table
                    .iter()
                    .filter_map(Slot::object)
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Every cached object the kind's type cannot hold, as read ([`Undecodable`]).
    pub(crate) fn undecodable_all(&self) -> Vec<Arc<Undecodable>> {
        self.stores
            .iter()
            .flat_map(|(_, s)| {
                s.read()
                    .table
                    .iter()
                    .filter_map(|slot| match &slot.obj {
                        Held::Undecodable(u) => Some(u.clone()),
                        _ => None,
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// How many objects are cached.
    pub(crate) fn len(&self) -> usize {
        self.stores.iter().map(|(_, s)| s.read().table.len()).sum()
    }

    /// How many cached objects are held encoded.
    #[cfg(test)]
    pub(crate) fn encoded_len(&self) -> usize {
        self.stores
            .iter()
            .map(|(_, s)| {
                let objects = s.read();
                objects
                    .table
                    .iter()
                    .filter(|s| matches!(s.obj, Held::Encoded(_)))
                    .count()
            })
            .sum()
    }
}

/// The annotation `kubectl apply` keeps the whole last-applied object in.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// `obj` without what the API server and `kubectl` keep for themselves and nothing in a
/// reconcile reads: `metadata.managedFields` (on a real API server often the largest part of a
/// small object) and the last-applied annotation (a second copy of the object). kube-rs
/// advises the same for reflector stores. Applied to what the watch delivers and to the
/// answers of the actors' own writes, which the actors keep as the newest version.
pub(crate) fn prune<K: ManagedResource>(obj: &mut K) {
    // `None`, not an empty list: that keeps the list's memory.
    obj.meta_mut().managed_fields = None;
    if let Some(annotations) = &mut obj.meta_mut().annotations {
        annotations.remove(LAST_APPLIED);
    }
}
