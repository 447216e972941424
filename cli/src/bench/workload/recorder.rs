//! [`Recorder`]: what the runtimes' reconciles of the bench objects did, object by object (seen,
//! done, runs, the changes they saw), and the workload's step for each reconcile.

use super::*;

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
