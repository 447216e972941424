//! The runtime's counters: cheap atomics shared by every controller, read with
//! [`Metrics::snapshot`].

use crossbeam_utils::CachePadded;
use std::sync::atomic::{AtomicU64, Ordering};
use thread_local::ThreadLocal;

use crate::messages::Trigger;
use serde::Serialize;

/// Runtime-wide counters, shared by every controller. Cheap atomics; read with
/// [`Metrics::snapshot`].
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    // Every reconcile touches these from whichever worker runs it: no `runs` counter of its own (it
    // is the sum of the two below), and peaks are read before they are raised, so a reconcile makes
    // as few read-modify-writes of these shared cache lines as it can.
    pub(crate) provision_reconciles: AtomicU64,
    pub(crate) deprovision_reconciles: AtomicU64,
    pub(crate) restarts: AtomicU64,
    pub(crate) quarantined: AtomicU64,
    pub(crate) status_writes: AtomicU64,
    pub(crate) in_flight: AtomicU64,
    pub(crate) peak_in_flight: AtomicU64,
    pub(crate) live_actors: AtomicU64,
    pub(crate) peak_live_actors: AtomicU64,
    pub(crate) passivations: AtomicU64,
    pub(crate) activations: AtomicU64,
    pub(crate) spawns: AtomicU64,
    pub(crate) status_conflicts: AtomicU64,
    pub(crate) status_rejected: AtomicU64,
    pub(crate) write_timeouts: AtomicU64,
    pub(crate) ignored: AtomicU64,
    /// The runtime's reference index, read for its size gauges.
    pub(crate) reference_index:
        std::sync::OnceLock<std::sync::Weak<crate::references::ReferenceIndex>>,
    /// Watch tasks started again after they stopped ([`crate::watch_tasks`]).
    pub(crate) watch_restarts: std::sync::Arc<AtomicU64>,
    /// Every controller's own figures, in registration order.
    kinds: std::sync::Mutex<Vec<std::sync::Arc<KindMetrics>>>,
}

/// A point-in-time copy of the runtime's counters ([`RuntimeHandle::metrics`](crate::runtime::RuntimeHandle::metrics)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MetricsSnapshot {
    /// Reconciles started (provision + deprovision).
    pub reconciles: u64,
    /// Provision reconciles.
    pub provision_reconciles: u64,
    /// Deprovision reconciles.
    pub deprovision_reconciles: u64,
    /// Resource actors restarted after a failure or panic.
    pub restarts: u64,
    /// Resources quarantined past the restart intensity.
    pub quarantined: u64,
    /// Status patches sent (only when status changed).
    pub status_writes: u64,
    /// Reconciles running right now.
    pub in_flight: u64,
    /// Most reconciles ever running at once.
    pub peak_in_flight: u64,
    /// Resource actors alive right now.
    pub live_actors: u64,
    /// Most resource actors ever alive at once.
    pub peak_live_actors: u64,
    /// Passivations: an actor with nothing due handed its object back (the actor itself is
    /// kept to adopt the next activation, or stopped past the idle bound).
    pub passivations: u64,
    /// Activations: an actor began serving an object (its first activation, a re-activation
    /// after passivation, or a restart).
    pub activations: u64,
    /// Resource actors spawned. Most activations spawn none: an actor that passivated, or whose
    /// object was deleted, adopts the next activation.
    pub spawns: u64,
    /// Status patches refused because the object changed since the reconcile read it (the object
    /// runs again on the newer version).
    pub status_conflicts: u64,
    /// Status patches refused as invalid (`422`: a CRD validation rule or the schema); each is
    /// retried with the error backoff and reported in a `StatusRejected` Warning Event.
    pub status_rejected: u64,
    /// Writes of the runtime's own abandoned unanswered at the policy's `write_timeout` (each
    /// retried).
    pub write_timeouts: u64,
    /// Reconciles skipped because the object carries the ignore annotation
    /// ([`ignore_annotation`](crate::names::OperatorNames::ignore_annotation)).
    pub ignored: u64,
    /// Watch tasks started again after they stopped (a panic, or their stream ended); each
    /// failed `/readyz` until it ran again.
    pub watch_restarts: u64,
}

