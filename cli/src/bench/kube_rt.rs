//! The kube-runtime side: the workload's reconcile logic under kube-runtime's `Controller`.

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use kube::{
    Api, Client,
    runtime::{
        Controller,
        controller::{self, Action},
        watcher,
    },
};
use tokio::{sync::oneshot, task::JoinHandle};

use super::workload::{BenchObject, Recorder, StatusWriter, Step, WorkloadError};

/// Delay before retrying a reconcile that failed.
pub const ERROR_REQUEUE: Duration = Duration::from_millis(100);

struct Ctx {
    recorder: Arc<Recorder>,
    client: Client,
}

/// A running kube-runtime `Controller`.
pub struct KubeRuntimeRun {
    shutdown: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

/// Starts a `Controller` over the bench objects of `namespace` with at most `concurrency`
/// reconciles in flight.
pub fn start(
    client: Client,
    namespace: &str,
    concurrency: u16,
    recorder: Arc<Recorder>,
) -> KubeRuntimeRun {
    let api: Api<BenchObject> = Api::namespaced(client.clone(), namespace);
    let (shutdown, stop) = oneshot::channel::<()>();
    let ctx = Arc::new(Ctx { recorder, client });
    let controller = Controller::new(api, watcher::Config::default())
        .with_config(controller::Config::default().concurrency(concurrency))
        .graceful_shutdown_on(async move {
            let _ = stop.await;
        });
    let task = tokio::spawn(async move {
        controller
            .run(reconcile, error_policy, ctx)
            .for_each(|result| async move {
                if let Err(err) = result {
                    tracing::debug!(error = %err, "kube-runtime reconcile error");
                }
            })
            .await;
    });
    KubeRuntimeRun { shutdown, task }
}

impl KubeRuntimeRun {
    /// Stops the controller (in-flight reconciles finish; gives up after `grace`).
    pub async fn stop(self, grace: Duration) {
        let _ = self.shutdown.send(());
        let abort = self.task.abort_handle();
        if tokio::time::timeout(grace, self.task).await.is_err() {
            abort.abort();
        }
    }
}

async fn reconcile(obj: Arc<BenchObject>, ctx: Arc<Ctx>) -> Result<Action, WorkloadError> {
    Ok(
        match ctx
            .recorder
            .reconcile(&obj, &ctx.client, StatusWriter::Reconcile)
            .await?
        {
            Step::Done => Action::await_change(),
            Step::YieldAfter(after) => Action::requeue(after),
        },
    )
}

fn error_policy(_obj: Arc<BenchObject>, err: &WorkloadError, _ctx: Arc<Ctx>) -> Action {
    tracing::debug!(error = %err, "reconcile failed; retrying");
    Action::requeue(ERROR_REQUEUE)
}
