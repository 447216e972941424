//! The floor: no runtime, only actorcile's requests for the workload, sent by a plain loop over
//! one watch of the bench objects. A runtime's time minus the floor's is what the runtime adds
//! to the time the API server needs for the same requests; where the API server sets the pace,
//! kube-runtime's time ÷ the floor's is about the most a runtime sending them can gain over
//! kube-runtime.
//!
//! - `status`: an object seen without its Ready status gets one status write (the merge patch
//!   of the other runtimes);
//! - `operator`: an object seen without the finalizer gets three requests, one after the other:
//!   the finalizer, the child (server-side apply, [`operator_child`]) and the Ready status; an
//!   object seen deleted with the finalizer gets two: delete the child, then remove the
//!   finalizer. These are the requests actorcile makes, sent as it sends them (see [`send`]).
//!
//! Nothing is queued, deduplicated or re-run: the loop recognises the echo of its own writes
//! from the object and skips it, and retries a request only when it failed in passing (a
//! connection, a 5xx). Its list and watch are the runtimes' (paginated list, then one watch),
//! and at most `concurrency` objects have requests in flight.

use std::sync::Arc;

use anyhow::{Result, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;
use tokio::task::JoinHandle;

use super::{
    args::Workload,
    kube_rt::OPERATOR_FINALIZER,
    workload::{BenchObject, Recorder, operator_child, ready_status, status_is_current},
};
use crate::retry::idempotent;

/// The field manager of the floor's server-side apply.
const FIELD_MANAGER: &str = "bench-floor";

/// The running loop.
pub struct FloorRun {
    task: JoinHandle<()>,
}

impl FloorRun {
    /// Stops the loop (requests in flight are dropped).
    pub fn stop(self) {
        self.task.abort();
    }
}

/// What the floor does with one version of an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    /// `status`: write the Ready status.
    WriteStatus,
    /// `operator`: finalizer, child, Ready status.
    Provision,
    /// `operator`: delete the child, remove the finalizer.
    Deprovision,
    /// The echo of the floor's own write, or nothing to do.
    Skip,
}

/// What `obj` (as the watch delivered it) needs in `workload`.
fn action(workload: Workload, obj: &BenchObject) -> Action {
    let finalized = obj.finalizers().iter().any(|f| f == OPERATOR_FINALIZER);
    let deleting = obj.metadata.deletion_timestamp.is_some();
    match workload {
        Workload::Status if !status_is_current(obj) => Action::WriteStatus,
        Workload::Operator if deleting && finalized => Action::Deprovision,
        Workload::Operator if !deleting && !finalized => Action::Provision,
        _ => Action::Skip,
    }
}

