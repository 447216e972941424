//! The floor: no runtime, only actorcile's requests for the workload, sent by a plain loop over
//! one watch of the bench objects. A runtime's time minus the floor's is what the runtime adds
//! to the time the API server needs for the same requests; where the API server sets the pace,
//! kube-runtime's time ÷ the floor's is about the most a runtime sending them can gain over
//! kube-runtime.
//!
//! - `status`: an object seen without its Ready status gets one status write;
//! - `operator`: an object seen without the finalizer gets four requests, one after the other:
//!   the finalizer, a read of the child (actorcile writes only a child its owner controls), the
//!   child (server-side apply, [`operator_child`]) and the Ready status; an object seen deleted
//!   with the finalizer gets three: read the child, delete it, then remove the finalizer.
//!
//! These are the requests actorcile makes, sent as it sends them (see [`send`]), under its field
//! manager and finalizer. Nothing is queued or deduplicated: the loop recognises the echo of
//! its own writes from the object and skips it. A request that fails in passing (a connection,
//! a 5xx, throttling) is retried; after any other failure the loop reads the object again and
//! carries on from where it stands, as a runtime would run it again. Its list and watch are the
//! runtimes' (paginated list, then one watch), and at most `concurrency` objects have requests
//! in flight, each object's in a task of its own, as actorcile runs each object in its own
//! actor.

use std::sync::Arc;

