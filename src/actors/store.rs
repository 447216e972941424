//! A kind's cache: the objects of each namespace the controller watches (one table for a
//! controller that watches one namespace or all). Each watch's re-list replaces its own store
//! only, so a namespace whose watch restarts leaves the others' objects in place.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use hashbrown::HashTable;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::Event;

use super::ManagedResource;
use super::object_map::name_hash;

/// One cached object, and whether its actor last reported it Ready (for the reference index:
/// kept here, where it costs a byte, rather than in a set of its own keyed by a copy of the
/// object's name; the same name keeps the flag across versions and re-lists).
struct Slot<K> {
    obj: Arc<K>,
    ready: AtomicBool,
}

/// One watch's objects, found by namespace and name.
///
/// Written here rather than taken from kube's `reflector::Store`: that store keys every object by
/// an `ObjectRef` holding its own copies of the name, namespace, resource version and uid beside
/// the object that already holds them (about 250 bytes per object, a sixth of an idle object's
/// whole cost), and its writer clones each object it is given. This table holds only the shared
/// object and finds it by hashing the name and namespace in the object itself.
struct Objects<K> {
    table: HashTable<Slot<K>>,
    hasher: ahash::RandomState,
}

/// An object's namespace and name, as its slot is found by.
fn names<K: ManagedResource>(obj: &K) -> (Option<&str>, &str) {
    let meta = obj.meta();
    (
        meta.namespace.as_deref(),
        meta.name.as_deref().unwrap_or(""),
    )
}

impl<K: ManagedResource> Objects<K> {
    fn new(hasher: ahash::RandomState, capacity: usize) -> Self {
        Self {
            table: HashTable::with_capacity(capacity),
            hasher,
        }
    }

    fn hash_obj(hasher: &ahash::RandomState, obj: &K) -> u64 {
        let (ns, name) = names(obj);
        name_hash(hasher, ns, name)
    }

    fn is(obj: &K, namespace: Option<&str>, name: &str) -> bool {
        names(obj) == (namespace, name)
    }

    fn get(&self, key: &ObjectRef<K>) -> Option<&Slot<K>> {
        self.find(key.namespace.as_deref(), &key.name)
    }

    fn find(&self, ns: Option<&str>, name: &str) -> Option<&Slot<K>> {
        self.table.find(name_hash(&self.hasher, ns, name), |s| {
            Self::is(&s.obj, ns, name)
        })
    }

    /// Caches `obj`, keeping the Ready flag of the version it replaces.
    fn insert(&mut self, obj: Arc<K>) {
        let hasher = &self.hasher;
        let hash = Self::hash_obj(hasher, &obj);
        let (ns, name) = names(obj.as_ref());
        match self.table.find_mut(hash, |s| Self::is(&s.obj, ns, name)) {
            Some(slot) => slot.obj = obj,
            None => {
                let slot = Slot {
                    obj,
                    ready: AtomicBool::new(false),
                };
                self.table
                    .insert_unique(hash, slot, |s| Self::hash_obj(hasher, &s.obj));
            }
        }
    }

    fn remove(&mut self, obj: &K) {
        let (ns, name) = names(obj);
        if let Ok(e) = self
            .table
            .find_entry(name_hash(&self.hasher, ns, name), |s| {
                Self::is(&s.obj, ns, name)
            })
        {
            e.remove();
        }
    }
}

/// One watch's cache: what its [`Writer`] last applied.
struct Cache<K>(Arc<RwLock<Objects<K>>>);

impl<K> Clone for Cache<K> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<K: ManagedResource> Cache<K> {
    fn read(&self) -> RwLockReadGuard<'_, Objects<K>> {
        self.0.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Objects<K>> {
        self.0.write().unwrap_or_else(|p| p.into_inner())
    }
}

/// Fills one watch's cache from its events, as kube's reflector writer does: changes at once,
/// a re-list (`Init` … `InitDone`) buffered and swapped in whole when it is complete, so the
/// cache never shows half a list.
pub(crate) struct Writer<K> {
    cache: Cache<K>,
    /// The re-list in progress, built as it arrives (outside the cache's lock).
    relist: Option<Objects<K>>,
}

