//! The watch feeder: kube-runtime's `watcher` + reflector, turned into messages.
//!
//! Events for objects with a live actor go straight to that actor's mailbox through the shared
//! route map (a `DashMap`), so routing never serializes through one mailbox; only objects
//! without a live actor (new, passive, restarting, quarantined, deleted) go through the manager.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::mailbox::Mailbox;
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::{self, Event};

use super::{ManagedResource, Shared};
use crate::lenient::Lenient;
use crate::messages::{ManagerMsg, ResourceMsg};
use crate::sharding::{follow, held_selector, server_side};

/// The object's key, without `extra` (resource version, uid): the manager keeps a key per object
/// for as long as the object exists and clones it into every message about it, and nothing reads
/// those fields from a key (equality and hashing ignore them).
fn key_of<K: ManagedResource>(obj: &Lenient<K>) -> ObjectRef<K> {
    let meta = kube::Resource::meta(obj);
    let mut key = ObjectRef::new(meta.name.as_deref().unwrap_or(""));
    key.namespace = meta.namespace.clone();
    key
}

/// Route one applied object to its actor, or to the manager when it has none (`listed`: found
/// by the start-up list, so its activation waits behind changes).
fn route<K: ManagedResource>(
    shared: &Shared<K>,
    manager: &Mailbox<ManagerMsg<K>>,
    key: ObjectRef<K>,
    listed: bool,
) {
    let Some(obj) = shared.store.get(&key) else {
        if shared.store.contains(&key) {
            route_undecodable(shared, manager, key, listed);
        }
        return;
    };
    if let Some(secrets) = &shared.secrets {
        secrets.observed(&key, obj.as_ref());
    }
    shared
        .in_flight
        .observed(&key, kube::Resource::meta(obj.as_ref()));
    if let Some(actor) = shared.routes.get(&key)
        && actor.cast(ResourceMsg::Observed(obj)).is_ok()
    {
        return;
    }
    if listed {
        manager.send_low(ManagerMsg::Listed(key));
    } else {
        manager.send(ManagerMsg::Event(key));
    }
}

/// Route an object that the kind's type cannot hold (cached as undecodable) to its actor, which
/// reads it from the store, or to the manager.
fn route_undecodable<K: ManagedResource>(
    shared: &Shared<K>,
    manager: &Mailbox<ManagerMsg<K>>,
    key: ObjectRef<K>,
    listed: bool,
) {
    if let Some(u) = shared.store.undecodable(&key) {
        tracing::warn!(kind = %K::kind(&()), object = %key, field = %u.field, "an object of the kind cannot be decoded as the operator's type; it is kept, and not reconciled until it changes");
    }
    if let Some(actor) = shared.routes.get(&key)
        && actor.cast(ResourceMsg::Undecodable).is_ok()
    {
        return;
    }
    if listed {
        manager.send_low(ManagerMsg::Listed(key));
    } else {
        manager.send(ManagerMsg::Event(key));
    }
}

fn route_gone<K: ManagedResource>(
    shared: &Shared<K>,
    manager: &Mailbox<ManagerMsg<K>>,
    key: ObjectRef<K>,
) {
    if let Some(secrets) = &shared.secrets {
        secrets.forget(&key);
    }
    shared.in_flight.gone(&key);
    // Most deletions are of objects that hold and wait on nothing: no target is built for them.
    if shared.references.holds_or_waits_any() {
        shared.references.gone(&crate::references::Target::new(
            K::api_version(&()),
            K::kind(&()),
            key.namespace.as_deref(),
            key.name.clone(),
        ));
    }
    if let Some(actor) = shared.routes.get(&key)
        && actor.cast(ResourceMsg::Gone).is_ok()
    {
        return;
    }
    manager.send(ManagerMsg::Gone(key));
}

