//! [`Controller`]: one managed kind, its provisioner tree and its options.

use std::future::Future;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use crate::ManagedResource;
use crate::actors::{ConfigSpec, HookError, KindSpec, RelatedSpec, boxed_hook};
use crate::policy::KindPolicy;
use crate::provisioners::Provisioner;
use crate::triggers::on_untrusted;

/// One managed kind: its provisioner tree and options.
pub struct Controller<K: ManagedResource> {
    pub(crate) spec: KindSpec<K>,
}

impl<K: ManagedResource> Controller<K> {
    /// Manage every object of kind `K` with `tree`.
    pub fn new(tree: impl Provisioner<K> + 'static) -> Self {
        Self {
            spec: KindSpec::new(Arc::new(tree)),
        }
    }

    /// Re-run an object when a child it owns changes or goes: kind `C` is watched (metadata
    /// only) in the controller's namespace, and a change of a `C` re-runs the objects of kind
    /// `K` its owner references name (any owner reference, not only the controller's). The
    /// echo of the runtime's own write of a child (by [`resource`](crate::provisioners::resource())
    /// or [`Context::create_owned`](crate::provisioners::Context::create_owned)) runs nothing.
    /// Someone deletes or edits a child by hand: its owner runs at once and puts it back,
    /// without waiting for a poll. Passive owners are activated like for any change, within
    /// the reconcile slots. The operator needs `list` and `watch` on `C` where it is watched
    /// ([`RuntimeBuilder::roles`](super::RuntimeBuilder::roles) includes them). With
    /// [sharding](crate::sharding) where each replica watches only its shards, the runtime
    /// labels the children it writes with their owner's shard, and each replica watches only
    /// the children of its shards
    /// ([`Sharding::owner_label_key`](crate::sharding::Sharding::owner_label_key)).
    ///
    /// ```
    /// # use actorcile::prelude::*;
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
    /// # #[kube(group = "example.com", version = "v1", kind = "App", namespaced, status = "ResourceStatus")]
    /// # struct AppSpec {}
    /// let tree = resource("settings", |app: &App| ConfigMap {
    ///     metadata: kube::api::ObjectMeta {
    ///         name: app.metadata.name.clone(),
    ///         ..Default::default()
    ///     },
    ///     ..Default::default()
    /// });
    /// let controller = Controller::<App>::new(tree).owns::<ConfigMap>();
    /// ```
    pub fn owns<C: ManagedResource>(mut self) -> Self {
        self.spec.related.push(RelatedSpec::owned::<C>());
        self
    }

    /// Re-run the objects `map` names when an object of kind `R` changes, appears or goes
    /// (`map` gets its last version): e.g. the objects that name it in their spec. `R` is
    /// watched in the controller's namespace (every namespace for a cluster-scoped `R`), and
    /// `map` is called on every version the runtime sees of every `R`: keep it cheap. Nothing
    /// re-runs for the watch's first list. The operator needs `list` and `watch` on `R` where it
    /// is watched ([`RuntimeBuilder::roles`](super::RuntimeBuilder::roles) includes them).
    ///
    /// ```
    /// # use actorcile::prelude::*;
    /// use k8s_openapi::api::core::v1::Service;
    /// use kube::runtime::reflector::ObjectRef;
    /// use kube::ResourceExt;
    /// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
    /// # #[kube(group = "example.com", version = "v1", kind = "App", namespaced, status = "ResourceStatus")]
    /// # struct AppSpec {}
    /// # let tree = step("deploy", |_cx: Context<App>| async { Outcome::Done });
    /// // A Service labelled `app: <name>` belongs to that App.
    /// let controller = Controller::<App>::new(tree).watches(|svc: &Service| {
    ///     let ns = svc.namespace().unwrap_or_default();
    ///     svc.labels()
    ///         .get("app")
    ///         .map(|app| vec![ObjectRef::new(app).within(&ns)])
    ///         .unwrap_or_default()
    /// });
    /// ```
    pub fn watches<R: ManagedResource>(
        mut self,
        map: impl Fn(&R) -> Vec<ObjectRef<K>> + Send + Sync + 'static,
    ) -> Self {
        // The mapper reads objects anyone who can write `R` wrote: a panic in it on one such
        // object maps that object to nothing (an error log names it) instead of ending the
        // watch for every other.
        let map = Arc::new(move |r: &R| {
            on_untrusted(
                r,
                "the watch's mapper",
                "it runs no owner",
                || map(r),
                Vec::new,
            )
        });
        self.spec.related.push(RelatedSpec::mapped(map));
        self
    }