impl<K: ManagedResource> Writer<K> {
    /// Applies one watch event.
    pub(crate) fn apply_watcher_event(&mut self, event: Event<K>) {
        match event {
            Event::Apply(obj) => self.cache.write().insert(compact(obj)),
            Event::Delete(obj) => self.cache.write().remove(&obj),
            Event::Init => self.relist = Some(self.fresh()),
            Event::InitApply(obj) => {
                if self.relist.is_none() {
                    self.relist = Some(self.fresh());
                }
                if let Some(listed) = &mut self.relist {
                    listed.insert(compact(obj));
                }
            }
            Event::InitDone => {
                let listed = self.relist.take().unwrap_or_else(|| self.fresh());
                let mut cache = self.cache.write();
                // The Ready flags carry over by name, under the lock: none set meanwhile is lost.
                for slot in listed.table.iter() {
                    let (ns, name) = names(slot.obj.as_ref());
                    if cache
                        .find(ns, name)
                        .is_some_and(|s| s.ready.load(Ordering::Relaxed))
                    {
                        slot.ready.store(true, Ordering::Relaxed);
                    }
                }
                *cache = listed;
            }
        }
    }

    /// An empty table, hashed as the cache is.
    fn fresh(&self) -> Objects<K> {
        Objects::new(self.cache.read().hasher.clone(), 0)
    }
}

/// `obj` as it is cached: a copy, which holds no spare capacity. The JSON decoder leaves some in
/// every list it fills (a list of one status condition has room for four: a few hundred bytes
/// per object), and a cached object lives as long as its object.
fn compact<K: Clone>(obj: K) -> Arc<K> {
    Arc::new(obj.clone())
}

/// The stores of one kind, by watched namespace (`None`: every namespace, or cluster-scoped).
pub(crate) struct KindStore<K: ManagedResource> {
    stores: Arc<[(Option<String>, Cache<K>)]>,
}

impl<K: ManagedResource> Clone for KindStore<K> {
    fn clone(&self) -> Self {
        Self {
            stores: self.stores.clone(),
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
            },
            writers,
        )
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

    /// The object at `key`, if cached.
    pub(crate) fn get(&self, key: &ObjectRef<K>) -> Option<Arc<K>> {
        self.store_of(key)?.read().get(key).map(|s| s.obj.clone())
    }

    /// Records whether `key`'s actor last reported it Ready (nothing if it is not cached: then
    /// it has been deleted, and its flag with it).
    pub(crate) fn set_ready(&self, key: &ObjectRef<K>, ready: bool) {
        if let Some(store) = self.store_of(key)
            && let Some(slot) = store.read().get(key)
        {
            slot.ready.store(ready, Ordering::Relaxed);
        }
    }

    /// Whether `key` is cached and its actor last reported it Ready.
    pub(crate) fn is_ready(&self, key: &ObjectRef<K>) -> bool {
        self.store_of(key)
            .and_then(|store| {
                store
                    .read()
                    .get(key)
                    .map(|s| s.ready.load(Ordering::Relaxed))
            })
            .unwrap_or(false)
    }

