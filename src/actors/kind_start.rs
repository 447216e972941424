//! One kind's start-up: the path watch → feeder → manager → resource actors, built from a
//! [`KindSpec`] (what [`Controller`](crate::runtime::Controller) collects) and the runtime's
//! [`StartCx`]. The runtime ([`crate::runtime`]) starts each kind through [`Start`], its type
//! erased.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::runtime::{ControllerPart, Setting};
use async_trait::async_trait;
use dashmap::DashMap;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::events::Reporter;
use ractor::{Actor, ActorCell};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use super::kind_spec::KindSpec;
use super::kind_view::KindView;
use crate::actors::watches::SecretTrigger;
use crate::actors::{
    KindMetrics, KindRules, KindWatch, Manager, ManagerArgs, Metrics, ReconcileSlots, ShardScope,
    Shared, Timers, run_feeder,
};
use crate::event_recorder::EventRecorder;
use crate::health::Health;
use crate::messages::ManagerMsg;
use crate::policy::SupervisorPolicy;
use crate::provisioners::{ControllerParts, Provisioner};
use crate::references::{ReferenceApi, ReferenceIndex, Target};
use crate::sharding::{ShardWatch, Sharding, Shards};
use crate::watch_tasks::supervise;
use crate::{Error, ManagedResource};

/// Type-erased controller, started by the runtime.
#[async_trait]
pub(crate) trait Start: Send {
    async fn start(self: Box<Self>, cx: &StartCx) -> Result<Started, Error>;
    /// What the runtime needs for this controller, with the runtime's namespace `default`.
    fn rules(&self, default: Option<&str>) -> Vec<crate::rbac::ScopedRule>;
    /// What its tree's steps need besides, their [`RuleScope::Object`] resolved.
    ///
    /// [`RuleScope::Object`]: crate::rbac::RuleScope::Object
    fn step_rules(&self, default: Option<&str>) -> Vec<crate::rbac::StepRule>;
    /// The kind, as (apiVersion, kind).
    fn kind(&self) -> (String, String);
    /// Whether its controller set a [`KindPolicy`](crate::policy::KindPolicy) of its own.
    fn has_own_policy(&self) -> bool;
    /// Whether its controller set a shard key of its own.
    fn has_shard_key(&self) -> bool;
    /// Whether its settings are valid (the first problem, naming the field).
    fn validate(&self) -> Result<(), Error>;
    /// Watch only `ns`, unless the controller names its own namespace.
    fn default_namespace(&mut self, ns: &str);
}

pub(crate) struct StartCx {
    pub(crate) client: Client,
    pub(crate) policy: SupervisorPolicy,
    pub(crate) slots: Arc<Semaphore>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) references: Arc<ReferenceIndex>,
    pub(crate) finalizer: String,
    /// Finalizers of earlier names, the runtime's own too.
    pub(crate) former_finalizers: Arc<[String]>,
    pub(crate) field_manager: String,
    pub(crate) reporter: Option<Reporter>,
    pub(crate) root: ActorCell,
    pub(crate) holder: Arc<str>,
    pub(crate) health: Arc<Health>,
    /// With sharding: the shards held, a fenced client per shard, and the settings (what each
    /// replica watches, the label key and the Leases' namespace).
    pub(crate) shards: Option<(Arc<Shards>, ShardClients, Arc<Sharding>)>,
    /// The runtime's introspection, when it is on: each kind adds its reporter.
    pub(crate) introspection: Option<Arc<crate::introspect::Introspection>>,
}

/// A fenced client per shard, in shard order.
pub(crate) type ShardClients = Arc<[Arc<Client>]>;

pub(crate) struct Started {
    pub(crate) kind: String,
    pub(crate) manager: ActorCell,
    /// The watch tasks: the kind's feeder, and its triggers' watches.
    pub(crate) tasks: Vec<JoinHandle<()>>,
    /// How many cached objects are held encoded (for the tests beside the actors).
    #[cfg(test)]
    pub(crate) encoded: Box<dyn Fn() -> usize + Send + Sync>,
}

