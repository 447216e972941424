//! The bench resource and the reconcile logic of each workload, shared verbatim by both runtimes.
//!
//! Runs and latencies are measured here, inside the reconcile logic, so both runtimes are measured
//! by the same code. What "latency" means per workload (event → run):
//! - `noop`: from the runtime's start (the objects exist before it) to the object's first run;
//! - `status`: from the runtime's start to the moment an observer (a watch on a separate,
//!   uncounted client, the same for both runtimes) sees the object's status Ready for its
//!   generation. This is also when a `status` object counts as done: the Ready status is written by
//!   the reconcile under kube-runtime and by the runtime itself under actorcile (see
//!   [`StatusWriter`]), so only the API tells both apart the same way;
//! - `yield`: how late each run after a yield comes, beyond the delay the yield asked for;
//! - `churn`: from the driver stamping `spec.stampMicros` (wall clock, same process) to the first
//!   run that sees that stamp;
//! - `chain`: one "hop" of a dependency chain: from the moment the observer saw an object's
//!   dependency (`spec.dependsOn`) Ready to the moment it saw the object itself Ready. An object
//!   is done, as in `status`, when the observer sees it Ready for its generation. Each runtime
//!   finds out whether the dependency is Ready its own way (actorcile: `Context::require_ready`;
//!   kube-runtime: its reflector store) and hands the answer to [`Recorder::reconcile_chain`];
//! - `operator`: from the runtime's start to the moment the observer sees the object's status
//!   Ready for its generation (as in `status`). An object is Ready then, and done once the
//!   observer sees it deleted (after the bench deleted every object). Each runtime drives this
//!   workload with its own finalizer handling and child step (see `kube_rt` and `actorcile_rt`),
//!   on the same child object ([`operator_child`]), and counts its runs with
//!   [`Recorder::count_run`].

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use actorcile::{
    prelude::{Outcome, Reason, Target},
    status::{Phase, ReadyReason, ResourceStatus},
};
use dashmap::DashMap;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api, Client, CustomResource, CustomResourceExt, Resource, ResourceExt,
    api::{ObjectMeta, Patch, PatchParams},
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use super::{args::Workload, counting::RequestCounter};

/// Spec of the bench resource (`BenchObject`, group `bench.actorcile.dev/v1`, namespaced). Its
/// status is actorcile's [`ResourceStatus`] (phase, `Ready` condition, observedGeneration).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "bench.actorcile.dev",
    version = "v1",
    kind = "BenchObject",
    plural = "benchobjects",
    namespaced,
    status = "ResourceStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct BenchObjectSpec {
    /// `churn`: wall-clock time (µs since the Unix epoch) at which the driver wrote this spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stamp_micros: Option<u64>,
    /// `churn`: this is the driver's last update of the object.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub last_update: bool,
    /// `chain`: name of the object (same namespace) that must be Ready before this one can be.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depends_on: Option<String>,
}

/// The bench CRD as installed: [`BenchObject::crd`] without `default: ""` in its schema.
///
/// kube-apiserver 1.20 (the envtest control plane) reads an empty-string default as `null` and
/// rejects the CRD; serde's own defaults fill those fields in anyway.
pub fn bench_crd() -> CustomResourceDefinition {
    let crd = BenchObject::crd();
    let mut value = match serde_json::to_value(&crd) {
        Ok(value) => value,
        Err(_) => return crd,
    };
    strip_empty_string_defaults(&mut value);
    serde_json::from_value(value).unwrap_or(crd)
}

fn strip_empty_string_defaults(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            if map.get("default").is_some_and(|d| d.as_str() == Some("")) {
                map.remove("default");
            }
            map.values_mut().for_each(strip_empty_string_defaults);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(strip_empty_string_defaults),
        _ => {}
    }
}

/// Name of the `i`-th bench object.
pub fn object_name(i: u32) -> String {
    format!("bench-{i:06}")
}

/// `chain`: index of the object that object `i` depends on, among `objects` objects in chains of
/// `chain_length` links (`None` for the head of a chain).
///
/// Chain `c` holds objects `c·L … c·L+L−1` (the last chain may be shorter); object `i` depends on
/// object `i+1` of the same chain, so the last object of a chain is its head, and in name order
/// (the order of a list) every dependent comes before its dependency: the worst order.
pub fn chain_dependency(i: u32, objects: u32, chain_length: u32) -> Option<u32> {
    let next = i.checked_add(1)?;
    (chain_length > 0 && next < objects && next % chain_length != 0).then_some(next)
}

/// `chain`: the spec of object `i` (see [`chain_dependency`]).
pub fn chain_spec(i: u32, objects: u32, chain_length: u32) -> BenchObjectSpec {
    BenchObjectSpec {
        depends_on: chain_dependency(i, objects, chain_length).map(object_name),
        ..Default::default()
    }
}

