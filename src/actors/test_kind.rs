//! What the actors' own tests drive: one kind started through its seam
//! ([`KindSpec::start`](super::Start::start)) on the in-process API server, without a
//! `RuntimeBuilder`, and a log of its reconciles.

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, CustomResource, CustomResourceExt, ResourceExt};
use ractor::{Actor, ActorRef};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::sync::{Semaphore, watch};

pub(crate) use crate::testing::ReconcileLog;

use super::{KindSpec, Metrics, Root, Start, StartCx, Started};
use crate::cluster::ApiServer;
use crate::counters::MetricsSnapshot;
use crate::health::Health;
use crate::policy::SupervisorPolicy;
use crate::provisioners::Provisioner;
use crate::references::ReferenceIndex;
use crate::status::ResourceStatus;

/// The kind the actors' tests manage.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "test.actorcile.dev",
    version = "v1",
    kind = "Widget",
    namespaced,
    status = "ResourceStatus"
)]
pub(crate) struct WidgetSpec {
    #[serde(default)]
    pub note: String,
}

/// How long a test waits for what must happen (virtual time: the clock is paused).
pub(crate) const LIMIT: Duration = Duration::from_secs(120);

pub(crate) use crate::testing::deterministic_policy as test_policy;

/// One kind, started on its own in-process API server.
pub(crate) struct Kind {
    pub(crate) client: Client,
    metrics: Arc<Metrics>,
    started: Started,
    root: ActorRef<()>,
    references: Arc<ReferenceIndex>,
    _server: ApiServer,
}

/// Starts the `Widget` kind with `tree` under `policy`, as the runtime starts each kind.
pub(crate) async fn start_kind(
    tree: impl Provisioner<Widget> + 'static,
    policy: SupervisorPolicy,
) -> Kind {
    start_spec(KindSpec::new(Arc::new(tree)), policy).await
}

/// Starts the `Widget` kind as `spec` says, under `policy`.
pub(crate) async fn start_spec(spec: KindSpec<Widget>, policy: SupervisorPolicy) -> Kind {
    let server = ApiServer::new();
    server.install_crd(&Widget::crd()).expect("install the CRD");
    let client = server.client();
    let (tx, _) = watch::channel(None);
    let (root, _) = Actor::spawn(None, Root, tx).await.expect("spawn the root");
    let metrics = Arc::new(Metrics::default());
    let references = ReferenceIndex::for_runtime(
        crate::names::STANDALONE_FIELD_MANAGER,
        Arc::new(crate::names::Keys::standalone()),
        client.clone(),
        policy.runtime.dependency_watch_idle,
    );
    let cx = StartCx {
        client: client.clone(),
        slots: Arc::new(Semaphore::new(policy.runtime.max_concurrent_reconciles)),
        policy,
        metrics: metrics.clone(),
        references: references.clone(),
        finalizer: "test.actorcile.dev/finalizer".into(),
        former_finalizers: Arc::from([]),
        field_manager: crate::names::STANDALONE_FIELD_MANAGER.into(),
        reporter: None,
        root: root.get_cell(),
        holder: Arc::from("test"),
        health: Arc::new(Health::default()),
        shards: None,
        introspection: None,
    };
    let started = Box::new(spec).start(&cx).await.expect("start the kind");
    Kind {
        client,
        metrics,
        started,
        root,
        references,
        _server: server,
    }
}

impl Kind {
    fn api(&self) -> Api<Widget> {
        Api::namespaced(self.client.clone(), "default")
    }

    /// How many of the kind's cached objects are held encoded.
    pub(crate) fn encoded(&self) -> usize {
        (self.started.encoded)()
    }

    /// The kind's reconciles cut because their object moved on.
    pub(crate) fn cancelled(&self) -> u64 {
        self.metrics
            .kinds()
            .iter()
            .map(|k| k.reconciles_with(crate::counters::ReconcileResult::Cancelled))
            .sum()
    }

    /// The kind's reconciles by why they ran, those that ran at all.
    pub(crate) fn triggers(&self) -> Vec<(crate::triggers::Trigger, u64)> {
        let kinds = self.metrics.kinds();
        kinds[0]
            .triggers
            .iter()
            .copied()
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// Asks for a reconcile of `name` from outside, as
    /// [`RuntimeHandle::reconcile`](crate::runtime::RuntimeHandle::reconcile) does.
    pub(crate) fn reconcile(&self, name: &str) {
        let target = crate::references::Target::new(
            "test.actorcile.dev/v1",
            "Widget",
            Some("default"),
            name,
        );
        let cause = crate::triggers::Cause::of(crate::triggers::Trigger::External);
        assert!(self.references.wake(&target, cause), "Widget is managed");
    }

    /// Sets a label on `name` (a change without a new generation).
    pub(crate) async fn label(&self, name: &str, value: &str) {
        let patch = serde_json::json!({ "metadata": { "labels": { "test": value } } });
        self.api()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("patch");
    }

    /// The runtime-wide counters.
    pub(crate) fn metrics(&self) -> MetricsSnapshot {
        self.metrics.snapshot()
    }

    pub(crate) async fn create(&self, name: &str) {
        let w = Widget::new(name, WidgetSpec::default());
        self.api()
            .create(&PostParams::default(), &w)
            .await
            .expect("create");
    }

    /// A new generation of `name`.
    pub(crate) async fn set_note(&self, name: &str, note: &str) {
        let patch = serde_json::json!({ "spec": { "note": note } });
        self.api()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("patch");
    }

    pub(crate) async fn delete(&self, name: &str) {
        self.api()
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete");
    }

    /// Waits until `name`'s Ready condition has `reason`; its status then.
    pub(crate) async fn wait_reason(&self, name: &str, reason: &str) -> ResourceStatus {
        crate::testing::wait_reason(&self.api(), name, reason, LIMIT).await
    }

    pub(crate) async fn wait_ready(&self, name: &str) {
        crate::testing::wait_ready(&self.api(), name, LIMIT).await;
    }

    /// Waits until `name` is gone (its finalizer removed).
    pub(crate) async fn wait_gone(&self, name: &str) {
        crate::testing::wait_gone(&self.api(), name, LIMIT).await;
    }

    /// Stops the kind as the runtime's shutdown does.
    pub(crate) async fn stop(self) {
        for task in &self.started.tasks {
            task.abort();
        }
        let manager = &self.started.manager;
        manager.stop_children_and_wait(None, None).await;
        let _ = manager.stop_and_wait(None, None).await;
        let _ = self.root.stop_and_wait(None, None).await;
        self.references.unregister_kinds();
    }
}

/// A tree that logs every reconcile in `log` and is done.
pub(crate) fn logging(log: ReconcileLog) -> impl Provisioner<Widget> {
    use crate::provisioners::{Context, Outcome, step};
    step("log", move |cx: Context<Widget>| {
        let log = log.clone();
        async move {
            let _reconcile = log.record(&cx.object().name_any());
            Outcome::Done
        }
    })
}
