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

#[derive(Debug, Default)]
struct ObjectState {
    seen: bool,
    done: bool,
    yields: u32,
    wake_due: Option<Instant>,
    last_stamp: Option<u64>,
    /// `chain`: when the observer first saw the object Ready.
    ready_at: Option<Instant>,
    /// `operator`: the observer has seen the object Ready.
    ready: bool,
    /// Latency samples taken on this object (kept per object, under the map's shard lock, so
    /// the runtime with more threads does not also contend on one global lock; the first one
    /// inline, so that the memory read per object is the runtime's, not the harness's).
    latencies: smallvec::SmallVec<[Duration; 1]>,
    /// `restart`: the stamps of changes written to this object and not yet seen by a run.
    pending: Vec<u64>,
    /// `restart`: changes seen by a run: (written, seen), wall-clock microseconds.
    changes_seen: Vec<(u64, u64)>,
}

/// Figures frozen at the moment the last object became done.
#[derive(Debug, Clone, Copy)]
pub struct DoneSnapshot {
    /// Elapsed time since the start.
    pub elapsed: Duration,
    /// Runs so far.
    pub runs: u64,
    /// API requests by the runtime's client so far.
    pub api_requests: u64,
}

/// The shared reconcile logic and its measurements (one per child process).
#[derive(Debug)]
pub struct Recorder {
    config: WorkloadConfig,
    /// When the runtime started (set by [`Recorder::start_clock`], or at the first use).
    start: std::sync::OnceLock<Instant>,
    requests: RequestCounter,
    runs: AtomicU64,
    seen: AtomicUsize,
    done: AtomicUsize,
    ready: AtomicUsize,
    objects: DashMap<String, ObjectState, ahash::RandomState>,
    finished: Mutex<Option<DoneSnapshot>>,
    all_ready_at: Mutex<Option<DoneSnapshot>>,
    all_seen_at: Mutex<Option<DoneSnapshot>>,
    /// `restart`: changes written and not yet seen by a run.
    pending_changes: AtomicUsize,
    all_seen: Notify,
    all_ready: Notify,
    all_done: Notify,
}

impl Recorder {
    /// Starts measuring now; `requests` is the runtime client's request counter.
    pub fn start(config: WorkloadConfig, requests: RequestCounter) -> Arc<Self> {
        let recorder = Self::new(config, requests);
        recorder.start_clock();
        recorder
    }

    /// A recorder with the state of every bench object (`object_name(0..objects)`) in place,
    /// whose clock starts at [`Recorder::start_clock`]: made before the memory is read that the
    /// runtime's is measured from, so that the harness's own memory per object is not counted
    /// as the runtime's.
    pub fn prepared(config: WorkloadConfig, requests: RequestCounter) -> Arc<Self> {
        let recorder = Self::new(config, requests);
        for i in 0..config.objects {
            recorder
                .objects
                .insert(object_name(i), ObjectState::default());
        }
        recorder
    }

    /// Starts the clock that runs and latencies are measured from (once: later calls do
    /// nothing).
    pub fn start_clock(&self) {
        let _ = self.start.set(Instant::now());
    }

    fn t0(&self) -> Instant {
        *self.start.get_or_init(Instant::now)
    }

    fn new(config: WorkloadConfig, requests: RequestCounter) -> Arc<Self> {
        Arc::new(Self {
            config,
            start: std::sync::OnceLock::new(),
            requests,
            runs: AtomicU64::new(0),
            seen: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            ready: AtomicUsize::new(0),
            objects: DashMap::with_capacity_and_hasher(
                config.objects as usize,
                ahash::RandomState::default(),
            ),
            finished: Mutex::new(None),
            all_ready_at: Mutex::new(None),
            all_seen_at: Mutex::new(None),
            pending_changes: AtomicUsize::new(0),
            all_seen: Notify::new(),
            all_ready: Notify::new(),
            all_done: Notify::new(),
        })
    }

    /// The workload measured.
    pub fn workload(&self) -> Workload {
        self.config.workload
    }

    /// Runs counted so far.
    pub fn runs(&self) -> u64 {
        self.runs.load(Ordering::Relaxed)
    }