/// Run one watch of a kind (of `namespace`, or of every namespace) until the task is
/// aborted. Applies each event to its cache in `shared.store` (through `writer`)
/// before routing it, so actors always find the object there. Sets `refused` while the API
/// server refuses the watch, and clears it once a list is in. Sends on `listed` once the first list is complete. With
/// [`ShardWatch::HeldShards`](crate::sharding::ShardWatch::HeldShards) the watch selects the
/// objects of the held shards (and those not placed yet), and starts again, relisting, when
/// the held shards change.
///
/// The first list goes straight into the store, one object at a time, and each object is routed
/// as soon as it is listed: its actor can run while later pages are still being fetched and
/// decoded. kube-runtime's `reflector` (and so its `Controller`) buffers every list and swaps it
/// into the store only at `InitDone`, which on a large first list means all pages before the
/// first reconcile. Buffering is what a re-list needs (objects missing from it are gone, and the store
/// must not show a half-listed mix meanwhile), but the first list has nothing to replace: the
/// store is empty. So only a first list is applied as `Apply` events; if it is interrupted, every
/// later list (including its retry) is buffered as usual and replaces the store at its end, and
/// the manager's `Resync` forgets any key the retry no longer lists.
pub(crate) async fn run_feeder<K: ManagedResource>(
    shared: Arc<Shared<K>>,
    of: KindWatch<K>,
    mut writer: crate::cache::Writer<K>,
    manager: Mailbox<ManagerMsg<K>>,
    listed: Listed,
    first_run: bool,
) {
    let KindWatch {
        api: typed,
        config,
        namespace,
        refused,
        prune: pruned,
    } = of;
    // Each object decoded on its own: one the type cannot hold is kept as undecodable instead of
    // failing the list (or, streamed, going missing from it).
    let api: Api<Lenient<K>> =
        crate::object_api::kind_api(typed.into_client(), namespace.as_deref());
    let watch = Watch {
        shared: &shared,
        manager: &manager,
        namespace: namespace.as_deref(),
        refused: &refused,
    };
    // With `ShardWatch::HeldShards` or `ServerSide`: the held shards, and how the watch
    // selects theirs.
    let view = shared.io.shards.as_ref().and_then(|s| {
        let by = match (&s.label, &s.server_side_leases) {
            (Some(key), _) if s.selects_by_label => Selects::Label(key.clone()),
            (_, Some(leases)) => Selects::Server(leases.clone()),
            _ => return None,
        };
        Some((s.shards.clone(), by))
    });
    let mut changes = view.as_ref().map(|(shards, _)| shards.changes());
    // With `ServerSide`: whether the server applies shard selectors, once a list said so.
    let mut server_applies: Option<bool> = None;
    let mut list: Option<List<K>> = None;
    // Only a first run's first list goes straight to the store: a restarted feeder's store
    // holds what its last run left.
    let mut first_list = first_run;
    // Whether lists may stream (`sendInitialEvents`), when the config asks for it: until the API
    // server refuses them once.
    let mut streaming = true;
    // Each round is one watch. It ends when a shard is acquired that it does not select (at
    // once, after `SETTLE`), or when it selects shards given up for `2 × lease_duration` (a
    // shard lost and soon taken again, as when renewals run late, costs no relist); the next
    // round watches with the new selector (its list replaces the store, and the manager
    // forgets what it no longer lists). Held here means what the keeper holds, not whether a
    // renewal is late: a late renewal must not narrow the watch.
    let narrow_after = shared
        .io
        .shards
        .as_ref()
        .map_or(std::time::Duration::ZERO, |s| s.narrow_after);
    // Objects this watch skipped ([`unplaced_elsewhere`]), kept aside, out of the store.
    let mut unplaced: std::collections::HashMap<ObjectRef<K>, Lenient<K>, ahash::RandomState> =
        Default::default();
    loop {
        unplaced.clear(); // the next list delivers them again
        let mut config = config.clone();
        if !streaming {
            config.initial_list_strategy = watcher::InitialListStrategy::ListWatch;
        }
        let mut watched: Vec<u32> = Vec::new();
        // Per shard, whether this watch selects its objects (with `ShardWatch::HeldShards`).
        let mut selects: Option<Vec<bool>> = None;
        let mut round_api = api.clone();
        // With `ServerSide` and no shard held: nothing to watch this round.
        let mut nothing = false;
        if let (Some((shards, by)), Some(changes)) = (&view, &mut changes) {
            changes.borrow_and_update();
            watched = shards.claimed();
            match by {
                Selects::Label(key) => {
                    selects = Some((0..shards.count()).map(|s| watched.contains(&s)).collect());
                    if let Some(sel) = held_selector(key, &watched, shards.count()) {
                        config.label_selector = Some(match config.label_selector.take() {
                            Some(user) => format!("{user},{sel}"),
                            None => sel,
                        });
                    }
                    tracing::debug!(kind = %K::kind(&()), selector = ?config.label_selector, "watching the held shards");
                }
                Selects::Server(leases) => match server_side::selector(&watched, shards.count()) {
                    None if watched.is_empty() => nothing = true,
                    None => {}
                    Some(sel) => {
                        let client = api.clone().into_client();
                        if server_applies.is_none() {
                            server_applies = probe_server(&client, leases, &sel).await;
                        }
                        if server_applies == Some(false) {
                            // Every replica places objects by uid all the same: watch them all.
                            tracing::warn!(kind = %K::kind(&()), "the API server does not apply shard selectors (Kubernetes 1.36+ with the ShardedListAndWatch feature gate): this replica watches every object of the kind");
                        } else {
                            tracing::debug!(kind = %K::kind(&()), selector = %sel, "watching the held shards (server-side)");
                            round_api = crate::object_api::kind_api(
                                server_side::selecting_client(&client, sel),
                                namespace.as_deref(),
                            );
                        }
                    }
                },
            }
        }
        if server_applies == Some(false) {
            changes = None; // no relist when the held shards change
        }
        if let Some(scope) = &shared.io.shards {
            scope.server_selects.store(
                scope.server_side_leases.is_some() && server_applies != Some(false),
                Ordering::Release,
            );
        }
        let streams = config.initial_list_strategy == watcher::InitialListStrategy::StreamingList;
        let events = if nothing {
            // An empty list: the store drops what it held, and the kind counts as listed.
            futures::stream::iter([Ok(Event::Init), Ok(Event::InitDone)])
                .chain(futures::stream::pending())
                .boxed()
        } else {
            watcher::watcher(round_api, config)
                .default_backoff()
                .modify(move |o| {
                    if pruned && let Lenient::Decoded(o) = o {
                        crate::cache::prune(o)
                    }
                })
                .boxed()
        };
        futures::pin_mut!(events);
        // When this watch ends to follow the held shards.
        let mut follow_at: Option<tokio::time::Instant> = None;
        loop {
            let event = tokio::select! {
                event = events.next() => match event {
                    Some(event) => event,
                    None => return,
                },
                () = follow::next_change(&mut changes) => {
                    let (Some((shards, _)), Some(scope)) = (&view, &shared.io.shards) else {
                        continue;
                    };
                    let held = shards.claimed();
                    // Set-aside objects of a shard just acquired run at once, before the relist.
                    let taken: Vec<ObjectRef<K>> = unplaced
                        .iter()
                        .filter(|(_, o)| held.contains(&scope.shard_of_lenient(o)))
                        .map(|(k, _)| k.clone())
                        .collect();
                    for key in taken {
                        if let Some(obj) = unplaced.remove(&key) {
                            let event = Ok(Event::Apply(obj));
                            let (list, first) = (&mut list, &mut first_list);
                            watch.apply(&mut writer, event, list, first, &listed);
                        }
                    }
                    follow_at = follow::follow_at(&watched, &held, follow_at, narrow_after);
                    continue;
                }
                () = follow::sleep_until(follow_at) => break,
            };
            if let Err(e) = &event
                && streams
                && streaming_refused(e)
            {
                // This API server does not offer streaming lists (WatchList off, or older than
                // v1.27): list and watch instead, for the rest of this feeder's life.
                tracing::info!(kind = %K::kind(&()), error = %e, "the API server refuses streaming lists (sendInitialEvents); listing instead");
                streaming = false;
                break;
            }
            if let Ok(Event::Apply(obj) | Event::InitApply(obj) | Event::Delete(obj)) = &event
                && unplaced_elsewhere(&shared, selects.as_deref(), obj)
                && !shared.store.contains(&key_of(obj))
            {
                match event {
                    Ok(Event::Delete(obj)) => unplaced.remove(&key_of(&obj)),
                    Ok(Event::Apply(obj) | Event::InitApply(obj)) => {
                        unplaced.insert(key_of(&obj), obj)
                    }
                    _ => None,
                };
                continue;
            }
            watch.apply(&mut writer, event, &mut list, &mut first_list, &listed);
        }
    }
}

