//! An in-process Kubernetes API server.
//!
//! [`ApiServer`] keeps Kubernetes objects in memory and serves the Kubernetes REST API as a
//! [`tower::Service`] ([`ApiService`]), so an unmodified [`kube::Client`] — and everything built on it:
//! `kube::Api`, `Api<DynamicObject>`, kube-runtime's `watcher`, reflectors and controllers — talks to it as
//! to a real kube-apiserver. It is the default backend for fast tests, for benchmarks and for simulations
//! under a paused tokio clock. It stands alone: it knows nothing of actorcile's runtime, which
//! re-exports it as `actorcile::cluster`.
//!
//! ```
//! use actorcile_apiserver::ApiServer;
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), kube::Error> {
//! let cluster = ApiServer::new();
//! let cms: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
//!
//! let mut cm = ConfigMap::default();
//! cm.metadata.name = Some("settings".into());
//! cm.data = Some([("mode".to_string(), "fast".to_string())].into());
//! let created = cms.create(&PostParams::default(), &cm).await?;
//! assert!(created.metadata.uid.is_some());
//!
//! let patch = serde_json::json!({"data": {"mode": "safe"}});
//! let patched = cms.patch("settings", &PatchParams::default(), &Patch::Merge(&patch)).await?;
//! assert_eq!(patched.data.unwrap()["mode"], "safe");
//!
//! // A stale resourceVersion is refused with 409 Conflict, as on a real server.
//! let err = cms.replace("settings", &PostParams::default(), &created).await.unwrap_err();
//! assert!(matches!(err, kube::Error::Api(s) if s.code == 409));
//!
//! assert_eq!(cms.list(&ListParams::default()).await?.items.len(), 1);
//! assert_eq!(cluster.stats().create, 1);
//! # Ok(())
//! # }
//! ```
//!
//! # What is served
//!
//! * Paths `/api/v1/...` and `/apis/GROUP/VERSION/...`, namespaced (`/namespaces/NS/PLURAL[/NAME[/status]]`)
//!   and cluster-scoped kinds, and all-namespace lists and watches of namespaced kinds. `/version` and
//!   minimal discovery documents (`/api`, `/api/v1`, `/apis`, `/apis/GROUP/VERSION`).
//! * Built-in kinds: core v1 `Namespace` (cluster-scoped; `default`, `kube-system`, `kube-public` and
//!   `kube-node-lease` exist from the start), `ConfigMap`, `Secret`, `Event`; `events.k8s.io/v1` `Event`
//!   (stored apart from core events, unlike the real server); `coordination.k8s.io/v1` `Lease`;
//!   `apiextensions.k8s.io/v1` `CustomResourceDefinition`. Also stored, without any behaviour of their own
//!   (no scheduler, kubelet or workload controllers run here; no defaulting or validation of their specs),
//!   so that operators that create them work unchanged: core v1 `Pod`, `Service`, `ServiceAccount`,
//!   `Endpoints`, `PersistentVolumeClaim`, `PersistentVolume`, `Node`; `apps/v1` `Deployment`,
//!   `StatefulSet`, `DaemonSet`, `ReplicaSet`; `batch/v1` `Job`, `CronJob`; `networking.k8s.io/v1`
//!   `Ingress`; `rbac.authorization.k8s.io/v1` `Role`, `RoleBinding`, `ClusterRole`,
//!   `ClusterRoleBinding`. Custom kinds: creating a CRD (by POST or
//!   [`ApiServer::install_crd`]) serves its kind at once in every served version, with its scope and its
//!   status subresource if declared; its status says `NamesAccepted` and `Established`. Versions share one
//!   storage; reads through another version only rewrite `apiVersion` (conversion strategy `None`),
//!   or are converted by a hook ([`ApiServer::register_conversion`]).
//!   Deleting a CRD deletes its objects and stops serving the kind. Unknown fields are pruned by each
//!   version's structural schema (`properties`, `additionalProperties`, `items`,
//!   `x-kubernetes-preserve-unknown-fields`), as the real server does; values are **not validated**
//!   against the schema (types, formats, enums, required fields, CEL rules) and no defaults are applied.
//! * Verbs: create (POST, `generateName`), get, list (`labelSelector` with `=`, `==`, `!=`, `in`, `notin`,
//!   `key`, `!key`, `>`/`<`; `fieldSelector` on `metadata.name` / `metadata.namespace`; `limit` +
//!   `continue`), watch, replace (PUT), patch, delete (with `propagationPolicy` and preconditions) and
//!   deletecollection.
//! * Patches: `application/merge-patch+json`; `application/json-patch+json` (a failed `test` op → 422);
//!   `application/strategic-merge-patch+json` on built-in kinds is applied as a merge patch (no merge
//!   keys), and on custom resources answers 415 as the real server; `application/apply-patch+yaml`
//!   (server-side apply, `fieldManager` required, `force` honoured) creates the object when missing and
//!   tracks field ownership among apply managers in `metadata.managedFields` (`operation: Apply`): a field
//!   another apply manager owns with a different value answers 409 `Conflict` unless forced (which takes
//!   it over), and a field a manager stops sending is removed unless someone else owns it. A replace or
//!   plain patch that changes a field another manager owns takes it, as the real server does: it
//!   becomes its manager's (`fieldManager`, else the User-Agent up to its first `/`) in an
//!   `operation: Update` entry, so that manager's next apply conflicts. Simplified: a create, and a
//!   write of fields nobody owns, record no entry (the real server records those too); lists are atomic (as for CRDs without list-type
//!   markers; built-in kinds' keyed lists are not merged by key). The apply body must be JSON (which
//!   is YAML; kube always sends JSON).
//!
//! # Semantics
//!
//! * One global revision counter (as etcd's); each write takes the next revision as the object's
//!   `resourceVersion`. A write carrying a stale `resourceVersion` → 409 Conflict. A PUT without one is
//!   unconditional for built-in kinds and refused (422) for custom resources and CRDs, as on the real
//!   server. A write that changes nothing stores nothing and sends no watch event.
//! * `metadata.uid`, `creationTimestamp` are set on create (timestamps follow the tokio clock, so a paused
//!   clock gives simulated time); `managedFields` are kept as written when a write sets them, and
//!   maintained by every other write (see server-side apply above).
//! * `metadata.generation` (custom resources, CRDs and the `apps` / `batch` kinds) starts at 1 and is
//!   bumped when anything outside metadata changes — outside metadata and status when the kind has a
//!   status subresource.
//! * Status subresource: writes to `/status` change only `status`; writes to the main resource keep the
//!   stored `status`; create drops `status`.
//! * Deletion: without finalizers the object goes at once. With finalizers, DELETE only sets
//!   `deletionTimestamp` and `deletionGracePeriodSeconds: 0`; no finalizer may be added meanwhile (422);
//!   a write that leaves no finalizers deletes the object instead of storing the write, so — as on the real
//!   server — the `DELETED` event carries the last stored state (at a new revision) and the answer the
//!   written state (at the old one). Marking an object for deletion bumps its `generation` (if it has
//!   one). DELETE answers the object while it remains (finalizers; always for namespaces, CRDs and pods)
//!   and a success `Status` naming it when it is gone at once, as the real server does (checked on
//!   v1.34 and v1.37). Preconditions
//!   (`uid`, `resourceVersion`) answer 409.
//! * Other checks done by the real server: label syntax (422), string-valued labels and annotations,
//!   complete `ownerReferences` with at most one controller (422),
//!   `metadata.uid` in a write must match (409), `immutable` ConfigMaps and Secrets (422), a Secret's
//!   `stringData` is folded into base64 `data`, names are DNS subdomains (labels for namespaces).
//! * Garbage collection by `ownerReferences` runs inline, within the request that removed an owner, so it
//!   is deterministic: dependents whose owners are all gone are deleted (background policy, respecting
//!   their finalizers). `propagationPolicy: Orphan` removes the owner's references from its dependents
//!   first; `Foreground` adds the `foregroundDeletion` finalizer when dependents with
//!   `blockOwnerDeletion: true` exist, deletes all dependents, and removes the owner once those are gone.
//!   Dangling owner references on newly created objects are not collected.
//! * Namespaces: creating in a missing namespace → 404, in a terminating one → 403. Deleting a namespace
//!   marks it `Terminating`, deletes its contents and removes it once empty.
//! * Watches: newline-delimited `WatchEvent`s (`ADDED`, `MODIFIED`, `DELETED`, `BOOKMARK`, `ERROR`).
//!   `resourceVersion` "" or "0" first sends a synthetic `ADDED` per current object (then a `BOOKMARK`
//!   annotated `k8s.io/initial-events-end` when `sendInitialEvents=true`, for kube-runtime's streaming
//!   lists); a revision sends every later event, in order. A revision older than the history window
//!   ([`ApiServerBuilder::history`]) answers an `ERROR` event with a 410 `Expired` `Status`, as the real
//!   server's watch cache. Selectors are honoured, including objects entering (`ADDED`) or leaving
//!   (`DELETED`) a label selector. `timeoutSeconds` ends the stream (default 30 minutes). With
//!   `allowWatchBookmarks=true` (kube's default) a `BOOKMARK` at the current revision comes every 60 s
//!   and when the stream ends, so a watcher of a quiet kind resumes without a 410 even when other kinds
//!   fill the history.
//! * Lists: `metadata.resourceVersion` is the current revision. `resourceVersion=0` lists are whole (the
//!   `limit` is ignored, as the real server's cache does); `remainingItemCount` is not given. Pages after
//!   the first show the objects' current state rather than a snapshot at the first page's revision; a
//!   `continue` token older than the history window answers 410.
//! * Errors are Kubernetes `Status` objects with `reason`, `code`, `details`, so `kube::Error::Api`
//!   carries them; malformed input answers 400/422, unsupported methods 405. Unknown kinds of built-in
//!   groups answer a 404 `Status`; paths no group serves (unknown groups, unknown kinds of custom
//!   resource groups) answer the real server's plain-text `404 page not found`. Messages
//!   follow the real kube-apiserver's where the conformance suite compares them. Built-in kinds take a missing `apiVersion`
//!   / `kind` from the URL; custom resources require them (400).
//! * `dryRun=All` (query, or `dryRun: ["All"]` in DeleteOptions) checks a write and answers its result
//!   without storing it or sending events.
//!
//! # What the real server does and this one does not
//!
//! The conformance suite (`tests/integration/conformance.rs` in the actorcile repository) runs the same cases here and on a real
//! kube-apiserver (v1.37 and v1.34). What a current server does that this one does not, so that a
//! test relying on it runs against `actorcile::envtest` instead:
//!
//! * CRD validation beyond the structural schema's pruning: OpenAPI value checks (`minimum`,
//!   `pattern`, `enum`, `maxLength`, …), CEL rules (`x-kubernetes-validations`) and their
//!   ratcheting. Objects that break them are stored.
//! * Admission: Pod Security, ResourceQuota, LimitRange, ServiceAccount, validating and mutating
//!   admission policies; no authentication or authorization (every request is an admin's).
//!   Admission webhooks are not read from webhook configurations: a webhook registered with
//!   [`ApiServer::register_webhook`] is called in process, for creates and updates.
//! * CRD conversion is called in process, not read from the CRD's webhook address: a hook
//!   registered with [`ApiServer::register_conversion`] converts a kind's versions. Without one, every served version answers the stored object as it is, with only
//!   `apiVersion` rewritten. No `selectableFields`, no `scale` subresource.
//! * Controllers: no controller-manager besides the inline garbage collector and namespace
//!   deletion (no Deployments rolling out Pods, no Service endpoints).
//! * Lists: no `remainingItemCount`, and pages after the first are not a snapshot (see above).
//!
//! # Determinism
//!
//! Given the same requests in the same order, two clusters built with the same
//! [`ApiServerBuilder::seed`] and [`Faults::seed`] answer the same: same uids, `generateName` suffixes,
//! revisions, injected faults, and the same order of garbage-collection and namespace-deletion events.
//! Nothing depends on wall-clock time except the text of timestamps.
//!
//! # Cost
//!
//! Objects are serialized once per write; lists, gets and every watcher share those bytes. Gets and
//! writes are `O(log n)` besides the object's own JSON; lists and watches starting from "now" walk only
//! the requested namespace (or page); watch resumption binary-searches the history. Each write costs one
//! check per open watch of its kind.
//!
//! # Fault injection
//!
//! [`Faults`] (from code, or TOML via serde) adds latency, 500 errors and 409 conflicts, drawn from a
//! seeded generator; [`ApiServer::set_faults`] changes them at run time. Delays use `tokio::time`, so they
//! cost nothing under a paused clock.
//!
//! # Where things are
//!
//! For a reader of the source: the HTTP layer parses requests and the store, behind one lock, does the
//! rest. Each concept has its own file under `src/`:
//!
//! | file | holds |
//! | --- | --- |
//! | `service.rs` | the `tower::Service`: routing, discovery, query parameters, patch types, watch streams and their periodic bookmarks |
//! | `apply.rs` | server-side apply: field sets and ownership in `managedFields` |
//! | `store.rs` | the object table and revision counter; create, get, update |
//! | `object.rs` | a stored object (its value and shared bytes), references to objects, `metadata` accessors |
//! | `kinds.rs` | the kind registry: built-in kinds and how each behaves |
//! | `crd.rs` | CustomResourceDefinitions: checking, status, serving and unserving their kinds |
//! | `validation.rs` | checks and normalization before a write (type, namespace, names, labels, `ownerReferences`, `immutable`, `stringData`) |
//! | `schema.rs` | pruning of unknown fields by structural schema |
//! | `list.rs` | lists: selectors, `limit` and `continue` |
//! | `watch.rs` | watch events, the event history, watch resumption and 410 `Expired` |
//! | `deletion.rs` | DELETE and deletecollection, preconditions, finalizers, namespace termination |
//! | `gc.rs` | garbage collection by `ownerReferences` and propagation policies |
//! | `service/admitted.rs` | writes sent to the admission webhooks before they are executed |
//! | `admission.rs` | admission webhooks called in process: the reviews sent, patches applied, denials returned |
//! | `conversion.rs` | CRD conversion called in process: the storage version, the reviews sent, what a conversion must keep |
//! | `selector.rs` | label and field selectors |
//! | `error.rs` | `Status` errors and [`ClusterError`] |
//! | `faults.rs` | fault injection ([`Faults`]) |
//! | `apf.rs` | a concurrency limit that answers 429 past its queue, as API Priority and Fairness ([`Apf`]) |

#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

mod admission;
mod apf;
mod apply;
mod conversion;
mod crd;
mod deletion;
mod error;
mod faults;
mod gc;
mod kinds;
mod list;
mod object;
mod routing;
mod schema;
mod selector;
mod service;
mod store;
#[cfg(test)]
mod testing;
mod validation;
mod watch;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

pub use admission::{AdmissionHook, ReviewFuture, Webhook};
pub use apf::Apf;
pub use conversion::ConversionHook;
pub use error::ClusterError;
pub use faults::Faults;
pub use service::{ApiBody, ApiService};

use faults::FaultState;
use store::Store;

/// Shared state behind every handle.
pub(crate) struct Inner {
    pub(crate) store: Mutex<Store>,
    pub(crate) faults: Mutex<FaultState>,
    pub(crate) stats: Stats,
    /// The admission webhooks, in order of registration.
    pub(crate) webhooks: std::sync::RwLock<Vec<Webhook>>,
    /// The concurrency limit ([`ApiServer::set_apf`]), if one is set.
    pub(crate) apf: Mutex<Option<Arc<apf::Gate>>>,
}

impl Inner {
    /// The webhooks registered for the resource `group`/`plural`.
    pub(crate) fn webhooks_for(&self, group: &str, plural: &str) -> Vec<Webhook> {
        let webhooks = self.webhooks.read().unwrap_or_else(|p| p.into_inner());
        if webhooks.is_empty() {
            return Vec::new();
        }
        webhooks
            .iter()
            .filter(|w| w.group == group && w.resource == plural)
            .cloned()
            .collect()
    }
}

#[derive(Default)]
pub(crate) struct Stats {
    pub(crate) get: AtomicU64,
    pub(crate) list: AtomicU64,
    pub(crate) watch: AtomicU64,
    pub(crate) create: AtomicU64,
    pub(crate) update: AtomicU64,
    pub(crate) patch: AtomicU64,
    pub(crate) delete: AtomicU64,
    pub(crate) total: AtomicU64,
    pub(crate) injected_errors: AtomicU64,
    pub(crate) throttled: AtomicU64,
}

/// Request counters of an [`ApiServer`], by verb.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ApiServerStats {
    /// GET of one object (main resource or status).
    pub get: u64,
    /// LIST requests.
    pub list: u64,
    /// WATCH requests.
    pub watch: u64,
    /// POST (create) requests.
    pub create: u64,
    /// PUT (replace) requests, status included.
    pub update: u64,
    /// PATCH requests, status and apply included.
    pub patch: u64,
    /// DELETE requests (one object or a collection).
    pub delete: u64,
    /// Every request, including discovery, `/version` and malformed ones.
    pub total: u64,
    /// Requests answered with an injected 500.
    pub injected_errors: u64,
    /// Writes answered with an injected 409.
    pub injected_conflicts: u64,
    /// Requests answered 429 by the concurrency limit ([`ApiServer::set_apf`]).
    pub throttled: u64,
}

