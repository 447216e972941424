//! One watch's table of objects, found by namespace and name, and how an object is held in it.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use hashbrown::HashTable;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::ObjectRef;

use super::encoded::Encoded;
use crate::ManagedResource;
use crate::hash::name_hash;
use crate::lenient::Undecodable;
use crate::references::Readiness;

/// One cached object, and the readiness its actor last reported ([`SaidCell`], for the reference
/// index: kept here, where it costs a byte, rather than in a map of its own keyed by a copy of
/// the object's name; the same name keeps it across versions and re-lists).
pub(super) struct Slot<K> {
    pub(super) obj: Held<K>,
    pub(super) said: SaidCell,
}

/// What an object's actor last reported of its readiness, in one byte: Ready, not Ready or
/// Failed, or nothing said. It is ahead of the cached status: the actor says it as soon as its
/// status write is answered, the watch event of that write comes later, and a resource woken in
/// between reads this instead of the status it replaced. (Deleting and missing are the cache's
/// own news: they are never held here.)
#[derive(Default)]
pub(super) struct SaidCell(AtomicU8);

impl SaidCell {
    pub(super) fn get(&self) -> Option<Readiness> {
        match self.0.load(Ordering::Relaxed) {
            1 => Some(Readiness::Ready),
            2 => Some(Readiness::NotReady),
            3 => Some(Readiness::Failed),
            _ => None,
        }
    }

    /// Records `said` (Deleting and Missing record nothing).
    pub(super) fn set(&self, said: Option<Readiness>) {
        let v = match said {
            Some(Readiness::Ready) => 1,
            Some(Readiness::NotReady) => 2,
            Some(Readiness::Failed) => 3,
            Some(Readiness::Deleting | Readiness::Missing) | None => 0,
        };
        self.0.store(v, Ordering::Relaxed);
    }

    /// Nothing said any more (through `&mut`: no atomic operation).
    pub(super) fn clear(&mut self) {
        *self.0.get_mut() = 0;
    }

    /// Whether anything is said (through `&mut`).
    pub(super) fn is_set(&mut self) -> bool {
        *self.0.get_mut() != 0
    }
}

/// A cached object as it is held: whole, encoded while its actor is passive, or, when the
/// kind's type cannot hold it, as what was read of it ([`Undecodable`]: present, but no `K`).
pub(super) enum Held<K> {
    Whole(Arc<K>),
    Encoded(Encoded),
    Undecodable(Arc<Undecodable>),
}

impl<K: ManagedResource> Held<K> {
    pub(super) fn names(&self) -> (Option<&str>, &str) {
        match self {
            Held::Whole(obj) => names(obj.as_ref()),
            Held::Encoded(e) => e.names(),
            Held::Undecodable(u) => meta_names(&u.meta),
        }
    }

    /// The object's uid and generation: what its actor said holds for one version of one object only.
    pub(super) fn identity(&self) -> (Option<String>, Option<i64>) {
        match self {
            Held::Whole(obj) => (obj.meta().uid.clone(), obj.meta().generation),
            Held::Encoded(e) => e
                .metadata()
                .map(|m| (m.uid, m.generation))
                .unwrap_or_default(),
            Held::Undecodable(u) => (u.meta.uid.clone(), u.meta.generation),
        }
    }
}

impl<K: ManagedResource> Slot<K> {
    pub(super) fn names(&self) -> (Option<&str>, &str) {
        self.obj.names()
    }

    /// The object, decoded if it is held encoded.
    pub(super) fn object(&self) -> Option<Arc<K>> {
        match &self.obj {
            Held::Whole(obj) => Some(obj.clone()),
            Held::Encoded(e) => e.decode().map(Arc::new),
            Held::Undecodable(_) => None,
        }
    }

    /// Whether the slot holds `obj` itself, whole.
    pub(super) fn holds(&self, obj: &Arc<K>) -> bool {
        matches!(&self.obj, Held::Whole(held) if Arc::ptr_eq(held, obj))
    }
}