/// With [`ShardWatch::HeldShards`](crate::sharding::ShardWatch::HeldShards) (`selects`: per
/// shard, whether this watch selects its objects): whether `obj` reached this watch only
/// because nobody has placed it yet (no shard label, or one of another shard count) and its
/// shard is one this watch does not select. Another replica holds that shard (or will): it
/// labels the object in its first write, which takes the object out of this watch again.
///
/// Such an object is kept aside by the feeder, out of the store: not routed, not listed.
/// Nothing here runs it, and readiness of objects in shards this replica does not hold is
/// asked elsewhere (as `Shared::in_view` says), so a replica pays no store entry and no
/// manager message for the two watch events (created, labelled away) of each new object of
/// every other replica's shards. If this replica acquires the shard, the objects set aside for
/// it go into the store and run at once (a takeover's newest objects wait for no relist), and
/// the watch relists with a selector that selects the shard. An object already in the store
/// (it was of a selected shard until its shard key changed) is handled as usual, so that its
/// removal reaches the manager.
fn unplaced_elsewhere<K: ManagedResource>(
    shared: &Shared<K>,
    selects: Option<&[bool]>,
    obj: &Lenient<K>,
) -> bool {
    let (Some(scope), Some(selects)) = (&shared.io.shards, selects) else {
        return false;
    };
    let selected = |s: u32| selects.get(s as usize).copied().unwrap_or(false);
    !scope
        .labelled_shard_of(kube::Resource::meta(obj))
        .is_some_and(selected)
        && !selected(scope.shard_of_lenient(obj))
}

