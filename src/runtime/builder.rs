//! [`Runtime`] and [`RuntimeBuilder`]: register controllers, check, start, run until a signal.

use std::future::Future;
use std::sync::Arc;

use kube::Client;
use kube::runtime::events::Reporter;
use ractor::Actor;
use tokio::sync::{Semaphore, watch};

use super::{Controller, RuntimeHandle};
use crate::actors::{Root, ShardClients, Start, StartCx};
use crate::counters::Metrics;
use crate::health::Health;
use crate::policy::SupervisorPolicy;
use crate::provisioners::new_holder_id;
use crate::references::ReferenceIndex;
use crate::sharding::{Sharding, Shards};
use crate::{Error, ManagedResource};

mod roles;
mod standby;
mod start;
mod validation;

/// Builds a [`Runtime`].
pub struct RuntimeBuilder {
    /// `None`: made by [`Runtime::offline_builder`], which renders and validates only.
    client: Option<Client>,
    policy: SupervisorPolicy,
    controllers: Vec<Box<dyn Start>>,
    names: crate::names::OperatorNames,
    finalizer: String,
    /// Finalizers of earlier names, treated as the runtime's own and replaced by `finalizer`.
    former_finalizers: Vec<String>,
    field_manager: String,
    reporter: Option<Reporter>,
    /// What the operator is ([`RuntimeBuilder::service`]).
    service: Option<crate::names::ServiceDescriptor>,
    preflight: bool,
    namespace: Option<String>,
    crds: Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>,
    #[cfg(feature = "admin")]
    admin: Option<std::net::SocketAddr>,
    #[cfg(feature = "admin")]
    metrics_addr: Option<std::net::SocketAddr>,
    #[cfg(feature = "admin")]
    introspection: Option<std::net::SocketAddr>,
    adaptive: Option<crate::adaptive::AdaptiveConcurrency>,
    #[cfg(feature = "metrics")]
    registry: Option<crate::metrics::Registry>,
    leader: Option<crate::leader::LeaderElection>,
    /// What [`RuntimeBuilder::run`] sets up before it waits for the Lease.
    early: Option<Early>,
    /// Start with no reconcile slot: watch and cache, run nothing ([`RuntimeHandle::lead`]).
    gated: bool,
    sharding: Option<Sharding>,
}

/// A replica waiting for the Lease: its controllers started and gated, or not yet started.
enum Standby {
    Warm(Box<RuntimeHandle>),
    Cold(Box<RuntimeBuilder>),
}

/// The admin servers: the one of [`RuntimeBuilder::admin`], and the one of
/// [`RuntimeBuilder::metrics_addr`] when metrics are served apart.
#[cfg(feature = "admin")]
#[derive(Default)]
pub(super) struct AdminServers {
    pub(super) main: Option<crate::admin::AdminServer>,
    pub(super) metrics: Option<crate::admin::AdminServer>,
    /// The one of [`RuntimeBuilder::introspection`], and what it serves.
    pub(super) objects: Option<(
        crate::admin::AdminServer,
        Arc<crate::introspect::Introspection>,
    )>,
}

/// What serves the probes and metrics, set up before the controllers start.
struct Early {
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    #[cfg(feature = "admin")]
    admin: AdminServers,
    #[cfg(feature = "metrics")]
    registry: Arc<crate::metrics::Registry>,
}

/// The runtime: every registered controller, under one root supervisor.
pub struct Runtime;

impl Runtime {
    /// Start building a runtime that talks to the cluster through `client`, for the operator
    /// `names`: its finalizer and field manager come from them ([`OperatorNames`]).
    ///
    /// [`OperatorNames`]: crate::names::OperatorNames
    pub fn builder(client: Client, names: crate::names::OperatorNames) -> RuntimeBuilder {
        Self::builder_with(Some(client), names)
    }

