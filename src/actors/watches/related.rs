//! Owned children and related objects: each change re-runs the objects it maps to, an echo of the
//! runtime's own write runs nothing.

use super::*;

/// Maps a related object to the managed objects to run ([`Controller::watches`]).
///
/// [`Controller::watches`]: crate::runtime::Controller::watches
pub(crate) type RelatedMap<K, R> = Arc<dyn Fn(&R) -> Vec<ObjectRef<K>> + Send + Sync>;

impl<K: ManagedResource> crate::actors::RelatedSpec<K> {
    /// The watch of `C`s the kind's objects own ([`Controller::owns`](crate::runtime::Controller::owns)):
    /// metadata only, each change running its owner.
    pub(crate) fn owned<C: ManagedResource>() -> Self {
        Self {
            owned: true,
            cluster_scoped: crate::object_api::is_cluster_scoped::<C>(),
            rule: crate::rbac::rule_for::<C>(&["list", "watch"]),
            kind: C::kind(&()).into_owned(),
            start: Arc::new(|client, namespace, shared, echoes, manager| {
                // Metadata only: the children's contents are never held.
                let api: Api<PartialObjectMeta<C>> =
                    crate::object_api::kind_api(client, namespace.as_deref());
                tokio::spawn(watch_owned(shared, api, echoes, manager))
            }),
        }
    }

    /// The watch of `R`s, each change running the objects `map` names
    /// ([`Controller::watches`](crate::runtime::Controller::watches)).
    pub(crate) fn mapped<R: ManagedResource>(map: RelatedMap<K, R>) -> Self {
        Self {
            owned: false,
            cluster_scoped: crate::object_api::is_cluster_scoped::<R>(),
            rule: crate::rbac::rule_for::<R>(&["list", "watch"]),
            kind: R::kind(&()).into_owned(),
            start: Arc::new(move |client, namespace, shared, _echoes, manager| {
                // Leniently: one `R` its type cannot hold is left out, not the whole list.
                let api: Api<Lenient<R>> =
                    crate::object_api::kind_api(client, namespace.as_deref());
                let events = crate::lenient::decoded_only(
                    watcher::watcher(api, watcher::Config::default()).default_backoff(),
                );
                tokio::spawn(watch_related(shared, events, map.clone(), None, manager))
            }),
        }
    }
}

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
        .io
        .shards
        .as_ref()
        .and_then(|s| Some((s.shards.clone(), s.child_label.clone()?)));
    let Some((shards, key)) = by_shard else {
        let events = watcher::watcher(api, watcher::Config::default()).default_backoff();
        return watch_related(shared, events, map, echoes, manager).await;
    };
    let narrow_after = shared
        .io
        .shards
        .as_ref()
        .map_or(Duration::ZERO, |s| s.narrow_after);
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
                () = crate::sharding::follow::next_change(&mut changes) => {
                    follow_at = crate::sharding::follow::follow_at(&watched, &shards.claimed(), follow_at, narrow_after);
                }
                () = crate::sharding::follow::sleep_until(follow_at) => break,
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

    /// Each object once, whatever number of keys named it, for a change of the related object
    /// `key`.
    fn run(&self, mut owners: Vec<ObjectRef<K>>, key: &(Option<String>, String)) {
        if owners.is_empty() {
            return;
        }
        owners.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        owners.dedup();
        let cause = Cause::about(Trigger::Related, &R::kind(&()), key.0.as_deref(), &key.1);
        for o in owners {
            notify(&self.shared, &self.manager, o, cause.clone());
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
                    self.run(owners, &key);
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
                            self.run(before.owners, &key);
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
            self.run(all, &key);
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