use super::actorcile_rt::{FIELD_MANAGER, FINALIZER as DEFAULT_FINALIZER};
use anyhow::{Result, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;
use tokio::task::{JoinHandle, JoinSet};

use super::{
    args::Workload,
    workload::{BenchObject, Recorder, operator_child, ready_status, status_is_current},
};
use crate::retry::idempotent;

/// How many times an object's requests are tried, reading the object again between tries.
const ATTEMPTS: u32 = 5;

/// The running loop.
pub struct FloorRun {
    task: JoinHandle<()>,
}

impl FloorRun {
    /// Stops the loop and every object's requests in flight.
    pub fn stop(self) {
        // The loop's `JoinSet` aborts the objects' tasks when it is dropped.
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

/// Whether `obj` carries actorcile's finalizer.
fn finalized(obj: &BenchObject) -> bool {
    obj.finalizers().iter().any(|f| f == DEFAULT_FINALIZER)
}

/// What `obj` (as the watch delivered it) needs in `workload`.
fn action(workload: Workload, obj: &BenchObject) -> Action {
    let deleting = obj.metadata.deletion_timestamp.is_some();
    match workload {
        Workload::Status if !status_is_current(obj) => Action::WriteStatus,
        Workload::Operator if deleting && finalized(obj) => Action::Deprovision,
        Workload::Operator if !deleting && !finalized(obj) => Action::Provision,
        _ => Action::Skip,
    }
}

/// Whether the floor can send actorcile's requests for this run: those of `operator` and
/// `status`, as actorcile runs them without `--actorcile-defaults`.
pub fn check(workload: Workload, actorcile_defaults: bool) -> Result<()> {
    if !matches!(workload, Workload::Status | Workload::Operator) {
        bail!(
            "the floor sends the requests of the operator and status workloads only, not {workload}"
        );
    }
    if actorcile_defaults {
        bail!(
            "the floor sends actorcile's requests of a plain run, not those of --actorcile-defaults"
        );
    }
    Ok(())
}

/// Starts the loop over the bench objects of `namespace` (for a run [`check`] lets through).
pub fn start(
    client: Client,
    namespace: &str,
    concurrency: u16,
    recorder: Arc<Recorder>,
) -> FloorRun {
    let workload = recorder.workload();
    let limit = usize::from(concurrency.max(1));
    let api: Api<BenchObject> = Api::namespaced(client.clone(), namespace);
    let task = tokio::spawn(async move {
        let mut objects = watcher(api.clone(), watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .boxed();
        let mut in_flight = JoinSet::new();
        loop {
            tokio::select! {
                Some(_) = in_flight.join_next(), if !in_flight.is_empty() => {}
                event = objects.next(), if in_flight.len() < limit => match event {
                    Some(Ok(obj)) => {
                        let action = action(workload, &obj);
                        if action == Action::Skip {
                            continue;
                        }
                        recorder.count_run(&obj);
                        let (api, client) = (api.clone(), client.clone());
                        in_flight.spawn(async move {
                            if let Err(err) = serve(action, obj, &api, &client).await {
                                tracing::warn!(error = format!("{err:#}"), "floor gave up on an object");
                            }
                        });
                    }
                    Some(Err(err)) => tracing::debug!(error = %err, "floor watch error"),
                    None => break,
                },
            }
        }
    });
    FloorRun { task }
}

/// Sends what `action` needs for `obj`; after a failure, reads the object again and carries on
/// from where it stands, up to [`ATTEMPTS`] times.
async fn serve(
    action: Action,
    obj: BenchObject,
    api: &Api<BenchObject>,
    client: &Client,
) -> Result<()> {
    let mut seen = obj;
    let mut attempt = 1;
    loop {
        match send(action, &seen, api, client).await {
            Ok(()) => return Ok(()),
            Err(err) if attempt < ATTEMPTS => {
                tracing::debug!(
                    attempt,
                    error = format!("{err:#}"),
                    "floor: reading the object again"
                );
                attempt += 1;
                match api.get_opt(&seen.name_any()).await? {
                    Some(fresh) => seen = fresh,
                    None => return Ok(()),
                }
            }
            Err(err) => return Err(err),
        }
    }
}

/// Sends the requests of `action` for `obj` as it stands, as actorcile sends them: the finalizer
/// added by a JSON patch guarded by the resourceVersion seen, the status with that of the
/// finalizer's write as a precondition, the finalizer removed by a JSON patch guarded by a test
/// of its index. What is done already (the finalizer there, the status current) is not sent.
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
        Action::WriteStatus if status_is_current(obj) => {}
        Action::WriteStatus => write_status(obj.resource_version()).await?,
        Action::Provision => {
            let version = if finalized(obj) {
                obj.resource_version()
            } else {
                let add = if obj.metadata.finalizers.is_none() {
                    json!({
                        "op": "add",
                        "path": "/metadata/finalizers",
                        "value": [DEFAULT_FINALIZER],
                    })
                } else {
                    json!({
                        "op": "add",
                        "path": "/metadata/finalizers/-",
                        "value": DEFAULT_FINALIZER,
                    })
                };
                let seen = json!({
                    "op": "test",
                    "path": "/metadata/resourceVersion",
                    "value": obj.resource_version(),
                });
                let claim = json_patch(json!([seen, add]))?;
                let claimed = idempotent("adding the finalizer", None, || async {
                    api.patch(&name, &params, &Patch::Json::<()>(claim.clone()))
                        .await
                        .map(Some)
                })
                .await?;
                claimed.and_then(|o| o.resource_version())
            };
            let child = operator_child(obj);
            let child_name = child.name_any();
            idempotent("reading the child", None, || async {
                configmaps.get_opt(&child_name).await.map(drop)
            })
            .await?;
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
            if !status_is_current(obj) {
                write_status(version).await?;
            }
        }
        Action::Deprovision => {
            let child_name = operator_child(obj).name_any();
            idempotent("reading the child", None, || async {
                configmaps.get_opt(&child_name).await.map(drop)
            })
            .await?;
            idempotent("deleting the child", Some(404), || async {
                configmaps
                    .delete(&child_name, &DeleteParams::background())
                    .await
                    .map(drop)
            })
            .await?;
            let Some(at) = obj.finalizers().iter().position(|f| f == DEFAULT_FINALIZER) else {
                return Ok(());
            };
            let path = format!("/metadata/finalizers/{at}");
            let release = json_patch(json!([
                { "op": "test", "path": path, "value": DEFAULT_FINALIZER },
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
        o.metadata.finalizers = Some(vec![DEFAULT_FINALIZER.into()]);
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

    /// An object the floor saw before its finalizer landed (the response lost, say): the claim
    /// guarded by the old resourceVersion is refused, so the floor reads it again and finishes
    /// from where it stands, without a second finalizer.
    #[tokio::test]
    async fn a_refused_request_is_finished_from_the_object_read_again() {
        let cluster = actorcile::cluster::ApiServer::new();
        cluster
            .install_crd(&crate::bench::workload::bench_crd())
            .unwrap();
        let client = cluster.client();
        let api: Api<BenchObject> = Api::namespaced(client.clone(), "default");
        let stale = api
            .create(&Default::default(), &obj())
            .await
            .expect("create");
        let claim = json!({ "metadata": { "finalizers": [DEFAULT_FINALIZER] } });
        api.patch(
            &stale.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&claim),
        )
        .await
        .expect("the finalizer lands");

        serve(Action::Provision, stale, &api, &client)
            .await
            .expect("served");

        let now = api.get("bench-1").await.unwrap();
        assert_eq!(now.finalizers(), [DEFAULT_FINALIZER.to_string()]);
        assert!(status_is_current(&now), "{:?}", now.status);
        let child: Api<ConfigMap> = Api::namespaced(client, "default");
        assert!(child.get_opt("bench-1-config").await.unwrap().is_some());
    }

    #[test]
    fn other_workloads_have_no_floor() {
        for workload in [Workload::Noop, Workload::Chain, Workload::Churn] {
            assert_eq!(action(workload, &obj()), Action::Skip);
        }
    }
}