#[async_trait]
impl<K: ManagedResource> Start for KindSpec<K> {
    fn rules(&self, default: Option<&str>) -> Vec<crate::rbac::ScopedRule> {
        use crate::rbac::{RuleScope, ScopedRule};
        let mut rules = Vec::new();
        if let Some(c) = &self.config {
            rules.extend(c.rules.iter().cloned());
        }
        for ns in self.objects_namespaces(default) {
            let objects = RuleScope::Object.resolve(ns.as_deref());
            let in_objects = |rule| ScopedRule::new(objects.clone(), rule);
            rules.extend(crate::rbac::rules_for::<K>().into_iter().map(in_objects));
            if self.secrets.is_some() {
                rules.push(in_objects(crate::rbac::rule_for::<Secret>(&[
                    "list", "watch",
                ])));
            }
            for r in &self.related {
                // A cluster-scoped related kind is watched once, cluster-wide.
                let scope = if r.cluster_scoped {
                    RuleScope::Cluster
                } else {
                    objects.clone()
                };
                rules.push(ScopedRule::new(scope, r.rule.clone()));
            }
            // Events go to the object's namespace; those of cluster-scoped objects to `default`.
            let events = if crate::object_api::is_cluster_scoped::<K>() {
                RuleScope::namespace("default")
            } else {
                objects.clone()
            };
            rules.extend(
                crate::rbac::common_rules()
                    .into_iter()
                    .map(|r| ScopedRule::new(events.clone(), r)),
            );
        }
        rules
    }

    fn kind(&self) -> (String, String) {
        (K::api_version(&()).into_owned(), K::kind(&()).into_owned())
    }

    fn has_own_policy(&self) -> bool {
        self.policy.is_some()
    }

    fn has_shard_key(&self) -> bool {
        self.shard_key.is_some()
    }

    fn step_rules(&self, default: Option<&str>) -> Vec<crate::rbac::StepRule> {
        let mut rules = Vec::new();
        for r in self.tree.rules() {
            if r.scope == crate::rbac::RuleScope::Object {
                // Once in each namespace the objects are in.
                for ns in self.objects_namespaces(default) {
                    let mut r = r.clone();
                    r.scope = crate::rbac::RuleScope::Object.resolve(ns.as_deref());
                    rules.push(r);
                }
            } else {
                rules.push(r);
            }
        }
        rules
    }

    fn default_namespace(&mut self, ns: &str) {
        if self.namespaces.is_empty() && !crate::object_api::is_cluster_scoped::<K>() {
            self.namespaces = vec![ns.to_string()];
        }
    }

    fn validate(&self) -> Result<(), Error> {
        if let Some(p) = &self.policy {
            p.validate()?;
        }
        if let Some(n) = self.max_concurrent_reconciles
            && !(1..=crate::policy::MAX_CONCURRENCY).contains(&n)
        {
            return Err(Error::Invalid {
                field: Setting::Controller {
                    kind: K::kind(&()).into_owned(),
                    part: ControllerPart::MaxConcurrentReconciles,
                },
                problem: format!("{n}: must be 1 to {}", crate::policy::MAX_CONCURRENCY),
            });
        }
        for ns in &self.namespaces {
            if crate::object_api::is_cluster_scoped::<K>() {
                return Err(Error::Invalid {
                    field: Setting::Controller {
                        kind: K::kind(&()).into_owned(),
                        part: ControllerPart::Namespace,
                    },
                    problem: format!(
                        "{} is cluster-scoped: its objects are in no namespace",
                        K::kind(&())
                    ),
                });
            }
            if !crate::names::is_dns_label(ns) {
                return Err(Error::Invalid {
                    field: Setting::Controller {
                        kind: K::kind(&()).into_owned(),
                        part: ControllerPart::Namespace,
                    },
                    problem: format!("{ns:?} is not a valid namespace name"),
                });
            }
        }
        if let Some(c) = &self.config
            && let Some(problem) = &c.invalid
        {
            return Err(Error::Invalid {
                field: Setting::Controller {
                    kind: K::kind(&()).into_owned(),
                    part: ControllerPart::Config,
                },
                problem: format!("{}: {problem}", c.described),
            });
        }
        Ok(())
    }