/// One watch's objects, found by namespace and name.
///
/// Written here rather than taken from kube's `reflector::Store`: that store keys every object by
/// an `ObjectRef` holding its own copies of the name, namespace, resource version and uid beside
/// the object that already holds them (about 250 bytes per object, a sixth of an idle object's
/// whole cost), and its writer clones each object it is given. This table holds only the shared
/// object and finds it by hashing the name and namespace in the object itself.
pub(super) struct Objects<K> {
    pub(super) table: HashTable<Slot<K>>,
    pub(super) hasher: ahash::RandomState,
}

/// An object's namespace and name, as its slot is found by.
pub(super) fn names<K: ManagedResource>(obj: &K) -> (Option<&str>, &str) {
    meta_names(obj.meta())
}

pub(super) fn meta_names(meta: &ObjectMeta) -> (Option<&str>, &str) {
    (
        meta.namespace.as_deref(),
        meta.name.as_deref().unwrap_or(""),
    )
}

impl<K: ManagedResource> Objects<K> {
    pub(super) fn new(hasher: ahash::RandomState, capacity: usize) -> Self {
        Self {
            table: HashTable::with_capacity(capacity),
            hasher,
        }
    }

    pub(super) fn hash_slot(hasher: &ahash::RandomState, slot: &Slot<K>) -> u64 {
        let (ns, name) = slot.names();
        name_hash(hasher, ns, name)
    }

    pub(super) fn get(&self, key: &ObjectRef<K>) -> Option<&Slot<K>> {
        self.find(key.namespace.as_deref(), &key.name)
    }

    pub(super) fn find(&self, ns: Option<&str>, name: &str) -> Option<&Slot<K>> {
        self.table.find(name_hash(&self.hasher, ns, name), |s| {
            s.names() == (ns, name)
        })
    }

    pub(super) fn get_mut(&mut self, key: &ObjectRef<K>) -> Option<&mut Slot<K>> {
        let (ns, name) = (key.namespace.as_deref(), key.name.as_str());
        self.table.find_mut(name_hash(&self.hasher, ns, name), |s| {
            s.names() == (ns, name)
        })
    }

    /// Caches `obj`, keeping the Ready flag of the version it replaces.
    pub(super) fn insert(&mut self, obj: Arc<K>) {
        self.insert_held(Held::Whole(obj));
    }

    /// Caches `held`, keeping the Ready flag of the version it replaces when it is the same
    /// object at the same generation (not one deleted and created again under the name, nor a
    /// changed spec: its actor says Ready again once it reconciled it).
    pub(super) fn insert_held(&mut self, held: Held<K>) {
        let hasher = &self.hasher;
        let (ns, name) = held.names();
        let hash = name_hash(hasher, ns, name);
        match self.table.find_mut(hash, |s| s.names() == (ns, name)) {
            Some(slot) => {
                if slot.said.is_set() && slot.obj.identity() != held.identity() {
                    slot.said.clear();
                }
                slot.obj = held;
            }
            None => {
                let slot = Slot {
                    obj: held,
                    said: SaidCell::default(),
                };
                self.table
                    .insert_unique(hash, slot, |s| Self::hash_slot(hasher, s));
            }
        }
    }

    pub(super) fn remove(&mut self, obj: &K) {
        self.remove_at(names(obj));
    }

    pub(super) fn remove_at(&mut self, (ns, name): (Option<&str>, &str)) {
        if let Ok(e) = self
            .table
            .find_entry(name_hash(&self.hasher, ns, name), |s| {
                s.names() == (ns, name)
            })
        {
            e.remove();
        }
    }
}

/// One watch's cache: what its [`Writer`] last applied.
pub(super) struct Cache<K>(pub(super) Arc<RwLock<Objects<K>>>);

impl<K> Clone for Cache<K> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<K: ManagedResource> Cache<K> {
    pub(super) fn read(&self) -> RwLockReadGuard<'_, Objects<K>> {
        self.0.read().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn write(&self) -> RwLockWriteGuard<'_, Objects<K>> {
        self.0.write().unwrap_or_else(|p| p.into_inner())
    }
}
