//! A kind's cache: the objects of each namespace the controller watches (one table for a
//! controller that watches one namespace or all). Each watch's re-list replaces its own store
//! only, so a namespace whose watch restarts leaves the others' objects in place.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use hashbrown::HashTable;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::Event;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::ManagedResource;
use super::object_map::name_hash;
use crate::lenient::{Lenient, Undecodable};
use crate::status::ResourceStatus;

/// One cached object, and whether its actor last reported it Ready (for the reference index:
/// kept here, where it costs a byte, rather than in a set of its own keyed by a copy of the
/// object's name; the same name keeps the flag across versions and re-lists).
struct Slot<K> {
    obj: Held<K>,
    ready: AtomicBool,
}

/// A cached object as it is held: whole, encoded while its actor is passive, or, when the
/// kind's type cannot hold it, as what was read of it ([`Undecodable`]: present, but no `K`).
enum Held<K> {
    Whole(Arc<K>),
    Encoded(Encoded),
    Undecodable(Arc<Undecodable>),
}

impl<K: ManagedResource> Held<K> {
    fn names(&self) -> (Option<&str>, &str) {
        match self {
            Held::Whole(obj) => names(obj.as_ref()),
            Held::Encoded(e) => e.names(),
            Held::Undecodable(u) => meta_names(&u.meta),
        }
    }

    /// The object's uid and generation: a Ready flag holds for one version of one object only.
    fn identity(&self) -> (Option<String>, Option<i64>) {
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
    fn names(&self) -> (Option<&str>, &str) {
        self.obj.names()
    }

    /// The object, decoded if it is held encoded.
    fn object(&self) -> Option<Arc<K>> {
        match &self.obj {
            Held::Whole(obj) => Some(obj.clone()),
            Held::Encoded(e) => e.decode().map(Arc::new),
            Held::Undecodable(_) => None,
        }
    }

    /// Whether the slot holds `obj` itself, whole.
    fn holds(&self, obj: &Arc<K>) -> bool {
        matches!(&self.obj, Held::Whole(held) if Arc::ptr_eq(held, obj))
    }
}

/// An object encoded as JSON behind its namespace and name (so the table finds it without
/// decoding it): `[namespace length: u16 LE, u16::MAX for none][name length: u16 LE]
/// [namespace][name][JSON]`.
///
/// A passive object's cached copy is held so: its bytes as JSON are a third to a half of the
/// decoded object's memory (every field of `ObjectMeta` takes its place in a decoded object,
/// set or not). It is decoded on the rare reads of a passive object (its actor re-activated by
/// a timer or a message, a reference check); a watch event brings a new version, held whole.
/// The layout is this module's own: no crate encodes a value behind a search key in one
/// allocation, and the key must be readable without a decoder.
#[derive(Clone)]
struct Encoded(Box<[u8]>);

impl Encoded {
    const NO_NAMESPACE: u16 = u16::MAX;
    /// In the name's length: the JSON lacks its [`type_prefix`].
    const TYPE_STRIPPED: u16 = 1 << 15;
    const HEADER: usize = 4;