impl Metrics {
    /// Copy the counters.
    pub(crate) fn snapshot(&self) -> MetricsSnapshot {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        MetricsSnapshot {
            reconciles: l(&self.provision_reconciles) + l(&self.deprovision_reconciles),
            provision_reconciles: l(&self.provision_reconciles),
            deprovision_reconciles: l(&self.deprovision_reconciles),
            restarts: l(&self.restarts),
            quarantined: l(&self.quarantined),
            status_writes: l(&self.status_writes),
            in_flight: l(&self.in_flight),
            peak_in_flight: l(&self.peak_in_flight),
            live_actors: l(&self.live_actors),
            peak_live_actors: l(&self.peak_live_actors),
            passivations: l(&self.passivations),
            activations: l(&self.activations),
            spawns: l(&self.spawns),
            status_conflicts: l(&self.status_conflicts),
            status_rejected: l(&self.status_rejected),
            write_timeouts: l(&self.write_timeouts),
            ignored: l(&self.ignored),
            watch_restarts: l(&self.watch_restarts),
        }
    }

    /// Register a controller's figures.
    pub(crate) fn add_kind(&self, kind: std::sync::Arc<KindMetrics>) {
        self.kinds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(kind);
    }

    /// Copy every controller's figures.
    pub(crate) fn kinds(&self) -> Vec<KindMetricsSnapshot> {
        let kinds = self.kinds.lock().unwrap_or_else(|e| e.into_inner()).clone();
        kinds.iter().map(|k| k.snapshot()).collect()
    }

    pub(crate) fn reconcile_started(&self, deleting: bool) -> InFlight<'_> {
        if deleting {
            self.deprovision_reconciles.fetch_add(1, Ordering::Relaxed);
        } else {
            self.provision_reconciles.fetch_add(1, Ordering::Relaxed);
        }
        let now = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        raise_peak(&self.peak_in_flight, now);
        InFlight(self)
    }

    /// Every actor start is an activation: counts both, and the peak of live actors.
    pub(crate) fn actor_started(&self) {
        Self::inc(&self.activations);
        let live = self.live_actors.fetch_add(1, Ordering::Relaxed) + 1;
        raise_peak(&self.peak_live_actors, live);
    }

    pub(crate) fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn dec(counter: &AtomicU64) {
        counter.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Raise `peak` to `value` if it is higher (a plain load first: most calls raise nothing).
fn raise_peak(peak: &AtomicU64, value: u64) {
    if value > peak.load(Ordering::Relaxed) {
        peak.fetch_max(value, Ordering::Relaxed);
    }
}

/// Decrements the in-flight gauge when a reconcile ends, even by panic.
pub(crate) struct InFlight<'a>(&'a Metrics);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        Metrics::dec(&self.0.in_flight);
    }
}

/// How a reconcile ended: the `result` label of `actorcile_reconciles_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ReconcileResult {
    /// [`Outcome::Done`](crate::provisioners::Outcome::Done), or a deprovision that finished.
    Done,
    /// [`Outcome::Yield`](crate::provisioners::Outcome::Yield).
    Yield,
    /// [`Outcome::Waiting`](crate::provisioners::Outcome::Waiting) (deletion blocked by
    /// referrers included).
    Waiting,
    /// [`Outcome::Failed`](crate::provisioners::Outcome::Failed).
    Failed,
    /// [`Outcome::Terminal`](crate::provisioners::Outcome::Terminal).
    Terminal,
    /// [`Outcome::UserActionRequired`](crate::provisioners::Outcome::UserActionRequired).
    UserActionRequired,
    /// Cut because the object moved on (a new generation or a deletion arrived); it runs again
    /// at once ([`Controller::cancel_on_change`](crate::runtime::Controller::cancel_on_change)).
    Cancelled,
}

impl ReconcileResult {
    /// Every result, in label order.
    pub const ALL: [ReconcileResult; 7] = [
        ReconcileResult::Done,
        ReconcileResult::Yield,
        ReconcileResult::Waiting,
        ReconcileResult::Failed,
        ReconcileResult::Terminal,
        ReconcileResult::UserActionRequired,
        ReconcileResult::Cancelled,
    ];