/// An in-process Kubernetes API server. Cheap to clone: clones share the same cluster.
///
/// See the [module documentation](self) for what it serves and how.
#[derive(Clone)]
pub struct ApiServer {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("objects", &self.object_count())
            .finish_non_exhaustive()
    }
}

impl Default for ApiServer {
    fn default() -> Self {
        ApiServer::new()
    }
}

/// Builds an [`ApiServer`] with non-default settings.
#[derive(Debug, Clone)]
pub struct ApiServerBuilder {
    history: usize,
    faults: Faults,
    seed: u64,
}

impl Default for ApiServerBuilder {
    fn default() -> Self {
        ApiServerBuilder {
            history: 100_000,
            faults: Faults::default(),
            seed: 0,
        }
    }
}

impl ApiServerBuilder {
    /// How many events the cluster keeps for watch resumption (default 100 000, at least 1). A watch from
    /// an older revision answers 410 Expired.
    pub fn history(mut self, events: usize) -> Self {
        self.history = events;
        self
    }

    /// Faults to inject from the start (default none).
    pub fn faults(mut self, faults: Faults) -> Self {
        self.faults = faults;
        self
    }

    /// Seed of the generator of uids and `generateName` suffixes (default 0), so runs are reproducible.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Builds the cluster.
    pub fn build(self) -> ApiServer {
        ApiServer {
            inner: Arc::new(Inner {
                store: Mutex::new(Store::new(self.history, self.seed)),
                faults: Mutex::new(FaultState::new(self.faults)),
                stats: Stats::default(),
                webhooks: Default::default(),
                apf: Mutex::new(None),
            }),
        }
    }
}