    /// `obj` encoded, if it encodes and its encoding decodes to the same object again (a type
    /// whose `Deserialize` refuses or changes what its `Serialize` writes stays whole).
    fn new<K: ManagedResource>(obj: &K) -> Option<Self> {
        let prefix = type_prefix::<K>();
        let (ns, name) = names(obj);
        let ns_len = match ns {
            None => Self::NO_NAMESPACE,
            Some(ns) => u16::try_from(ns.len())
                .ok()
                .filter(|l| *l != Self::NO_NAMESPACE)?,
        };
        // Kubernetes names are at most 253 bytes; a longer one (not from an API server) stays
        // whole rather than reach the flag bit.
        let name_len = u16::try_from(name.len())
            .ok()
            .filter(|l| *l < Self::TYPE_STRIPPED)?;
        let encoded = SCRATCH.with_borrow_mut(|json| {
            json.clear();
            serde_json::to_writer(&mut *json, obj).ok()?;
            // Most types write their `apiVersion` and `kind` first: the same for every object
            // of the kind, so not kept (decoding puts them back).
            let rest = json.strip_prefix(prefix.as_bytes());
            let (flag, body) = match rest {
                Some(rest) => (Self::TYPE_STRIPPED, rest),
                None => (0, &json[..]),
            };
            let mut bytes =
                Vec::with_capacity(Self::HEADER + ns.map_or(0, str::len) + name.len() + body.len());
            bytes.extend_from_slice(&ns_len.to_le_bytes());
            bytes.extend_from_slice(&(name_len | flag).to_le_bytes());
            bytes.extend_from_slice(ns.unwrap_or("").as_bytes());
            bytes.extend_from_slice(name.as_bytes());
            bytes.extend_from_slice(body);
            Some(Self(bytes.into_boxed_slice()))
        })?;
        // Decoding must give back the object itself, not only some object: a type whose
        // `Deserialize` drops or changes what its `Serialize` wrote (a defaulted field, a
        // lossy number) would hand a reconcile another object than the one cached.
        let again = serde_json::to_vec(&encoded.parse::<K>(prefix.as_bytes())?).ok()?;
        let body = encoded.json();
        let same_bytes = match again.strip_prefix(prefix.as_bytes()) {
            Some(rest) if encoded.type_stripped() => rest == body,
            _ => !encoded.type_stripped() && again == body,
        };
        // Maps whose order is not fixed (a `HashMap` field) write the same object in another
        // order: compared as JSON values then.
        let same = same_bytes || {
            let original: Option<serde_json::Value> = encoded.parse(prefix.as_bytes());
            original.is_some()
                && serde_json::from_slice::<serde_json::Value>(&again).ok() == original
        };
        same.then_some(encoded)
    }

    fn lengths(&self) -> (Option<usize>, usize) {
        let b = &self.0;
        let ns = u16::from_le_bytes([b[0], b[1]]);
        let name = u16::from_le_bytes([b[2], b[3]]) & !Self::TYPE_STRIPPED;
        (
            (ns != Self::NO_NAMESPACE).then_some(usize::from(ns)),
            usize::from(name),
        )
    }

    fn type_stripped(&self) -> bool {
        u16::from_le_bytes([self.0[2], self.0[3]]) & Self::TYPE_STRIPPED != 0
    }

    fn names(&self) -> (Option<&str>, &str) {
        let (ns, name) = self.lengths();
        let ns_len = ns.unwrap_or(0);
        let text = |from: usize, len: usize| {
            std::str::from_utf8(&self.0[from..from + len]).unwrap_or_default()
        };
        (
            ns.map(|len| text(Self::HEADER, len)),
            text(Self::HEADER + ns_len, name),
        )
    }

    fn json(&self) -> &[u8] {
        let (ns, name) = self.lengths();
        &self.0[Self::HEADER + ns.unwrap_or(0) + name..]
    }

    /// The object. Checked when it was encoded, so `None` only for a type whose decoding is
    /// not a function of its bytes.
    fn decode<K: ManagedResource>(&self) -> Option<K> {
        self.parse(type_prefix::<K>().as_bytes())
    }

    /// Some fields of the object, read into `T` without decoding the rest (the JSON without
    /// its type prefix is still the object's members, after its `{`).
    fn read<T: serde::de::DeserializeOwned>(&self) -> Option<T> {
        self.parse(b"{")
    }

    /// The JSON parsed into `T`, `prefix` put back first if the type prefix was stripped.
    fn parse<T: serde::de::DeserializeOwned>(&self, prefix: &[u8]) -> Option<T> {
        if !self.type_stripped() {
            return serde_json::from_slice(self.json()).ok();
        }
        SCRATCH.with_borrow_mut(|buf| {
            buf.clear();
            buf.extend_from_slice(prefix);
            buf.extend_from_slice(self.json());
            serde_json::from_slice(buf).ok()
        })
    }

    /// The object's metadata fields that the cache reads without decoding it.
    fn metadata(&self) -> Option<PartialMeta> {
        #[derive(serde::Deserialize)]
        struct Object {
            #[serde(default)]
            metadata: PartialMeta,
        }
        Some(self.read::<Object>()?.metadata)
    }

    /// Whether the object is being deleted, its status as [`ResourceStatus::of`] reads it, and
    /// its generation.
    fn readiness(&self) -> Option<(bool, ResourceStatus, Option<i64>)> {
        #[derive(serde::Deserialize)]
        struct Object {
            #[serde(default)]
            metadata: PartialMeta,
            #[serde(default)]
            status: Option<serde_json::Value>,
        }
        let o = self.read::<Object>()?;
        let status = o
            .status
            .and_then(|s| serde_json::from_value(s).ok())
            .unwrap_or_default();
        Some((
            o.metadata.deletion_timestamp.is_some(),
            status,
            o.metadata.generation,
        ))
    }
}

/// What the cache reads of an encoded object's metadata.
#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct PartialMeta {
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default)]
    deletion_timestamp: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    uid: Option<String>,
    #[serde(default)]
    generation: Option<i64>,
}

