//! [`RuntimeHandle`]: a running runtime, observed and shut down.

use std::sync::Arc;

use ractor::ActorCell;
use ractor::ActorRef;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;

#[cfg(feature = "admin")]
use super::builder::AdminServers;
use crate::Error;
use crate::actors::{ManagerFailure, Started};
use crate::counters::{KindMetricsSnapshot, Metrics, MetricsSnapshot};
use crate::health::Health;
use crate::references::ReferenceIndex;

/// A running runtime.
pub struct RuntimeHandle {
    pub(super) holder: Arc<str>,
    pub(super) started: Vec<Started>,
    /// The reconcile slots; closed at shutdown, so no new reconcile or activation starts.
    pub(super) slots: Arc<Semaphore>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) escalated: watch::Receiver<Option<ManagerFailure>>,
    pub(super) references: Arc<ReferenceIndex>,
    pub(super) root: ActorRef<()>,
    pub(super) root_task: JoinHandle<()>,
    pub(super) shutdown_timeout: std::time::Duration,
    pub(super) health: Arc<Health>,
    /// With sharding: stops the shard keeper, which hands itself back to release the shards.
    pub(super) keeper: Option<(
        watch::Sender<bool>,
        JoinHandle<crate::sharding::keeper::Keeper>,
    )>,
    #[cfg(feature = "admin")]
    pub(super) admin: AdminServers,
    #[cfg(feature = "metrics")]
    pub(super) registry: Arc<crate::metrics::Registry>,
    /// The tasks of [`RuntimeHandle::reconcile_on`], stopped with the runtime.
    pub(super) external: Vec<JoinHandle<()>>,
}

/// Stops a runtime at once, from outside its shutdown ([`RuntimeBuilder::run`](super::RuntimeBuilder::run) on a second
/// signal).
pub(super) struct Aborter {
    managers: Vec<ActorCell>,
    tasks: Vec<tokio::task::AbortHandle>,
    root: ActorCell,
}

impl Aborter {
    pub(super) fn abort(self) {
        for t in &self.tasks {
            t.abort();
        }
        for m in &self.managers {
            for child in m.get_children() {
                child.kill();
            }
            m.kill();
        }
        self.root.kill();
    }
}

impl RuntimeHandle {
    pub(super) fn aborter(&self) -> Aborter {
        Aborter {
            managers: self.started.iter().map(|s| s.manager.clone()).collect(),
            tasks: self
                .started
                .iter()
                .flat_map(|s| s.tasks.iter().map(|t| t.abort_handle()))
                .chain(self.keeper.iter().map(|(_, k)| k.abort_handle()))
                .chain(self.external.iter().map(|t| t.abort_handle()))
                .collect(),
            root: self.root.get_cell(),
        }
    }

    /// Give a gated runtime (a warm standby) its `slots` reconcile slots: it starts running.
    pub(super) fn lead(&self, slots: usize) {
        self.slots.add_permits(slots);
    }

    /// With [sharding](super::RuntimeBuilder::sharding), the shards this replica holds now (runs the
    /// objects of), in order; without, empty.
    pub fn shards_held(&self) -> Vec<u32> {
        self.health.shards_held()
    }

    /// What the health probes answer ([`crate::health`]).
    pub fn health(&self) -> Arc<Health> {
        self.health.clone()
    }

    /// The address the admin server listens on (with [`RuntimeBuilder::admin`](super::RuntimeBuilder::admin)).
    #[cfg(feature = "admin")]
    pub fn admin_addr(&self) -> Option<std::net::SocketAddr> {
        self.admin.main.as_ref().map(|a| a.local_addr())
    }

    /// The address the introspection is served on (with
    /// [`RuntimeBuilder::introspection`](super::RuntimeBuilder::introspection)).
    #[cfg(feature = "admin")]
    pub fn introspection_addr(&self) -> Option<std::net::SocketAddr> {
        self.admin.objects.as_ref().map(|(a, _)| a.local_addr())
    }

    /// What the runtime knows of one object now (with
    /// [`RuntimeBuilder::introspection`](super::RuntimeBuilder::introspection); `None` without
    /// it, or when the runtime does not have the object): what the introspection address serves.
    #[cfg(feature = "admin")]
    pub fn introspect(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<crate::introspect::ObjectReport> {
        let (_, introspection) = self.admin.objects.as_ref()?;
        introspection.object(kind, namespace, name)
    }

    /// The address metrics are served on apart (with [`RuntimeBuilder::metrics_addr`](super::RuntimeBuilder::metrics_addr)).
    #[cfg(feature = "admin")]
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.admin.metrics.as_ref().map(|a| a.local_addr())
    }

    /// The Prometheus registry with the runtime's metrics (and the operator's own, given
    /// with [`RuntimeBuilder::metrics_registry`](super::RuntimeBuilder::metrics_registry)), e.g. to serve it elsewhere.
    #[cfg(feature = "metrics")]
    pub fn metrics_registry(&self) -> Arc<crate::metrics::Registry> {
        self.registry.clone()
    }

