//! The watches behind a controller's triggers (see [`crate::triggers`]): its provider config,
//! whose change re-runs every object; the Secrets its objects reference, whose change re-runs
//! the objects that reference them; and the children it owns and the objects it relates to
//! ([`Controller::owns`], [`Controller::watches`]), whose change re-runs the objects they map
//! to.
//!
//! [`Controller::owns`]: crate::runtime::Controller::owns
//! [`Controller::watches`]: crate::runtime::Controller::watches

use std::any::Any;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::{self, Event};
use kube::{Client, Resource};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::mailbox::Mailbox;
use super::{FastMap, ManagedResource, Shared};
use crate::lenient::Lenient;
use crate::messages::{ManagerMsg, ResourceMsg};
use crate::triggers::{ConfigRef, PollFrom, SecretIndex, SecretRefs};

/// A controller's provider config as its reconciles see it (the config's type erased).
pub(crate) trait ConfigView: Send + Sync {
    /// The config object now (`None`: it does not exist).
    fn current(&self) -> Option<Arc<dyn Any + Send + Sync>>;
    /// The poll interval the config gives, if it gives one.
    fn poll_interval(&self) -> Option<Duration>;
    /// `namespace/name` of the config, for status messages.
    fn describe(&self) -> &str;
    /// The field at which the config could not be decoded as its type, while it cannot (then
    /// [`ConfigView::current`] is `None`: provisioning waits as for a missing config).
    fn unreadable(&self) -> Option<String>;
}

/// The config as the reconciles read it, and what its watch decides by. It outlives the watch:
/// a watch that is started again (after a panic) goes on from it, so the config does not read
/// as missing meanwhile and a change made while no watch ran still re-runs every object.
struct ConfigState<C: Resource<DynamicType = ()> + 'static> {
    /// The config object as last listed or watched. One object by name, so a slot rather than a
    /// reflector's store: a store has one writer, which a watch task that panicked takes with
    /// it.
    slot: std::sync::RwLock<Option<Arc<C>>>,
    /// What the last list or event showed (its version and unreadable field): a list after a
    /// restart that shows something else re-runs every object. `None` until the first list.
    last: std::sync::Mutex<Option<ConfigSeen>>,
    key: ObjectRef<C>,
    poll_from: Option<PollFrom<C>>,
    described: String,
    /// The last out-of-range poll interval the config gave that was logged.
    warned: std::sync::Mutex<Option<Duration>>,
    /// Set while the config's newest version cannot be decoded as `C`: the field the decoder
    /// named ([`Undecodable::field`](crate::lenient::Undecodable)).
    unreadable: std::sync::Mutex<Option<String>>,
}

/// A config's version ([`config_version`], `None` without one) and the field at which it could
/// not be decoded.
type ConfigSeen = (Option<(Option<String>, Option<String>)>, Option<String>);

impl<C: Resource<DynamicType = ()> + 'static> ConfigState<C> {
    fn get(&self) -> Option<Arc<C>> {
        self.slot.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set(&self, config: Option<C>) {
        *self.slot.write().unwrap_or_else(|e| e.into_inner()) = config.map(Arc::new);
    }
}

/// The shortest poll interval a config object may give: shorter ones (`pollSeconds: 0`) would
/// re-run every object without pause.
pub(crate) const MIN_CONFIG_POLL: Duration = Duration::from_secs(1);

