//! The actorcile side: the workload's reconcile logic as a one-step provisioner tree under
//! actorcile's [`Runtime`].
//!
//! By default the runtime does the same API work as the kube-runtime side: no finalizer, and the
//! status (phase, `Ready` condition, observedGeneration) written only in the `status` workload
//! (where the kube-runtime reconcile writes the same status). `--actorcile-defaults` measures it
//! as an operator runs it by default: finalizer on every object, status in every workload.
//!
//! `chain` writes status too (the kube-runtime reconcile writes the same), and each object's reconcile
//! first asks `cx.require_ready(dependency)`: while the dependency is not Ready the reconcile ends
//! `Waiting` and the object's actor is woken by a message when the dependency's actor records
//! it Ready (no polling).
//!
//! `operator` runs actorcile as an operator runs it: the runtime's finalizer and status on, and
//! the child ConfigMap as a [`resource`] step (server-side apply with an owner reference;
//! deprovision deletes it and waits until it is gone), wrapped in a step that counts the runs.

use std::{sync::Arc, time::Duration};

use actorcile::prelude::*;
use anyhow::{Context as _, Result};
use kube::Client;

use super::{
    args::Workload,
    workload::{
        BenchObject, Recorder, StatusWriter, Step, dependency_target, operator_child,
        waiting_outcome,
    },
};

/// The benchmarked operator's field manager, of its names ([`names`]).
pub const FIELD_MANAGER: &str = "bench-actorcile";
/// The benchmarked operator's finalizer, of its names ([`names`]).
pub const FINALIZER: &str = "bench.actorcile.dev/finalizer";

/// The benchmarked operator's names.
pub fn names() -> OperatorNames {
    OperatorNames::new(FIELD_MANAGER, "bench.actorcile.dev")
}

/// Which of its own writes the runtime makes.
#[derive(Clone, Copy, Debug)]
pub struct Writes {
    /// Add the runtime finalizer.
    pub finalizer: bool,
    /// Write the actorcile status.
    pub status: bool,
}

/// `operator`: the child ConfigMap as a [`resource`] step, each provision and deprovision reconcile
/// counted as one run.
fn operator_tree(recorder: Arc<Recorder>) -> impl Provisioner<BenchObject> {
    let child = Arc::new(resource("config", operator_child));
    let (provision_child, provision_recorder) = (child.clone(), recorder.clone());
    step("operator", move |cx: Context<BenchObject>| {
        let (child, recorder) = (provision_child.clone(), provision_recorder.clone());
        async move {
            recorder.count_run(cx.object());
            child.provision(&cx).await
        }
    })
    .on_delete(move |cx: Context<BenchObject>| {
        let (child, recorder) = (child.clone(), recorder.clone());
        async move {
            recorder.count_run(cx.object());
            child.deprovision(&cx).await
        }
    })
}

/// A running actorcile runtime.
pub struct ActorcileRun {
    handle: RuntimeHandle,
}

/// Starts actorcile over the bench objects of `namespace` with at most `concurrency` provisioner
/// runs in flight; `streaming_lists`: see [`Controller::streaming_lists`].
pub async fn start(
    client: Client,
    namespace: &str,
    concurrency: u16,
    recorder: Arc<Recorder>,
    writes: Writes,
    streaming_lists: bool,
) -> Result<ActorcileRun> {
    let controller = if recorder.workload() == Workload::Operator {
        Controller::<BenchObject>::new(operator_tree(recorder))
    } else {
        Controller::<BenchObject>::new(bench_tree(recorder))
    };
    let policy = SupervisorPolicy {
        runtime: actorcile::policy::RuntimePolicy {
            max_concurrent_reconciles: usize::from(concurrency),
            ..Default::default()
        },
        ..Default::default()
    };
    let mut controller = controller
        .namespace(namespace)
        .streaming_lists(streaming_lists);
    if !writes.finalizer {
        controller = controller.without_finalizer();
    }
    if !writes.status {
        controller = controller.without_status();
    }
    let handle = Runtime::builder(client, names())
        .policy(policy)
        .controller(controller)
        .start()
        .await
        .context("starting the actorcile runtime")?;
    Ok(ActorcileRun { handle })
}

/// Every workload but `operator`: one step that calls the shared reconcile logic.
fn bench_tree(recorder: Arc<Recorder>) -> impl Provisioner<BenchObject> {
    step("bench", move |cx: Context<BenchObject>| {
        let recorder = recorder.clone();
        async move {
            let obj = cx.object();
            let (result, wait) = if recorder.workload() == Workload::Chain {
                let target = dependency_target(obj);
                let wait = match &target {
                    Some(target) => cx.require_ready(target).await,
                    None => None,
                };
                let result = recorder
                    .reconcile_chain(obj, cx.client(), StatusWriter::Runtime, wait.is_none())
                    .await;
                (result, wait)
            } else {
                let result = recorder
                    .reconcile(obj, cx.client(), StatusWriter::Runtime)
                    .await;
                (result, None)
            };
            match result {
                Ok(Step::Done) => Outcome::Done,
                Ok(Step::WaitForDependency) => match (wait, dependency_target(obj)) {
                    // As `require_ready` returned it (it registered the wake-up).
                    (Some(wait), _) => wait,
                    // Not reached: only a chain object whose dependency is not Ready waits.
                    (None, Some(target)) => waiting_outcome(target),
                    (None, None) => Outcome::Done,
                },
                Ok(Step::YieldAfter(after)) => {
                    Outcome::yield_after(after, Reason::new("BenchYield", "the workload yields"))
                }
                Err(err) => Outcome::failed(
                    Reason::new("BenchFailed", "the bench reconcile failed"),
                    err,
                ),
            }
        }
    })
}

impl ActorcileRun {
    /// Waits (at most `limit`) until every object's actor has passivated: no more live actors
    /// than the idle ones kept for the next activations (one per reconcile slot, `concurrency`).
    pub async fn wait_passive(&self, concurrency: u16, limit: Duration) {
        let _ = tokio::time::timeout(limit, async {
            while self.handle.metrics().live_actors > u64::from(concurrency) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
    }

    /// Shuts the runtime down (in-flight runs finish within the policy's shutdown timeout; gives
    /// up after `grace`).
    pub async fn stop(self, grace: Duration) {
        if tokio::time::timeout(grace, self.handle.shutdown())
            .await
            .is_err()
        {
            tracing::warn!("actorcile runtime did not shut down within {grace:?}");
        }
    }
}