    /// A builder without a client, for what needs none: rendering the RBAC the runtime needs
    /// ([`RuntimeBuilder::roles`]) and checking its settings ([`RuntimeBuilder::validate`]),
    /// with no cluster and no Tokio runtime (a `manifests` command, a build script). Starting
    /// it ([`RuntimeBuilder::start`], `run`) is an [`Error::Invalid`] naming
    /// [`Setting::Client`](crate::runtime::Setting::Client).
    ///
    /// ```
    /// use actorcile::prelude::*;
    /// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
    /// # #[kube(group = "example.com", version = "v1", kind = "App", namespaced)]
    /// # struct AppSpec {}
    /// let names = OperatorNames::new("app-operator", "example.com");
    /// let builder = Runtime::offline_builder(names)
    ///     .controller(Controller::<App>::new(step("noop", |_cx| async { Outcome::Done })));
    /// let yaml = builder.roles("app-operator").to_yaml().unwrap();
    /// assert!(yaml.contains("apps"));
    /// ```
    pub fn offline_builder(names: crate::names::OperatorNames) -> RuntimeBuilder {
        Self::builder_with(None, names)
    }

    fn builder_with(client: Option<Client>, names: crate::names::OperatorNames) -> RuntimeBuilder {
        RuntimeBuilder {
            client,
            policy: SupervisorPolicy::default(),
            controllers: Vec::new(),
            finalizer: names.finalizer(),
            // An operator upgraded from another domain owns that domain's finalizer too.
            former_finalizers: names
                .former()
                .map(|d| format!("{d}/finalizer"))
                .into_iter()
                .collect(),
            field_manager: names.field_manager(),
            names,
            reporter: None,
            service: None,
            preflight: false,
            namespace: None,
            crds: Vec::new(),
            #[cfg(feature = "admin")]
            admin: None,
            #[cfg(feature = "admin")]
            metrics_addr: None,
            #[cfg(feature = "admin")]
            introspection: None,
            adaptive: None,
            #[cfg(feature = "metrics")]
            registry: None,
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

    /// The finalizer put on provisioned objects (default: the names'
    /// [`finalizer`](crate::names::OperatorNames::finalizer), `<domain>/finalizer`).
    pub fn finalizer(mut self, name: impl Into<String>) -> Self {
        self.finalizer = name.into();
        self
    }

    /// Treat `finalizer` as the runtime's own on objects that carry it: an operator that used
    /// to put `finalizer` on its objects (another name, or an earlier release's default,
    /// [`LEGACY_FINALIZER`](crate::names::LEGACY_FINALIZER)) keeps them. An object that carries
    /// it is deprovisioned when deleted, and the next write of its finalizer replaces it with the
    /// current one (in place, guarded by a `test` of its index): no object is left with a
    /// finalizer nothing removes, and none is provisioned twice. Call it once per former name.
    ///
    /// ```
    /// use actorcile::names::{LEGACY_FINALIZER, OperatorNames};
    /// use actorcile::runtime::Runtime;
    ///
    /// # fn f(client: kube::Client) {
    /// let builder = Runtime::builder(client, OperatorNames::new("bucket-operator", "buckets.example.com"))
    ///     .migrate_finalizer(LEGACY_FINALIZER);
    /// # let _ = builder;
    /// # }
    /// ```
    pub fn migrate_finalizer(mut self, finalizer: impl Into<String>) -> Self {
        self.former_finalizers.push(finalizer.into());
        self
    }

    /// The operator's names the builder was made with.
    pub fn names(&self) -> &crate::names::OperatorNames {
        &self.names
    }

    /// The field manager for server-side apply and every other write (default: the names'
    /// [`field_manager`](crate::names::OperatorNames::field_manager), the operator's name).
    pub fn field_manager(mut self, name: impl Into<String>) -> Self {
        self.field_manager = name.into();
        self
    }

    /// Say what the operator is: its application, version and revision
    /// ([`ServiceDescriptor`](crate::names::ServiceDescriptor), e.g.
    /// [`service_descriptor!()`](crate::service_descriptor)). The runtime logs it when it
    /// starts and exports it as `actorcile_build_info{application, version, revision}`; and
    /// it publishes Events as the application, unless [`events`](Self::events) names another
    /// reporting controller.
    pub fn service(mut self, service: crate::names::ServiceDescriptor) -> Self {
        if self.reporter.is_none() {
            self.reporter = Some(Reporter {
                controller: service.application.clone(),
                instance: std::env::var("POD_NAME").ok(),
            });
        }
        self.service = Some(service);
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
    #[cfg(feature = "admin")]
    pub fn admin(mut self, addr: std::net::SocketAddr) -> Self {
        self.admin = Some(addr);
        self
    }

    /// Serve `/metrics` on `addr` instead of on the [`admin`](RuntimeBuilder::admin) address,
    /// which then serves the probes only. Bound before any controller starts, like it.
    #[cfg(feature = "admin")]
    pub fn metrics_addr(mut self, addr: std::net::SocketAddr) -> Self {
        self.metrics_addr = Some(addr);
        self
    }

    /// Let the reconcile slots follow `limit`, an [`AdaptiveConcurrency`](crate::adaptive::AdaptiveConcurrency)
    /// that is also a layer of the client (see [`crate::adaptive`]): between its minimum and
    /// the policy's `max_concurrent_reconciles`, up while every slot is in use and the API
    /// server answers promptly, down on 429s and rising latency.
    pub fn adaptive_concurrency(mut self, limit: crate::adaptive::AdaptiveConcurrency) -> Self {
        self.adaptive = Some(limit);
        self
    }

    /// Serve the runtime's introspection on `addr`: what it knows of each object now, as
    /// `GET /objects/<Kind>/<namespace>/<name>` (see [`crate::introspect`]). An address of its
    /// own, apart from the probes; keep it on loopback (`127.0.0.1:8081`) and read it with
    /// `kubectl port-forward` and `actorcile why`. With it on, each reconcile also times its
    /// steps and the runtime keeps each object's last reconcile (a few hundred bytes per
    /// object). Bound before any controller starts.
    ///
    /// ```no_run
    /// # async fn f(client: kube::Client) -> Result<(), actorcile::Error> {
    /// use actorcile::prelude::*;
    /// let names = actorcile::names::OperatorNames::new("bucket-operator", "buckets.example.com");
    /// let builder = Runtime::builder(client, names)
    ///     .admin("0.0.0.0:8080".parse().unwrap())
    ///     .introspection("127.0.0.1:8081".parse().unwrap());
    /// # let _ = builder;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "admin")]
    pub fn introspection(mut self, addr: std::net::SocketAddr) -> Self {
        self.introspection = Some(addr);
        self
    }

    /// The Prometheus registry the runtime adds its metrics to and `/metrics` serves (default:
    /// an empty one). Register the operator's own metrics in it first. See [`crate::metrics`]
    /// for the runtime's metric names.
    #[cfg(feature = "metrics")]
    pub fn metrics_registry(mut self, registry: crate::metrics::Registry) -> Self {
        self.registry = Some(registry);
        self
    }

    /// Elect a leader among the operator's replicas on a Lease ([`crate::leader`]):
    /// [`RuntimeBuilder::run`] and [`RuntimeBuilder::run_until`] honour it (they wait for the
    /// Lease, standing by, before they start the controllers); [`RuntimeBuilder::start`]
    /// refuses a builder that has it. The policy's
    /// `lease_duration`, `lease_renew_deadline` and `lease_retry_period` set the timings.
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
    /// `lease_retry_period` set the timings. What `sharding` does not set (the Lease prefix,
    /// the labels' domain) comes from the runtime's names ([`Sharding::named`]).
    pub fn sharding(mut self, sharding: Sharding) -> Self {
        self.sharding = Some(sharding.named(&self.names));
        self
    }

    /// Check at start-up (with SelfSubjectAccessReviews) that the running identity has every
    /// permission of [`RuntimeBuilder::roles`], each where they grant it; `start` fails with [`Error::Forbidden`]
    /// naming what is missing instead of failing later, object by object.
    pub fn preflight_rbac(mut self, check: bool) -> Self {
        self.preflight = check;
        self
    }
}
