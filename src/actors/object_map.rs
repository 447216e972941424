//! A map from an object's name and namespace to a value, for the manager's one entry per known
//! object.
//!
//! A `HashMap<ObjectRef<K>, V>` would do, but an `ObjectRef` is 96 bytes (its dynamic type,
//! name, namespace and an `extra` of resource version and uid) where the key needs 32: at a
//! million idle objects the difference is most of the manager's memory. Keys go in and come out
//! as `ObjectRef`s; only the name and namespace are kept.

use std::marker::PhantomData;

use hashbrown::HashTable;
use hashbrown::hash_table::Entry as Slot;
use kube::runtime::reflector::ObjectRef;

use super::ManagedResource;
use crate::hash::name_hash;

/// One entry: the key's name and namespace, and the value.
struct Keyed<V> {
    name: Box<str>,
    namespace: Option<Box<str>>,
    value: V,
}

impl<V> Keyed<V> {
    fn is<K: ManagedResource>(&self, key: &ObjectRef<K>) -> bool {
        *self.name == key.name && self.namespace.as_deref() == key.namespace.as_deref()
    }
}

/// Values by object (name and namespace).
pub(crate) struct ObjectMap<K, V> {
    table: HashTable<Keyed<V>>,
    hasher: ahash::RandomState,
    kind: PhantomData<fn() -> K>,
}

impl<K, V> Default for ObjectMap<K, V> {
    fn default() -> Self {
        Self {
            table: HashTable::new(),
            hasher: ahash::RandomState::new(),
            kind: PhantomData,
        }
    }
}

impl<K: ManagedResource, V> ObjectMap<K, V> {
    fn hash_key(&self, key: &ObjectRef<K>) -> u64 {
        name_hash(&self.hasher, key.namespace.as_deref(), &key.name)
    }

    /// How many entries there are.
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    /// How many entries fit before the table grows.
    pub(crate) fn capacity(&self) -> usize {
        self.table.capacity()
    }

    /// Room for `additional` more entries.
    pub(crate) fn reserve(&mut self, additional: usize) {
        let hasher = &self.hasher;
        self.table.reserve(additional, |e| {
            name_hash(hasher, e.namespace.as_deref(), &e.name)
        });
    }

    /// The value at `key`.
    pub(crate) fn get(&self, key: &ObjectRef<K>) -> Option<&V> {
        self.table
            .find(self.hash_key(key), |e| e.is(key))
            .map(|e| &e.value)
    }

    /// The value at `key`, to change.
    pub(crate) fn get_mut(&mut self, key: &ObjectRef<K>) -> Option<&mut V> {
        let h = self.hash_key(key);
        self.table.find_mut(h, |e| e.is(key)).map(|e| &mut e.value)
    }

    /// Whether there is a value at `key`.
    pub(crate) fn contains_key(&self, key: &ObjectRef<K>) -> bool {
        self.get(key).is_some()
    }

    /// Takes the value at `key` out.
    pub(crate) fn remove(&mut self, key: &ObjectRef<K>) -> Option<V> {
        let h = self.hash_key(key);
        match self.table.find_entry(h, |e| e.is(key)) {
            Ok(e) => Some(e.remove().0.value),
            Err(_) => None,
        }
    }

    /// The value at `key`, inserted by `make` if there is none.
    pub(crate) fn get_or_insert_with(
        &mut self,
        key: &ObjectRef<K>,
        make: impl FnOnce() -> V,
    ) -> &mut V {
        let h = self.hash_key(key);
        let hasher = &self.hasher;
        match self.table.entry(
            h,
            |e| e.is(key),
            |e| name_hash(hasher, e.namespace.as_deref(), &e.name),
        ) {
            Slot::Occupied(e) => &mut e.into_mut().value,
            Slot::Vacant(e) => {
                &mut e
                    .insert(Keyed {
                        name: key.name.as_str().into(),
                        namespace: key.namespace.as_deref().map(Into::into),
                        value: make(),
                    })
                    .into_mut()
                    .value
            }
        }
    }

    /// Every key.
    pub(crate) fn keys(&self) -> impl Iterator<Item = ObjectRef<K>> + '_ {
        self.table.iter().map(|e| {
            let key = ObjectRef::new(&e.name);
            match &e.namespace {
                Some(ns) => key.within(ns),
                None => key,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn key(ns: Option<&str>, name: &str) -> ObjectRef<ConfigMap> {
        let k = ObjectRef::new(name);
        match ns {
            Some(ns) => k.within(ns),
            None => k,
        }
    }

    /// Entries are told apart by name and namespace (a cluster-scoped key is not a namespaced
    /// one of the same name), survive growth, and come back out as the keys they went in as.
    #[test]
    fn entries_are_found_by_name_and_namespace() {
        let mut map = ObjectMap::<ConfigMap, u32>::default();
        for i in 0..1000 {
            *map.get_or_insert_with(&key(Some("a"), &format!("o{i}")), || 0) += i;
            *map.get_or_insert_with(&key(Some("b"), &format!("o{i}")), || 1) += i;
        }
        *map.get_or_insert_with(&key(None, "o1"), || 7) += 1;
        *map.get_or_insert_with(&key(Some("a"), "o1"), || 100) += 1;
        assert_eq!(map.len(), 2001);
        assert_eq!(map.get(&key(Some("a"), "o1")), Some(&2));
        assert_eq!(map.get(&key(Some("b"), "o1")), Some(&2));
        assert_eq!(map.get(&key(None, "o1")), Some(&8));
        assert_eq!(map.get(&key(Some("c"), "o1")), None);
        *map.get_mut(&key(Some("b"), "o999")).unwrap() = 5;
        assert_eq!(map.get(&key(Some("b"), "o999")), Some(&5));
        assert_eq!(map.remove(&key(None, "o1")), Some(8));
        assert_eq!(map.remove(&key(None, "o1")), None);
        assert!(map.contains_key(&key(Some("a"), "o1")));
        let mut keys: Vec<_> = map.keys().filter(|k| k.name == "o3").collect();
        keys.sort_by(|x, y| x.namespace.cmp(&y.namespace));
        assert_eq!(keys, [key(Some("a"), "o3"), key(Some("b"), "o3")]);
        map.reserve(5000);
        assert!(map.capacity() >= map.len() + 5000);
    }
}