    /// With [sharding](crate::sharding), the key an object's shard is computed from (default
    /// `namespace/name`): objects with one key are always in one shard, run by one replica,
    /// e.g. all objects of a tenant by a tenant label. Derive it from what does not change in
    /// an object's life (its namespace, a label set at creation): an object whose key changes
    /// moves to another shard, and the replica that held its old shard stops running it only
    /// when it sees the change.
    ///
    /// ```no_run
    /// # use actorcile::prelude::*;
    /// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
    /// # #[kube(group = "example.com", version = "v1", kind = "App", namespaced, status = "ResourceStatus")]
    /// # struct AppSpec {}
    /// # let tree = step("deploy", |_cx: Context<App>| async { Outcome::Done });
    /// use kube::ResourceExt;
    /// let controller = Controller::<App>::new(tree)
    ///     .shard_key(|app: &App| app.labels().get("tenant").cloned().unwrap_or_default());
    /// ```
    pub fn shard_key(mut self, key: impl Fn(&K) -> String + Send + Sync + 'static) -> Self {
        // Called on objects anyone who can write `K` wrote: a panic on one places that object
        // by `namespace/name` (an error log names it) instead of ending its kind's watch.
        self.spec.shard_key = Some(Arc::new(move |obj: &K| {
            let by_name = || {
                let meta = obj.meta();
                crate::sharding::object_key(
                    meta.namespace.as_deref(),
                    meta.name.as_deref().unwrap_or(""),
                )
            };
            let what = "the shard key function";
            on_untrusted(
                obj,
                what,
                "it is placed by namespace/name",
                || key(obj),
                by_name,
            )
        }));
        self
    }