impl ApiServer {
    /// A cluster with default settings: namespaces `default`, `kube-system`, `kube-public` and
    /// `kube-node-lease`, no faults, a 100 000-event watch history.
    pub fn new() -> ApiServer {
        ApiServerBuilder::default().build()
    }

    /// A builder for non-default settings.
    pub fn builder() -> ApiServerBuilder {
        ApiServerBuilder::default()
    }

    /// A `kube::Client` talking to this cluster, with default namespace `default`.
    ///
    /// Must be called inside a tokio runtime (kube's client spawns its request buffer task).
    pub fn client(&self) -> kube::Client {
        kube::Client::new(self.service(), "default")
    }

    /// The cluster as a `tower::Service`, e.g. to wrap it in other layers before `kube::Client::new`.
    pub fn service(&self) -> ApiService {
        ApiService {
            inner: self.inner.clone(),
        }
    }

    /// Creates a CustomResourceDefinition, or replaces the spec of an existing one, and serves its kind at
    /// once (it is `Established` immediately).
    pub fn install_crd(&self, crd: &CustomResourceDefinition) -> Result<(), ClusterError> {
        let value = serde_json::to_value(crd)?;
        let mut store = self.inner.store.lock().unwrap_or_else(|p| p.into_inner());
        store.install_crd(value).map_err(ClusterError::from)
    }