    /// Every cached object.
    pub(crate) fn state(&self) -> Vec<Arc<K>> {
        self.stores
            .iter()
            .flat_map(|(_, s)| {
                s.read()
                    .table
                    .iter()
                    .map(|s| s.obj.clone())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// How many objects are cached.
    pub(crate) fn len(&self) -> usize {
        self.stores.iter().map(|(_, s)| s.read().table.len()).sum()
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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn cm(ns: &str, name: &str) -> ConfigMap {
        let mut c = ConfigMap::default();
        c.metadata.name = Some(name.into());
        c.metadata.namespace = Some(ns.into());
        c
    }

    /// Each namespace's store answers for its own keys only, and one namespace's re-list
    /// leaves the others' objects in place.
    #[test]
    fn each_namespace_relists_its_own_store_only() {
        let (store, mut writers) =
            KindStore::<ConfigMap>::new(&[Some("a".into()), Some("b".into())]);
        writers[0].apply_watcher_event(Event::Apply(cm("a", "x")));
        writers[1].apply_watcher_event(Event::Apply(cm("b", "x")));
        writers[1].apply_watcher_event(Event::Apply(cm("b", "y")));
        assert_eq!(store.len(), 3);
        assert!(store.get(&ObjectRef::new("x").within("a")).is_some());
        assert!(
            store.get(&ObjectRef::new("y").within("a")).is_none(),
            "y is in b"
        );
        assert!(
            store.get(&ObjectRef::new("y").within("c")).is_none(),
            "c is not watched"
        );
        // b re-lists with y only.
        writers[1].apply_watcher_event(Event::Init);
        writers[1].apply_watcher_event(Event::InitApply(cm("b", "y")));
        writers[1].apply_watcher_event(Event::InitDone);
        let mut names: Vec<String> = store
            .state()
            .iter()
            .map(|c| {
                format!(
                    "{}/{}",
                    c.metadata.namespace.as_deref().unwrap_or(""),
                    c.metadata.name.as_deref().unwrap_or("")
                )
            })
            .collect();
        names.sort();
        assert_eq!(names, ["a/x", "b/y"]);
    }

    /// A change replaces the object at its name, a deletion removes it, and a re-list shows
    /// nothing of itself until it is complete; then it is the whole store.
    #[test]
    fn changes_apply_at_once_and_a_relist_when_complete() {
        let (store, mut writers) = KindStore::<ConfigMap>::new(&[None]);
        let w = &mut writers[0];
        let version = |name: &str, ns: &str| {
            store
                .get(&ObjectRef::new(name).within(ns))
                .and_then(|c| c.metadata.resource_version.clone())
        };
        let at = |ns: &str, name: &str, rv: &str| {
            let mut c = cm(ns, name);
            c.metadata.resource_version = Some(rv.into());
            c
        };
        for i in 0..100 {
            w.apply_watcher_event(Event::Apply(at("a", &format!("o{i}"), "1")));
        }
        w.apply_watcher_event(Event::Apply(at("a", "o7", "2")));
        w.apply_watcher_event(Event::Apply(at("b", "o7", "3")));
        assert_eq!(store.len(), 101);
        assert_eq!(version("o7", "a").as_deref(), Some("2"));
        assert_eq!(version("o7", "b").as_deref(), Some("3"));
        w.apply_watcher_event(Event::Delete(at("a", "o7", "4")));
        assert_eq!(version("o7", "a"), None);
        assert_eq!(store.len(), 100);

        let key = |ns: &str, name: &str| ObjectRef::new(name).within(ns);
        store.set_ready(&key("a", "o1"), true);
        w.apply_watcher_event(Event::Init);
        w.apply_watcher_event(Event::InitApply(at("a", "o1", "5")));
        w.apply_watcher_event(Event::InitApply(at("a", "o2", "5")));
        w.apply_watcher_event(Event::InitApply(at("c", "new", "6")));
        assert_eq!(store.len(), 100, "half a list is not shown");
        assert_eq!(version("o1", "a").as_deref(), Some("1"));
        // Said while the list arrives: kept too.
        store.set_ready(&key("a", "o2"), true);
        w.apply_watcher_event(Event::InitDone);
        assert!(
            store.is_ready(&key("a", "o1")),
            "a flag carries over by name"
        );
        assert!(store.is_ready(&key("a", "o2")));
        assert!(!store.is_ready(&key("c", "new")));
        store.set_ready(&key("c", "gone"), true);
        assert!(
            !store.is_ready(&key("c", "gone")),
            "no flag without its object"
        );
        assert_eq!(store.len(), 3);
        assert_eq!(version("o1", "a").as_deref(), Some("5"));
        assert_eq!(version("new", "c").as_deref(), Some("6"));
        assert_eq!(
            version("o7", "b"),
            None,
            "gone from the list, gone from the store"
        );
    }
}