impl<C> ConfigView for ConfigState<C>
where
    C: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    fn current(&self) -> Option<Arc<dyn Any + Send + Sync>> {
        if self.unreadable().is_some() {
            return None;
        }
        self.get().map(|c| c as Arc<dyn Any + Send + Sync>)
    }
    fn poll_interval(&self) -> Option<Duration> {
        let f = self.poll_from.as_ref()?;
        let given = f(self.get()?.as_ref())?;
        let bounded = given.clamp(MIN_CONFIG_POLL, crate::policy::MAX_DURATION);
        if bounded != given {
            let mut warned = self.warned.lock().unwrap_or_else(|e| e.into_inner());
            if *warned != Some(given) {
                *warned = Some(given);
                tracing::warn!(
                    config = %self.described,
                    given = ?given,
                    used = ?bounded,
                    "the config's poll interval is out of range (1 s to 1 year); using the nearest bound"
                );
            }
        }
        Some(bounded)
    }
    fn describe(&self) -> &str {
        &self.described
    }
    fn unreadable(&self) -> Option<String> {
        self.unreadable
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Starts the config watch once the manager exists (again, after a panic, from where the last
/// left off): `broadcast` re-runs every object, `listed` is set once a first list is in.
pub(crate) type StartConfigWatch =
    Box<dyn Fn(Arc<dyn Fn() + Send + Sync>, Arc<watch::Sender<bool>>) -> JoinHandle<()> + Send>;

/// The view of the config `cref` names, and what starts its watch.
pub(crate) fn config_trigger<C>(
    client: &Client,
    cref: ConfigRef<C>,
) -> (Arc<dyn ConfigView>, StartConfigWatch)
where
    C: ManagedResource,
{
    let key = match &cref.namespace {
        Some(ns) => ObjectRef::new(&cref.name).within(ns),
        None => ObjectRef::new(&cref.name),
    };
    let view = Arc::new(ConfigState {
        slot: Default::default(),
        last: Default::default(),
        key: key.clone(),
        poll_from: cref.poll_from.clone(),
        described: cref.describe(),
        warned: Default::default(),
        unreadable: Default::default(),
    });
    // By name in its namespace: what RBAC can grant by `resourceNames`.
    let fields = format!("metadata.name={}", cref.name);
    let api: Api<Lenient<C>> =
        crate::object_api::kind_api(client.clone(), cref.namespace.as_deref());
    let config = watcher::Config::default().fields(&fields);
    let secrets = cref.secrets_from.clone().map(|refs| {
        let api: Api<PartialObjectMeta<Secret>> = match &cref.namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        (api, refs)
    });
    let state = view.clone();
    let start: StartConfigWatch = Box::new(move |broadcast, listed| {
        let (api, config, state, secrets, key) = (
            api.clone(),
            config.clone(),
            state.clone(),
            secrets.clone(),
            key.clone(),
        );
        tokio::spawn(async move {
            let config_watch = watch_config(api, config, state.clone(), broadcast.clone(), listed);
            match secrets {
                None => config_watch.await,
                Some((api, refs)) => {
                    // A Secret the config names now: every object runs again.
                    let changed = move |secret: &ObjectRef<Secret>| {
                        if state
                            .get()
                            .is_some_and(|c| refs(c.as_ref()).contains(secret))
                        {
                            tracing::info!(config = %key, secret = %secret, "a Secret of the provider config changed; re-running every object");
                            broadcast();
                        }
                    };
                    tokio::join!(config_watch, watch_secret_changes(api, changed));
                }
            }
        })
    });
    (view, start)
}

/// What identifies a version of the config that its users would act on: its uid and its
/// generation (its resourceVersion for kinds without one, such as ConfigMaps), so that a
/// config's own status updates do not re-run every object.
fn config_version<C: Resource>(c: &C) -> (Option<String>, Option<String>) {
    let m = c.meta();
    let version = m
        .generation
        .map(|g| g.to_string())
        .or_else(|| m.resource_version.clone());
    (m.uid.clone(), version)
}

async fn watch_config<C>(
    api: Api<Lenient<C>>,
    config: watcher::Config,
    state: Arc<ConfigState<C>>,
    broadcast: Arc<dyn Fn() + Send + Sync>,
    listed: Arc<watch::Sender<bool>>,
) where
    C: ManagedResource,
{
    let events = watcher::watcher(api, config).default_backoff();
    futures::pin_mut!(events);
    // The config a list in progress found (`None` outside a list).
    let mut listing: Option<Option<C>> = None;
    let key = &state.key;
    let set_unreadable = |field: Option<String>| {
        *state.unreadable.lock().unwrap_or_else(|e| e.into_inner()) = field;
    };
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(event) => event,
            // The store keeps the config it had: a transient error drops nothing.
            Err(e) => {
                tracing::warn!(error = %e, config = %key, "config watch error; retrying with backoff");
                continue;
            }
        };
        // A version the type cannot hold reads as no config (provisioning waits, and its
        // status says why) until a version it can hold comes.
        match event {
            Event::Init => {
                set_unreadable(None);
                listing = Some(None);
                continue;
            }
            Event::InitApply(Lenient::Decoded(c)) => {
                set_unreadable(None);
                listing = Some(Some(c));
                continue;
            }
            Event::InitApply(Lenient::Undecodable(u)) => {
                tracing::error!(config = %key, field = %u.field, "the provider config cannot be decoded as its type; provisioning waits until it can");
                set_unreadable(Some(u.field.clone()));
                listing = Some(None);
                continue;
            }
            Event::InitDone => state.set(listing.take().flatten()),
            Event::Apply(Lenient::Decoded(c)) => {
                set_unreadable(None);
                state.set(Some(c));
            }
            Event::Apply(Lenient::Undecodable(u)) => {
                tracing::error!(config = %key, field = %u.field, "the provider config cannot be decoded as its type; provisioning waits until it can");
                set_unreadable(Some(u.field.clone()));
            }
            Event::Delete(_) => {
                set_unreadable(None);
                state.set(None);
            }
        }
        let now = (
            state.get().map(|c| config_version(c.as_ref())),
            state.unreadable(),
        );
        let before = state
            .last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace(now.clone());
        listed.send_replace(true);
        // The first list ever only tells what there is; after it, a list or event that shows
        // another version (a change meanwhile, when the watch started again) re-runs every
        // object.
        if before.is_some_and(|before| before != now) {
            tracing::info!(config = %key, "provider config changed; re-running every object");
            broadcast();
        }
    }
}

