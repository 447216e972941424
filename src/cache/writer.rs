//! Fills one watch's table from its events.

use std::sync::Arc;

use kube::runtime::watcher::Event;

use super::encoded::Encoded;
use super::table::{Cache, Held, Objects, meta_names, names};
use crate::ManagedResource;
use crate::lenient::Lenient;

/// Fills one watch's cache from its events, as kube's reflector writer does: changes at once,
/// a re-list (`Init` … `InitDone`) buffered and swapped in whole when it is complete, so the
/// cache never shows half a list.
pub(crate) struct Writer<K> {
    pub(super) cache: Cache<K>,
    /// The re-list in progress, built as it arrives (outside the cache's lock).
    pub(super) relist: Option<Objects<K>>,
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
                // An object the re-list finds unchanged stays as it is held: a passive one
                // encoded (its actor is not told of it, so nothing would encode it again).
                let kept = self.unchanged_encoded(&obj);
                if let Some(listed) = &mut self.relist {
                    match kept {
                        Some(encoded) => listed.insert_held(Held::Encoded(encoded)),
                        None => listed.insert(compact(obj)),
                    }
                }
            }
            Event::InitDone => {
                let listed = self.relist.take().unwrap_or_else(|| self.fresh());
                let mut cache = self.cache.write();
                // What the actors said carries over by name, under the lock: nothing said
                // meanwhile is lost.
                for slot in listed.table.iter() {
                    let (ns, name) = slot.names();
                    if let Some(said) = cache.find(ns, name).and_then(|s| s.said.get()) {
                        slot.said.set(Some(said));
                    }
                }
                *cache = listed;
            }
        }
    }

    /// Applies one event of a lenient watch ([`Lenient`]): a decoded object as
    /// [`Writer::apply_watcher_event`] does, an undecodable one held as what was read of it.
    pub(crate) fn apply_lenient(&mut self, event: Event<Lenient<K>>) {
        match event {
            Event::Apply(Lenient::Decoded(obj)) => self.apply_watcher_event(Event::Apply(obj)),
            Event::InitApply(Lenient::Decoded(obj)) => {
                self.apply_watcher_event(Event::InitApply(obj))
            }
            Event::Delete(Lenient::Decoded(obj)) => self.apply_watcher_event(Event::Delete(obj)),
            Event::Apply(Lenient::Undecodable(u)) => self
                .cache
                .write()
                .insert_held(Held::Undecodable(Arc::from(u))),
            Event::InitApply(Lenient::Undecodable(u)) => {
                let fresh = self.fresh();
                self.relist
                    .get_or_insert(fresh)
                    .insert_held(Held::Undecodable(Arc::from(u)));
            }
            Event::Delete(Lenient::Undecodable(u)) => {
                self.cache.write().remove_at(meta_names(&u.meta))
            }
            Event::Init => self.apply_watcher_event(Event::Init),
            Event::InitDone => self.apply_watcher_event(Event::InitDone),
        }
    }

    /// A copy of `obj`'s cached encoding, if it is held encoded at the same resource version.
    pub(super) fn unchanged_encoded(&self, obj: &K) -> Option<Encoded> {
        let version = obj.meta().resource_version.as_ref()?;
        let (ns, name) = names(obj);
        let cache = self.cache.read();
        match &cache.find(ns, name)?.obj {
            Held::Encoded(e)
                if e.metadata().and_then(|m| m.resource_version).as_ref() == Some(version) =>
            {
                Some(e.clone())
            }
            _ => None,
        }
    }

    /// An empty table, hashed as the cache is.
    pub(super) fn fresh(&self) -> Objects<K> {
        Objects::new(self.cache.read().hasher.clone(), 0)
    }
}

/// `obj` as it is cached: a copy, which holds no spare capacity. The JSON decoder leaves some in
/// every list it fills (a list of one status condition has room for four: a few hundred bytes
/// per object), and a cached object lives as long as its object.
pub(super) fn compact<K: Clone>(obj: K) -> Arc<K> {
    Arc::new(obj.clone())
}
