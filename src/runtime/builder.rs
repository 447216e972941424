//! [`Runtime`] and [`RuntimeBuilder`]: register controllers, check, start, run until a signal.

use std::future::Future;
use std::sync::Arc;

use kube::Client;
use kube::runtime::events::Reporter;
use ractor::Actor;
use tokio::sync::{Semaphore, watch};

use super::{Controller, DEFAULT_FINALIZER, RuntimeHandle};
use crate::actors::{Root, ShardClients, Start, StartCx};
use crate::counters::Metrics;
use crate::health::Health;
use crate::policy::SupervisorPolicy;
use crate::provisioners::new_holder_id;
use crate::references::ReferenceIndex;
use crate::sharding::{Sharding, Shards};
use crate::{Error, ManagedResource};

/// Builds a [`Runtime`].
pub struct RuntimeBuilder {
    client: Client,
    policy: SupervisorPolicy,
    controllers: Vec<Box<dyn Start>>,
    finalizer: String,
    field_manager: String,
    reporter: Option<Reporter>,
    preflight: bool,
    namespace: Option<String>,
    crds: Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>,
    #[cfg(feature = "operator")]
    admin: Option<std::net::SocketAddr>,
    #[cfg(feature = "operator")]
    metrics_addr: Option<std::net::SocketAddr>,
    #[cfg(feature = "operator")]
    registry: Option<crate::metrics::Registry>,
    #[cfg(feature = "operator")]
    leader: Option<crate::leader::LeaderElection>,
    /// What [`RuntimeBuilder::run`] sets up before it waits for the Lease.
    early: Option<Early>,
    /// Start with no run slot: watch and cache, run nothing ([`RuntimeHandle::lead`]).
    gated: bool,
    sharding: Option<Sharding>,
}

/// A replica waiting for the Lease: its controllers started and gated, or not yet started.
#[cfg(feature = "operator")]
enum Standby {
    Warm(Box<RuntimeHandle>),
    Cold(Box<RuntimeBuilder>),
}

/// The admin servers: the one of [`RuntimeBuilder::admin`], and the one of
/// [`RuntimeBuilder::metrics_addr`] when metrics are served apart.
#[cfg(feature = "operator")]
#[derive(Default)]
pub(super) struct AdminServers {
    pub(super) main: Option<crate::admin::AdminServer>,
    pub(super) metrics: Option<crate::admin::AdminServer>,
}

/// What serves the probes and metrics, set up before the controllers start.
struct Early {
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    #[cfg(feature = "operator")]
    admin: AdminServers,
    #[cfg(feature = "operator")]
    registry: Arc<crate::metrics::Registry>,
}

/// The runtime: every registered controller, under one root supervisor.
pub struct Runtime;

impl Runtime {
    /// Start building a runtime that talks to the cluster through `client`.
    pub fn builder(client: Client) -> RuntimeBuilder {
        RuntimeBuilder {
            client,
            policy: SupervisorPolicy::default(),
            controllers: Vec::new(),
            finalizer: DEFAULT_FINALIZER.to_string(),
            field_manager: crate::FIELD_MANAGER.to_string(),
            reporter: None,
            preflight: false,
            namespace: None,
            crds: Vec::new(),
            #[cfg(feature = "operator")]
            admin: None,
            #[cfg(feature = "operator")]
            metrics_addr: None,
            #[cfg(feature = "operator")]
            registry: None,
            #[cfg(feature = "operator")]
            leader: None,
            early: None,
            gated: false,
            sharding: None,
        }
    }
}