    /// Calls `webhook` before every create and update of its resource, as the real server
    /// calls an admission webhook (see the module `admission` of the crate's source for what
    /// is sent and how the answer is used). Webhooks are called in order of registration,
    /// mutating ones first.
    pub fn register_webhook(&self, webhook: Webhook) {
        self.inner
            .webhooks
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(webhook);
    }

    /// Makes the server convert the objects of `group`'s `kind` by `hook`, as a real server
    /// calls a CRD's conversion webhook (the registration stands for the CRD's `conversion`
    /// stanza): the kind's objects (its CRD installed before or after this call) are stored in
    /// the storage version and converted when read or written through another version (see the module
    /// `conversion` of the crate's source). The hook is called with the server's state locked: it
    /// must be a quick, pure function of the review, and must not call the server.
    pub fn register_conversion(&self, group: &str, kind: &str, hook: Arc<dyn ConversionHook>) {
        self.inner
            .store
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .register_conversion(group, kind, hook);
    }

    /// Replaces the injected faults (and reseeds the fault generator with `faults.seed`).
    pub fn set_faults(&self, faults: Faults) {
        *self.inner.faults.lock().unwrap_or_else(|p| p.into_inner()) = FaultState::new(faults);
    }

    /// Limit the requests served at once as kube-apiserver's API Priority and Fairness does
    /// ([`Apf`]): past `seats`, requests wait; past `queue` more, they are answered
    /// `429 TooManyRequests` with `Retry-After: 1` (counted in [`ApiServerStats::throttled`]).
    /// `None` lifts the limit. Requests already waiting keep the setting they met.
    ///
    /// ```
    /// # use actorcile_apiserver::{ApiServer, Apf, Faults};
    /// let cluster = ApiServer::new();
    /// // 8 requests at once, each served in 2 ms: at most 4 000 a second, as a busy server.
    /// cluster.set_apf(Some(Apf { seats: 8, queue: 16 }));
    /// cluster.set_faults(Faults { latency: std::time::Duration::from_millis(2), ..Faults::default() });
    /// ```
    pub fn set_apf(&self, apf: Option<Apf>) {
        *self.inner.apf.lock().unwrap_or_else(|p| p.into_inner()) =
            apf.map(|a| Arc::new(apf::Gate::new(a)));
    }

    /// The current faults.
    pub fn faults(&self) -> Faults {
        self.inner
            .faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .faults
            .clone()
    }

    /// Request counters so far.
    pub fn stats(&self) -> ApiServerStats {
        let s = &self.inner.stats;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ApiServerStats {
            get: l(&s.get),
            list: l(&s.list),
            watch: l(&s.watch),
            create: l(&s.create),
            update: l(&s.update),
            patch: l(&s.patch),
            delete: l(&s.delete),
            total: l(&s.total),
            injected_errors: l(&s.injected_errors),
            throttled: l(&s.throttled),
            injected_conflicts: self
                .inner
                .store
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .injected_conflicts,
        }
    }

    /// How many objects are stored, of every kind — the built-in namespaces and CRDs included.
    pub fn object_count(&self) -> usize {
        self.inner
            .store
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .object_count()
    }

    /// The current revision (the `resourceVersion` of the latest write).
    pub fn revision(&self) -> u64 {
        self.inner
            .store
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .revision()
    }
}
