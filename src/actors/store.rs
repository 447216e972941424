//! A kind's cache: the reflector store of each namespace the controller watches (one for a
//! controller that watches one namespace or all). Each watch's re-list replaces its own store
//! only, so a namespace whose watch restarts leaves the others' objects in place.

use std::sync::Arc;

use kube::runtime::reflector::{self, ObjectRef, Store};

use kube::ResourceExt;

use super::ManagedResource;

/// The stores of one kind, by watched namespace (`None`: every namespace, or cluster-scoped).
#[derive(Clone)]
pub(crate) struct KindStore<K: ManagedResource> {
    stores: Arc<[(Option<String>, Store<K>)]>,
}

impl<K: ManagedResource> KindStore<K> {
    /// One store per entry of `namespaces`, with the writer each watch fills it through.
    pub(crate) fn new(namespaces: &[Option<String>]) -> (Self, Vec<reflector::store::Writer<K>>) {
        let (stores, writers): (Vec<_>, Vec<_>) = namespaces
            .iter()
            .map(|ns| {
                let (store, writer) = reflector::store::<K>();
                ((ns.clone(), store), writer)
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
    fn store_of(&self, key: &ObjectRef<K>) -> Option<&Store<K>> {
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
        self.store_of(key)?.get(key)
    }

    /// Every cached object.
    pub(crate) fn state(&self) -> Vec<Arc<K>> {
        match &*self.stores {
            [(_, only)] => only.state(),
            stores => stores.iter().flat_map(|(_, s)| s.state()).collect(),
        }
    }

    /// How many objects are cached.
    pub(crate) fn len(&self) -> usize {
        self.stores.iter().map(|(_, s)| s.len()).sum()
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
    obj.managed_fields_mut().clear();
    if let Some(annotations) = &mut obj.meta_mut().annotations {
        annotations.remove(LAST_APPLIED);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::watcher::Event;

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
        writers[0].apply_watcher_event(&Event::Apply(cm("a", "x")));
        writers[1].apply_watcher_event(&Event::Apply(cm("b", "x")));
        writers[1].apply_watcher_event(&Event::Apply(cm("b", "y")));
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
        writers[1].apply_watcher_event(&Event::Init);
        writers[1].apply_watcher_event(&Event::InitApply(cm("b", "y")));
        writers[1].apply_watcher_event(&Event::InitDone);
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
}