/// How a watch of a replica's held shards selects their objects.
enum Selects {
    /// By the shard label with this key ([`ShardWatch::HeldShards`](crate::sharding::ShardWatch::HeldShards)).
    Label(Arc<str>),
    /// By the API server ([`ShardWatch::ServerSide`](crate::sharding::ShardWatch::ServerSide));
    /// the shard Leases' collection, which tells whether it does.
    Server(Arc<str>),
}

/// Whether the API server applies shard selectors, asked once by listing `url` (the shard
/// Leases: the server's answers for custom resources do not say, its answers for built-in
/// kinds do) with `selector`: `None` when the list failed (asked again next round). Either
/// answer is safe: an object's shard does not depend on it, only what this replica receives
/// and caches.
async fn probe_server(client: &kube::Client, url: &str, selector: &str) -> Option<bool> {
    match server_side::probe(client, url, selector).await {
        Ok(applies) => Some(applies),
        Err(e) => {
            tracing::debug!(error = %e, "could not ask whether the API server applies shard selectors");
            None
        }
    }
}

/// Whether a watcher error is an API server's refusal of a streaming list: a watch with
/// `sendInitialEvents=true` answered `400 Bad Request` or `422 Invalid` (what servers without
/// the WatchList feature answer), which no plain list or watch is.
fn streaming_refused(e: &watcher::Error) -> bool {
    let code = match e {
        watcher::Error::WatchStartFailed(kube::Error::Api(s)) => s.code,
        watcher::Error::WatchError(s) => s.code,
        _ => return false,
    };
    matches!(code, 400 | 422)
}

/// A list in progress.
struct List<K: ManagedResource> {
    /// Its keys, in list order.
    keys: Vec<ObjectRef<K>>,
    /// Whether it goes straight to the store (a first list) or is buffered (a re-list).
    direct: bool,
    /// Of a buffered list: the keys whose object is new or changed against the store, the only
    /// ones routed when it is in (the others' actors have seen them).
    changed: Vec<ObjectRef<K>>,
}

/// Told once the kind's first list is in the store (kept across a restarted feeder's runs).
pub(crate) type Listed = Arc<std::sync::Mutex<Option<tokio::sync::oneshot::Sender<()>>>>;

/// One watch of a kind, for [`run_feeder`].
#[derive(Clone)]
pub(crate) struct KindWatch<K: ManagedResource> {
    /// The kind's API, in `namespace` or in all.
    pub api: Api<K>,
    /// The controller's watch options.
    pub config: watcher::Config,
    /// The namespace it watches (`None`: every namespace, or a cluster-scoped kind).
    pub namespace: Option<String>,
    /// Why the API server refuses this watch, while it does (for `/readyz`).
    pub refused: crate::health::WatchRefusal,
    /// Whether the objects are [`pruned`](crate::cache::prune) before they are cached.
    pub prune: bool,
}

/// What one watch of a kind routes to, and where it reports a refusal.
struct Watch<'a, K: ManagedResource> {
    shared: &'a Shared<K>,
    manager: &'a Mailbox<ManagerMsg<K>>,
    /// The namespace it watches (`None`: every namespace, or a cluster-scoped kind).
    namespace: Option<&'a str>,
    refused: &'a crate::health::WatchRefusal,
}