/// Re-run `key`: at its live actor, or through the manager.
pub(crate) fn notify<K: ManagedResource>(
    shared: &Shared<K>,
    manager: &Mailbox<ManagerMsg<K>>,
    key: ObjectRef<K>,
) {
    if let Some(a) = shared.routes.get(&key)
        && a.cast(ResourceMsg::Notify).is_ok()
    {
        return;
    }
    manager.send(ManagerMsg::Notify(key));
}

/// Watch the Secrets (metadata only: their data is never held) and re-run the objects that
/// reference one when it changes, appears or goes. Nothing re-runs for the first list (every
/// object runs at start-up anyway); a re-list compares each Secret's resourceVersion with the
/// last one seen, so changes made while the watch was down are not missed.
pub(crate) async fn watch_secrets<K: ManagedResource>(
    shared: Arc<Shared<K>>,
    api: Api<PartialObjectMeta<Secret>>,
    manager: Mailbox<ManagerMsg<K>>,
) {
    let Some(trigger) = shared.secrets.as_ref() else {
        return;
    };
    let changed = |secret: &ObjectRef<Secret>| {
        let referrers = trigger.index().referrers(secret);
        for key in referrers {
            notify(&shared, &manager, key);
        }
    };
    watch_secret_changes(api, changed).await;
}