    /// The label value (`done`, `yield`, `waiting`, `failed`, `terminal`,
    /// `user_action_required`, `cancelled`).
    pub fn as_str(self) -> &'static str {
        match self {
            ReconcileResult::Done => "done",
            ReconcileResult::Yield => "yield",
            ReconcileResult::Waiting => "waiting",
            ReconcileResult::Failed => "failed",
            ReconcileResult::Terminal => "terminal",
            ReconcileResult::UserActionRequired => "user_action_required",
            ReconcileResult::Cancelled => "cancelled",
        }
    }

    pub(crate) fn of(outcome: &crate::provisioners::Outcome) -> Self {
        use crate::provisioners::Outcome;
        match outcome {
            Outcome::Done => ReconcileResult::Done,
            Outcome::Yield { .. } => ReconcileResult::Yield,
            Outcome::Waiting { .. } => ReconcileResult::Waiting,
            Outcome::Failed { .. } => ReconcileResult::Failed,
            Outcome::Terminal(_) => ReconcileResult::Terminal,
            Outcome::UserActionRequired(_) => ReconcileResult::UserActionRequired,
        }
    }
}

/// Upper bounds (seconds) of the duration histograms' buckets; a last `+Inf` bucket follows.
pub(crate) const DURATION_BUCKETS: [f64; 16] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// Figures written by every worker thread on each reconcile and read rarely: each thread adds to a
/// copy of its own, on a cache line of its own, and a read sums the copies. One atomic shared
/// by every thread moves its cache line between cores on each write. (Measured with
/// `bench --workload yield`, alternating builds: these cells take about 3 % off a yield's CPU;
/// removing every per-reconcile figure would take about 8 %.)
/// `thread_local` gives a new thread the slot (and counts) of one that exited, so the copies
/// do not grow with threads that come and go, and nothing counted is lost.
#[derive(Debug, Default)]
struct PerThread<T: Send + Sync + Default>(ThreadLocal<CachePadded<T>>);

impl<T: Send + Sync + Default> PerThread<T> {
    /// This thread's copy (only this thread writes it).
    fn local(&self) -> &T {
        self.0.get_or_default()
    }

    /// Every thread's copy.
    fn each(&self) -> impl Iterator<Item = &T> {
        self.0.iter().map(|c| &**c)
    }
}

/// Adds `n` to a cell only the calling thread writes (a load and a store, no locked add).
fn bump(cell: &AtomicU64, n: u64) {
    cell.store(
        cell.load(Ordering::Relaxed).wrapping_add(n),
        Ordering::Relaxed,
    );
}

/// The element-wise sum of every thread's copy of an array of cells.
fn summed<'a, const N: usize>(copies: impl Iterator<Item = &'a [AtomicU64; N]>) -> [u64; N] {
    let mut totals = [0u64; N];
    for cells in copies {
        for (total, cell) in totals.iter_mut().zip(cells) {
            *total = total.wrapping_add(cell.load(Ordering::Relaxed));
        }
    }
    totals
}

/// One thread's part of a [`Histogram`].
#[derive(Debug, Default)]
struct HistogramCells {
    /// Per bucket (not cumulative); the last is `+Inf`.
    buckets: [AtomicU64; DURATION_BUCKETS.len() + 1],
    sum_nanos: AtomicU64,
}

/// A duration histogram of per-thread atomics: an observation is two stores to the observing
/// thread's own cells, no lock.
#[derive(Debug, Default)]
pub(crate) struct Histogram(PerThread<HistogramCells>);

impl Histogram {
    pub(crate) fn observe(&self, d: std::time::Duration) {
        let s = d.as_secs_f64();
        let i = DURATION_BUCKETS
            .iter()
            .position(|&b| s <= b)
            .unwrap_or(DURATION_BUCKETS.len());
        let cells = self.0.local();
        bump(&cells.buckets[i], 1);
        bump(&cells.sum_nanos, d.as_nanos().min(u64::MAX as u128) as u64);
    }

    fn snapshot(&self) -> HistogramSnapshot {
        let per_bucket = summed(self.0.each().map(|cells| &cells.buckets));
        let sum_nanos = self
            .0
            .each()
            .map(|cells| cells.sum_nanos.load(Ordering::Relaxed))
            .fold(0u64, u64::wrapping_add);
        let mut cumulative = 0;
        let mut buckets = Vec::with_capacity(per_bucket.len());
        for (i, n) in per_bucket.iter().enumerate() {
            cumulative += n;
            buckets.push((
                DURATION_BUCKETS.get(i).copied().unwrap_or(f64::INFINITY),
                cumulative,
            ));
        }
        HistogramSnapshot {
            count: cumulative,
            sum_seconds: sum_nanos as f64 / 1e9,
            buckets,
        }
    }
}