    /// This runtime's holder id: the holder its guarded steps' locks name
    /// ([`Context::guard`](crate::provisioners::Context::guard)). Unique per runtime.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Runtime-wide counters.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.metrics.snapshot()
    }

    /// Each controller's own figures: reconciles by result, reconcile durations, the wait from due to
    /// start, objects cached, Events.
    pub fn kind_metrics(&self) -> Vec<KindMetricsSnapshot> {
        self.metrics.kinds()
    }

    /// The kinds this runtime does not manage whose objects it watches now, as
    /// (apiVersion, kind): each started by a provisioner waiting on one of its objects
    /// ([`Context::require_ready`](crate::provisioners::Context::require_ready)) and stopped
    /// once nobody waited on it for the policy's `dependency_watch_idle`.
    pub fn dependency_watches(&self) -> Vec<(String, String)> {
        self.references.watched_external_kinds()
    }

    /// Resolves when a manager escalates (restart intensity exceeded with `escalate`).
    pub async fn escalated(&mut self) -> Error {
        loop {
            let failure = self.escalated.borrow().clone();
            if let Some(failure) = failure {
                self.health.set_failed();
                return match failure {
                    ManagerFailure::Escalated(e) => Error::Escalated(e),
                    ManagerFailure::Other(e) => Error::ManagerFailed(e),
                };
            }
            if self.escalated.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Run the reconcile of `target` as a change of the object would (kube-runtime's
    /// `reconcile_on`): for a trigger from outside Kubernetes, a cloud's webhook or a queue.
    /// A reconcile in flight runs again once it ends; an object that does not exist, or that
    /// another replica's shard holds, is not run. Returns whether `target`'s kind is one of
    /// this runtime's controllers (`false`: nothing is run).
    ///
    /// ```
    /// # use actorcile::prelude::*;
    /// # fn f(handle: &RuntimeHandle) {
    /// let db = Target::new("example.com/v1", "Database", Some("team-a"), "orders");
    /// assert!(handle.reconcile(&db), "Database is managed here");
    /// # }
    /// ```
    #[must_use = "false: the kind is not one of this runtime's controllers"]
    pub fn reconcile(&self, target: &crate::references::Target) -> bool {
        self.references.wake(
            target,
            crate::messages::Cause::of(crate::messages::Trigger::External),
        )
    }

    /// Run the reconcile of every target `triggers` yields, as [`reconcile`](Self::reconcile)
    /// does, until the stream ends or the runtime shuts down. A target of a kind this runtime
    /// does not manage is logged and skipped.
    ///
    /// ```
    /// # use actorcile::prelude::*;
    /// # fn f(handle: &mut RuntimeHandle) {
    /// // e.g. the names a cloud's webhook receiver puts on a channel
    /// let (tx, rx) = futures::channel::mpsc::channel::<Target>(64);
    /// handle.reconcile_on(rx);
    /// # drop(tx);
    /// # }
    /// ```
    pub fn reconcile_on<S>(&mut self, triggers: S)
    where
        S: futures::Stream<Item = crate::references::Target> + Send + 'static,
    {
        use futures::StreamExt;
        let references = self.references.clone();
        self.external.retain(|t| !t.is_finished());
        self.external.push(tokio::spawn(async move {
            let mut triggers = std::pin::pin!(triggers);
            while let Some(target) = triggers.next().await {
                if !references.wake(
                    &target,
                    crate::messages::Cause::of(crate::messages::Trigger::External),
                ) {
                    tracing::warn!(
                        target = %format_args!("{} {}", target.api_version, target.kind),
                        name = %target.name,
                        "a reconcile was asked of a kind this runtime does not manage"
                    );
                }
            }
        }));
    }

    /// Stop watching, start no new runs, let in-flight runs finish within the policy's shutdown
    /// timeout (then abort them), stop every actor, and release the controllers (their
    /// provisioner trees are dropped once nothing of the runtime runs any more).
    pub async fn shutdown(self) {
        self.health.set_stopping();
        for t in &self.external {
            t.abort();
        }
        for s in &self.started {
            for task in &s.tasks {
                task.abort();
            }
        }
        self.slots.close();
        for s in &self.started {
            s.manager
                .stop_children_and_wait(Some("shutdown".into()), Some(self.shutdown_timeout))
                .await;
            // Past the timeout (or started while the others stopped): killed, mid-run or not.
            let left = s.manager.get_children();
            if !left.is_empty() {
                tracing::warn!(
                    kind = %s.kind,
                    actors = left.len(),
                    "resource actors had not stopped when shutdown ended their wait; killing them"
                );
            }
            for child in left {
                child.kill();
            }
            let _ = s.manager.stop_and_wait(Some("shutdown".into()), None).await;
        }
        // No reconcile runs any more: give the shards up, so the other replicas take them at once.
        if let Some((stop, keeper)) = self.keeper {
            let _ = stop.send(true);
            if let Ok(keeper) = keeper.await {
                keeper.release_all().await;
            }
        }
        let _ = self.root.stop_and_wait(None, None).await;
        let _ = self.root_task.await;
        self.references.unregister_kinds();
    }
}