/// Starts the loop over the bench objects of `namespace` (`status` and `operator` only).
pub fn start(
    client: Client,
    namespace: &str,
    concurrency: u16,
    recorder: Arc<Recorder>,
) -> Result<FloorRun> {
    let workload = recorder.workload();
    if !matches!(workload, Workload::Status | Workload::Operator) {
        bail!("the floor sends the requests of the operator and status workloads, not {workload}");
    }
    let api: Api<BenchObject> = Api::namespaced(client.clone(), namespace);
    let task = tokio::spawn(async move {
        watcher(api.clone(), watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .filter_map(|event| async move {
                event
                    .map_err(|err| tracing::debug!(error = %err, "floor watch error"))
                    .ok()
            })
            .for_each_concurrent(usize::from(concurrency), |obj| {
                let (api, client, recorder) = (api.clone(), client.clone(), recorder.clone());
                let action = action(workload, &obj);
                // Each object's requests in a task of their own, as a runtime runs each object
                // (the in-process cluster serves a request in the task that sends it, so one
                // task for all would serve every request on one thread).
                let sent = (action != Action::Skip).then(|| {
                    tokio::spawn(async move {
                        recorder.count_run(&obj);
                        if let Err(err) = send(action, &obj, &api, &client).await {
                            tracing::warn!(error = format!("{err:#}"), "floor request failed");
                        }
                    })
                });
                async move {
                    if let Some(sent) = sent {
                        let _ = sent.await;
                    }
                }
            })
            .await;
    });
    Ok(FloorRun { task })
}

/// Sends the requests of `action` for `obj`, as actorcile sends them: the finalizer added by a
/// JSON patch guarded by the resourceVersion seen, the status with that of the finalizer's write
/// as a precondition, the finalizer removed by a JSON patch guarded by a test of its index.
async fn send(
    action: Action,
    obj: &BenchObject,
    api: &Api<BenchObject>,
    client: &Client,
) -> Result<()> {
    let name = obj.name_any();
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    let configmaps: Api<ConfigMap> =
        Api::namespaced(client.clone(), &obj.namespace().unwrap_or_default());
    let write_status = |version: Option<String>| {
        let (api, name, params) = (api, &name, &params);
        async move {
            let mut patch = ready_status(obj).patch();
            patch["metadata"] = json!({ "resourceVersion": version });
            idempotent("writing the status", None, || async {
                api.patch_status(name, params, &Patch::Merge(&patch))
                    .await
                    .map(drop)
            })
            .await
        }
    };
    match action {
        Action::Skip => {}
        Action::WriteStatus => write_status(obj.resource_version()).await?,
        Action::Provision => {
            let claim = json_patch(json!([
                { "op": "test", "path": "/metadata/resourceVersion", "value": obj.resource_version() },
                { "op": "add", "path": "/metadata/finalizers", "value": [OPERATOR_FINALIZER] },
            ]))?;
            let claimed = idempotent("adding the finalizer", None, || async {
                api.patch(&name, &params, &Patch::Json::<()>(claim.clone()))
                    .await
                    .map(Some)
            })
            .await?;
            let child = operator_child(obj);
            let child_name = child.name_any();
            idempotent("applying the child", None, || async {
                configmaps
                    .patch(
                        &child_name,
                        &PatchParams::apply(FIELD_MANAGER).force(),
                        &Patch::Apply(&child),
                    )
                    .await
                    .map(drop)
            })
            .await?;
            write_status(claimed.and_then(|o| o.resource_version())).await?;
        }
        Action::Deprovision => {
            let child_name = operator_child(obj).name_any();
            idempotent("deleting the child", Some(404), || async {
                configmaps
                    .delete(&child_name, &DeleteParams::background())
                    .await
                    .map(drop)
            })
            .await?;
            let at = obj
                .finalizers()
                .iter()
                .position(|f| f == OPERATOR_FINALIZER)
                .unwrap_or_default();
            let path = format!("/metadata/finalizers/{at}");
            let release = json_patch(json!([
                { "op": "test", "path": path, "value": OPERATOR_FINALIZER },
                { "op": "remove", "path": path },
            ]))?;
            idempotent("removing the finalizer", Some(404), || async {
                api.patch(&name, &params, &Patch::Json::<()>(release.clone()))
                    .await
                    .map(drop)
            })
            .await?;
        }
    }
    Ok(())
}

/// `ops` as a JSON patch.
fn json_patch(ops: serde_json::Value) -> Result<json_patch::Patch> {
    Ok(serde_json::from_value(ops)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use crate::bench::workload::BenchObjectSpec;

    fn obj() -> BenchObject {
        let mut o = BenchObject::new("bench-1", BenchObjectSpec::default());
        o.metadata.namespace = Some("default".into());
        o.metadata.generation = Some(1);
        o
    }

    fn finalized(mut o: BenchObject) -> BenchObject {
        o.metadata.finalizers = Some(vec![OPERATOR_FINALIZER.into()]);
        o
    }

    fn deleting(mut o: BenchObject) -> BenchObject {
        o.metadata.deletion_timestamp = Some(Time(Default::default()));
        o
    }

    fn ready(mut o: BenchObject) -> BenchObject {
        o.status = Some(ready_status(&o));
        o
    }

    #[test]
    fn operator_provisions_a_new_object_once_and_skips_the_echoes_of_its_writes() {
        assert_eq!(action(Workload::Operator, &obj()), Action::Provision);
        // The echo of the finalizer, then of the status.
        assert_eq!(action(Workload::Operator, &finalized(obj())), Action::Skip);
        assert_eq!(
            action(Workload::Operator, &ready(finalized(obj()))),
            Action::Skip
        );
    }

    #[test]
    fn operator_deprovisions_a_deleted_object_that_still_has_the_finalizer() {
        let gone_soon = deleting(ready(finalized(obj())));
        assert_eq!(action(Workload::Operator, &gone_soon), Action::Deprovision);
        // Deleted by someone else with no finalizer of ours: nothing to clean up.
        assert_eq!(action(Workload::Operator, &deleting(obj())), Action::Skip);
    }

    #[test]
    fn status_writes_until_the_status_is_ready_for_the_generation() {
        assert_eq!(action(Workload::Status, &obj()), Action::WriteStatus);
        assert_eq!(action(Workload::Status, &ready(obj())), Action::Skip);
        let mut changed = ready(obj());
        changed.metadata.generation = Some(2);
        assert_eq!(action(Workload::Status, &changed), Action::WriteStatus);
    }

    #[test]
    fn other_workloads_have_no_floor() {
        for workload in [Workload::Noop, Workload::Chain, Workload::Churn] {
            assert_eq!(action(workload, &obj()), Action::Skip);
        }
    }
}