/// Calls `changed` for each Secret `api` watches that changes, appears or goes: not for the
/// first list; a re-list compares each Secret's resourceVersion with the last one seen, so
/// changes made while the watch was down are not missed.
async fn watch_secret_changes(
    api: Api<PartialObjectMeta<Secret>>,
    changed: impl Fn(&ObjectRef<Secret>),
) {
    let events = watcher::watcher(api, watcher::Config::default()).default_backoff();
    futures::pin_mut!(events);
    let mut known: FastMap<ObjectRef<Secret>, String> = FastMap::default();
    let mut first = true;
    let mut seen: Option<HashSet<ObjectRef<Secret>, ahash::RandomState>> = None;
    while let Some(event) = events.next().await {
        let (meta, listing) = match event {
            Ok(Event::Init) => {
                seen = Some(HashSet::default());
                continue;
            }
            Ok(Event::InitApply(m)) => (m, true),
            Ok(Event::Apply(m)) => (m, false),
            Ok(Event::Delete(m)) => {
                let key = secret_key(&m.metadata);
                known.remove(&key);
                changed(&key);
                continue;
            }
            Ok(Event::InitDone) => {
                if let Some(seen) = seen.take()
                    && !first
                {
                    let gone: Vec<_> = known
                        .keys()
                        .filter(|k| !seen.contains(*k))
                        .cloned()
                        .collect();
                    for key in gone {
                        known.remove(&key);
                        changed(&key);
                    }
                }
                first = false;
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "secret watch error; retrying with backoff");
                continue;
            }
        };
        let key = secret_key(&meta.metadata);
        if listing && let Some(seen) = &mut seen {
            seen.insert(key.clone());
        }
        let rv = meta.metadata.resource_version.unwrap_or_default();
        let before = known.insert(key.clone(), rv.clone());
        if !(listing && first) && before.as_deref() != Some(rv.as_str()) {
            changed(&key);
        }
    }
}

fn secret_key(meta: &kube::api::ObjectMeta) -> ObjectRef<Secret> {
    let r = ObjectRef::<Secret>::new(meta.name.as_deref().unwrap_or_default());
    match &meta.namespace {
        Some(ns) => r.within(ns),
        None => r,
    }
}

/// The Secrets trigger of a controller: which Secrets an object references (the user's
/// function), and the index of it the feeder keeps current.
pub(crate) struct SecretTrigger<K: ManagedResource> {
    refs: SecretRefs<K>,
    index: std::sync::Mutex<SecretIndex<K>>,
}

impl<K: ManagedResource> SecretTrigger<K> {
    pub(crate) fn new(refs: SecretRefs<K>) -> Self {
        Self {
            refs,
            index: std::sync::Mutex::default(),
        }
    }

    fn index(&self) -> std::sync::MutexGuard<'_, SecretIndex<K>> {
        self.index
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A version of the object came in: index what it references now.
    pub(crate) fn observed(&self, key: &ObjectRef<K>, obj: &K) {
        let secrets = (self.refs)(obj);
        self.index().set(key, secrets);
    }

    /// The object is gone.
    pub(crate) fn forget(&self, key: &ObjectRef<K>) {
        self.index().remove(key);
    }

    /// After a re-list of `namespace` (`None`: of every namespace): forget every object of it
    /// that the list did not hold.
    pub(crate) fn retain(
        &self,
        existing: &HashSet<ObjectRef<K>, ahash::RandomState>,
        namespace: Option<&str>,
    ) {
        self.index().retain(|k| {
            existing.contains(k) || namespace.is_some_and(|ns| k.namespace.as_deref() != Some(ns))
        });
    }
}

/// Maps a related object to the managed objects to run ([`Controller::watches`]).
///
/// [`Controller::watches`]: crate::runtime::Controller::watches
pub(crate) type RelatedMap<K, R> = Arc<dyn Fn(&R) -> Vec<ObjectRef<K>> + Send + Sync>;

/// Re-run the objects `map` names for each change, appearance or deletion that `events` (a
/// watch of kind `R`) delivers. An echo of the runtime's own write of a child (`echoes`) runs
/// nothing; nothing re-runs for the first list (every object runs at start-up anyway); a
/// re-list re-runs the objects of what changed or went while the watch was down.
pub(crate) async fn watch_related<K, R, S>(
    shared: Arc<Shared<K>>,
    events: S,
    map: RelatedMap<K, R>,
    echoes: Option<Arc<crate::provisioners::context::OwnWrites>>,
    manager: Mailbox<ManagerMsg<K>>,
) where
    K: ManagedResource,
    R: Resource<DynamicType = ()>,
    S: futures::Stream<Item = Result<Event<R>, watcher::Error>>,
{
    let mut related = Related::new(shared, map, echoes, manager, None);
    futures::pin_mut!(events);
    while let Some(event) = events.next().await {
        related.handle(event);
    }
}