    async fn start(mut self: Box<Self>, cx: &StartCx) -> Result<Started, Error> {
        // The kind's knobs: its controller's, or the policy's section for the kind, or the
        // policy's top level (never a controller's and a section: the builder refuses that).
        // Its actors run by these only; the runtime-wide parts stay the runtime's.
        let policy = match self.policy.take() {
            Some(kind) => kind,
            None => cx.policy.for_kind(&K::kind(&())).clone(),
        };
        policy.validate()?;
        for (name, hook) in [
            ("upgrade", self.upgrade.take()),
            ("initialize", self.initialize.take()),
        ] {
            if let Some(hook) = hook {
                tracing::info!(controller = %K::kind(&()), hook = name, "running start-up hook");
                hook(cx.client.clone()).await.map_err(|e| Error::Hook {
                    controller: K::kind(&()).into_owned(),
                    hook: name,
                    message: e.to_string(),
                })?;
            }
        }
        // One watch, and one store, per namespace (the runtime's default is applied already).
        let namespaces = self.objects_namespaces(None);
        let (store, writers) = crate::actors::KindStore::<K>::new(&namespaces);
        let recorder = cx
            .reporter
            .clone()
            .map(|r| Arc::new(EventRecorder::new(cx.client.clone(), r)));
        let related = std::mem::take(&mut self.related);
        let own_writes = related
            .iter()
            .any(|r| r.owned)
            .then(|| Arc::new(crate::provisioners::context::OwnWrites::default()));
        let parts = Arc::new(ControllerParts {
            own_writes: own_writes.clone(),
            recorder,
            references: Some(cx.references.clone() as Arc<dyn ReferenceApi>),
            field_manager: Arc::from(cx.field_manager.as_str()),
            keys: cx.references.keys().clone().into(),
            holder: cx.holder.clone(),
            lock_expiry: policy.lock_expiry,
            locks_seen: Default::default(),
            unrecorded: Default::default(),
            log_steps: cx.introspection.is_some(),
        });
        let kind = K::kind(&()).into_owned();
        let (config, start_config) = match self.config {
            Some(spec) => {
                if let Err(e) = (spec.probe)(cx.client.clone()).await
                    && matches!(&e, kube::Error::Api(s) if s.code == 404)
                {
                    return Err(Error::Invalid {
                        field: Setting::Controller {
                            kind: kind.clone(),
                            part: ControllerPart::Config,
                        },
                        problem: format!("the API server does not serve {}: {e}", spec.described),
                    });
                }
                let (view, start) = (spec.start)(&cx.client);
                (Some(view), Some(start))
            }
            None => (None, None),
        };
        let slots = ReconcileSlots::new(
            cx.slots.clone(),
            cx.policy.runtime.max_concurrent_reconciles,
            self.max_concurrent_reconciles,
        );
        let timers = Timers::with_slots(&slots);
        cx.health.add_task(
            &format!("the {kind} timers"),
            crate::health::TaskCheck(Box::new(timers.liveness())),
        );
        let kind_metrics = Arc::new(KindMetrics::new(&kind, {
            let (store, timers) = (store.clone(), timers.gauges());
            Box::new(move || (store.len() as u64, timers.armed(), timers.waiting()))
        }));
        cx.metrics.add_kind(kind_metrics.clone());
        let keyed = self.shard_key.is_some();
        let write_timeout = policy.write_timeout;
        let io = Arc::new(crate::writes::Io {
            client: Arc::new(cx.client.clone()),
            shards: cx
                .shards
                .as_ref()
                .map(|(shards, clients, sharding)| ShardScope {
                    shards: shards.clone(),
                    clients: clients.clone(),
                    key: self.shard_key.take(),
                    label: (sharding.watch == ShardWatch::HeldShards
                        || (sharding.watch == ShardWatch::Everything && keyed))
                        .then(|| Arc::from(sharding.label_key())),
                    selects_by_label: sharding.watch == ShardWatch::HeldShards,
                    server_side_leases: (sharding.watch == ShardWatch::ServerSide)
                        .then(|| Arc::from(sharding.leases_url())),
                    server_selects: Default::default(),
                    child_label: sharding
                        .splits_watches()
                        .then(|| Arc::from(sharding.owner_label_key())),
                    narrow_after: cx.policy.lease.duration * 2,
                }),
            parts: parts.clone(),
            metrics: cx.metrics.clone(),
            kind_metrics: kind_metrics.clone(),
            finalizers: crate::writes::OwnFinalizers {
                current: cx.finalizer.clone(),
                former: cx.former_finalizers.clone(),
            },
            write_timeout,
        });
        let shared = Arc::new(Shared {
            rules: KindRules {
                tree: self.tree,
                policy,
                use_finalizer: self.finalizer,
                write_status: self.status,
                prune_cache: self.prune_cache,
                encode_passive: self.encode_passive,
                tenants: self.tenants,
            },
            io,
            slots,
            store,
            routes: DashMap::default(),
            in_flight: crate::scheduling::moved_on::InFlight::new(self.cancel_on_change),
            status_checks: Default::default(),
            references: cx.references.clone(),
            timers,
            config,
            secrets: self.secrets.map(SecretTrigger::new),
            reports: cx.introspection.as_ref().map(|_| Default::default()),
        });
        if let Some(introspection) = &cx.introspection {
            let reporter = super::inspect::reporter(shared.clone(), cx.holder.clone());
            introspection.add(&kind, reporter);
        }
        let synced = Arc::new(AtomicBool::new(false));
        // What `/readyz` checks for each watch: whether its first list is in (the kind's, with
        // one watch), and why the server refuses it; named by the kind, and its namespace with
        // several watches.
        let watches: Vec<(Arc<AtomicBool>, crate::health::WatchRefusal)> = namespaces
            .iter()
            .map(|ns| {
                let refused = crate::health::WatchRefusal::default();
                let (name, listed) = match ns {
                    Some(ns) if namespaces.len() > 1 => {
                        (format!("{kind} in {ns}"), Arc::new(AtomicBool::new(false)))
                    }
                    _ => (kind.clone(), synced.clone()),
                };
                cx.health.add_kind(&name, listed.clone(), refused.clone());
                (listed, refused)
            })
            .collect();
        let handle = Arc::new(KindView {
            shared: shared.clone(),
            synced: synced.clone(),
            manager: OnceLock::new(),
        });
        cx.references
            .register_kind(&K::api_version(&()), &kind, handle.clone());
        let (mailbox, rx) = crate::actors::mailbox::channel();
        let (manager, _) = Actor::spawn_linked(
            None,
            Manager {
                shared: shared.clone(),
            },
            ManagerArgs {
                mailbox: mailbox.clone(),
                rx,
            },
            cx.root.clone(),
        )
        .await
        .map_err(|e| Error::Spawn {
            actor: format!("{kind} manager"),
            source: Box::new(e),
        })?;
        cx.health.add_supervisor(manager.get_cell());
        let mailbox = mailbox.bind(manager.clone());
        let _ = handle.manager.set(mailbox.clone());
        if let Some((shards, ..)) = &cx.shards {
            // A shard acquired: run its objects (the previous holder's work is not known here).
            let m = mailbox.clone();
            shards.on_acquired(Box::new(move |shard| {
                m.send(ManagerMsg::ShardAcquired(shard));
            }));
        }
        let mut tasks = Vec::new();
        let restarts = cx.metrics.watch_restarts.clone();
        if let Some(start) = start_config {
            let (listed_tx, mut listed) = tokio::sync::watch::channel(false);
            let listed_tx = Arc::new(listed_tx);
            let m = mailbox.clone();
            let broadcast: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
                m.send(ManagerMsg::Broadcast);
            });
            tasks.push(supervise(
                format!("the provider config watch of {kind}"),
                cx.health.clone(),
                restarts.clone(),
                move |_| start(broadcast.clone(), listed_tx.clone()),
            ));
            // Passes must see the config as it is, not as missing because it is not listed yet.
            let _ = listed.wait_for(|listed| *listed).await;
        }
        for r in related {
            let scopes = if r.cluster_scoped {
                &[None][..]
            } else {
                &namespaces[..]
            };
            for ns in scopes {
                let (client, ns, shared, own_writes, mailbox) = (
                    cx.client.clone(),
                    ns.clone(),
                    shared.clone(),
                    own_writes.clone(),
                    mailbox.clone(),
                );
                let name = format!("the {} watch of {kind}{}", r.kind, in_namespace(&ns));
                let start = r.start.clone();
                tasks.push(supervise(
                    name,
                    cx.health.clone(),
                    restarts.clone(),
                    move |_| {
                        start(
                            client.clone(),
                            ns.clone(),
                            shared.clone(),
                            own_writes.clone(),
                            mailbox.clone(),
                        )
                    },
                ));
            }
        }
        if shared.secrets.is_some() {
            for ns in &namespaces {
                let api: Api<PartialObjectMeta<Secret>> = match ns {
                    Some(ns) => Api::namespaced(cx.client.clone(), ns),
                    None => Api::all(cx.client.clone()),
                };
                let (shared, mailbox) = (shared.clone(), mailbox.clone());
                let name = format!("the Secret watch of {kind}{}", in_namespace(ns));
                tasks.push(supervise(
                    name,
                    cx.health.clone(),
                    restarts.clone(),
                    move |_| {
                        tokio::spawn(crate::actors::watches::watch_secrets(
                            shared.clone(),
                            api.clone(),
                            mailbox.clone(),
                        ))
                    },
                ));
            }
        }
        // Mark the kind synced (and rebuild its part of the reference index from the persisted
        // annotations) once the first list of every watch is in the store, before references
        // are trusted.
        let store = shared.store.clone();
        #[cfg(test)]
        let shared_store = store.clone();
        let references = cx.references.clone();
        let mut lists = Vec::new();
        for (((ns, writer), (flag, refused)), at) in
            namespaces.iter().zip(writers).zip(watches).zip(0..)
        {
            let api: Api<K> = crate::object_api::kind_api(cx.client.clone(), ns.as_deref());
            let (listed_tx, listed) = tokio::sync::oneshot::channel::<()>();
            let several = namespaces.len() > 1;
            lists.push(async move {
                let done = listed.await.is_ok();
                if done && several {
                    flag.store(true, Ordering::Release);
                }
                done
            });
            let watch = KindWatch {
                api,
                config: self.watcher.clone(),
                namespace: ns.clone(),
                refused,
                prune: self.prune_cache,
            };
            // A restarted feeder fills the same store, and says the kind is listed if its first
            // run ended before it could.
            let listed_tx = Arc::new(std::sync::Mutex::new(Some(listed_tx)));
            let (shared, mailbox) = (shared.clone(), mailbox.clone());
            let mut writer = Some(writer);
            let name = format!("the {kind} watch{}", in_namespace(ns));
            tasks.push(supervise(
                name,
                cx.health.clone(),
                restarts.clone(),
                move |run| {
                    let writer = writer.take().unwrap_or_else(|| shared.store.writer_at(at));
                    tokio::spawn(run_feeder(
                        shared.clone(),
                        watch.clone(),
                        writer,
                        mailbox.clone(),
                        listed_tx.clone(),
                        run == 0,
                    ))
                },
            ));
        }
        let (api_version, kind_name) = (K::api_version(&()).into_owned(), kind.clone());
        tokio::spawn(async move {
            let all_listed = futures::future::join_all(lists).await;
            if all_listed.into_iter().all(|listed| listed) {
                for obj in store.state() {
                    if let Some(a) = obj.meta().annotations.as_ref() {
                        references.learn(&Target::of(obj.as_ref()), &references.referrers_in(a));
                    }
                }
                // A target its type cannot hold is held by its referrers all the same.
                for u in store.undecodable_all() {
                    if let Some(a) = u.meta.annotations.as_ref() {
                        let target = Target::new(
                            &*api_version,
                            &*kind_name,
                            u.meta.namespace.as_deref(),
                            u.meta.name.clone().unwrap_or_default(),
                        );
                        references.learn(&target, &references.referrers_in(a));
                    }
                }
                synced.store(true, Ordering::Release);
                references.kind_synced(&api_version, &kind_name);
            }
        });
        Ok(Started {
            kind,
            manager: manager.get_cell(),
            tasks,
            #[cfg(test)]
            encoded: {
                let store = shared_store;
                Box::new(move || store.encoded_len())
            },
        })
    }
}

/// ` in <namespace>` for a watch of one namespace, nothing for one of all.
fn in_namespace(ns: &Option<String>) -> String {
    ns.as_ref()
        .map(|ns| format!(" in {ns}"))
        .unwrap_or_default()
}
