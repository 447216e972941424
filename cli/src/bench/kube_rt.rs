//! The kube-runtime side: the workload's reconcile logic under kube-runtime's `Controller`.
//!
//! `chain` is built the event-driven way kube-runtime offers for a relation between objects: one
//! shared reflector over the bench objects feeds both the controller's own trigger
//! ([`Controller::for_shared_stream`]) and a relation trigger ([`Controller::watches_shared_stream`])
//! whose mapper ([`DependentsIndex`]) maps a Ready object to the objects that depend on it. The
//! reconcile looks the dependency up in the controller's store; if it is not Ready it returns
//! `Action::await_change()` and is re-triggered by the relation when the dependency becomes
//! Ready. One reflector means one list + watch (the same as actorcile), and the store is updated
//! before either trigger fires, so a re-triggered reconcile always sees the dependency as Ready
//! (a second, separate watch could trigger before the controller's own store caught up, and the
//! dependent would then wait forever).
//!
//! `operator` is written as kube-runtime's users write an operator: the reconcile goes through
//! [`kube::runtime::finalizer::finalizer`] (which adds the finalizer and returns; the echo of that
//! write runs the reconcile again), `Apply` server-side applies the child ConfigMap (every run)
//! and patches the Ready status when it is not current, and `Cleanup` deletes the child, after
//! which the helper removes the finalizer. The child is not watched (`.owns()`), as actorcile
//! does not watch it either.

use std::{collections::HashSet, sync::Arc, time::Duration};