/// A point-in-time copy of a duration histogram.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct HistogramSnapshot {
    /// Observations.
    pub count: u64,
    /// Their sum, in seconds.
    pub sum_seconds: f64,
    /// (upper bound in seconds, observations at or below it), cumulative, ending with `+Inf`.
    pub buckets: Vec<(f64, u64)>,
}

/// Reads a kind's gauges: objects cached, wake-ups armed, reconciles waiting for a reconcile slot.
pub(crate) type ReadGauges = Box<dyn Fn() -> (u64, u64, u64) + Send + Sync>;

/// One controller's own figures (the runtime-wide ones are in [`MetricsSnapshot`]).
pub(crate) struct KindMetrics {
    pub(crate) kind: String,
    gauges: ReadGauges,
    results: PerThread<[AtomicU64; ReconcileResult::ALL.len()]>,
    triggers: PerThread<[AtomicU64; Trigger::ALL.len()]>,
    pub(crate) reconcile_duration: Histogram,
    pub(crate) due_to_start: Histogram,
    pub(crate) events: AtomicU64,
    pub(crate) events_dropped: AtomicU64,
    /// When each running reconcile started, for the count and the longest running. A lock, taken
    /// at each reconcile's start and end and at a scrape: the gauges need the oldest start of a
    /// set that changes at every reconcile.
    running: std::sync::Mutex<slab::Slab<tokio::time::Instant>>,
}

/// A reconcile of a kind, counted as running until dropped ([`KindMetrics::running`]).
pub(crate) struct Running<'a> {
    kind: &'a KindMetrics,
    key: usize,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let mut running = self.kind.running.lock().unwrap_or_else(|e| e.into_inner());
        running.try_remove(self.key);
    }
}

impl std::fmt::Debug for KindMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KindMetrics")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl KindMetrics {
    pub(crate) fn new(kind: &str, gauges: ReadGauges) -> Self {
        Self {
            kind: kind.to_string(),
            gauges,
            results: Default::default(),
            triggers: Default::default(),
            reconcile_duration: Histogram::default(),
            due_to_start: Histogram::default(),
            events: AtomicU64::new(0),
            events_dropped: AtomicU64::new(0),
            running: Default::default(),
        }
    }

    /// A reconcile that started at `started`, running until the guard drops (its end, or its
    /// abandonment when its shard is lost).
    pub(crate) fn running(&self, started: tokio::time::Instant) -> Running<'_> {
        let key = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(started);
        Running { kind: self, key }
    }

    /// Reconciles running now, and how long the longest of them has run.
    fn running_now(&self) -> (u64, std::time::Duration) {
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let oldest = running.iter().map(|(_, started)| *started).min();
        let longest = oldest.map_or(std::time::Duration::ZERO, |o| o.elapsed());
        (running.len() as u64, longest)
    }

    /// A reconcile started, for `trigger`.
    pub(crate) fn triggered(&self, trigger: Trigger) {
        bump(&self.triggers.local()[trigger as usize], 1);
    }

    pub(crate) fn reconciled(&self, result: ReconcileResult, took: std::time::Duration) {
        bump(&self.results.local()[result as usize], 1);
        self.reconcile_duration.observe(took);
    }

    pub(crate) fn snapshot(&self) -> KindMetricsSnapshot {
        let (objects, wake_ups, waiting) = (self.gauges)();
        let results = summed(self.results.each());
        let triggers = summed(self.triggers.each());
        let (running, longest_running) = self.running_now();
        KindMetricsSnapshot {
            wake_ups,
            waiting,
            running,
            longest_running,
            kind: self.kind.clone(),
            reconciles: ReconcileResult::ALL
                .iter()
                .map(|&r| (r, results[r as usize]))
                .collect(),
            triggers: Trigger::ALL
                .iter()
                .map(|&t| (t, triggers[t as usize]))
                .collect(),
            reconcile_duration: self.reconcile_duration.snapshot(),
            due_to_start: self.due_to_start.snapshot(),
            objects,
            events: self.events.load(Ordering::Relaxed),
            events_dropped: self.events_dropped.load(Ordering::Relaxed),
        }
    }
}

