//! Readiness of objects of kinds this runtime does not manage (another operator's, a cloud
//! resource's custom resource, a `Deployment`): one shared watch per kind, started on the first
//! question about an object of the kind and stopped once nobody has waited on any of its objects
//! for the policy's `dependency_watch_idle`.
//!
//! The watch keeps, per object, only what readiness is decided from: metadata (without
//! `managedFields` and annotations) and `status`. When an object somebody waits on changes (its
//! generation, deletion or status) or appears, its waiters are woken, and ask again.
//!
//! kube-runtime's `reflector` keeps whole objects and reports no previous version; this keeps the
//! stripped objects in its own map so that it can tell a change that matters (and wake only
//! then) from one that does not (an annotation, a label, a resync).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use dashmap::DashMap;
use futures::StreamExt;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::{WatchStreamExt, watcher};

use super::{Readiness, ReferenceError, ReferenceIndex, Target};

/// How long a readiness question waits for a newly started watch's first list; after that the
/// object reads as not Ready, and its waiter is woken when the list is in.
const FIRST_LIST_WAIT: Duration = Duration::from_secs(10);

/// A predicate deciding whether an object of a kind this runtime does not manage is Ready (see
/// [`Context::require_ready_when`](crate::provisioners::Context::require_ready_when)). It sees
/// the object's metadata (without `managedFields` and annotations) and its `status`.
pub type ReadyWhen<'a> = dyn Fn(&DynamicObject) -> bool + Send + Sync + 'a;

/// The readiness of an object of a kind this runtime does not manage, by the conventions most
/// controllers follow:
///
/// | the object | readiness |
/// |---|---|
/// | has a deletion timestamp | [`Readiness::Deleting`] |
/// | condition `Ready` is `True`, and the condition's and the status's `observedGeneration` (when present) are the object's generation | [`Readiness::Ready`] |
/// | condition `Stalled` is `True` (kstatus), or `status.phase` is `Failed` | [`Readiness::Failed`] |
/// | anything else | [`Readiness::NotReady`] |
///
/// ```
/// use actorcile::references::{Readiness, readiness_of};
/// let obj: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
///     "apiVersion": "example.com/v1", "kind": "Bucket",
///     "metadata": { "name": "logs", "generation": 2 },
///     "status": { "conditions": [
///         { "type": "Ready", "status": "True", "observedGeneration": 2 }
///     ] }
/// })).unwrap();
/// assert_eq!(readiness_of(&obj), Readiness::Ready);
/// ```
pub fn readiness_of(obj: &DynamicObject) -> Readiness {
    if obj.metadata.deletion_timestamp.is_some() {
        return Readiness::Deleting;
    }
    let status = obj.data.get("status");
    let generation = obj.metadata.generation;
    let current = |v: Option<&serde_json::Value>| match (v.and_then(|g| g.as_i64()), generation) {
        (Some(observed), Some(generation)) => observed == generation,
        _ => true,
    };
    let condition = |type_: &str| {
        status
            .and_then(|s| s.get("conditions"))
            .and_then(|c| c.as_array())
            .and_then(|c| {
                c.iter()
                    .find(|c| c.get("type").and_then(|t| t.as_str()) == Some(type_))
            })
    };
    let is_true = |c: &serde_json::Value| c.get("status").and_then(|s| s.as_str()) == Some("True");
    if let Some(ready) = condition("Ready")
        && is_true(ready)
        && current(ready.get("observedGeneration"))
        && current(status.and_then(|s| s.get("observedGeneration")))
    {
        return Readiness::Ready;
    }
    let stalled = condition("Stalled").is_some_and(is_true);
    let phase_failed =
        status.and_then(|s| s.get("phase")).and_then(|p| p.as_str()) == Some("Failed");
    if stalled || phase_failed {
        return Readiness::Failed;
    }
    Readiness::NotReady
}

/// The watches of kinds this runtime does not manage, and what they need to start one.
pub(crate) struct ExternalKinds {
    client: Client,
    /// Stop a watch nobody has waited on for this long.
    idle: Duration,
    /// (apiVersion, kind, namespace) → its watch. A handful of kinds.
    kinds: Mutex<HashMap<WatchKey, Arc<ExternalKind>>>,
    /// (apiVersion, kind) → its API resource and whether it is namespaced, from discovery:
    /// what reference writes on objects of the kind go through.
    resources: Mutex<HashMap<(String, String), (ApiResource, bool)>>,
}