/// The watch of a controller's children ([`Controller::owns`]), metadata only: a change of a
/// child re-runs its owners, as [`watch_related`] does.
///
/// With sharding that splits the objects' watches across replicas
/// ([`ShardWatch::HeldShards`] or [`ShardWatch::ServerSide`]), the runtime labels every child
/// it writes with its owner's shard ([`Sharding::owner_label_key`]), and this watch selects the
/// children of the shards this replica holds, and children without the label (written before,
/// or by someone else), by a label selector the API server applies: a replica receives and
/// keeps its share of the children only. When the held shards change the watch starts again
/// with the new selector, when the objects' watch does (an acquisition after a short settling
/// time, a loss after twice the lease duration): its list re-runs the owners of the children
/// that changed meanwhile, except those of shards just acquired (their objects all run anyway)
/// and those of shards let go. A child of a shard just acquired that someone changes after
/// the acquisition's reconcile wrote it and before this list runs its owner only at the
/// owner's next reconcile.
///
/// [`Controller::owns`]: crate::runtime::Controller::owns
/// [`ShardWatch::HeldShards`]: crate::sharding::ShardWatch::HeldShards
/// [`ShardWatch::ServerSide`]: crate::sharding::ShardWatch::ServerSide
/// [`Sharding::owner_label_key`]: crate::sharding::Sharding::owner_label_key
pub(crate) async fn watch_owned<K, C>(
    shared: Arc<Shared<K>>,
    api: Api<PartialObjectMeta<C>>,
    echoes: Option<Arc<crate::provisioners::context::OwnWrites>>,
    manager: Mailbox<ManagerMsg<K>>,
) where
    K: ManagedResource,
    C: ManagedResource,
{
    let map: RelatedMap<K, PartialObjectMeta<C>> = Arc::new(owners_of::<K, PartialObjectMeta<C>>);
    let by_shard = shared
        .shards
        .as_ref()
        .and_then(|s| Some((s.shards.clone(), s.child_label.clone()?)));
    let Some((shards, key)) = by_shard else {
        let events = watcher::watcher(api, watcher::Config::default()).default_backoff();
        return watch_related(shared, events, map, echoes, manager).await;
    };
    let narrow_after = shared.policy.lease_duration * 2;
    let count = shards.count();
    let shard_of = {
        let key = key.clone();
        move |child: &PartialObjectMeta<C>| {
            let value = child.meta().labels.as_ref()?.get(&*key)?;
            crate::sharding::parse_label_value(value, count)
        }
    };
    let mut related = Related::new(shared, map, echoes, manager, Some(Box::new(shard_of)));
    let mut changes = Some(shards.changes());
    loop {
        if let Some(changes) = &mut changes {
            changes.borrow_and_update();
        }
        let watched = shards.claimed();
        let mut config = watcher::Config::default();
        if let Some(selector) = crate::sharding::held_selector(&key, &watched, count) {
            config = config.labels(&selector);
        }
        related.restart(&watched);
        let events = watcher::watcher(api.clone(), config).default_backoff();
        futures::pin_mut!(events);
        let mut follow_at: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                event = events.next() => match event {
                    Some(event) => related.handle(event),
                    None => return,
                },
                () = super::feeder::next_change(&mut changes) => {
                    follow_at = super::feeder::follow_at(&watched, &shards.claimed(), follow_at, narrow_after);
                }
                () = super::feeder::sleep_until(follow_at) => break,
            }
        }
    }
}