/// A point-in-time copy of one controller's figures
/// ([`RuntimeHandle::kind_metrics`](crate::runtime::RuntimeHandle::kind_metrics)).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct KindMetricsSnapshot {
    /// The controller's kind.
    pub kind: String,
    /// Reconciles that ended, by how they ended (every [`ReconcileResult`], zeros included).
    pub reconciles: Vec<(ReconcileResult, u64)>,
    /// Reconciles that started, by why they ran (every [`Trigger`], zeros included).
    pub triggers: Vec<(Trigger, u64)>,
    /// How long reconciles took.
    pub reconcile_duration: HistogramSnapshot,
    /// From a reconcile becoming due in the object's actor (a watch event with news, a
    /// notification, a wake-up, an activation) to its start: the wait for a reconcile slot.
    pub due_to_start: HistogramSnapshot,
    /// Objects of the kind in the runtime's cache.
    pub objects: u64,
    /// Wake-ups armed and not yet due (yields, backoffs, polls) of live actors.
    pub wake_ups: u64,
    /// Due reconciles and activations waiting for a reconcile slot.
    pub waiting: u64,
    /// Reconciles of the kind running now.
    pub running: u64,
    /// How long the longest-running of them has run (zero when none runs).
    pub longest_running: std::time::Duration,
    /// Kubernetes Events published for the kind's objects.
    pub events: u64,
    /// Events not published because their object was over its Event budget.
    pub events_dropped: u64,
}

impl KindMetricsSnapshot {
    /// Reconciles that started for `trigger`.
    pub fn triggered_by(&self, trigger: Trigger) -> u64 {
        self.triggers
            .iter()
            .find(|(t, _)| *t == trigger)
            .map_or(0, |(_, n)| *n)
    }

    /// Reconciles that ended with `result`.
    pub fn reconciles_with(&self, result: ReconcileResult) -> u64 {
        self.reconciles
            .iter()
            .find(|(r, _)| *r == result)
            .map_or(0, |(_, n)| *n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_histogram_counts_the_observations_of_every_thread_including_exited_ones() {
        let h = std::sync::Arc::new(Histogram::default());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let h = h.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        h.observe(Duration::from_millis(2 + t));
                    }
                    h.observe(Duration::from_secs(100)); // +Inf
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        h.observe(Duration::from_micros(100)); // this thread: the first bucket
        let snap = h.snapshot();
        // Cumulative: 100 µs; then 2 ms (thread 0); then 3, 4 and 5 ms; then 100 s from each.
        assert_eq!(snap.count, 4 * 1001 + 1);
        assert_eq!(snap.buckets[0], (0.0005, 1));
        assert_eq!(snap.buckets[2], (0.0025, 1 + 1000));
        assert_eq!(snap.buckets[3], (0.005, 1 + 4 * 1000));
        assert_eq!(snap.buckets[15], (60.0, 1 + 4 * 1000));
        assert_eq!(snap.buckets.last(), Some(&(f64::INFINITY, 4 * 1001 + 1)));
        let expected = 4.0 * 100.0 + 1000.0 * (0.002 + 0.003 + 0.004 + 0.005) + 0.0001;
        assert!((snap.sum_seconds - expected).abs() < 1e-9, "{snap:?}");
    }

    #[test]
    fn run_results_are_summed_over_threads() {
        let k = std::sync::Arc::new(KindMetrics::new("T", Box::new(|| (0, 0, 0))));
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let k = k.clone();
                std::thread::spawn(move || {
                    for _ in 0..10 {
                        k.reconciled(ReconcileResult::Yield, Duration::from_millis(1));
                    }
                    k.reconciled(ReconcileResult::Failed, Duration::from_millis(1));
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let snap = k.snapshot();
        let reconciles: std::collections::HashMap<_, _> = snap.reconciles.into_iter().collect();
        assert_eq!(reconciles[&ReconcileResult::Yield], 30);
        assert_eq!(reconciles[&ReconcileResult::Failed], 3);
        assert_eq!(reconciles[&ReconcileResult::Done], 0);
        assert_eq!(snap.reconcile_duration.count, 33);
    }

    #[tokio::test(start_paused = true)]
    async fn the_longest_running_reconcile_is_the_oldest_still_running() {
        let k = KindMetrics::new("T", Box::new(|| (0, 0, 0)));
        assert_eq!(k.running_now(), (0, Duration::ZERO));
        let first = k.running(tokio::time::Instant::now());
        tokio::time::advance(Duration::from_secs(10)).await;
        let second = k.running(tokio::time::Instant::now());
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(k.running_now(), (2, Duration::from_secs(15)));
        drop(first);
        assert_eq!(k.running_now(), (1, Duration::from_secs(5)));
        drop(second);
        assert_eq!(k.running_now(), (0, Duration::ZERO));
    }
}