use anyhow::{Context as _, Result};
use dashmap::DashMap;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams},
    runtime::{
        Controller, WatchStreamExt,
        controller::{self, Action},
        finalizer::{self, finalizer},
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use tokio::{sync::oneshot, task::JoinHandle};

use super::{
    args::Workload,
    workload::{
        BenchObject, Recorder, StatusWriter, Step, WorkloadError, is_ready_dependency,
        operator_child, patch_ready_status, status_is_current,
    },
};

/// `operator`: the finalizer the kube-runtime side puts on every object.
pub const OPERATOR_FINALIZER: &str = "bench.actorcile.dev/cleanup";

/// `operator`: the field manager of the kube-runtime side's server-side apply.
pub const OPERATOR_FIELD_MANAGER: &str = "bench-kube-runtime";

/// A failed reconcile of the kube-runtime side.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The workload's reconcile failed.
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    /// `operator`: the finalizer helper or the step it ran failed.
    #[error(transparent)]
    Finalizer(#[from] Box<finalizer::Error<WorkloadError>>),
}

/// Delay before retrying a reconcile that failed.
pub const ERROR_REQUEUE: Duration = Duration::from_millis(100);

/// `chain`: buffer of the shared reflector's broadcast to its two subscribers (the reflector
/// waits when a subscriber lags this far behind).
pub const SHARED_STREAM_BUFFER: usize = 1024;

struct Ctx {
    recorder: Arc<Recorder>,
    client: Client,
    /// `chain`: the controller's reflector store, where the reconcile looks up dependencies.
    store: Option<Store<BenchObject>>,
}

/// A running kube-runtime `Controller`.
pub struct KubeRuntimeRun {
    shutdown: oneshot::Sender<()>,
    task: JoinHandle<()>,
    /// `chain`: the task driving the shared reflector.
    root: Option<JoinHandle<()>>,
}

/// `chain`: the object `obj` depends on, in its namespace (`None` for a chain's head).
fn dependency_ref(obj: &BenchObject) -> Option<ObjectRef<BenchObject>> {
    let dep = ObjectRef::new(obj.spec.depends_on.as_deref()?);
    Some(match obj.metadata.namespace.as_deref() {
        Some(ns) => dep.within(ns),
        None => dep,
    })
}

/// `chain`: the relation "depends on", indexed from dependency to dependents, as a
/// [`Controller::watches_shared_stream`] mapper.
///
/// Every object the mapper sees records its own `spec.dependsOn`; an object seen Ready maps to
/// the objects recorded as depending on it. The mapper sees every object (the initial list,
/// then every change, in the order of the watch), and a dependent exists, so is seen, before its
/// dependency can be seen Ready for it, so no dependent is missed. Entries are never removed:
/// bench objects do not change their dependency (a stale entry would only cost an extra
/// reconcile).
#[derive(Debug, Default)]
pub struct DependentsIndex {
    dependents: DashMap<ObjectRef<BenchObject>, HashSet<ObjectRef<BenchObject>>>,
}

impl DependentsIndex {
    /// Records `obj`'s dependency and returns the objects to reconcile because of this version of
    /// `obj`: its dependents if it is Ready, none otherwise.
    pub fn map(&self, obj: &BenchObject) -> Vec<ObjectRef<BenchObject>> {
        let me = ObjectRef::from_obj(obj);
        if let Some(dep) = dependency_ref(obj) {
            self.dependents.entry(dep).or_default().insert(me.clone());
        }
        if !is_ready_dependency(obj) {
            return Vec::new();
        }
        self.dependents
            .get(&me)
            .map(|d| d.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// `obj` without `managedFields` and the last-applied annotation, as kube-rs advises for
/// reflector stores and as actorcile's cache keeps objects by default.
fn prune(obj: &mut BenchObject) {
    obj.managed_fields_mut().clear();
    obj.annotations_mut()
        .remove("kubectl.kubernetes.io/last-applied-configuration");
}

/// Starts a `Controller` over the bench objects of `namespace` with at most `concurrency`
/// reconciles in flight (`pruned`: its cache keeps the objects [`prune`]d).
pub fn start(
    client: Client,
    namespace: &str,
    concurrency: u16,
    recorder: Arc<Recorder>,
    pruned: bool,
) -> Result<KubeRuntimeRun> {
    let api: Api<BenchObject> = Api::namespaced(client.clone(), namespace);
    let (shutdown, stop) = oneshot::channel::<()>();
    let config = controller::Config::default().concurrency(concurrency);
    let (controller, store, root) = if recorder.workload() == Workload::Chain {
        let (reader, writer) = reflector::store_shared(SHARED_STREAM_BUFFER);
        let own = writer
            .subscribe()
            .context("subscribing to the shared reflector")?;
        let related = writer
            .subscribe()
            .context("subscribing to the shared reflector")?;
        let root = tokio::spawn(
            watcher(api, watcher::Config::default())
                .default_backoff()
                .modify(move |o| {
                    if pruned {
                        prune(o)
                    }
                })
                .reflect_shared(writer)
                .for_each(|event| async move {
                    if let Err(err) = event {
                        tracing::debug!(error = %err, "kube-runtime watch error");
                    }
                }),
        );
        let index = Arc::new(DependentsIndex::default());
        let controller = Controller::for_shared_stream(own, reader.clone())
            .watches_shared_stream(related, move |obj: Arc<BenchObject>| index.map(&obj));
        (controller, Some(reader), Some(root))
    } else if pruned {
        // As kube-rs documents for pruned stores: the controller over a watch of our own.
        let (reader, writer) = reflector::store();
        let stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .modify(prune)
            .reflect(writer)
            .applied_objects();
        (Controller::for_stream(stream, reader), None, None)
    } else {
        (Controller::new(api, watcher::Config::default()), None, None)
    };
    let controller = controller
        .with_config(config)
        .graceful_shutdown_on(async move {
            let _ = stop.await;
        });
    let ctx = Arc::new(Ctx {
        recorder,
        client,
        store,
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
    Ok(KubeRuntimeRun {
        shutdown,
        task,
        root,
    })
}

impl KubeRuntimeRun {
    /// Stops the controller (in-flight reconciles finish; gives up after `grace`).
    pub async fn stop(self, grace: Duration) {
        let _ = self.shutdown.send(());
        let abort = self.task.abort_handle();
        if tokio::time::timeout(grace, self.task).await.is_err() {
            abort.abort();
        }
        if let Some(root) = self.root {
            root.abort();
        }
    }
}

async fn reconcile(obj: Arc<BenchObject>, ctx: Arc<Ctx>) -> Result<Action, ReconcileError> {
    if ctx.recorder.workload() == Workload::Operator {
        return reconcile_operator(obj, &ctx).await;
    }
    let step = match &ctx.store {
        Some(store) => {
            let dependency_ready = match dependency_ref(&obj) {
                None => true,
                Some(key) => store.get(&key).is_some_and(|d| is_ready_dependency(&d)),
            };
            ctx.recorder
                .reconcile_chain(&obj, &ctx.client, StatusWriter::Reconcile, dependency_ready)
                .await?
        }
        None => {
            ctx.recorder
                .reconcile(&obj, &ctx.client, StatusWriter::Reconcile)
                .await?
        }
    };
    Ok(match step {
        Step::Done | Step::WaitForDependency => Action::await_change(),
        Step::YieldAfter(after) => Action::requeue(after),
    })
}

/// `operator`: the reconcile through kube-runtime's finalizer helper.
async fn reconcile_operator(obj: Arc<BenchObject>, ctx: &Ctx) -> Result<Action, ReconcileError> {
    ctx.recorder.count_run(&obj);
    let api: Api<BenchObject> = match obj.namespace() {
        Some(ns) => Api::namespaced(ctx.client.clone(), &ns),
        None => Api::default_namespaced(ctx.client.clone()),
    };
    finalizer(&api, OPERATOR_FINALIZER, obj, |event| async move {
        match event {
            finalizer::Event::Apply(obj) => operator_apply(&obj, &ctx.client).await,
            finalizer::Event::Cleanup(obj) => operator_cleanup(&obj, &ctx.client).await,
        }
    })
    .await
    .map_err(|e| ReconcileError::Finalizer(Box::new(e)))
}

fn configmaps(client: &Client, obj: &BenchObject) -> Api<ConfigMap> {
    match obj.namespace() {
        Some(ns) => Api::namespaced(client.clone(), &ns),
        None => Api::default_namespaced(client.clone()),
    }
}

/// `operator`, `Apply`: server-side apply the child, then write the Ready status if it is not
/// current.
async fn operator_apply(obj: &BenchObject, client: &Client) -> Result<Action, WorkloadError> {
    let child = operator_child(obj);
    let name = child.name_any();
    configmaps(client, obj)
        .patch(
            &name,
            &PatchParams::apply(OPERATOR_FIELD_MANAGER).force(),
            &Patch::Apply(&child),
        )
        .await?;
    if !status_is_current(obj) {
        patch_ready_status(obj, client).await?;
    }
    Ok(Action::await_change())
}

/// `operator`, `Cleanup`: delete the child (gone already is fine).
async fn operator_cleanup(obj: &BenchObject, client: &Client) -> Result<Action, WorkloadError> {
    let name = operator_child(obj).name_any();
    match configmaps(client, obj)
        .delete(&name, &DeleteParams::background())
        .await
    {
        Ok(_) => Ok(Action::await_change()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Action::await_change()),
        Err(e) => Err(e.into()),
    }
}

fn error_policy(_obj: Arc<BenchObject>, err: &ReconcileError, _ctx: Arc<Ctx>) -> Action {
    tracing::debug!(error = %err, "reconcile failed; retrying");
    Action::requeue(ERROR_REQUEUE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use actorcile::prelude::{Outcome, ResourceStatus};

    use crate::bench::workload::BenchObjectSpec;

    fn link(ns: &str, name: &str, depends_on: Option<&str>, ready: bool) -> BenchObject {
        let mut o = BenchObject::new(
            name,
            BenchObjectSpec {
                depends_on: depends_on.map(str::to_string),
                ..Default::default()
            },
        );
        o.metadata.namespace = Some(ns.into());
        o.metadata.generation = Some(1);
        if ready {
            o.status = Some(ResourceStatus::default().after_provision(&Outcome::Done, Some(1)));
        }
        o
    }

    fn names(refs: Vec<ObjectRef<BenchObject>>) -> Vec<String> {
        let mut names: Vec<String> = refs
            .into_iter()
            .map(|r| format!("{}/{}", r.namespace.unwrap_or_default(), r.name))
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_ready_dependency_maps_to_its_dependents() {
        let index = DependentsIndex::default();
        // Dependents first, as listed.
        assert!(index.map(&link("ns", "c", Some("b"), false)).is_empty());
        assert!(index.map(&link("ns", "b", Some("a"), false)).is_empty());
        assert!(index.map(&link("ns", "b2", Some("a"), false)).is_empty());
        assert!(
            index.map(&link("other", "x", Some("a"), false)).is_empty(),
            "another namespace's `a`"
        );
        assert!(
            index.map(&link("ns", "a", None, false)).is_empty(),
            "not Ready: nothing to re-trigger"
        );
        assert_eq!(
            names(index.map(&link("ns", "a", None, true))),
            ["ns/b", "ns/b2"]
        );
        assert_eq!(
            names(index.map(&link("ns", "b", Some("a"), true))),
            ["ns/c"]
        );
        // Seen again (e.g. an echo): the same dependents, no duplicates.
        assert_eq!(
            names(index.map(&link("ns", "b", Some("a"), true))),
            ["ns/c"]
        );
        assert!(
            index.map(&link("ns", "c", Some("b"), true)).is_empty(),
            "a tail"
        );
        assert_eq!(
            names(index.map(&link("other", "a", None, true))),
            ["other/x"]
        );
        let mut deleting = link("ns", "a", None, true);
        deleting.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
        );
        assert!(
            index.map(&deleting).is_empty(),
            "a deleting object is not Ready"
        );
    }
}