impl RuntimeBuilder {
    /// The default policy of every controller, and the runtime-wide concurrency limit.
    pub fn policy(mut self, policy: SupervisorPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Register a kind.
    pub fn controller<K: ManagedResource>(mut self, controller: Controller<K>) -> Self {
        self.controllers.push(Box::new(controller.spec));
        self
    }

    /// The finalizer put on provisioned objects (default [`DEFAULT_FINALIZER`]).
    pub fn finalizer(mut self, name: impl Into<String>) -> Self {
        self.finalizer = name.into();
        self
    }

    /// The field manager for server-side apply (default `actorcile`).
    pub fn field_manager(mut self, name: impl Into<String>) -> Self {
        self.field_manager = name.into();
        self
    }

    /// Publish Kubernetes Events on status transitions, as this controller.
    pub fn events(mut self, controller_name: impl Into<String>) -> Self {
        self.reporter = Some(Reporter {
            controller: controller_name.into(),
            instance: std::env::var("POD_NAME").ok(),
        });
        self
    }

    /// Install (or update) these CRDs as the runtime starts, before any controller, and wait
    /// until they are Established ([`crds::install`](crate::crds::install), as the runtime's
    /// field manager; waits at most a minute). A failure fails
    /// [`RuntimeBuilder::start`]. The ClusterRole then includes the CRD permissions.
    pub fn install_crds(
        mut self,
        crds: impl IntoIterator<
            Item = k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        >,
    ) -> Self {
        self.crds.extend(crds);
        self
    }

    /// Watch only namespace `ns` with every namespaced controller that does not name its own
    /// ([`Controller::namespace`]).
    pub fn namespace(mut self, ns: impl Into<String>) -> Self {
        self.namespace = Some(ns.into());
        self
    }

    /// Serve `/metrics`, `/healthz` and `/readyz` on `addr` (see [`crate::admin`]). The
    /// server is bound before any controller starts; an address that cannot be bound fails
    /// [`RuntimeBuilder::start`] with [`Error::Admin`].
    #[cfg(feature = "operator")]
    pub fn admin(mut self, addr: std::net::SocketAddr) -> Self {
        self.admin = Some(addr);
        self
    }

    /// Serve `/metrics` on `addr` instead of on the [`admin`](RuntimeBuilder::admin) address,
    /// which then serves the probes only. Bound before any controller starts, like it.
    #[cfg(feature = "operator")]
    pub fn metrics_addr(mut self, addr: std::net::SocketAddr) -> Self {
        self.metrics_addr = Some(addr);
        self
    }

    /// The Prometheus registry the runtime adds its metrics to and `/metrics` serves (default:
    /// an empty one). Register the operator's own metrics in it first. See [`crate::metrics`]
    /// for the runtime's metric names.
    #[cfg(feature = "operator")]
    pub fn metrics_registry(mut self, registry: crate::metrics::Registry) -> Self {
        self.registry = Some(registry);
        self
    }

    /// Elect a leader among the operator's replicas on a Lease ([`crate::leader`]):
    /// [`RuntimeBuilder::run`] and [`RuntimeBuilder::run_until`] honour it (they wait for the
    /// Lease, standing by, before they start the controllers); [`RuntimeBuilder::start`]
    /// refuses a builder that has it. The policy's
    /// `lease_duration`, `lease_renew_deadline` and `lease_retry_period` set the timings.
    #[cfg(feature = "operator")]
    pub fn leader_election(mut self, election: crate::leader::LeaderElection) -> Self {
        self.leader = Some(election);
        self
    }

    /// Split the objects of every controller across the operator's replicas by Leases
    /// ([`crate::sharding`]): this replica runs only the objects of the shards it holds, and
    /// releases them when it shuts down. Works with [`RuntimeBuilder::start`] and
    /// [`RuntimeBuilder::run`]; not together with
    /// [leader election](RuntimeBuilder::leader_election) (sharding with one replica is the
    /// same as leading). The policy's `lease_duration`, `lease_renew_deadline` and
    /// `lease_retry_period` set the timings.
    pub fn sharding(mut self, sharding: Sharding) -> Self {
        self.sharding = Some(sharding);
        self
    }

    /// The health state, the metrics and the admin server (bound now: a bind failure is a
    /// start-up error).
    async fn prepare(&mut self) -> Result<Early, Error> {
        let health = Arc::new(Health::default());
        let metrics = Arc::new(Metrics::default());
        #[cfg(feature = "operator")]
        let (admin, registry) = {
            let mut registry = self.registry.take().unwrap_or_default();
            registry.register_collector(Box::new(crate::metrics::RuntimeCollector {
                metrics: metrics.clone(),
                health: health.clone(),
                max_concurrent_reconciles: self.policy.max_concurrent_reconciles as u64,
            }));
            let registry = Arc::new(registry);
            use crate::admin::{AdminLimits, AdminServer, Endpoints};
            let bind = |addr, endpoints| {
                AdminServer::bind_with(
                    addr,
                    registry.clone(),
                    health.clone(),
                    endpoints,
                    AdminLimits::default(),
                )
            };
            let main_endpoints = if self.metrics_addr.is_some() {
                Endpoints::Probes
            } else {
                Endpoints::All
            };
            let admin = AdminServers {
                main: match self.admin {
                    Some(addr) => Some(bind(addr, main_endpoints).await?),
                    None => None,
                },
                metrics: match self.metrics_addr {
                    Some(addr) => Some(bind(addr, Endpoints::Metrics).await?),
                    None => None,
                },
            };
            (admin, registry)
        };
        Ok(Early {
            health,
            metrics,
            #[cfg(feature = "operator")]
            admin,
            #[cfg(feature = "operator")]
            registry,
        })
    }

    /// Check at start-up (with SelfSubjectAccessReviews) that the running identity has every
    /// permission of [`RuntimeBuilder::roles`], each where they grant it; `start` fails with [`Error::Forbidden`]
    /// naming what is missing instead of failing later, object by object.
    pub fn preflight_rbac(mut self, check: bool) -> Self {
        self.preflight = check;
        self
    }

    /// The roles this runtime needs, named `name` (print them with
    /// [`Roles::to_yaml`](crate::rbac::Roles::to_yaml), bind them with
    /// [`Roles::bindings`](crate::rbac::Roles::bindings)). For each controller: its kind
    /// (list, watch, get, patch, and patch of its status), its config object (by name), the
    /// Secrets it watches, Events, and what its tree's steps declare ([`Provisioner::rules`](crate::provisioners::Provisioner::rules): the
    /// children kinds of [`resource`](crate::provisioners::resource()), a CD driver's, a step's
    /// [`needs`](crate::provisioners::Step::needs)) — in a Role in the namespace it watches, or
    /// in the ClusterRole when it watches all or its kind is cluster-scoped. Besides: the CRDs it
    /// installs (by name), and the Leases of its leader election (by name) or sharding, in a Role
    /// in their namespace.
    pub fn roles(&self, name: &str) -> crate::rbac::Roles {
        let mut rules = self.own_rules();
        rules.extend(
            self.step_rules()
                .into_iter()
                .map(|s| crate::rbac::ScopedRule::new(s.scope, s.rule)),
        );
        crate::rbac::Roles::new(name, rules)
    }

    /// What the trees' steps declare they need, in the scopes they need it.
    fn step_rules(&self) -> Vec<crate::rbac::StepRule> {
        let default = self.namespace.as_deref();
        self.controllers
            .iter()
            .flat_map(|c| c.step_rules(default))
            .collect()
    }

    /// What the runtime itself needs: its kinds (their configs, Secrets and Events), installing
    /// its CRDs, and the Leases of its leader election or sharding.
    fn own_rules(&self) -> Vec<crate::rbac::ScopedRule> {
        use crate::rbac::{RuleScope, ScopedRule, named_rule_for, rule_for};
        use k8s_openapi::api::coordination::v1::Lease;
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        let default = self.namespace.as_deref();
        let mut rules: Vec<_> = self
            .controllers
            .iter()
            .flat_map(|c| c.rules(default))
            .collect();
        if !self.crds.is_empty() {
            // Read by name (an installed CRD newer than the operator's is not replaced), applied
            // by name (server-side apply: a patch, which Kubernetes authorizes as a `create` of
            // that name when the CRD does not exist yet), then watched by name until Established.
            let names: Vec<&str> = self
                .crds
                .iter()
                .filter_map(|c| c.metadata.name.as_deref())
                .collect();
            rules.push(ScopedRule::new(
                RuleScope::Cluster,
                named_rule_for::<CustomResourceDefinition>(
                    &["get", "create", "patch", "list", "watch"],
                    &names,
                ),
            ));
        }
        #[cfg(feature = "operator")]
        if let Some(election) = &self.leader {
            let here = RuleScope::namespace(&election.namespace);
            rules.push(ScopedRule::new(
                here.clone(),
                rule_for::<Lease>(&["create"]),
            ));
            rules.push(ScopedRule::new(
                here,
                named_rule_for::<Lease>(&["get", "update"], &[&election.lease]),
            ));
        }
        if let Some(sharding) = &self.sharding {
            // Shard and member Leases: members are named after replicas, and found by a label.
            rules.push(ScopedRule::new(
                RuleScope::namespace(&sharding.namespace),
                rule_for::<Lease>(&["get", "list", "create", "update", "delete"]),
            ));
        }
        rules
    }

    /// Check everything given to the builder, without starting anything: the policies, that
    /// there is a controller and no kind has two, that each `[kinds.<Kind>]` section of the
    /// policy names a controller's kind that sets no policy in code, the finalizer name, the
    /// field manager, and each controller's config. The first problem is an [`Error::Invalid`] naming its field
    /// (or an [`Error::Policy`] naming the policy's).
    pub fn validate(&self) -> Result<(), Error> {
        self.policy.validate()?;
        if self.controllers.is_empty() {
            return Err(Error::Invalid {
                field: "controllers".into(),
                problem: "no controller is registered (add one with RuntimeBuilder::controller)"
                    .into(),
            });
        }
        if !crate::names::is_prefixed_qualified_name(&self.finalizer) {
            return Err(Error::Invalid {
                field: "finalizer".into(),
                problem: format!(
                    "{:?} is not a qualified name with a prefix, like example.com/finalizer",
                    self.finalizer
                ),
            });
        }
        if self.field_manager.is_empty() || self.field_manager.len() > 128 {
            return Err(Error::Invalid {
                field: "field_manager".into(),
                problem: "must be 1 to 128 characters".into(),
            });
        }
        let mut kinds = std::collections::HashSet::new();
        for c in &self.controllers {
            let (api_version, kind) = c.kind();
            if !kinds.insert((api_version.clone(), kind.clone())) {
                return Err(Error::Invalid {
                    field: format!("controller {kind}"),
                    problem: format!(
                        "{api_version} {kind} is registered twice; one controller per kind"
                    ),
                });
            }
            if c.has_own_policy() && self.policy.kinds.contains_key(&kind) {
                return Err(Error::Invalid {
                    field: format!("policy of the {kind} controller"),
                    problem: format!(
                        "set both in code (Controller::policy) and by the policy's [kinds.{kind}] section; keep one"
                    ),
                });
            }
            c.validate()?;
        }
        if let Some(kind) = self
            .policy
            .kinds
            .keys()
            .find(|k| !kinds.iter().any(|(_, kind)| kind == *k))
        {
            return Err(Error::Invalid {
                field: format!("policy section kinds.{kind}"),
                problem: format!("no controller of kind {kind} is registered"),
            });
        }
        if let Some(sharding) = &self.sharding {
            sharding.validate(&self.policy)?;
            if sharding.watch == crate::sharding::ShardWatch::ServerSide
                && let Some(c) = self.controllers.iter().find(|c| c.has_shard_key())
            {
                return Err(Error::Invalid {
                    field: format!("shard key of the {} controller", c.kind().1),
                    problem: "ShardWatch::ServerSide places objects by their uid (the API server's selection); a shard key cannot be used with it".into(),
                });
            }
            #[cfg(feature = "operator")]
            if self.leader.is_some() {
                return Err(Error::Invalid {
                    field: "sharding".into(),
                    problem: "sharding and leader election exclude each other (one shard is the same as leading)".into(),
                });
            }
        }
        Ok(())
    }

    /// Start every controller; returns a handle to observe and stop the runtime. Fails
    /// without starting anything when [`RuntimeBuilder::validate`] does.
    pub async fn start(mut self) -> Result<RuntimeHandle, Error> {
        self.validate()?;
        #[cfg(feature = "operator")]
        if self.leader.is_some() {
            return Err(Error::Invalid {
                field: "leader election".into(),
                problem: "only RuntimeBuilder::run and run_until elect a leader; start() would run unelected"
                    .into(),
            });
        }
        if let Some(ns) = &self.namespace {
            for c in &mut self.controllers {
                c.default_namespace(ns);
            }
        }
        if self.preflight {
            let own = self.own_rules();
            let steps = self.step_rules();
            let missing = crate::rbac::missing_step_permissions(&self.client, &own, &steps).await?;
            if !missing.is_empty() {
                return Err(Error::Forbidden(missing));
            }
        }
        let Early {
            health,
            metrics,
            #[cfg(feature = "operator")]
            admin,
            #[cfg(feature = "operator")]
            registry,
        } = match self.early.take() {
            Some(early) => early,
            None => self.prepare().await?,
        };
        if !self.crds.is_empty() {
            crate::crds::install(
                self.client.clone(),
                &self.crds,
                &self.field_manager,
                std::time::Duration::from_secs(60),
            )
            .await
            .map_err(|e| Error::Invalid {
                field: "CRDs".into(),
                problem: e.to_string(),
            })?;
        }
        let (tx, escalated) = watch::channel(None);
        let (root, root_task) = Actor::spawn(None, Root, tx)
            .await
            .map_err(|e| Error::Spawn {
                actor: "root supervisor".into(),
                source: Box::new(e),
            })?;
        health.add_supervisor(root.get_cell());
        let references = ReferenceIndex::for_runtime(
            &self.field_manager,
            self.client.clone(),
            self.policy.dependency_watch_idle,
        );
        let _ = metrics.reference_index.set(Arc::downgrade(&references));
        let shards = self.sharding.as_ref().map(|s| {
            let shards = Arc::new(Shards::new(s.shards));
            let clients: ShardClients =
                crate::sharding::fenced_clients(&self.client, &shards).into();
            health.set_shards(shards.clone());
            (shards, clients, Arc::new(s.clone()))
        });
        let cx = StartCx {
            client: self.client,
            // Gated (a warm standby): no slot, so no pass and no activation, until it leads.
            runs: Arc::new(Semaphore::new(if self.gated {
                0
            } else {
                self.policy.max_concurrent_reconciles
            })),
            policy: self.policy.clone(),
            metrics: metrics.clone(),
            references,
            finalizer: self.finalizer,
            field_manager: self.field_manager,
            reporter: self.reporter,
            root: root.get_cell(),
            holder: Arc::from(new_holder_id().as_str()),
            health: health.clone(),
            shards,
        };
        let mut handle = RuntimeHandle {
            holder: cx.holder.clone(),
            started: Vec::new(),
            runs: cx.runs.clone(),
            metrics,
            escalated,
            references: cx.references.clone(),
            root,
            root_task,
            shutdown_timeout: self.policy.shutdown_timeout,
            health: health.clone(),
            keeper: None,
            #[cfg(feature = "operator")]
            admin,
            #[cfg(feature = "operator")]
            registry,
        };
        for c in self.controllers {
            match c.start(&cx).await {
                Ok(s) => handle.started.push(s),
                Err(e) => {
                    // Stop what already started (a hook or a config probe failed).
                    handle.shutdown().await;
                    return Err(e);
                }
            }
        }
        // The keeper starts once every manager listens for the shards it acquires.
        if let (Some(sharding), Some((shards, ..))) = (self.sharding, &cx.shards) {
            let keeper = crate::sharding::keeper::Keeper::new(
                cx.client.clone(),
                sharding,
                shards.clone(),
                &cx.policy,
            );
            let (stop, stopped) = watch::channel(false);
            handle.keeper = Some((stop, tokio::spawn(keeper.run(stopped))));
        }
        health.set_started();
        Ok(handle)
    }

    /// Start, run until SIGTERM or SIGINT (or a manager escalates), then shut down gracefully
    /// ([`RuntimeHandle::shutdown`]): no new reconciles, in-flight reconciles finish within the
    /// policy's shutdown timeout, timers and waiters dropped; `Ok(())`. A second signal during
    /// the shutdown stops everything at once and returns [`Error::Interrupted`]. It never
    /// exits the process: `main` decides.
    ///
    /// ```no_run
    /// # use actorcile::prelude::*;
    /// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
    /// # #[kube(group = "example.com", version = "v1", kind = "App", namespaced, status = "ResourceStatus")]
    /// # struct AppSpec {}
    /// # async fn run(client: kube::Client) -> Result<(), actorcile::Error> {
    /// let tree = step("deploy", |_cx: Context<App>| async { Outcome::Done });
    /// Runtime::builder(client)
    ///     .controller(Controller::<App>::new(tree))
    ///     .admin("127.0.0.1:8080".parse().unwrap())
    ///     .run()
    ///     .await
    /// # }
    /// ```
    #[cfg(feature = "operator")]
    pub async fn run(self) -> Result<(), Error> {
        // Listening before the start: a signal during start-up is not lost.
        let signals = crate::signals::Signals::new()?;
        let result = self
            .run_stopping_on(crate::signals::Stop::<std::future::Pending<()>>::Signals(
                signals,
            ))
            .await;
        // The last spans of the exporter the flags installed, if any.
        #[cfg(feature = "otel")]
        if let Ok(Err(e)) = tokio::task::spawn_blocking(crate::telemetry::shutdown_otlp).await {
            tracing::warn!(error = %e, "the last spans were not exported");
        }
        result
    }

    /// [`RuntimeBuilder::run`], stopped by `signals`.
    #[cfg(feature = "operator")]
    async fn run_stopping_on<F: Future<Output = ()>>(
        mut self,
        mut signals: crate::signals::Stop<F>,
    ) -> Result<(), Error> {
        let Some(election) = self.leader.take() else {
            let handle = self.start().await?;
            return run_with(handle, &mut signals, None).await;
        };
        self.validate()?;
        election.validate(&self.policy)?;
        // Probes and metrics answer while this replica stands by.
        let early = self.prepare().await?;
        let health = early.health.clone();
        health.set_standby(true);
        self.early = Some(early);
        let warm = election.warm_standby;
        let slots = self.policy.max_concurrent_reconciles;
        let mut elector = crate::leader::Elector::new(self.client.clone(), election, &self.policy);
        // A warm standby watches and caches while it waits: its takeover starts with the
        // objects in hand, not with a list.
        let standby = if warm {
            self.gated = true;
            Standby::Warm(Box::new(self.start().await?))
        } else {
            Standby::Cold(Box::new(self))
        };
        let elected = tokio::select! {
            _ = elector.acquire() => true,
            signal = signals.next() => {
                tracing::info!(signal, "stopping while standing by");
                false
            }
        };
        let handle = match (elected, standby) {
            (false, Standby::Warm(handle)) => {
                handle.shutdown().await;
                return Ok(());
            }
            (false, Standby::Cold(_)) => return Ok(()),
            (true, Standby::Warm(handle)) => {
                handle.lead(slots);
                *handle
            }
            (true, Standby::Cold(builder)) => builder.start().await?,
        };
        health.set_standby(false);
        let result = run_with(handle, &mut signals, Some(&mut elector)).await;
        if !matches!(result, Err(Error::LeadershipLost)) {
            elector.release().await;
        }
        result
    }

    /// Start, run until `shutdown` completes (e.g. SIGTERM) or a manager escalates, then shut
    /// down gracefully. With [leader election](RuntimeBuilder::leader_election), as
    /// [`RuntimeBuilder::run`]: stand by until the Lease is held (`shutdown` ends the wait), run,
    /// and return [`Error::LeadershipLost`] if it is lost.
    pub async fn run_until(self, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
        #[cfg(feature = "operator")]
        if self.leader.is_some() {
            let stop = crate::signals::Stop::Until(Some(Box::pin(shutdown)));
            return self.run_stopping_on(stop).await;
        }
        let mut handle = self.start().await?;
        let result = tokio::select! {
            _ = shutdown => Ok(()),
            e = handle.escalated() => Err(e),
        };
        handle.shutdown().await;
        result
    }
}

/// [`RuntimeBuilder::run`] once it runs the controllers: until a signal, an escalation or the
/// loss of the Lease, then stop.
#[cfg(feature = "operator")]
async fn run_with<F: Future<Output = ()>>(
    mut handle: RuntimeHandle,
    signals: &mut crate::signals::Stop<F>,
    elector: Option<&mut crate::leader::Elector>,
) -> Result<(), Error> {
    let abort = handle.aborter();
    // Resolves when leadership is lost: every run must stop at once (fencing).
    let lost = async {
        match elector {
            Some(e) => e.hold().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(lost);
    let result = tokio::select! {
        signal = signals.next() => {
            tracing::info!(signal, "shutting down gracefully (again to stop at once)");
            Ok(())
        }
        e = handle.escalated() => Err(e),
        _ = &mut lost => {
            abort.abort();
            return Err(Error::LeadershipLost);
        }
    };
    // The Lease is still renewed while the shutdown waits for the runs in flight.
    tokio::select! {
        _ = handle.shutdown() => result,
        signal = signals.next() => {
            tracing::warn!(signal, "second signal: stopping at once");
            abort.abort();
            Err(Error::Interrupted)
        }
        _ = &mut lost => {
            abort.abort();
            Err(Error::LeadershipLost)
        }
    }
}