    /// Run `hook` once at start-up, before [`Controller::on_initialize`]'s hook and before the
    /// kind is watched: migrate what an earlier version of the operator stored (labels,
    /// annotations, a finalizer's name). It gets the runtime's client. An error fails
    /// [`RuntimeBuilder::start`](super::RuntimeBuilder::start) with [`Error::Hook`](crate::Error::Hook) carrying its message.
    ///
    /// ```
    /// # use actorcile::prelude::*;
    /// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
    /// # #[kube(group = "example.com", version = "v1", kind = "App", namespaced, status = "ResourceStatus")]
    /// # struct AppSpec {}
    /// # let tree = step("noop", |_cx: Context<App>| async { Outcome::Done });
    /// use kube::api::{Api, ListParams, Patch, PatchParams};
    /// let controller = Controller::<App>::new(tree).on_upgrade(|client| async move {
    ///     // Objects of version 1 carried the finalizer `example.com/old`: drop it, the runtime
    ///     // now puts its own.
    ///     let apps: Api<App> = Api::all(client);
    ///     for app in apps.list(&ListParams::default()).await? {
    ///         if app.metadata.finalizers.iter().flatten().any(|f| f == "example.com/old") {
    ///             let ns = app.metadata.namespace.clone().unwrap_or_default();
    ///             let name = app.metadata.name.clone().unwrap_or_default();
    ///             let keep: Vec<_> = app.metadata.finalizers.iter().flatten()
    ///                 .filter(|f| *f != "example.com/old").cloned().collect();
    ///             let patch = serde_json::json!({"metadata": {"finalizers": keep}});
    ///             Api::<App>::namespaced(apps.clone().into_client(), &ns)
    ///                 .patch(&name, &PatchParams::default(), &Patch::Merge(patch)).await?;
    ///         }
    ///     }
    ///     Ok(())
    /// });
    /// ```
    pub fn on_upgrade<F, Fut>(mut self, hook: F) -> Self
    where
        F: FnOnce(Client) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), HookError>> + Send + 'static,
    {
        self.spec.upgrade = Some(boxed_hook(hook));
        self
    }

    /// Run `hook` once at start-up, after [`Controller::on_upgrade`]'s and before the kind is
    /// watched (e.g. create the objects the tree expects to exist, or check an external
    /// service). It gets the runtime's client. An error fails [`RuntimeBuilder::start`](super::RuntimeBuilder::start) with
    /// [`Error::Hook`](crate::Error::Hook) carrying its message.
    pub fn on_initialize<F, Fut>(mut self, hook: F) -> Self
    where
        F: FnOnce(Client) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), HookError>> + Send + 'static,
    {
        self.spec.initialize = Some(boxed_hook(hook));
        self
    }

    /// Read the provider config from the object `config` names: steps get it with
    /// [`Context::config`](crate::provisioners::Context::config), and its change (a new
    /// generation, or resourceVersion for kinds without one; its creation or deletion)
    /// re-runs every object of this controller, passive ones included, through the reconcile slots
    /// (see [`crate::triggers`]). While it does not exist, provision reconciles do not run the tree:
    /// the objects say so (phase Failed, reason `ConfigMissing`) and resume when it comes back.
    /// Deprovision reconciles run without it. The runtime lists the config before it starts the
    /// controller; a config kind the API server does not serve fails [`RuntimeBuilder::start`](super::RuntimeBuilder::start).
    ///
    /// The config is watched by name (a field selector) in its namespace, so the operator needs
    /// `list` and `watch` on that object ([`RuntimeBuilder::roles`](super::RuntimeBuilder::roles) grants them there, by
    /// `resourceNames`).
    pub fn config<C>(mut self, config: crate::triggers::ConfigRef<C>) -> Self
    where
        C: ManagedResource,
    {
        let cluster_scoped = crate::object_api::is_cluster_scoped::<C>();
        let invalid = if config.name.is_empty() {
            Some("the config object has no name".to_string())
        } else if cluster_scoped && config.namespace.is_some() {
            Some(format!(
                "{} is cluster-scoped: name it with ConfigRef::cluster",
                C::kind(&())
            ))
        } else if !cluster_scoped && config.namespace.is_none() {
            Some(format!(
                "{} is namespaced: name its namespace with ConfigRef::namespaced",
                C::kind(&())
            ))
        } else {
            None
        };
        let (name, namespace) = (config.name.clone(), config.namespace.clone());
        // Read from another cluster: its roles are granted there, not in the rendered ones.
        let elsewhere = config.client.clone();
        let scope = match &namespace {
            Some(ns) => crate::rbac::RuleScope::namespace(ns),
            None => crate::rbac::RuleScope::Cluster,
        };
        self.spec.config = Some(ConfigSpec {
            described: format!("{} {}", C::kind(&()), config.describe()),
            invalid,
            // Listed and watched by a `metadata.name` field selector, which RBAC matches
            // against `resourceNames`.
            rules: if elsewhere.is_some() {
                Vec::new()
            } else {
                let mut rules = vec![crate::rbac::ScopedRule::new(
                    scope.clone(),
                    crate::rbac::named_rule_for::<C>(&["list", "watch"], &[&name]),
                )];
                if config.secrets_from.is_some() {
                    rules.push(crate::rbac::ScopedRule::new(
                        scope,
                        crate::rbac::rule_for::<Secret>(&["list", "watch"]),
                    ));
                }
                rules
            },
            probe: Box::new(move |client| {
                let client = elsewhere.unwrap_or(client);
                Box::pin(async move {
                    let api: Api<C> = crate::object_api::kind_api(client, namespace.as_deref());
                    let lp = kube::api::ListParams::default()
                        .fields(&format!("metadata.name={name}"))
                        .limit(1);
                    api.list_metadata(&lp).await.map(|_| ())
                })
            }),
            start: Box::new(move |client| {
                let client = config.client.clone().unwrap_or_else(|| client.clone());
                ConfigSpec::trigger(&client, config)
            }),
        });
        self
    }

    /// Re-run an object when a Secret it references changes, appears or goes: `refs` says
    /// which Secrets an object references (it is called on every version of every object the
    /// runtime sees; keep it cheap). Only those objects re-run, not the whole kind. The Secrets
    /// are watched as metadata only (their data is never held), in the controller's namespace
    /// or in all, so the operator needs `list` and `watch` on Secrets there.
    pub fn secrets(
        mut self,
        refs: impl Fn(&K) -> Vec<ObjectRef<Secret>> + Send + Sync + 'static,
    ) -> Self {
        // Called on objects anyone who can write `K` wrote: a panic on one says it references
        // nothing (an error log names it) instead of ending its kind's watch.
        self.spec.secrets = Some(crate::triggers::SecretsBy::Refs(Box::new(
            move |obj: &K| {
                let what = "the Secrets function";
                on_untrusted(obj, what, "it re-runs on no Secret", || refs(obj), Vec::new)
            },
        )));
        self
    }

    /// Re-run an object when a Secret of its namespace that `referenced(object, secret)` says it
    /// uses changes, appears or goes (openmcp's `IsReferencedSecret`): a predicate over the
    /// Secrets, by their metadata (name, labels, annotations; never their data), instead of a
    /// list of names. When a Secret changes, the predicate is asked for each object of the
    /// kind in the Secret's namespace (every object, for a cluster-scoped kind); those it
    /// answers `true` for re-run. The Secrets are watched as [`Controller::secrets`] watches
    /// them (metadata only; `list` and `watch` on Secrets), and one of the two is the
    /// controller's way.
    ///
    /// ```
    /// use actorcile::prelude::*;
    /// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
    /// # #[kube(group = "example.com", version = "v1", kind = "Tenant", namespaced, status = "ResourceStatus")]
    /// # struct TenantSpec {}
    /// # let tree = step("noop", |_cx: Context<Tenant>| async { Outcome::Done });
    /// // Every Secret labelled for the tenants' platform re-runs the tenants of its namespace.
    /// let controller = Controller::<Tenant>::new(tree).secrets_where(|_t: &Tenant, secret| {
    ///     secret.labels.as_ref().is_some_and(|l| l.get("platform.example.com/credentials").is_some())
    /// });
    /// # let _ = controller;
    /// ```
    pub fn secrets_where(
        mut self,
        referenced: impl Fn(&K, &kube::api::ObjectMeta) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.spec.secrets = Some(crate::triggers::SecretsBy::Matching(Box::new(
            move |obj: &K, secret: &kube::api::ObjectMeta| {
                let what = "the Secrets predicate";
                on_untrusted(
                    obj,
                    what,
                    "this Secret re-runs it not",
                    || referenced(obj, secret),
                    || false,
                )
            },
        )));
        self
    }

    /// Do not put the runtime finalizer on this kind's objects. Deletion then never waits for
    /// the tree's deprovision (the object goes at once and deprovision does not run), and
    /// references cannot hold its objects back. For kinds with nothing to clean up.
    pub fn without_finalizer(mut self) -> Self {
        self.spec.finalizer = false;
        self
    }

    /// Do not write actorcile's status (Ready condition, phase, observedGeneration) on this
    /// kind — e.g. a built-in kind whose status belongs to someone else. Readiness of its
    /// objects is then known to this runtime only in memory, from each reconcile's outcome.
    pub fn without_status(mut self) -> Self {
        self.spec.status = false;
        self
    }

    /// This kind's restarts, backoffs, wake-ups, passivation and timeouts (default: those of
    /// the runtime's policy, [`RuntimeBuilder::policy`](super::RuntimeBuilder::policy)). What is
    /// runtime-wide stays the runtime's: a [`KindPolicy`] cannot hold it. A kind's own limit of
    /// concurrent reconciles is [`Controller::max_concurrent_reconciles`].
    ///
    /// ```
    /// # use actorcile::prelude::*;
    /// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
    /// # #[kube(group = "example.com", version = "v1", kind = "App", namespaced, status = "ResourceStatus")]
    /// # struct AppSpec {}
    /// # let tree = step("deploy", |_cx: Context<App>| async { Outcome::Done });
    /// use actorcile::policy::KindPolicy;
    ///
    /// let runtime = SupervisorPolicy::default();
    /// let controller = Controller::<App>::new(tree).policy(KindPolicy {
    ///     idle_timeout: None,
    ///     ..runtime.kind.clone()
    /// });
    /// ```
    pub fn policy(mut self, policy: KindPolicy) -> Self {
        self.spec.policy = Some(policy);
        self
    }

    /// At most `n` reconciles of this kind at once, within the runtime's `max_concurrent_reconciles`
    /// (default: no limit of its own). A reconcile then holds a reconcile slot of both limits, so a kind
    /// whose reconciles are slow or costly (a remote cluster's API, a cloud quota) cannot take
    /// every reconcile slot of the runtime. Must be 1 to [`MAX_CONCURRENCY`](crate::policy::MAX_CONCURRENCY):
    /// [`RuntimeBuilder::validate`](super::RuntimeBuilder::validate) says so.
    ///
    /// ```
    /// # use actorcile::prelude::*;
    /// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
    /// # #[kube(group = "example.com", version = "v1", kind = "App", namespaced, status = "ResourceStatus")]
    /// # struct AppSpec {}
    /// let tree = step("call-the-cloud", |_cx: Context<App>| async { Outcome::Done });
    /// // Reconciles of App run at most 4 at a time, whatever the runtime's limit.
    /// let controller = Controller::<App>::new(tree).max_concurrent_reconciles(4);
    /// ```
    pub fn max_concurrent_reconciles(mut self, n: usize) -> Self {
        self.spec.max_concurrent_reconciles = Some(n);
        self
    }

    /// Name each object's tenant with `by` (default: its namespace), for fair shares of the
    /// runtime's starts.
    ///
    /// Objects waiting for a live actor (new objects, changes to objects that ran before, and
    /// the start-up list, each class in its order) are served tenant by tenant in turn, each
    /// tenant's oldest first: a tenant that creates ten thousand objects at once delays another
    /// tenant's next object by one turn of every tenant waiting, not by its whole burst. With
    /// one tenant the order is first in, first out. Weights: [`Controller::tenant_weight`].
    /// The name is read from the cached object when it is queued (an object not cached counts
    /// under its namespace).
    ///
    /// ```
    /// # use actorcile::prelude::*;
    /// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
    /// # #[kube(group = "example.com", version = "v1", kind = "App", namespaced, status = "ResourceStatus")]
    /// # struct AppSpec {}
    /// use kube::ResourceExt;
    /// let tree = step("deploy", |_cx: Context<App>| async { Outcome::Done });
    /// // Tenants are teams, named by a label; objects without it share one tenant.
    /// let controller = Controller::<App>::new(tree).tenant(|app: &App| {
    ///     app.labels().get("example.com/team").cloned().unwrap_or_default()
    /// });
    /// ```
    pub fn tenant(mut self, by: impl Fn(&K) -> String + Send + Sync + 'static) -> Self {
        self.spec.tenants.by = Some(std::sync::Arc::new(by));
        self
    }

    /// Give tenant `name` `weight` starts per turn (default 1; 0 counts as 1): a tenant of
    /// weight 3 gets three starts for every one of a tenant of weight 1 while both wait.
    /// The name is a namespace, or what [`Controller::tenant`] returns.
    ///
    /// ```
    /// # use actorcile::prelude::*;
    /// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
    /// # #[kube(group = "example.com", version = "v1", kind = "App", namespaced, status = "ResourceStatus")]
    /// # struct AppSpec {}
    /// let tree = step("deploy", |_cx: Context<App>| async { Outcome::Done });
    /// let controller = Controller::<App>::new(tree).tenant_weight("platform", 4);
    /// ```
    pub fn tenant_weight(mut self, name: impl Into<String>, weight: u32) -> Self {
        self.spec.tenants.weights.insert(name.into(), weight);
        self
    }

    /// Whether a provision reconcile is cancelled when its object moves on (default `true`).
    ///
    /// A reconcile whose steps still await (a slow call to a cloud API, a remote cluster) when
    /// a new generation of its object or its deletion arrives is cut at its next await point,
    /// and the object runs again at once on what arrived: a deleted object starts
    /// deprovisioning without waiting for a call made for the intent it no longer has. Only the
    /// provisioner tree is cut, never the runtime's own status write, nor a step's
    /// [`Context::shielded`](crate::provisioners::Context::shielded) work
    /// ([`Context::guard`](crate::provisioners::Context::guard)'s lock, task and record
    /// are shielded). What the cut steps wrote stays written; their outcome is not recorded.
    /// A cut reconcile counts as `cancelled` in `actorcile_reconciles_total`, and is logged at
    /// `info`. A deprovision reconcile is never cut.
    ///
    /// Steps must be safe to stop at an await point, as any Rust future (the policy's
    /// `reconcile_timeout` stops them there too). A step that changes its own object's spec
    /// cancels its own reconcile, which then runs again on the new generation. `false` keeps
    /// every reconcile running to its end.
    ///
    /// ```
    /// # use actorcile::prelude::*;
    /// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
    /// # #[kube(group = "example.com", version = "v1", kind = "App", namespaced, status = "ResourceStatus")]
    /// # struct AppSpec {}
    /// let tree = step("migrate-the-database", |_cx: Context<App>| async { Outcome::Done });
    /// // A migration half done is worse than a late one: never cut.
    /// let controller = Controller::<App>::new(tree).cancel_on_change(false);
    /// ```
    pub fn cancel_on_change(mut self, cancel: bool) -> Self {
        self.spec.cancel_on_change = cancel;
        self
    }

    /// Whether the runtime's cached copy of each object is pruned (default `true`): without
    /// `metadata.managedFields` and the `kubectl.kubernetes.io/last-applied-configuration`
    /// annotation, which the API server and `kubectl` keep for themselves. On a real cluster
    /// they are often most of a small object's bytes, so the cache of many objects needs
    /// markedly less memory. Steps then see the object without them
    /// ([`Context::object`](crate::provisioners::Context::object)); `false` keeps every
    /// object whole, for a tree that reads them.
    pub fn prune_cache(mut self, prune: bool) -> Self {
        self.spec.prune_cache = prune;
        self
    }

    /// Whether the cached copy of an object whose actor is passive is held encoded (default
    /// `true`): as its JSON, a third to a half of the memory of the decoded object, decoded
    /// again when its actor re-activates (by a timer or a message; an event brings a new
    /// version, held whole until the actor is passive again). It costs an encoding and a
    /// check that it decodes each time an actor passivates, a few microseconds for a small
    /// object. An object that does not decode from its own encoding is held whole, and so is
    /// every object of its kind after it (with a warning in the log). Turn it off for a type
    /// whose `Serialize` drops what its `Deserialize` would fill in (a field skipped when
    /// serialized), since a re-activated actor would see that field's default.
    ///
    /// ```
    /// # use actorcile::prelude::*;
    /// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
    /// # #[kube(group = "example.com", version = "v1", kind = "App", namespaced, status = "ResourceStatus")]
    /// # struct AppSpec {}
    /// let tree = step("noop", |_cx: Context<App>| async { Outcome::Done });
    /// let controller = Controller::<App>::new(tree).encode_passive(false);
    /// ```
    pub fn encode_passive(mut self, encode: bool) -> Self {
        self.spec.encode_passive = encode;
        self
    }

    /// Watch options, e.g. a label selector. The config is used as given: call
    /// `.streaming_lists()` on it to keep streaming lists (see [`Controller::streaming_lists`]).
    pub fn watcher_config(mut self, config: watcher::Config) -> Self {
        self.spec.watcher = config;
        self
    }

    /// Whether the kind's lists stream (`sendInitialEvents`, the WatchList feature: the initial
    /// list arrives as watch events, without the API server building the whole list in memory).
    /// Default `true`: the watch asks for a streaming list, and where the API server refuses it
    /// (a server without WatchList answers `400`/`422`), lists and watches instead from then on.
    /// `false` always lists and watches (so does a [`watcher_config`](Self::watcher_config)
    /// set afterwards, unless it asks for streaming lists itself).
    pub fn streaming_lists(mut self, streaming: bool) -> Self {
        if streaming {
            self.spec.watcher = self.spec.watcher.streaming_lists();
        } else {
            self.spec.watcher.initial_list_strategy = watcher::InitialListStrategy::ListWatch;
        }
        self
    }

    /// Watch only one namespace (default: the runtime's [`RuntimeBuilder::namespace`](super::RuntimeBuilder::namespace), else
    /// all). The kind is then listed and watched in that namespace only (a namespaced URL), so
    /// a Role there is all the operator needs for it ([`RuntimeBuilder::roles`](super::RuntimeBuilder::roles)). Only for a
    /// namespaced kind: [`RuntimeBuilder::validate`](super::RuntimeBuilder::validate) refuses it on a cluster-scoped one.
    pub fn namespace(mut self, ns: impl Into<String>) -> Self {
        self.spec.namespaces = vec![ns.into()];
        self
    }

    /// Watch these namespaces only: one watch per namespace (the kind, and its
    /// [`owns`](Self::owns), [`watches`](Self::watches) and [`secrets`](Self::secrets)
    /// watches), each with its own cache, so a Role in each is all the operator needs
    /// ([`RuntimeBuilder::roles`](super::RuntimeBuilder::roles) renders one per namespace). A watch the server refuses in
    /// one namespace fails `/readyz` naming that namespace, while the others run. Replaces
    /// what [`namespace`](Self::namespace) set; repeats count once.
    ///
    /// ```
    /// # use actorcile::prelude::*;
    /// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
    /// # #[kube(group = "example.com", version = "v1", kind = "App", namespaced, status = "ResourceStatus")]
    /// # struct AppSpec {}
    /// # let tree = step("deploy", |_cx: Context<App>| async { Outcome::Done });
    /// let controller = Controller::<App>::new(tree).namespaces(["team-a", "team-b"]);
    /// ```
    pub fn namespaces<S: Into<String>>(mut self, namespaces: impl IntoIterator<Item = S>) -> Self {
        let mut namespaces: Vec<String> = namespaces.into_iter().map(Into::into).collect();
        namespaces.sort();
        namespaces.dedup();
        self.spec.namespaces = namespaces;
        self
    }
}