    /// Objects done so far.
    pub fn done_count(&self) -> usize {
        self.done.load(Ordering::Relaxed)
    }

    /// Objects that have had their first run so far.
    pub fn seen_count(&self) -> usize {
        self.seen.load(Ordering::Relaxed)
    }

    /// `operator`: objects seen Ready so far.
    pub fn ready_count(&self) -> usize {
        self.ready.load(Ordering::Relaxed)
    }

    /// Time since the measurement started.
    pub fn elapsed(&self) -> Duration {
        self.t0().elapsed()
    }

    /// Latency samples so far (grouped by object, in no particular order).
    pub fn latencies(&self) -> Vec<Duration> {
        self.objects
            .iter()
            .flat_map(|e| e.latencies.clone())
            .collect()
    }

    /// Runs `f` on the state of the object named `name` (created at its first sight); looking
    /// up an object seen before allocates nothing.
    fn with_state<R>(&self, name: &str, f: impl FnOnce(&mut ObjectState) -> R) -> R {
        match self.objects.get_mut(name) {
            Some(mut state) => f(&mut state),
            None => f(&mut self.objects.entry(name.to_string()).or_default()),
        }
    }

    /// The figures at the moment the last object became done, once it has.
    pub fn finished(&self) -> Option<DoneSnapshot> {
        *self.finished.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until every object has had its first run.
    pub async fn wait_all_seen(&self) {
        loop {
            let notified = self.all_seen.notified();
            if self.seen.load(Ordering::Acquire) >= self.config.objects as usize {
                return;
            }
            notified.await;
        }
    }

    /// The figures at the moment the last object had its first run, once it has.
    pub fn all_seen(&self) -> Option<DoneSnapshot> {
        *self.all_seen_at.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `restart`: records a change about to be written to object `name` and returns its stamp
    /// (`spec.stampMicros`); the first run that sees this stamp or a later one takes a latency
    /// sample from it.
    pub fn change(&self, name: &str) -> u64 {
        let stamp = wall_micros();
        self.pending_changes.fetch_add(1, Ordering::AcqRel);
        self.with_state(name, |state| state.pending.push(stamp));
        stamp
    }

    /// `restart`: every change seen by a run, as (written, seen) in wall-clock microseconds.
    pub fn changes_seen(&self) -> Vec<(u64, u64)> {
        self.objects
            .iter()
            .flat_map(|e| e.changes_seen.clone())
            .collect()
    }

    /// `restart`: changes written and not yet seen by a run.
    pub fn pending_changes(&self) -> usize {
        self.pending_changes.load(Ordering::Acquire)
    }

    /// `operator`: the figures at the moment the last object was seen Ready, once it has been.
    pub fn all_ready(&self) -> Option<DoneSnapshot> {
        *self.all_ready_at.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `operator`: waits until every object has been seen Ready and returns the figures of that
    /// moment.
    pub async fn wait_ready(&self) -> DoneSnapshot {
        loop {
            let notified = self.all_ready.notified();
            if let Some(snapshot) = self.all_ready() {
                return snapshot;
            }
            notified.await;
        }
    }

    fn snapshot(&self) -> DoneSnapshot {
        DoneSnapshot {
            elapsed: self.t0().elapsed(),
            runs: self.runs(),
            api_requests: self.requests.get(),
        }
    }

    fn mark_ready(&self, state: &mut ObjectState) {
        if state.ready {
            return;
        }
        state.ready = true;
        if self.ready.fetch_add(1, Ordering::AcqRel) + 1 == self.config.objects as usize {
            *self.all_ready_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(self.snapshot());
            self.all_ready.notify_waiters();
        }
    }

    /// Waits until every object is done and returns the figures of that moment.
    pub async fn wait_done(&self) -> DoneSnapshot {
        loop {
            let notified = self.all_done.notified();
            if let Some(snapshot) = self.finished() {
                return snapshot;
            }
            notified.await;
        }
    }

    fn mark_done(&self, state: &mut ObjectState) {
        if state.done {
            return;
        }
        state.done = true;
        if self.done.fetch_add(1, Ordering::AcqRel) + 1 == self.config.objects as usize {
            let snapshot = self.snapshot();
            *self.finished.lock().unwrap_or_else(|e| e.into_inner()) = Some(snapshot);
            self.all_done.notify_waiters();
        }
    }

    /// One reconcile of `obj` (both runtimes call exactly this).
    ///
    /// `status_writer` says who writes the Ready status in the `status` workload: kube-runtime's
    /// `Controller` leaves it to the reconcile, actorcile's runtime writes it itself.
    pub async fn reconcile(
        &self,
        obj: &BenchObject,
        client: &Client,
        status_writer: StatusWriter,
    ) -> Result<Step, WorkloadError> {
        if self.config.workload == Workload::Chain {
            // No dependency check here: only a chain's head can proceed.
            let ready = obj.spec.depends_on.is_none();
            return self
                .reconcile_chain(obj, client, status_writer, ready)
                .await;
        }
        self.runs.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let name = obj.metadata.name.as_deref().ok_or(WorkloadError::Unnamed)?;
        // `Err(step)`: the reconcile is done with this step; `Ok(write)`: whether to write status.
        let next = self.with_state(name, |state| {
            if self.note_seen(state) && self.config.workload == Workload::Noop {
                state.latencies.push(now - self.t0());
            }
            match self.config.workload {
                Workload::Noop => {
                    self.mark_done(state);
                    Err(Step::Done)
                }
                Workload::Yield => {
                    if let Some(due) = state.wake_due.take() {
                        state.latencies.push(now.saturating_duration_since(due));
                    }
                    if state.yields < self.config.yields {
                        state.yields += 1;
                        state.wake_due = Some(now + self.config.yield_interval);
                        return Err(Step::YieldAfter(self.config.yield_interval));
                    }
                    self.mark_done(state);
                    Err(Step::Done)
                }
                Workload::Churn => {
                    if let Some(stamp) = obj.spec.stamp_micros
                        && state.last_stamp != Some(stamp)
                    {
                        state.last_stamp = Some(stamp);
                        let lag = wall_micros().saturating_sub(stamp);
                        state.latencies.push(Duration::from_micros(lag));
                        if obj.spec.last_update {
                            self.mark_done(state);
                        }
                    }
                    Err(Step::Done)
                }
                Workload::Status => {
                    Ok(status_writer == StatusWriter::Reconcile && !status_is_current(obj))
                }
                // Handled by `reconcile_chain` above.
                Workload::Chain => Ok(false),
                // Each runtime drives `operator` itself and calls only `count_run`.
                Workload::Operator => Err(Step::Done),
                Workload::Restart => {
                    if let Some(stamp) = obj.spec.stamp_micros {
                        let at = wall_micros();
                        let before = state.pending.len();
                        state.pending.retain(|&change| {
                            let seen = change <= stamp;
                            if seen {
                                let lag = at.saturating_sub(change);
                                state.latencies.push(Duration::from_micros(lag));
                                state.changes_seen.push((change, at));
                            }
                            !seen
                        });
                        let served = before - state.pending.len();
                        self.pending_changes.fetch_sub(served, Ordering::AcqRel);
                    }
                    Err(Step::Done)
                }
            }
        });
        let write_status = match next {
            Ok(write) => write,
            Err(step) => return Ok(step),
        };
        if write_status {
            patch_ready_status(obj, client).await?;
        }
        Ok(Step::Done)
    }

    /// Counts one run of `obj` (`operator`: each runtime calls this once per reconcile or reconcile;
    /// the floor once per object version it sends requests for).
    pub fn count_run(&self, obj: &BenchObject) {
        self.runs.fetch_add(1, Ordering::Relaxed);
        if let Some(name) = obj.metadata.name.as_deref() {
            self.with_state(name, |state| self.note_seen(state));
        }
    }

    /// Marks the object seen by the runtime (its first run); `true` the first time.
    fn note_seen(&self, state: &mut ObjectState) -> bool {
        if state.seen {
            return false;
        }
        state.seen = true;
        if self.seen.fetch_add(1, Ordering::AcqRel) + 1 == self.config.objects as usize {
            *self.all_seen_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(self.snapshot());
            self.all_seen.notify_waiters();
        }
        true
    }

    /// `chain`: one reconcile of `obj`, whose dependency (`spec.dependsOn`) the runtime found
    /// Ready (`dependency_ready`; `true` for a chain's head) or not.
    ///
    /// The object's status becomes Ready (phase, `Ready` condition, observedGeneration) once its
    /// dependency is Ready, and says `DependencyNotReady` until then. With
    /// [`StatusWriter::Reconcile`] this writes that status (merge patch on `/status`, only when it
    /// changed), the same status actorcile's runtime writes for the outcomes `Done` and
    /// `Waiting` ([`ResourceStatus::after_provision`]).
    pub async fn reconcile_chain(
        &self,
        obj: &BenchObject,
        client: &Client,
        status_writer: StatusWriter,
        dependency_ready: bool,
    ) -> Result<Step, WorkloadError> {
        self.runs.fetch_add(1, Ordering::Relaxed);
        let name = obj.metadata.name.as_deref().ok_or(WorkloadError::Unnamed)?;
        self.with_state(name, |state| self.note_seen(state));
        let (outcome, step) = match dependency_target(obj) {
            Some(target) if !dependency_ready => (waiting_outcome(target), Step::WaitForDependency),
            _ => (Outcome::Done, Step::Done),
        };
        if status_writer == StatusWriter::Reconcile {
            let current = obj.status.clone().unwrap_or_default();
            let desired = current.after_provision(&outcome, obj.metadata.generation);
            if desired != current {
                patch_status(obj, client, &desired).await?;
            }
        }
        Ok(step)
    }

    /// `status` and `chain`: called by the observer for every version of an object it sees in
    /// the API; the object is done once its status says Ready for its current generation
    /// (whoever wrote it).
    ///
    /// `chain` also takes the hop sample: from the moment the observer saw the object's
    /// dependency Ready to now. The observer sees a dependency's Ready status before its
    /// dependent's (a dependent is written Ready only after its runtime saw the dependency
    /// Ready), provided it watched from before the runtime started; an object whose dependency
    /// it has not seen Ready counts as done without a sample.
    ///
    /// `operator`: the object is Ready then (not done: done is [`Recorder::observe_deleted`]).
    pub fn observe(&self, obj: &BenchObject) {
        let workload = self.config.workload;
        if !matches!(
            workload,
            Workload::Status | Workload::Chain | Workload::Operator
        ) || !status_is_current(obj)
        {
            return;
        }
        let Some(name) = obj.metadata.name.as_deref() else {
            return;
        };
        let now = Instant::now();
        // Read the dependency before locking this object's entry: both may share a shard.
        let dependency_ready_at = match (workload, obj.spec.depends_on.as_deref()) {
            (Workload::Chain, Some(dep)) => self.objects.get(dep).and_then(|s| s.ready_at),
            _ => None,
        };
        self.with_state(name, |state| {
            if workload == Workload::Operator {
                if !state.ready {
                    state.latencies.push(now - self.t0());
                    self.mark_ready(state);
                }
                return;
            }
            if state.done {
                return;
            }
            match workload {
                Workload::Chain => {
                    state.ready_at = Some(now);
                    if let Some(at) = dependency_ready_at {
                        state.latencies.push(now.saturating_duration_since(at));
                    }
                }
                _ => state.latencies.push(now - self.t0()),
            }
            self.mark_done(state);
        });
    }
}

impl Recorder {
    /// `operator`: called by the observer when it sees `obj` deleted (gone from the API, so its
    /// finalizers were removed); the object is done.
    pub fn observe_deleted(&self, obj: &BenchObject) {
        if self.config.workload != Workload::Operator {
            return;
        }
        if let Some(name) = obj.metadata.name.as_deref() {
            self.with_state(name, |state| self.mark_done(state));
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, Response};
    use kube::client::Body;
    use std::convert::Infallible;

    fn obj(name: &str) -> BenchObject {
        let mut o = BenchObject::new(name, BenchObjectSpec::default());
        o.metadata.namespace = Some("ns".into());
        o.metadata.generation = Some(1);
        o
    }

    fn config(workload: Workload, objects: u32) -> WorkloadConfig {
        WorkloadConfig {
            workload,
            objects,
            yields: 3,
            yield_interval: Duration::from_millis(1),
        }
    }

    /// A client whose every request fails the test (for workloads that must do no I/O).
    fn no_io_client() -> Client {
        Client::new(
            tower::service_fn(|req: Request<Body>| async move {
                panic!("unexpected request {} {}", req.method(), req.uri());
                #[allow(unreachable_code)]
                Ok::<Response<Body>, Infallible>(Response::new(Body::empty()))
            }),
            "ns",
        )
    }

    #[tokio::test]
    async fn noop_is_done_on_first_run() {
        let counter = RequestCounter::new();
        let rec = Recorder::start(config(Workload::Noop, 2), counter);
        let client = no_io_client();
        assert_eq!(
            rec.reconcile(&obj("a"), &client, StatusWriter::Reconcile)
                .await
                .unwrap(),
            Step::Done
        );
        assert!(rec.finished().is_none());
        assert_eq!(
            rec.reconcile(&obj("a"), &client, StatusWriter::Reconcile)
                .await
                .unwrap(),
            Step::Done
        );
        assert!(
            rec.finished().is_none(),
            "a second run of one object is not a second object"
        );
        rec.reconcile(&obj("b"), &client, StatusWriter::Reconcile)
            .await
            .unwrap();
        let snap = tokio::time::timeout(Duration::from_secs(5), rec.wait_done())
            .await
            .unwrap();
        assert_eq!(snap.runs, 3);
        assert_eq!(rec.done_count(), 2);
        assert_eq!(
            rec.latencies().len(),
            2,
            "one start→first-run sample per object"
        );
        // Runs after done still count in the live total but not in the snapshot.
        rec.reconcile(&obj("b"), &client, StatusWriter::Reconcile)
            .await
            .unwrap();
        assert_eq!(rec.runs(), 4);
        assert_eq!(rec.finished().unwrap().runs, 3);
    }

    #[tokio::test]
    async fn yield_yields_k_times_then_done() {
        let rec = Recorder::start(config(Workload::Yield, 1), RequestCounter::new());
        let client = no_io_client();
        for _ in 0..3 {
            assert_eq!(
                rec.reconcile(&obj("a"), &client, StatusWriter::Reconcile)
                    .await
                    .unwrap(),
                Step::YieldAfter(Duration::from_millis(1))
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert!(rec.finished().is_none());
        assert_eq!(
            rec.reconcile(&obj("a"), &client, StatusWriter::Reconcile)
                .await
                .unwrap(),
            Step::Done
        );
        let snap = rec.finished().unwrap();
        assert_eq!(snap.runs, 4);
        let lat = rec.latencies();
        assert_eq!(lat.len(), 3, "one lateness sample per run after a yield");
        assert!(
            lat.iter().all(|d| *d >= Duration::from_millis(1)),
            "slept 2 ms per 1 ms yield: {lat:?}"
        );
    }

    #[tokio::test]
    async fn churn_measures_stamp_to_run_and_finishes_on_last_update() {
        let rec = Recorder::start(config(Workload::Churn, 1), RequestCounter::new());
        let client = no_io_client();
        let mut o = obj("a");
        rec.reconcile(&o, &client, StatusWriter::Reconcile)
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(5), rec.wait_all_seen())
            .await
            .unwrap();
        assert!(rec.latencies().is_empty(), "no stamp, no sample");
        o.spec.stamp_micros = Some(wall_micros() - 5_000);
        rec.reconcile(&o, &client, StatusWriter::Reconcile)
            .await
            .unwrap();
        rec.reconcile(&o, &client, StatusWriter::Reconcile)
            .await
            .unwrap();
        assert_eq!(rec.latencies().len(), 1, "a stamp is measured once");
        assert!(rec.latencies()[0] >= Duration::from_millis(5));
        assert!(rec.finished().is_none());
        o.spec.stamp_micros = Some(wall_micros());
        o.spec.last_update = true;
        rec.reconcile(&o, &client, StatusWriter::Reconcile)
            .await
            .unwrap();
        assert_eq!(rec.finished().unwrap().runs, 4);
        assert_eq!(rec.latencies().len(), 2);
    }

    #[tokio::test]
    async fn status_is_patched_only_when_changed() {
        let (client, patches) = status_patch_client();
        let counter = RequestCounter::new();
        let rec = Recorder::start(config(Workload::Status, 2), counter);
        let mut o = obj("a");
        rec.reconcile(&o, &client, StatusWriter::Reconcile)
            .await
            .unwrap();
        {
            let p = patches.lock().unwrap();
            assert_eq!(p.len(), 1);
            assert_eq!(
                p[0].0,
                "/apis/bench.actorcile.dev/v1/namespaces/ns/benchobjects/a/status"
            );
            let patch = &p[0].1;
            assert_eq!(patch["status"]["phase"], "Ready");
            assert_eq!(patch["status"]["observedGeneration"], 1);
            assert_eq!(patch["status"]["conditions"][0]["type"], "Ready");
        }
        // Under a runtime that writes status itself, the reconcile writes nothing.
        rec.reconcile(&o, &client, StatusWriter::Runtime)
            .await
            .unwrap();
        assert_eq!(patches.lock().unwrap().len(), 1);
        // Done only once the observer sees the Ready status.
        rec.observe(&o);
        assert_eq!(rec.done_count(), 0);
        o.status = Some(ResourceStatus::default().with_ready(
            Phase::Ready,
            true,
            ReadyReason::Provisioned,
            "provisioned",
            Some(1),
        ));
        assert!(status_is_current(&o));
        rec.reconcile(&o, &client, StatusWriter::Reconcile)
            .await
            .unwrap();
        assert_eq!(
            patches.lock().unwrap().len(),
            1,
            "the echo run writes nothing"
        );
        rec.observe(&o);
        rec.observe(&o);
        assert_eq!(rec.done_count(), 1);
        assert_eq!(rec.latencies().len(), 1);
        assert!(rec.finished().is_none());
        let mut b = o.clone();
        b.metadata.name = Some("b".into());
        rec.observe(&b);
        assert_eq!(rec.finished().unwrap().runs, 3);
        o.metadata.generation = Some(2);
        assert!(!status_is_current(&o));
    }

    /// Status patches a test client received: (path, body).
    type Patches = Arc<Mutex<Vec<(String, serde_json::Value)>>>;

    /// A client that records every status patch it gets (path, body) and answers with the object;
    /// every request must be a merge patch.
    fn status_patch_client() -> (Client, Patches) {
        let patches = Arc::new(Mutex::new(Vec::new()));
        let seen = patches.clone();
        let client = Client::new(
            tower::service_fn(move |req: Request<Body>| {
                let seen = seen.clone();
                async move {
                    assert_eq!(req.method(), http::Method::PATCH);
                    assert_eq!(
                        req.headers()["content-type"],
                        "application/merge-patch+json"
                    );
                    let path = req.uri().path().to_string();
                    let body = http_body_util::BodyExt::collect(req.into_body())
                        .await
                        .unwrap()
                        .to_bytes();
                    let patch: serde_json::Value = serde_json::from_slice(&body).unwrap();
                    let name = path.rsplit('/').nth(1).unwrap().to_string();
                    let mut o = obj(&name);
                    o.status = serde_json::from_value(patch["status"].clone()).unwrap();
                    seen.lock().unwrap().push((path, patch));
                    Ok::<_, Infallible>(Response::new(Body::from(serde_json::to_vec(&o).unwrap())))
                }
            }),
            "ns",
        );
        (client, patches)
    }

    fn link(name: &str, depends_on: Option<&str>) -> BenchObject {
        let mut o = obj(name);
        o.spec.depends_on = depends_on.map(str::to_string);
        o
    }

    fn ready(mut o: BenchObject) -> BenchObject {
        o.status = Some(ResourceStatus::default().after_provision(&Outcome::Done, Some(1)));
        o
    }

    #[test]
    fn chain_layout_is_dependents_first() {
        // 25 objects in chains of 10: 0..=9, 10..=19, 20..=24; i depends on i+1 in its chain.
        let deps: Vec<Option<u32>> = (0..25).map(|i| chain_dependency(i, 25, 10)).collect();
        for i in [0, 1, 8, 10, 18, 20, 23] {
            assert_eq!(deps[i as usize], Some(i + 1), "object {i}");
        }
        for head in [9, 19, 24] {
            assert_eq!(deps[head as usize], None, "object {head} heads its chain");
        }
        assert_eq!(
            deps.iter().filter(|d| d.is_none()).count(),
            3,
            "three chains"
        );
        // Length 1: no dependencies at all; one chain longer than the objects: one chain.
        assert!((0..5).all(|i| chain_dependency(i, 5, 1).is_none()));
        assert_eq!(
            (0..5)
                .filter(|&i| chain_dependency(i, 5, 100).is_none())
                .count(),
            1
        );
        assert_eq!(chain_dependency(u32::MAX, u32::MAX, 10), None);
        assert_eq!(chain_dependency(3, 10, 0), None, "no panic on length 0");

        let spec = chain_spec(8, 25, 10);
        assert_eq!(spec.depends_on.as_deref(), Some("bench-000009"));
        assert_eq!(chain_spec(9, 25, 10).depends_on, None);
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(json, serde_json::json!({"dependsOn": "bench-000009"}));
        assert_eq!(
            serde_json::to_value(BenchObjectSpec::default()).unwrap(),
            serde_json::json!({}),
            "other workloads' objects are unchanged"
        );
    }

    #[tokio::test]
    async fn chain_writes_waiting_then_ready() {
        let (client, patches) = status_patch_client();
        let rec = Recorder::start(config(Workload::Chain, 2), RequestCounter::new());
        let mut b = link("b", Some("a"));

        // Dependency not Ready: the status says so, once.
        let step = rec
            .reconcile_chain(&b, &client, StatusWriter::Reconcile, false)
            .await
            .unwrap();
        assert_eq!(step, Step::WaitForDependency);
        {
            let p = patches.lock().unwrap();
            assert_eq!(p.len(), 1);
            assert_eq!(
                p[0].0,
                "/apis/bench.actorcile.dev/v1/namespaces/ns/benchobjects/b/status"
            );
            let st = &p[0].1["status"];
            assert_eq!(st["phase"], "Progressing");
            assert_eq!(st["observedGeneration"], 1);
            assert_eq!(st["conditions"][0]["status"], "False");
            assert_eq!(st["conditions"][0]["reason"], "DependencyNotReady");
            assert!(
                st["conditions"][0]["message"]
                    .as_str()
                    .unwrap()
                    .contains("BenchObject ns/a"),
                "{st}"
            );
            b.status = serde_json::from_value(st.clone()).unwrap();
        }
        let step = rec
            .reconcile_chain(&b, &client, StatusWriter::Reconcile, false)
            .await
            .unwrap();
        assert_eq!(step, Step::WaitForDependency);
        assert_eq!(
            patches.lock().unwrap().len(),
            1,
            "unchanged status: no write"
        );

        // Under actorcile the runtime writes; the reconcile only answers.
        let step = rec
            .reconcile_chain(&link("c", Some("b")), &client, StatusWriter::Runtime, false)
            .await
            .unwrap();
        assert_eq!(step, Step::WaitForDependency);
        assert_eq!(patches.lock().unwrap().len(), 1);

        // Dependency Ready: Ready for the generation.
        let step = rec
            .reconcile_chain(&b, &client, StatusWriter::Reconcile, true)
            .await
            .unwrap();
        assert_eq!(step, Step::Done);
        {
            let p = patches.lock().unwrap();
            assert_eq!(p.len(), 2);
            let st = &p[1].1["status"];
            assert_eq!(st["phase"], "Ready");
            assert_eq!(st["conditions"][0]["status"], "True");
            b.status = serde_json::from_value(st.clone()).unwrap();
        }
        assert!(status_is_current(&b));
        rec.reconcile_chain(&b, &client, StatusWriter::Reconcile, true)
            .await
            .unwrap();
        assert_eq!(
            patches.lock().unwrap().len(),
            2,
            "the echo run writes nothing"
        );

        // A head needs no dependency; `reconcile` without a check lets only heads proceed.
        let head = link("a", None);
        assert_eq!(
            rec.reconcile(&head, &client, StatusWriter::Runtime)
                .await
                .unwrap(),
            Step::Done
        );
        assert_eq!(
            rec.reconcile(&b, &client, StatusWriter::Runtime)
                .await
                .unwrap(),
            Step::WaitForDependency
        );
        assert_eq!(rec.runs(), 7);
        assert_eq!(
            rec.done_count(),
            0,
            "only the observer makes an object done"
        );
    }

    #[tokio::test]
    async fn chain_observer_measures_hops() {
        let rec = Recorder::start(config(Workload::Chain, 3), RequestCounter::new());
        let (a, b, c) = (link("a", None), link("b", Some("a")), link("c", Some("b")));
        // Not Ready yet: nothing.
        rec.observe(&a);
        rec.observe(&b);
        assert_eq!(rec.done_count(), 0);

        rec.observe(&ready(a.clone()));
        assert_eq!(rec.done_count(), 1);
        assert!(rec.latencies().is_empty(), "a head is no hop");
        tokio::time::sleep(Duration::from_millis(20)).await;
        rec.observe(&ready(b.clone()));
        rec.observe(&ready(b.clone()));
        assert_eq!(rec.done_count(), 2, "seen twice, done once");
        let lat = rec.latencies();
        assert_eq!(lat.len(), 1);
        assert!(lat[0] >= Duration::from_millis(20), "{lat:?}");
        assert!(rec.finished().is_none());

        // Ready for an older generation does not count.
        let mut stale = ready(c.clone());
        stale.metadata.generation = Some(2);
        rec.observe(&stale);
        assert_eq!(rec.done_count(), 2);
        rec.observe(&ready(c.clone()));
        let snap = rec.finished().expect("all three done");
        assert_eq!(snap.runs, 0);
        let all = rec.latencies();
        assert_eq!(all.len(), 2);
        assert!(
            all.iter().any(|d| *d < lat[0]),
            "c's hop starts at b's Ready, not a's: {all:?}"
        );
    }

    #[test]
    fn chain_observer_without_the_dependency_seen_takes_no_sample() {
        let rec = Recorder::start(config(Workload::Chain, 2), RequestCounter::new());
        rec.observe(&ready(link("b", Some("a"))));
        assert_eq!(rec.done_count(), 1);
        assert!(rec.latencies().is_empty());
        rec.observe(&ready(link("a", None)));
        assert!(rec.finished().is_some());
        assert!(rec.latencies().is_empty());
    }

    #[test]
    fn dependency_readiness() {
        let a = link("a", None);
        assert!(!is_ready_dependency(&a));
        assert!(is_ready_dependency(&ready(a.clone())));
        let mut deleting = ready(a.clone());
        deleting.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
        );
        assert!(!is_ready_dependency(&deleting));
        let t = dependency_target(&link("b", Some("a"))).unwrap();
        assert_eq!(t, Target::for_kind::<BenchObject>(Some("ns"), "a"));
        assert_eq!(t.kind, "BenchObject");
        assert_eq!(dependency_target(&a), None);
        match waiting_outcome(t.clone()) {
            Outcome::Waiting { target, reason } => {
                assert_eq!(target, t);
                assert_eq!(reason.code(), "DependencyNotReady");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn crd_shape() {
        let crd = bench_crd();
        let text = serde_json::to_string(&crd).unwrap();
        assert!(
            !text.contains(r#""default":"""#),
            "no empty-string defaults: {text}"
        );
        let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
        let cond =
            &schema["openAPIV3Schema"]["properties"]["status"]["properties"]["conditions"]["items"];
        assert_eq!(cond["properties"]["reason"]["type"], "string");
        assert_eq!(crd.spec.group, "bench.actorcile.dev");
        assert_eq!(crd.spec.names.plural, "benchobjects");
        assert_eq!(crd.spec.scope, "Namespaced");
        let v = &crd.spec.versions[0];
        assert!(v.subresources.as_ref().unwrap().status.is_some());
        let depends_on =
            &schema["openAPIV3Schema"]["properties"]["spec"]["properties"]["dependsOn"];
        assert_eq!(depends_on["type"], "string", "{depends_on}");
    }
}