/// `chain`: the object `obj` depends on, as an actorcile [`Target`] (`None` for a chain's head).
pub fn dependency_target(obj: &BenchObject) -> Option<Target> {
    let name = obj.spec.depends_on.as_deref()?;
    Some(Target::for_kind::<BenchObject>(
        obj.metadata.namespace.as_deref(),
        name,
    ))
}

/// `chain`: the outcome of a reconcile that waits for `target`, with the reason
/// `Context::require_ready` gives, so the status written while waiting is the same whichever
/// runtime writes it.
pub fn waiting_outcome(target: Target) -> Outcome {
    let reason = Reason::new(
        "DependencyNotReady",
        format!("waiting for {target} to become Ready"),
    );
    Outcome::Waiting { target, reason }
}

/// `chain`: whether `obj`, as a dependency, counts as Ready: its `Ready` condition is True and it
/// is not being deleted (what actorcile's reference index checks too).
pub fn is_ready_dependency(obj: &BenchObject) -> bool {
    obj.metadata.deletion_timestamp.is_none()
        && obj.status.as_ref().is_some_and(ResourceStatus::is_ready)
}

/// `operator`: the end of a child ConfigMap's name (the parent's name comes first).
pub const OPERATOR_CHILD_SUFFIX: &str = "-config";

/// `operator`: the name of `parent`'s child ConfigMap.
pub fn operator_child_name(parent: &str) -> String {
    format!("{parent}{OPERATOR_CHILD_SUFFIX}")
}

/// `operator`: the child ConfigMap of `obj`, owned by it (a controller owner reference), in its
/// namespace. Both runtimes server-side apply exactly this object.
pub fn operator_child(obj: &BenchObject) -> ConfigMap {
    let name = obj.name_any();
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(operator_child_name(&name)),
            namespace: obj.namespace(),
            owner_references: obj.controller_owner_ref(&()).map(|r| vec![r]),
            ..Default::default()
        },
        data: Some([("parent".to_string(), name)].into()),
        ..Default::default()
    }
}

/// What a reconcile asks its runtime to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Nothing more to do until the object changes.
    Done,
    /// Run again after this delay.
    YieldAfter(Duration),
    /// `chain`: the dependency is not Ready; run again once it is (actorcile: the `Waiting`
    /// outcome of `require_ready`; kube-runtime: `Action::await_change()`, re-triggered by the
    /// controller's dependency relation).
    WaitForDependency,
}

/// A reconcile failed (the runtime retries it).
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// An API call failed.
    #[error("kubernetes API call failed: {0}")]
    Kube(#[from] kube::Error),
    /// The object has no name.
    #[error("object has no name")]
    Unnamed,
}

/// Who writes the Ready status (phase, `Ready` condition, observedGeneration) of an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusWriter {
    /// The reconcile writes it (kube-runtime: a `Controller` writes no status of its own).
    Reconcile,
    /// The runtime writes it after the reconcile (actorcile writes it on every change).
    Runtime,
}

/// Workload parameters.
#[derive(Debug, Clone, Copy)]
pub struct WorkloadConfig {
    /// Which workload.
    pub workload: Workload,
    /// Number of objects.
    pub objects: u32,
    /// `yield`: yields per object before it is done.
    pub yields: u32,
    /// `yield`: delay each yield asks for.
    pub yield_interval: Duration,
}

/// Microseconds since the Unix epoch (the churn stamp's clock).
pub fn wall_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// Whether `obj`'s status already says Ready for its current generation.
pub fn status_is_current(obj: &BenchObject) -> bool {
    let Some(status) = &obj.status else {
        return false;
    };
    status.phase == Some(Phase::Ready)
        && status.observed_generation == obj.metadata.generation
        && status.is_ready()
}

/// The status actorcile's runtime writes after a provision reconcile that is done: `obj`'s status
/// with phase Ready, the `Ready` condition true and observedGeneration its generation.
pub fn ready_status(obj: &BenchObject) -> ResourceStatus {
    obj.status.clone().unwrap_or_default().with_ready(
        Phase::Ready,
        true,
        ReadyReason::Provisioned,
        "provisioned",
        obj.metadata.generation,
    )
}

/// [`ready_status`], written by the reconcile itself (a merge patch on `/status`, as an operator
/// on kube-runtime would).
pub async fn patch_ready_status(obj: &BenchObject, client: &Client) -> Result<(), WorkloadError> {
    patch_status(obj, client, &ready_status(obj)).await
}

/// Writes `desired` as `obj`'s status (a merge patch on `/status`).
async fn patch_status(
    obj: &BenchObject,
    client: &Client,
    desired: &ResourceStatus,
) -> Result<(), WorkloadError> {
    let name = obj.metadata.name.as_deref().ok_or(WorkloadError::Unnamed)?;
    let api: Api<BenchObject> = match obj.namespace() {
        Some(ns) => Api::namespaced(client.clone(), &ns),
        None => Api::default_namespaced(client.clone()),
    };
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(desired.patch()),
    )
    .await?;
    Ok(())
}

mod recorder;
pub use recorder::Recorder;

#[cfg(test)]
mod tests;