/// What a test feeds [`Related`] ([`drive_related`]): a watch event, or a new watch of the
/// children of the `held` shards.
#[cfg(test)]
pub(crate) enum TestInput<R> {
    Event(Event<R>),
    Restart(Vec<u32>),
}

/// [`Related`] driven by a test: a child's shard is its label `shard`; the first watch selects
/// no shard.
#[cfg(test)]
pub(crate) async fn drive_related<K, R>(
    shared: Arc<Shared<K>>,
    mut inputs: tokio::sync::mpsc::UnboundedReceiver<TestInput<R>>,
    map: RelatedMap<K, R>,
    echoes: Option<Arc<crate::provisioners::context::OwnWrites>>,
    manager: Mailbox<ManagerMsg<K>>,
) where
    K: ManagedResource,
    R: Resource<DynamicType = ()> + 'static,
{
    let shard_of = |r: &R| r.meta().labels.as_ref()?.get("shard")?.parse().ok();
    let mut related = Related::new(shared, map, echoes, manager, Some(Box::new(shard_of)));
    related.restart(&[]);
    while let Some(input) = inputs.recv().await {
        match input {
            TestInput::Event(event) => related.handle(Ok(event)),
            TestInput::Restart(held) => related.restart(&held),
        }
    }
}

/// A related object as [`Related`] last saw it: its resourceVersion, whom it maps to (for its
/// deletion while the watch was down), and the shard its owner label names.
struct Seen<K: ManagedResource> {
    version: String,
    owners: Vec<ObjectRef<K>>,
    shard: Option<u32>,
}

/// What a watch of related objects keeps to tell a change from an echo or a re-list's repeat
/// ([`watch_related`], [`watch_owned`]).
struct Related<K: ManagedResource, R> {
    shared: Arc<Shared<K>>,
    map: RelatedMap<K, R>,
    echoes: Option<Arc<crate::provisioners::context::OwnWrites>>,
    manager: Mailbox<ManagerMsg<K>>,
    /// The shard a related object's owner label names ([`watch_owned`] with sharding).
    shard_of: Option<ChildShard<R>>,
    known: FastMap<(Option<String>, String), Seen<K>>,
    /// Before the first list is in: nothing re-runs.
    first: bool,
    /// The shards the watch selects ([`Related::restart`]; `None` before the first).
    watched: Option<Vec<u32>>,
    /// Until the first list after a [`Related::restart`] is in: the shards that restart
    /// added, whose children's appearance in the list runs nothing (their objects all run as
    /// the shard is acquired).
    acquired: Vec<u32>,
    /// The keys a list delivered, while one is coming in.
    seen: Option<HashSet<(Option<String>, String), ahash::RandomState>>,
}

/// The shard a child's owner label names, if any.
type ChildShard<R> = Box<dyn Fn(&R) -> Option<u32> + Send>;

impl<K: ManagedResource, R: Resource<DynamicType = ()>> Related<K, R> {
    fn new(
        shared: Arc<Shared<K>>,
        map: RelatedMap<K, R>,
        echoes: Option<Arc<crate::provisioners::context::OwnWrites>>,
        manager: Mailbox<ManagerMsg<K>>,
        shard_of: Option<ChildShard<R>>,
    ) -> Self {
        Self {
            shared,
            map,
            echoes,
            manager,
            shard_of,
            known: FastMap::default(),
            first: true,
            watched: None,
            acquired: Vec::new(),
            seen: None,
        }
    }

    /// A new watch starts, of the children of the `held` shards (and those without a shard):
    /// forget the children of shards it no longer selects (they left the view; they are not
    /// gone), and let its list run nothing for children of the shards it adds.
    fn restart(&mut self, held: &[u32]) {
        self.known
            .retain(|_, seen| seen.shard.is_none_or(|s| held.contains(&s)));
        self.acquired = match &self.watched {
            Some(before) if !self.first => held
                .iter()
                .filter(|s| !before.contains(s))
                .copied()
                .collect(),
            _ => Vec::new(),
        };
        self.watched = Some(held.to_vec());
        self.seen = None;
    }