/// A watch's kind (apiVersion, kind) and the one namespace it watches (`None`: all).
type WatchKey = (String, String, Option<String>);

/// (namespace, name) of an object of the kind.
type ObjectKey = (Option<String>, String);

/// One watched kind.
pub(crate) struct ExternalKind {
    api_version: String,
    kind: String,
    /// The one namespace watched (`None`: every namespace, or a cluster-scoped kind).
    namespace: Option<String>,
    /// The stripped objects, once the first list is in.
    objects: DashMap<ObjectKey, Arc<DynamicObject>, ahash::RandomState>,
    /// The first list is in (or the kind turned out not to be served: then every object of it
    /// reads as missing).
    synced: tokio::sync::watch::Sender<bool>,
    /// The API server does not serve the kind (yet: a CRD may be installed later).
    unknown: AtomicBool,
    task: Mutex<Option<tokio::task::AbortHandle>>,
}

impl ExternalKinds {
    pub(crate) fn new(client: Client, idle: Duration) -> Self {
        Self {
            client,
            idle,
            kinds: Mutex::default(),
            resources: Mutex::default(),
        }
    }

    /// The API of `target`'s kind, in its namespace (every namespace for a namespaced kind
    /// asked without one: only to list it), resolved by discovery once per kind. A kind the
    /// server does not serve, or a cluster-scoped target named with a namespace, or a
    /// namespaced one named without, is [`ReferenceError::TargetMissing`].
    pub(crate) async fn api_for(
        &self,
        target: &Target,
    ) -> Result<Api<DynamicObject>, ReferenceError> {
        let key = (target.api_version.clone(), target.kind.clone());
        let cached = self
            .resources
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        let (ar, namespaced) = match cached {
            Some(r) => r,
            None => {
                let (ar, caps) = match resolve_with_scope(&self.client, &key.0, &key.1).await {
                    Ok(r) => r,
                    Err(kube::Error::Api(s)) if s.code == 404 => {
                        return Err(ReferenceError::TargetMissing(target.clone()));
                    }
                    Err(kube::Error::Discovery(_)) => {
                        return Err(ReferenceError::TargetMissing(target.clone()));
                    }
                    Err(e) => return Err(ReferenceError::Kube(e)),
                };
                let namespaced = caps.scope == kube::discovery::Scope::Namespaced;
                self.resources
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(key, (ar.clone(), namespaced));
                (ar, namespaced)
            }
        };
        let client = self.client.clone();
        match (&target.namespace, namespaced) {
            (Some(ns), true) => Ok(Api::namespaced_with(client, ns, &ar)),
            (None, true) if target.name.is_empty() => Ok(Api::all_with(client, &ar)),
            (None, false) => Ok(Api::all_with(client, &ar)),
            _ => Err(ReferenceError::TargetMissing(target.clone())),
        }
    }

    /// The watch of `target`'s kind, started now if there is none: in `target`'s namespace
    /// only with `in_namespace` (a kind this runtime manages in some namespaces only, asked
    /// about an object of another replica's shard: the operator's roles grant the watch there,
    /// not cluster-wide), else in every namespace.
    pub(crate) fn kind_of(
        &self,
        index: &Weak<ReferenceIndex>,
        target: &Target,
        in_namespace: bool,
    ) -> Arc<ExternalKind> {
        let mut kinds = self.kinds.lock().unwrap_or_else(|e| e.into_inner());
        let namespace = target.namespace.clone().filter(|_| in_namespace);
        let key = (target.api_version.clone(), target.kind.clone(), namespace);
        if let Some(k) = kinds.get(&key) {
            return k.clone();
        }
        let kind = Arc::new(ExternalKind {
            api_version: key.0.clone(),
            kind: key.1.clone(),
            namespace: key.2.clone(),
            objects: DashMap::default(),
            synced: tokio::sync::watch::Sender::new(false),
            unknown: AtomicBool::new(false),
            task: Mutex::new(None),
        });
        tracing::debug!(api_version = %key.0, kind = %key.1, "watching a kind this runtime does not manage");
        let task = tokio::spawn(watch_kind(
            self.client.clone(),
            kind.clone(),
            index.clone(),
            self.idle,
        ));
        *kind.task.lock().unwrap_or_else(|e| e.into_inner()) = Some(task.abort_handle());
        kinds.insert(key, kind.clone());
        kind
    }