impl<K: ManagedResource> Watch<'_, K> {
    /// Apply one watch event to the store and route it.
    fn apply(
        &self,
        writer: &mut crate::cache::Writer<K>,
        event: Result<Event<Lenient<K>>, watcher::Error>,
        list: &mut Option<List<K>>,
        first_list: &mut bool,
        listed: &Listed,
    ) {
        let (shared, manager) = (self.shared, self.manager);
        match event {
            Ok(Event::Apply(obj)) => {
                let key = key_of(&obj);
                writer.apply_lenient(Event::Apply(obj));
                route(shared, manager, key, false);
            }
            Ok(Event::Delete(obj)) => {
                let key = key_of(&obj);
                writer.apply_lenient(Event::Delete(obj));
                route_gone(shared, manager, key);
            }
            Ok(Event::Init) => {
                let direct = std::mem::take(first_list);
                if !direct {
                    writer.apply_lenient(Event::Init);
                }
                *list = Some(List {
                    keys: Vec::new(),
                    direct,
                    changed: Vec::new(),
                });
            }
            Ok(Event::InitApply(obj)) => {
                let key = key_of(&obj);
                match list {
                    Some(l) if l.direct => {
                        l.keys.push(key.clone());
                        writer.apply_lenient(Event::Apply(obj));
                        route(shared, manager, key, true);
                    }
                    Some(l) => {
                        let seen = shared.store.resource_version(&key);
                        if seen.is_none_or(|v| v != kube::Resource::meta(&obj).resource_version) {
                            l.changed.push(key.clone());
                        }
                        l.keys.push(key);
                        writer.apply_lenient(Event::InitApply(obj));
                    }
                    // The watcher always starts a list with `Init`; buffer to be safe.
                    None => writer.apply_lenient(Event::InitApply(obj)),
                }
            }
            Ok(Event::InitDone) => {
                let Some(l) = list.take() else {
                    writer.apply_lenient(Event::InitDone);
                    return;
                };
                if !l.direct {
                    writer.apply_lenient(Event::InitDone);
                    // A buffered list is in the store only now: route what is new in it, in list
                    // order.
                    for key in l.changed {
                        route(shared, manager, key, false);
                    }
                }
                *self.refused.lock().unwrap_or_else(|p| p.into_inner()) = None;
                // The first list: the kind's start-up rebuilds the references and wakes what
                // waited once every namespace has listed (`ReferenceIndex::kind_synced`).
                let first = listed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take()
                    .map(|listed| listed.send(()))
                    .is_some();
                let existing: HashSet<ObjectRef<K>, ahash::RandomState> =
                    l.keys.into_iter().collect();
                if let Some(secrets) = &shared.secrets {
                    secrets.retain(&existing, self.namespace);
                }
                manager.send(ManagerMsg::Resync(
                    existing,
                    self.namespace.map(str::to_string),
                ));
                // A relist drops from the store what was deleted while the watch was down,
                // without a delete event: those of them that held references (objects of other
                // replicas' shards included, which the manager has no entry for) wake what
                // they held, and waiters on them see them missing, as for a deletion seen.
                if !first {
                    shared
                        .references
                        .kind_synced(&K::api_version(&()), &K::kind(&()));
                }
            }
            Err(e) => match refusal::<K>(&e) {
                Some((why, served)) => {
                    let mut refused = self.refused.lock().unwrap_or_else(|p| p.into_inner());
                    if refused.as_deref() == Some(why.as_str()) {
                        return; // said already; the watcher retries with its backoff
                    }
                    tracing::error!(kind = %K::kind(&()), refusal = %why, "the API server refuses to list or watch the kind; /readyz fails naming it until it does (the controller starts by itself then)");
                    if !served {
                        // Not served: its CRD is not installed, or was deleted (the API server
                        // deletes every object of a kind before its CRD). Nothing of it exists,
                        // so the cache empties as for an empty list: the manager stops the
                        // kind's actors and timers, and waiters on its objects see them gone.
                        drop(refused);
                        self.apply(writer, Ok(Event::Init), list, first_list, listed);
                        self.apply(writer, Ok(Event::InitDone), list, first_list, listed);
                        refused = self.refused.lock().unwrap_or_else(|p| p.into_inner());
                    }
                    *refused = Some(why);
                }
                None => {
                    tracing::warn!(error = %e, kind = %K::kind(&()), "watch error; retrying with backoff")
                }
            },
        }
    }
}

/// Why the API server refuses a list or watch of kind `K` for good until someone acts, and
/// whether it serves the kind: the operator lacks the permission (403, the server's message
/// names it), or the server does not serve the kind (404: its CRD is not installed, or was
/// deleted).
fn refusal<K: ManagedResource>(e: &watcher::Error) -> Option<(String, bool)> {
    let s = match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s)) => s,
        watcher::Error::WatchError(s) => s.as_ref(),
        _ => return None,
    };
    match s.code {
        403 => Some((s.message.clone(), true)),
        404 => Some((
            format!(
                "the API server does not serve {} (is its CRD installed?)",
                K::api_version(&())
            ),
            false,
        )),
        _ => None,
    }
}