    /// Each object once, whatever number of keys named it.
    fn run(&self, mut owners: Vec<ObjectRef<K>>) {
        owners.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        owners.dedup();
        for o in owners {
            notify(&self.shared, &self.manager, o);
        }
    }

    fn echo(&self, key: &(Option<String>, String), version: &str) -> bool {
        self.echoes
            .as_ref()
            .is_some_and(|e| e.is_echo::<R>(key.0.as_deref(), &key.1, version))
    }

    fn handle(&mut self, event: Result<Event<R>, watcher::Error>) {
        let key_of = |r: &R| {
            let m = r.meta();
            (m.namespace.clone(), m.name.clone().unwrap_or_default())
        };
        let (obj, listing) = match event {
            Ok(Event::Init) => {
                self.seen = Some(HashSet::default());
                return;
            }
            Ok(Event::InitApply(o)) => (o, true),
            Ok(Event::Apply(o)) => (o, false),
            Ok(Event::Delete(o)) => {
                let key = key_of(&o);
                let mut owners = (self.map)(&o);
                if let Some(before) = self.known.remove(&key) {
                    owners.extend(before.owners);
                }
                if !self.echo(&key, crate::provisioners::context::OwnWrites::DELETED) {
                    self.run(owners);
                }
                return;
            }
            Ok(Event::InitDone) => {
                if let Some(seen) = self.seen.take()
                    && !self.first
                {
                    let gone: Vec<_> = self
                        .known
                        .keys()
                        .filter(|k| !seen.contains(*k))
                        .cloned()
                        .collect();
                    for key in gone {
                        if let Some(before) = self.known.remove(&key) {
                            self.run(before.owners);
                        }
                    }
                }
                self.first = false;
                self.acquired.clear();
                return;
            }
            Err(e) => {
                tracing::warn!(kind = %R::kind(&()), error = %e, "watch error; retrying with backoff");
                return;
            }
        };
        let key = key_of(&obj);
        if listing && let Some(seen) = &mut self.seen {
            seen.insert(key.clone());
        }
        let version = obj.meta().resource_version.clone().unwrap_or_default();
        let owners = (self.map)(&obj);
        let shard = self.shard_of.as_ref().and_then(|f| f(&obj));
        let before = self.known.insert(
            key.clone(),
            Seen {
                version: version.clone(),
                owners: owners.clone(),
                shard,
            },
        );
        let changed = match &before {
            // Listed after a restart, of a shard just acquired: its owner runs anyway.
            None if listing && shard.is_some_and(|s| self.acquired.contains(&s)) => false,
            None => true,
            Some(b) => b.version != version,
        };
        if !(listing && self.first) && changed && !self.echo(&key, &version) {
            // The objects it mapped to before too: a child whose owner reference moved.
            let mut all = owners;
            if let Some(before) = before {
                all.extend(before.owners);
            }
            self.run(all);
        }
    }
}

/// The objects of kind `K` that own `child` by an owner reference (any, not only the
/// controller's): in the child's namespace, or cluster-scoped owners.
pub(crate) fn owners_of<K, C>(child: &C) -> Vec<ObjectRef<K>>
where
    K: ManagedResource,
    C: Resource,
{
    let (api_version, kind) = (K::api_version(&()), K::kind(&()));
    let cluster_scoped = crate::object_api::is_cluster_scoped::<K>();
    child
        .meta()
        .owner_references
        .iter()
        .flatten()
        .filter(|o| o.api_version == api_version && o.kind == kind)
        .map(|o| {
            let r = ObjectRef::<K>::new(&o.name);
            match (&child.meta().namespace, cluster_scoped) {
                (Some(ns), false) => r.within(ns),
                _ => r,
            }
        })
        .collect()
}