    /// The kinds watched now (apiVersion, kind).
    pub(crate) fn watched(&self) -> Vec<(String, String)> {
        let kinds = self.kinds.lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<_> = kinds
            .keys()
            .map(|(a, k, _)| (a.clone(), k.clone()))
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// Stop `kind`'s watch if nobody waits on any of its objects (checked under the lock that
    /// starting a watch takes, after the waiter registered: a question that comes in meanwhile
    /// either keeps this watch or starts a new one).
    fn stop_if_idle(&self, index: &ReferenceIndex, kind: &ExternalKind) -> bool {
        let mut kinds = self.kinds.lock().unwrap_or_else(|e| e.into_inner());
        if index.waits_on_kind(&kind.api_version, &kind.kind) {
            return false;
        }
        kinds.remove(&(
            kind.api_version.clone(),
            kind.kind.clone(),
            kind.namespace.clone(),
        ));
        tracing::debug!(api_version = %kind.api_version, kind = %kind.kind, "stopped watching: nobody waits on it");
        true
    }

    /// Stop every watch (at shutdown).
    pub(crate) fn stop_all(&self) {
        let mut kinds = self.kinds.lock().unwrap_or_else(|e| e.into_inner());
        for (_, k) in kinds.drain() {
            if let Some(t) = k.task.lock().unwrap_or_else(|e| e.into_inner()).take() {
                t.abort();
            }
        }
    }
}

impl ExternalKind {
    /// Wait (bounded) for the first list.
    pub(crate) async fn first_list(&self) {
        let mut rx = self.synced.subscribe();
        let _ = tokio::time::timeout(FIRST_LIST_WAIT, rx.wait_for(|s| *s)).await;
    }

    /// `target`'s readiness: by `when` if given, else by [`readiness_of`].
    pub(crate) fn readiness(&self, target: &Target, when: Option<&ReadyWhen<'_>>) -> Readiness {
        if !*self.synced.borrow() {
            return Readiness::NotReady;
        }
        if self.unknown.load(Ordering::Acquire) {
            return Readiness::Missing;
        }
        let key = (target.namespace.clone(), target.name.clone());
        let Some(obj) = self.objects.get(&key).map(|o| o.clone()) else {
            return Readiness::Missing;
        };
        match (readiness_of(&obj), when) {
            (Readiness::Deleting, _) => Readiness::Deleting,
            (_, Some(when)) if when(&obj) => Readiness::Ready,
            (Readiness::Ready, Some(_)) => Readiness::NotReady,
            (r, _) => r,
        }
    }

    /// Whether `target` exists (`None` until the first list is in).
    pub(crate) fn exists(&self, target: &Target) -> Option<bool> {
        if !*self.synced.borrow() {
            return None;
        }
        if self.unknown.load(Ordering::Acquire) {
            return Some(false);
        }
        let key = (target.namespace.clone(), target.name.clone());
        Some(self.objects.contains_key(&key))
    }

    fn target(&self, key: &ObjectKey) -> Target {
        Target::new(&self.api_version, &self.kind, key.0.as_deref(), &key.1)
    }
}

/// What readiness is decided from: metadata without managed fields and annotations, and the
/// status.
fn strip(mut o: DynamicObject) -> DynamicObject {
    o.metadata.managed_fields = None;
    o.metadata.annotations = None;
    let status = o.data.get_mut("status").map(serde_json::Value::take);
    o.data = match status {
        Some(s) => serde_json::json!({ "status": s }),
        None => serde_json::Value::Object(Default::default()),
    };
    o
}

fn key_of(o: &DynamicObject) -> ObjectKey {
    (
        o.metadata.namespace.clone(),
        o.metadata.name.clone().unwrap_or_default(),
    )
}

/// Whether `a` and `b` may read differently for readiness (by [`readiness_of`] or a predicate,
/// which sees the labels too).
fn differs(a: &DynamicObject, b: &DynamicObject) -> bool {
    a.metadata.generation != b.metadata.generation
        || a.metadata.deletion_timestamp != b.metadata.deletion_timestamp
        || a.metadata.labels != b.metadata.labels
        || a.data != b.data
}

/// The API resource of `api_version`/`kind`, from the server's discovery.
async fn resolve(
    client: &Client,
    api_version: &str,
    kind: &str,
) -> Result<ApiResource, kube::Error> {
    Ok(resolve_with_scope(client, api_version, kind).await?.0)
}

/// The API resource of `api_version`/`kind` and its capabilities (its scope), from the
/// server's discovery.
async fn resolve_with_scope(
    client: &Client,
    api_version: &str,
    kind: &str,
) -> Result<(ApiResource, kube::discovery::ApiCapabilities), kube::Error> {
    let (group, version) = match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    };
    let gvk = GroupVersionKind::gvk(group, version, kind);
    kube::discovery::pinned_kind(client, &gvk).await
}

