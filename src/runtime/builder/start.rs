//! Start-up ([`RuntimeBuilder::start`]): the probes and metrics first, then the controllers under one root supervisor.

use super::*;

impl RuntimeBuilder {
    /// The health state, the metrics and the admin server (bound now: a bind failure is a
    /// start-up error).
    pub(super) async fn prepare(&mut self) -> Result<Early, Error> {
        if let Some(service) = &self.service {
            tracing::info!(
                application = %service.application,
                version = %service.version,
                revision = %service.revision,
                actorcile = env!("CARGO_PKG_VERSION"),
                "starting {service}"
            );
        }
        let health = Arc::new(Health::default());
        let metrics = Arc::new(Metrics::default());
        #[cfg(feature = "metrics")]
        let registry = {
            let mut registry = self.registry.take().unwrap_or_default();
            registry.register_collector(Box::new(crate::metrics::ProcessCollector::new()));
            registry.register_collector(Box::new(crate::metrics::RuntimeCollector {
                metrics: metrics.clone(),
                health: health.clone(),
                max_concurrent_reconciles: self.policy.runtime.max_concurrent_reconciles as u64,
                adaptive: self.adaptive.clone(),
                service: self.service.clone().unwrap_or_else(|| {
                    crate::names::ServiceDescriptor::new(self.names.name(), "unknown", "unknown")
                }),
            }));
            Arc::new(registry)
        };
        #[cfg(feature = "admin")]
        let admin = {
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
            AdminServers {
                main: match self.admin {
                    Some(addr) => Some(bind(addr, main_endpoints).await?),
                    None => None,
                },
                metrics: match self.metrics_addr {
                    Some(addr) => Some(bind(addr, Endpoints::Metrics).await?),
                    None => None,
                },
                objects: match self.introspection {
                    Some(addr) => {
                        let introspection = crate::introspect::Introspection::new();
                        let server = AdminServer::bind_introspection(
                            addr,
                            introspection.clone(),
                            AdminLimits::default(),
                        )
                        .await?;
                        Some((server, introspection))
                    }
                    None => None,
                },
            }
        };
        Ok(Early {
            health,
            metrics,
            #[cfg(feature = "admin")]
            admin,
            #[cfg(feature = "metrics")]
            registry,
        })
    }

    /// The client, or why there is none ([`Runtime::offline_builder`]).
    pub(super) fn client(&self) -> Result<Client, Error> {
        self.client.clone().ok_or_else(|| Error::Invalid {
            field: crate::runtime::Setting::Client,
            problem: "the builder was made without a client (Runtime::offline_builder): it renders roles and validates, it does not start".into(),
        })
    }

    /// Start every controller; returns a handle to observe and stop the runtime. Fails
    /// without starting anything when [`RuntimeBuilder::validate`] does.
    pub async fn start(mut self) -> Result<RuntimeHandle, Error> {
        self.validate()?;
        let client = self.client()?;
        if self.leader.is_some() {
            return Err(Error::Invalid {
                field: crate::runtime::Setting::LeaderElection { option: "" },
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
            let missing = crate::rbac::missing_step_permissions(&client, &own, &steps).await?;
            if !missing.is_empty() {
                return Err(Error::Forbidden(missing));
            }
        }
        let Early {
            health,
            metrics,
            #[cfg(feature = "admin")]
            admin,
            #[cfg(feature = "metrics")]
            registry,
        } = match self.early.take() {
            Some(early) => early,
            None => self.prepare().await?,
        };
        if !self.crds.is_empty() {
            crate::crds::install(
                client.clone(),
                &self.crds,
                &self.field_manager,
                std::time::Duration::from_secs(60),
            )
            .await
            .map_err(|e| Error::Invalid {
                field: crate::runtime::Setting::Crds,
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
            Arc::new(self.names.keys()),
            client.clone(),
            self.policy.runtime.dependency_watch_idle,
        );
        let _ = metrics.reference_index.set(Arc::downgrade(&references));
        let shards = self.sharding.as_ref().map(|s| {
            let shards = Arc::new(Shards::new(s.shards));
            let clients: ShardClients = crate::sharding::fenced_clients(&client, &shards).into();
            health.set_shards(shards.clone());
            (shards, clients, Arc::new(s.clone()))
        });
        let cx = StartCx {
            client,
            // Gated (a warm standby): no slot, so no reconcile and no activation, until it leads.
            slots: Arc::new(Semaphore::new(if self.gated {
                0
            } else {
                self.policy.runtime.max_concurrent_reconciles
            })),
            policy: self.policy.clone(),
            metrics: metrics.clone(),
            references,
            finalizer: self.finalizer,
            former_finalizers: self.former_finalizers.into(),
            field_manager: self.field_manager,
            reporter: self.reporter,
            root: root.get_cell(),
            holder: Arc::from(new_holder_id().as_str()),
            health: health.clone(),
            shards,
            #[cfg(feature = "admin")]
            introspection: admin.objects.as_ref().map(|(_, i)| i.clone()),
            #[cfg(not(feature = "admin"))]
            introspection: None,
        };
        if let Some(limit) = &self.adaptive {
            limit.attach(
                cx.slots.clone(),
                self.policy.runtime.max_concurrent_reconciles,
            );
        }
        let mut handle = RuntimeHandle {
            holder: cx.holder.clone(),
            started: Vec::new(),
            slots: cx.slots.clone(),
            metrics,
            escalated,
            references: cx.references.clone(),
            root,
            root_task,
            shutdown_timeout: self.policy.runtime.shutdown_timeout,
            health: health.clone(),
            keeper: None,
            #[cfg(feature = "admin")]
            admin,
            #[cfg(feature = "metrics")]
            registry,
            external: Vec::new(),
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
}