thread_local! {
    /// Each thread's buffer for encoding and decoding (the encoded bytes are copied out at
    /// their exact length; a shrunk buffer would keep its whole allocation).
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// How the JSON of an object of kind `K` begins when its type writes `apiVersion` and `kind`
/// first, as kube's derived custom resources and k8s-openapi's types do.
fn type_prefix<K: ManagedResource>() -> String {
    format!(
        "{{\"apiVersion\":{},\"kind\":{},",
        serde_json::Value::from(K::api_version(&()).as_ref()),
        serde_json::Value::from(K::kind(&()).as_ref()),
    )
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
    meta_names(obj.meta())
}

fn meta_names(meta: &ObjectMeta) -> (Option<&str>, &str) {
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

    fn hash_slot(hasher: &ahash::RandomState, slot: &Slot<K>) -> u64 {
        let (ns, name) = slot.names();
        name_hash(hasher, ns, name)
    }

    fn get(&self, key: &ObjectRef<K>) -> Option<&Slot<K>> {
        self.find(key.namespace.as_deref(), &key.name)
    }

    fn find(&self, ns: Option<&str>, name: &str) -> Option<&Slot<K>> {
        self.table.find(name_hash(&self.hasher, ns, name), |s| {
            s.names() == (ns, name)
        })
    }

    fn get_mut(&mut self, key: &ObjectRef<K>) -> Option<&mut Slot<K>> {
        let (ns, name) = (key.namespace.as_deref(), key.name.as_str());
        self.table.find_mut(name_hash(&self.hasher, ns, name), |s| {
            s.names() == (ns, name)
        })
    }

    /// Caches `obj`, keeping the Ready flag of the version it replaces.
    fn insert(&mut self, obj: Arc<K>) {
        self.insert_held(Held::Whole(obj));
    }

    /// Caches `held`, keeping the Ready flag of the version it replaces when it is the same
    /// object at the same generation (not one deleted and created again under the name, nor a
    /// changed spec: its actor says Ready again once it reconciled it).
    fn insert_held(&mut self, held: Held<K>) {
        let hasher = &self.hasher;
        let (ns, name) = held.names();
        let hash = name_hash(hasher, ns, name);
        match self.table.find_mut(hash, |s| s.names() == (ns, name)) {
            Some(slot) => {
                if *slot.ready.get_mut() && slot.obj.identity() != held.identity() {
                    *slot.ready.get_mut() = false;
                }
                slot.obj = held;
            }
            None => {
                let slot = Slot {
                    obj: held,
                    ready: AtomicBool::new(false),
                };
                self.table
                    .insert_unique(hash, slot, |s| Self::hash_slot(hasher, s));
            }
        }
    }

    fn remove(&mut self, obj: &K) {
        self.remove_at(names(obj));
    }

    fn remove_at(&mut self, (ns, name): (Option<&str>, &str)) {
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
                // The Ready flags carry over by name, under the lock: none set meanwhile is lost.
                for slot in listed.table.iter() {
                    let (ns, name) = slot.names();
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
    fn unchanged_encoded(&self, obj: &K) -> Option<Encoded> {
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

    /// Records whether `key`'s actor last reported it Ready (nothing if it is not cached: then
    /// it has been deleted, and its flag with it).
    pub(crate) fn set_ready(&self, key: &ObjectRef<K>, ready: bool) {
        if let Some(store) = self.store_of(key)
            && let Some(slot) = store.read().get(key)
        {
            slot.ready.store(ready, Ordering::Relaxed);
        }
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
                slot.ready.store(true, Ordering::Relaxed);
                true
            }
            _ => false,
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

    /// A passive object held encoded is found by its name, reads back equal, shows its
    /// version without decoding, and is replaced whole by its next version; only the version
    /// given is encoded.
    #[test]
    fn an_encoded_object_reads_back_equal_and_its_next_version_is_whole() {
        let (store, mut writers) = KindStore::<ConfigMap>::new(&[None]);
        let w = &mut writers[0];
        let mut c = cm("ns", "x");
        c.metadata.resource_version = Some("7".into());
        c.metadata.uid = Some("a-uid".into());
        c.data = Some([("k".to_string(), "v\u{e9}".to_string())].into());
        w.apply_watcher_event(Event::Apply(c.clone()));
        w.apply_watcher_event(Event::Apply(cm("ns", "y")));
        w.apply_watcher_event(Event::Apply(cm("other", "x")));
        let key = ObjectRef::new("x").within("ns");
        let cached = store.get(&key).expect("cached");

        let stale = Arc::new(c.clone());
        assert!(!store.encode(&key, &stale), "not the cached version");
        store.set_ready(&key, true);
        assert!(store.encode(&key, &cached));
        assert_eq!(store.encoded_len(), 1);
        let stripped = store.stores[0]
            .1
            .read()
            .get(&key)
            .is_some_and(|s| matches!(&s.obj, Held::Encoded(e) if e.type_stripped()));
        assert!(
            stripped,
            "a ConfigMap's JSON begins with its apiVersion and kind"
        );
        assert!(!store.encode(&key, &cached), "already encoded");
        drop(cached);

        assert_eq!(store.get(&key).as_deref(), Some(&c));
        assert!(store.contains(&key));
        assert!(store.is_ready(&key), "the flag stays with the slot");
        assert_eq!(store.resource_version(&key), Some(Some("7".into())));
        assert_eq!(
            store.resource_version(&ObjectRef::new("gone").within("ns")),
            None
        );
        assert!(store.get(&ObjectRef::new("x").within("other")).is_some());
        assert!(store.get(&ObjectRef::new("y").within("ns")).is_some());
        assert_eq!(store.state().len(), 3, "state decodes what is encoded");

        // The table grows (rehashing every slot, the encoded one by its header's names).
        for i in 0..200 {
            w.apply_watcher_event(Event::Apply(cm("ns", &format!("z{i}"))));
        }
        assert_eq!(store.get(&key).as_deref(), Some(&c));

        let mut next = c.clone();
        next.metadata.resource_version = Some("8".into());
        w.apply_watcher_event(Event::Apply(next.clone()));
        assert_eq!(store.encoded_len(), 0, "a new version is held whole");
        assert_eq!(store.get(&key).as_deref(), Some(&next));

        assert!(store.encode(&key, &store.get(&key).expect("cached")));
        w.apply_watcher_event(Event::Delete(next));
        assert!(
            !store.contains(&key),
            "an encoded object is deleted by name"
        );
        assert_eq!(store.encoded_len(), 0);
    }

    /// A cluster-scoped object (no namespace) and a re-list: encoded slots are matched by the
    /// names in their header.
    #[test]
    fn encoded_objects_without_a_namespace_keep_their_flags_across_a_relist() {
        let (store, mut writers) = KindStore::<ConfigMap>::new(&[None]);
        let w = &mut writers[0];
        let mut c = ConfigMap::default();
        c.metadata.name = Some("cluster-wide".into());
        w.apply_watcher_event(Event::Apply(c.clone()));
        let key = ObjectRef::<ConfigMap>::new("cluster-wide");
        assert!(store.encode(&key, &store.get(&key).expect("cached")));
        assert_eq!(store.get(&key).as_deref(), Some(&c));
        assert!(!store.contains(&ObjectRef::new("cluster-wide").within("")));
        store.set_ready(&key, true);
        w.apply_watcher_event(Event::Init);
        w.apply_watcher_event(Event::InitApply(c.clone()));
        w.apply_watcher_event(Event::InitDone);
        assert!(store.is_ready(&key));
    }

    /// A re-list keeps an unchanged object as it is held (encoded), and a changed one whole.
    #[test]
    fn a_relist_keeps_unchanged_objects_encoded() {
        let (store, mut writers) = KindStore::<ConfigMap>::new(&[None]);
        let w = &mut writers[0];
        let at = |name: &str, rv: &str| {
            let mut c = cm("ns", name);
            c.metadata.resource_version = Some(rv.into());
            c
        };
        for name in ["same", "changed"] {
            w.apply_watcher_event(Event::Apply(at(name, "1")));
            let key = ObjectRef::new(name).within("ns");
            assert!(store.encode(&key, &store.get(&key).expect("cached")));
        }
        w.apply_watcher_event(Event::Init);
        w.apply_watcher_event(Event::InitApply(at("same", "1")));
        w.apply_watcher_event(Event::InitApply(at("changed", "2")));
        w.apply_watcher_event(Event::InitDone);
        assert_eq!(store.encoded_len(), 1);
        let version = |name: &str| store.resource_version(&ObjectRef::new(name).within("ns"));
        assert_eq!(version("same"), Some(Some("1".into())));
        assert_eq!(version("changed"), Some(Some("2".into())));
        assert_eq!(
            store.get(&ObjectRef::new("same").within("ns")).as_deref(),
            Some(&at("same", "1"))
        );
    }

    /// The Ready flag an object's actor set holds for that object at that generation only:
    /// another generation (a changed spec) or another uid (deleted and created again under the
    /// name) clears it, whole or encoded; a new version of the same (its status) keeps it.
    #[test]
    fn the_ready_flag_is_of_one_generation_of_one_object() {
        use crate::actors::testing::{Widget, WidgetSpec};
        let (store, mut writers) = KindStore::<Widget>::new(&[None]);
        let key = ObjectRef::new("w").within("ns");
        let version = |uid: &str, generation: i64, rv: &str| {
            let mut w = Widget::new("w", WidgetSpec::default());
            w.metadata.namespace = Some("ns".into());
            w.metadata.uid = Some(uid.into());
            w.metadata.generation = Some(generation);
            w.metadata.resource_version = Some(rv.into());
            w
        };
        writers[0].apply_watcher_event(Event::Apply(version("u1", 1, "1")));
        store.set_ready(&key, true);
        writers[0].apply_watcher_event(Event::Apply(version("u1", 1, "2")));
        assert!(store.is_ready(&key), "a status write keeps it");
        for encoded in [false, true] {
            if encoded {
                store.set_ready(&key, true);
                assert!(store.encode(&key, &store.get(&key).unwrap()));
            }
            let next = if encoded { ("u1", 3) } else { ("u1", 2) };
            writers[0].apply_watcher_event(Event::Apply(version(next.0, next.1, "3")));
            assert!(
                !store.is_ready(&key),
                "a new generation clears it (encoded: {encoded})"
            );
        }
        store.set_ready(&key, true);
        writers[0].apply_watcher_event(Event::Apply(version("u2", 3, "9")));
        assert!(!store.is_ready(&key), "another object under the name");
    }

    /// What the reference index reads of an encoded object (deletion, status) is what it reads
    /// of the whole object.
    #[test]
    fn an_encoded_object_s_readiness_is_read_as_the_whole_object_s() {
        use crate::actors::testing::{Widget, WidgetSpec};
        use crate::status::{Phase, ReadyReason};
        let (store, mut writers) = KindStore::<Widget>::new(&[None]);
        let ready = ResourceStatus::default().with_ready(
            Phase::Ready,
            true,
            ReadyReason::Provisioned,
            "all done",
            Some(3),
        );
        let mut objects = Vec::new();
        for (name, status, deleting) in [
            ("ready", Some(ready), false),
            ("bare", None, false),
            ("leaving", None, true),
        ] {
            let mut w = Widget::new(name, WidgetSpec::default());
            w.metadata.namespace = Some("ns".into());
            w.status = status;
            if deleting {
                w.metadata.deletion_timestamp = Some(
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
                );
            }
            writers[0].apply_watcher_event(Event::Apply(w));
            objects.push(ObjectRef::new(name).within("ns"));
        }
        for key in &objects {
            let whole = store.readiness(key).expect("cached");
            let deleting = store.deleting(key).expect("cached");
            assert!(store.encode(key, &store.get(key).expect("cached")));
            assert_eq!(store.readiness(key), Some(whole), "{key}");
            assert_eq!(store.deleting(key), Some(deleting), "{key}");
        }
        let read = |name: &str| store.readiness(&ObjectRef::new(name).within("ns"));
        assert!(read("ready").is_some_and(|(d, s, _)| !d && s.is_ready()));
        assert!(read("bare").is_some_and(|(d, s, _)| !d && !s.is_ready()));
        assert!(read("leaving").is_some_and(|(d, _, _)| d));
        assert_eq!(
            store.deleting(&ObjectRef::new("leaving").within("ns")),
            Some(true)
        );
        assert_eq!(
            store.deleting(&ObjectRef::new("ready").within("ns")),
            Some(false)
        );
    }

    /// A kind whose `Deserialize` refuses what its `Serialize` writes.
    #[derive(
        kube::CustomResource,
        Clone,
        Debug,
        serde::Deserialize,
        serde::Serialize,
        schemars::JsonSchema,
    )]
    #[kube(
        group = "test.actorcile.dev",
        version = "v1",
        kind = "OneWay",
        namespaced
    )]
    struct OneWaySpec {
        #[serde(skip_serializing)]
        required: String,
    }

    #[derive(
        kube::CustomResource,
        Clone,
        Debug,
        serde::Deserialize,
        serde::Serialize,
        schemars::JsonSchema,
    )]
    #[kube(
        group = "test.actorcile.dev",
        version = "v1",
        kind = "Lossy",
        namespaced
    )]
    struct LossySpec {
        /// Decodes as something else than was written: a trimmed copy.
        #[serde(deserialize_with = "trimmed")]
        name: String,
    }

    fn trimmed<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        Ok(<String as serde::Deserialize>::deserialize(d)?
            .trim()
            .to_string())
    }

    /// An object that decodes from its encoding, but as another object, stays whole: a
    /// reconcile must see the object as it was cached.
    #[test]
    fn a_kind_that_decodes_to_another_object_stays_whole() {
        let (store, mut writers) = KindStore::<Lossy>::new(&[None]);
        let mut o = Lossy::new(
            "a",
            LossySpec {
                name: "  spaced ".into(),
            },
        );
        o.metadata.namespace = Some("ns".into());
        writers[0].apply_watcher_event(Event::Apply(o));
        let key = ObjectRef::new("a").within("ns");
        let obj = store.get(&key).expect("cached");
        assert!(!store.encode(&key, &obj));
        assert_eq!(store.get(&key).expect("cached").spec.name, "  spaced ");
        // One that round-trips, with a map whose order is not fixed, is encoded.
        let (store, mut writers) = KindStore::<ConfigMap>::new(&[None]);
        let mut c = cm("ns", "x");
        c.data = Some(
            (0..20)
                .map(|i| (format!("k{i}"), "v".to_string()))
                .collect(),
        );
        writers[0].apply_watcher_event(Event::Apply(c.clone()));
        let key = ObjectRef::new("x").within("ns");
        let obj = store.get(&key).expect("cached");
        assert!(store.encode(&key, &obj));
        assert_eq!(store.get(&key).unwrap().as_ref(), &c);
    }

    /// Ready is recorded for the generation a reconcile ran on only: a newer generation cached
    /// since then is not Ready until its own reconcile says so.
    #[test]
    fn ready_is_recorded_for_the_generation_reconciled_only() {
        let (store, mut writers) = KindStore::<ConfigMap>::new(&[None]);
        let at = |generation: i64| {
            let mut c = cm("ns", "t");
            c.metadata.generation = Some(generation);
            c
        };
        let key = ObjectRef::new("t").within("ns");
        writers[0].apply_watcher_event(Event::Apply(at(1)));
        // Generation 2 arrives while generation 1's reconcile ends Ready.
        writers[0].apply_watcher_event(Event::Apply(at(2)));
        assert!(!store.set_ready_at(&key, Some(1)));
        assert!(!store.is_ready(&key));
        assert!(store.set_ready_at(&key, Some(2)));
        assert!(store.is_ready(&key));
        assert!(!store.set_ready_at(&ObjectRef::new("gone").within("ns"), Some(1)));
    }

    /// An object that does not decode from its own encoding stays whole, and so does every
    /// object of its kind after it.
    #[test]
    fn a_kind_that_does_not_round_trip_stays_whole() {
        let (store, mut writers) = KindStore::<OneWay>::new(&[None]);
        for name in ["a", "b"] {
            let mut o = OneWay::new(
                name,
                OneWaySpec {
                    required: "kept".into(),
                },
            );
            o.metadata.namespace = Some("ns".into());
            writers[0].apply_watcher_event(Event::Apply(o));
        }
        for name in ["a", "b"] {
            let key = ObjectRef::new(name).within("ns");
            let obj = store.get(&key).expect("cached");
            assert!(!store.encode(&key, &obj));
            assert_eq!(store.get(&key).expect("cached").spec.required, "kept");
        }
        assert!(!store.encodes.load(Ordering::Relaxed));
        assert_eq!(store.encoded_len(), 0);
    }
}