/// The watch task of one kind: resolve the kind, then apply its events to `kind.objects` and
/// wake the waiters of what changed; stop once nobody waited on the kind for `idle`.
async fn watch_kind(
    client: Client,
    kind: Arc<ExternalKind>,
    index: Weak<ReferenceIndex>,
    idle: Duration,
) {
    let mut idle_tick = tokio::time::interval(idle);
    idle_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    idle_tick.tick().await;
    let mut resolve_retry = Duration::from_secs(1);
    let ar = loop {
        match resolve(&client, &kind.api_version, &kind.kind).await {
            Ok(ar) => break ar,
            Err(e) => {
                tracing::warn!(api_version = %kind.api_version, kind = %kind.kind, error = %e, "the API server does not serve this kind: its objects read as missing");
                kind.unknown.store(true, Ordering::Release);
                if !kind.synced.send_replace(true) {
                    wake_kind(&index, &kind);
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(resolve_retry) => {}
            _ = idle_tick.tick() => {
                if stop_if_idle(&index, &kind) { return; }
            }
        }
        resolve_retry = (resolve_retry * 2).min(idle);
    };
    if kind.unknown.swap(false, Ordering::AcqRel) {
        // It is served now: the objects are listed before anyone reads them as missing again.
        kind.synced.send_replace(false);
    }
    let api: Api<DynamicObject> = match &kind.namespace {
        Some(ns) => Api::namespaced_with(client, ns, &ar),
        None => Api::all_with(client, &ar),
    };
    let events = watcher(api, watcher::Config::default()).default_backoff();
    futures::pin_mut!(events);
    let mut listing: Option<HashMap<ObjectKey, Arc<DynamicObject>>> = None;
    let mut waited_since_tick = true;
    loop {
        tokio::select! {
            event = events.next() => {
                let Some(event) = event else { return };
                let event = match event {
                    Ok(e) => e,
                    Err(e) => {
                        tracing::warn!(api_version = %kind.api_version, kind = %kind.kind, error = %e, "watch error; retrying with backoff");
                        continue;
                    }
                };
                apply(&kind, &index, &mut listing, event);
            }
            _ = idle_tick.tick() => {
                let Some(ix) = index.upgrade() else { return };
                if ix.waits_on_kind(&kind.api_version, &kind.kind) {
                    waited_since_tick = true;
                } else if !std::mem::take(&mut waited_since_tick) && stop_if_idle(&index, &kind) {
                    return;
                }
            }
        }
    }
}

fn stop_if_idle(index: &Weak<ReferenceIndex>, kind: &ExternalKind) -> bool {
    let Some(ix) = index.upgrade() else {
        return true;
    };
    match &ix.external {
        Some(ext) => ext.stop_if_idle(&ix, kind),
        None => true,
    }
}

/// Apply one watch event, waking the waiters of every object whose readiness inputs changed.
fn apply(
    kind: &ExternalKind,
    index: &Weak<ReferenceIndex>,
    listing: &mut Option<HashMap<ObjectKey, Arc<DynamicObject>>>,
    event: watcher::Event<DynamicObject>,
) {
    let Some(ix) = index.upgrade() else { return };
    match event {
        watcher::Event::Init => *listing = Some(HashMap::new()),
        watcher::Event::InitApply(o) => {
            let o = strip(o);
            listing
                .get_or_insert_with(HashMap::new)
                .insert(key_of(&o), Arc::new(o));
        }
        watcher::Event::InitDone => {
            let listed = listing.take().unwrap_or_default();
            let first = !*kind.synced.borrow();
            let mut changed: Vec<ObjectKey> = kind
                .objects
                .iter()
                .filter(|e| !listed.contains_key(e.key()))
                .map(|e| e.key().clone())
                .collect();
            for key in &changed {
                kind.objects.remove(key);
            }
            for (key, o) in listed {
                let new = match kind.objects.get(&key) {
                    Some(old) => differs(&old, &o),
                    None => true,
                };
                if new {
                    changed.push(key.clone());
                }
                kind.objects.insert(key, o);
            }
            kind.synced.send_replace(true);
            if first {
                // Everyone who asked before the list was in read "not Ready": all ask again.
                wake_kind(index, kind);
            } else {
                for key in changed {
                    ix.wake_waiters_of(&kind.target(&key));
                }
            }
        }
        watcher::Event::Apply(o) => {
            let o = Arc::new(strip(o));
            let key = key_of(&o);
            let changed = match kind.objects.insert(key.clone(), o.clone()) {
                Some(old) => differs(&old, &o),
                None => true,
            };
            if changed {
                ix.wake_waiters_of(&kind.target(&key));
            }
        }
        watcher::Event::Delete(o) => {
            let key = key_of(&o);
            kind.objects.remove(&key);
            ix.wake_waiters_of(&kind.target(&key));
        }
    }
}

/// Wake everyone waiting on an object of `kind`.
fn wake_kind(index: &Weak<ReferenceIndex>, kind: &ExternalKind) {
    if let Some(ix) = index.upgrade() {
        ix.wake_waiters_of_kind(&kind.api_version, &kind.kind);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: serde_json::Value) -> DynamicObject {
        serde_json::from_value(v).unwrap()
    }

    fn with_status(generation: i64, status: serde_json::Value) -> DynamicObject {
        obj(serde_json::json!({
            "apiVersion": "example.com/v1", "kind": "Bucket",
            "metadata": { "name": "b", "namespace": "ns", "generation": generation },
            "spec": { "size": 3 },
            "status": status,
        }))
    }

    #[test]
    fn ready_needs_a_true_ready_condition_of_the_current_generation() {
        let ready = |g: i64| {
            serde_json::json!({ "conditions": [
                { "type": "Ready", "status": "True", "observedGeneration": g }
            ] })
        };
        assert_eq!(readiness_of(&with_status(2, ready(2))), Readiness::Ready);
        assert_eq!(readiness_of(&with_status(3, ready(2))), Readiness::NotReady);
        let stale_status = serde_json::json!({
            "observedGeneration": 1,
            "conditions": [{ "type": "Ready", "status": "True" }]
        });
        assert_eq!(
            readiness_of(&with_status(2, stale_status)),
            Readiness::NotReady
        );
        let no_generations =
            serde_json::json!({ "conditions": [{ "type": "Ready", "status": "True" }] });
        assert_eq!(
            readiness_of(&with_status(5, no_generations)),
            Readiness::Ready
        );
        let not_ready =
            serde_json::json!({ "conditions": [{ "type": "Ready", "status": "False" }] });
        assert_eq!(
            readiness_of(&with_status(1, not_ready)),
            Readiness::NotReady
        );
        assert_eq!(
            readiness_of(&with_status(1, serde_json::json!({}))),
            Readiness::NotReady
        );
    }

    #[test]
    fn stalled_or_a_failed_phase_is_failed_and_deletion_wins() {
        let stalled = serde_json::json!({ "conditions": [
            { "type": "Ready", "status": "False" },
            { "type": "Stalled", "status": "True", "reason": "QuotaExceeded" }
        ] });
        assert_eq!(readiness_of(&with_status(1, stalled)), Readiness::Failed);
        let phase = serde_json::json!({ "phase": "Failed" });
        assert_eq!(readiness_of(&with_status(1, phase)), Readiness::Failed);
        let mut deleting = with_status(1, serde_json::json!({ "phase": "Failed" }));
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert_eq!(readiness_of(&deleting), Readiness::Deleting);
    }

    #[test]
    fn strip_keeps_only_metadata_and_status_and_differs_ignores_the_rest() {
        let mut a = with_status(1, serde_json::json!({ "phase": "Running" }));
        a.metadata.annotations = Some([("k".to_string(), "v".to_string())].into());
        let a = strip(a);
        assert!(a.data.get("spec").is_none());
        assert_eq!(a.data["status"]["phase"], "Running");
        assert!(a.metadata.annotations.is_none());
        let mut b = a.clone();
        b.metadata.resource_version = Some("99".into());
        assert!(
            !differs(&a, &b),
            "a resourceVersion change is not a readiness change"
        );
        b.metadata.labels = Some([("l".to_string(), "v".to_string())].into());
        assert!(differs(&a, &b), "a predicate may read the labels");
        let c = strip(with_status(1, serde_json::json!({ "phase": "Failed" })));
        assert!(differs(&a, &c));
        let d = strip(with_status(2, serde_json::json!({ "phase": "Running" })));
        assert!(differs(&a, &d));
    }
}
