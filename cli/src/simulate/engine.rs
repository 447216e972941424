//! One run: a fresh in-process cluster and runtime, one policy, one scenario, on the current
//! (paused-clock) tokio runtime.
//!
//! The scenario's faults are on from the start. The runtime is started; once its initial list is
//! done (its watch request has reached the cluster), virtual time 0 begins and the objects are
//! created, 256 requests at a time, retrying injected errors; those requests are not counted in
//! the report. The scenario is thus N resources arriving at a running operator; time 0 is when
//! the runtime is watching, so its start-up is not counted.
//!
//! Readiness is observed honestly, from the API: an observer watches the objects (its own
//! requests are not counted in the report) and records the virtual time of every change of the
//! number of Ready objects; it is sampled every `sample_every` for the plot. The run stops when
//! every object is Ready (unless the scenario says `stop_when_ready = false`), when `duration`
//! has passed, or when a manager escalates.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use actorcile::cluster::{ApiServer, ApiServerStats};
use actorcile::prelude::*;
use futures::StreamExt;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{CustomResourceExt, ResourceExt};
use tokio::sync::watch;
use tokio::time::Instant;
use tower::ServiceExt;

use super::mix;
use super::report::{Percentiles, PolicyResult};
use super::scenario::Scenario;
use super::workload::{Behaviour, SimObject, SimObjectSpec, tree};

/// Why a run could not be carried out (not a policy's poor result: that is reported).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The in-process cluster refused the set-up.
    #[error("setting up the in-process cluster failed: {0}")]
    Setup(String),
    /// The runtime did not start.
    #[error("the runtime did not start: {0}")]
    Runtime(#[from] actorcile::Error),
}

/// The namespace the objects live in.
const NAMESPACE: &str = "default";

/// Readiness as the observer sees it.
struct Tracker {
    ready: HashMap<String, bool>,
    count: usize,
    /// Thresholds (object counts) and when they were first reached.
    thresholds: [usize; 4],
    reached: [Option<Duration>; 4],
    t0: Instant,
}

impl Tracker {
    fn new(n: usize, t0: Instant) -> Self {
        let at = |p: f64| ((n as f64 * p).ceil() as usize).clamp(1, n);
        Self {
            ready: HashMap::with_capacity(n),
            count: 0,
            thresholds: [at(0.5), at(0.9), at(0.99), n],
            reached: [None; 4],
            t0,
        }
    }

    fn observe(&mut self, obj: &SimObject) -> usize {
        let now_ready = obj.status.as_ref().is_some_and(|s| s.is_ready());
        let was = self
            .ready
            .insert(obj.name_any(), now_ready)
            .unwrap_or(false);
        match (was, now_ready) {
            (false, true) => self.count += 1,
            (true, false) => self.count -= 1,
            _ => {}
        }
        let t = Instant::now().saturating_duration_since(self.t0);
        for (i, th) in self.thresholds.iter().enumerate() {
            if self.reached[i].is_none() && self.count >= *th {
                self.reached[i] = Some(t);
            }
        }
        self.count
    }
}

/// A client whose requests are counted in `counter`, so they can be left out of the report.
fn counted_client(cluster: &ApiServer, counter: Arc<AtomicU64>) -> kube::Client {
    let svc = cluster
        .service()
        .map_request(move |r: http::Request<kube::client::Body>| {
            counter.fetch_add(1, Ordering::Relaxed);
            r
        });
    kube::Client::new(svc, NAMESPACE)
}

/// Create the `n` objects, 256 at a time, retrying injected errors. Returns how many create
/// requests that took.
async fn create_objects(api: &Api<SimObject>, n: usize) -> Result<u64, RunError> {
    let width = n.to_string().len();
    let attempts = Arc::new(AtomicU64::new(0));
    let results: Vec<Result<(), RunError>> = futures::stream::iter(0..n)
        .map(|i| {
            let attempts = attempts.clone();
            async move {
                let mut o = SimObject::new(
                    &format!("obj-{i:0width$}"),
                    SimObjectSpec { index: i as u32 },
                );
                o.metadata.namespace = Some(NAMESPACE.into());
                for _ in 0..CREATE_ATTEMPTS {
                    attempts.fetch_add(1, Ordering::Relaxed);
                    match api.create(&PostParams::default(), &o).await {
                        Ok(_) => return Ok(()),
                        Err(kube::Error::Api(s)) if s.code == 409 => return Ok(()),
                        Err(kube::Error::Api(s)) if s.code >= 500 => {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        Err(e) => {
                            return Err(RunError::Setup(format!("creating object {i}: {e}")));
                        }
                    }
                }
                Err(RunError::Setup(format!(
                    "creating object {i}: still failing after {CREATE_ATTEMPTS} attempts"
                )))
            }
        })
        .buffer_unordered(256)
        .collect()
        .await;
    for r in results {
        r?;
    }
    Ok(attempts.load(Ordering::Relaxed))
}

/// Objects not Ready, counted by their Ready condition's reason (`NoStatus` when they have none).
async fn not_ready_reasons(api: &Api<SimObject>) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    let mut lp = ListParams::default().limit(1000);
    loop {
        let Ok(page) = api.list(&lp).await else {
            out.insert("Unknown (list failed)".to_string(), 0);
            return out;
        };
        for o in &page.items {
            let status = o.status.as_ref();
            if status.is_some_and(|s| s.is_ready()) {
                continue;
            }
            let reason = status
                .and_then(|s| s.ready())
                .map_or_else(|| "NoStatus".to_string(), |c| c.reason.clone());
            *out.entry(reason).or_default() += 1;
        }
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
            _ => return out,
        }
    }
}

/// How long (virtual) to wait for the runtime's initial list before creating objects anyway.
const SYNC_LIMIT: Duration = Duration::from_secs(300);

/// Attempts per object at creating it (injected 500s are retried).
const CREATE_ATTEMPTS: u32 = 1000;

fn minus(a: ApiServerStats, b: ApiServerStats) -> ApiServerStats {
    ApiServerStats {
        get: a.get - b.get,
        list: a.list - b.list,
        watch: a.watch - b.watch,
        create: a.create - b.create,
        update: a.update - b.update,
        patch: a.patch - b.patch,
        delete: a.delete - b.delete,
        total: a.total - b.total,
        injected_errors: a.injected_errors - b.injected_errors,
        injected_conflicts: a.injected_conflicts - b.injected_conflicts,
        throttled: a.throttled - b.throttled,
    }
}

/// The seed a policy runs with: its own, else one derived from the scenario's.
pub fn policy_seed(policy: &SupervisorPolicy, scenario: &Scenario) -> u64 {
    policy
        .kind
        .seed
        .unwrap_or_else(|| mix(&[scenario.seed, 0x5EED]))
}

/// Run `scenario` under `policy` (reported as `name`). Call on a current-thread tokio runtime
/// with a paused clock, one run per runtime, for reproducible results.
pub async fn run_one(
    scenario: &Scenario,
    name: &str,
    policy: &SupervisorPolicy,
) -> Result<PolicyResult, RunError> {
    let wall = std::time::Instant::now();
    let n = scenario.objects;
    let mut policy = policy.clone();
    policy.kind.seed = Some(policy_seed(&policy, scenario));
    // The runtime draws a few things (poll jitter, kube's watch backoff jitter) from fastrand's
    // thread-local generator: seed it, so those draws repeat too.
    fastrand::seed(mix(&[scenario.seed, 0x7EAD]));

    let cluster = ApiServer::builder().seed(scenario.seed).build();
    cluster
        .install_crd(&SimObject::crd())
        .map_err(|e| RunError::Setup(e.to_string()))?;
    cluster.set_faults(scenario.faults.to_faults(scenario.seed));
    let base = cluster.stats();
    let client = cluster.client();
    let behaviour = Behaviour::new(scenario.seed, scenario.provisioner.clone());
    let mut rt = Runtime::builder(
        client,
        OperatorNames::new("simulate-operator", "simulate.actorcile.dev"),
    )
    .policy(policy)
    .controller(Controller::<SimObject>::new(tree(
        behaviour,
        scenario.nodes.clone(),
    )))
    .start()
    .await?;
    // Create nothing before the runtime's initial list is done (its watch request has come), so
    // time 0 is a runtime that is watching.
    let sync_limit = Instant::now() + SYNC_LIMIT;
    while cluster.stats().watch == base.watch && Instant::now() < sync_limit {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Virtual time 0: the objects start being created. The observer watches them.
    let t0 = Instant::now();
    let tracker = Arc::new(Mutex::new(Tracker::new(n, t0)));
    let (count_tx, count_rx) = watch::channel(0usize);
    let mut all_ready_rx = count_rx.clone();
    // Requests of the observer and of the set-up (creating the objects): left out of the report.
    let uncounted = Arc::new(AtomicU64::new(0));
    let obs_api: Api<SimObject> =
        Api::namespaced(counted_client(&cluster, uncounted.clone()), NAMESPACE);
    let obs_tracker = tracker.clone();
    let observer = tokio::spawn(async move {
        let mut events = std::pin::pin!(
            watcher(obs_api, watcher::Config::default())
                .default_backoff()
                .applied_objects()
        );
        while let Some(ev) = events.next().await {
            if let Ok(obj) = ev {
                let c = obs_tracker
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .observe(&obj);
                count_tx.send_if_modified(|old| std::mem::replace(old, c) != c);
            }
        }
    });
    let setup: Api<SimObject> =
        Api::namespaced(counted_client(&cluster, uncounted.clone()), NAMESPACE);
    let setup_writes = create_objects(&setup, n).await?;

    let every = scenario.sample_every;
    let deadline = t0 + scenario.duration;
    let mut series: Vec<(f64, f64)> = vec![(0.0, 0.0)];
    let fraction = |c: usize| c as f64 / n as f64;
    let mut next = t0 + every;
    let mut escalated = None;
    loop {
        let until = next.min(deadline);
        tokio::select! {
            biased;
            e = rt.escalated() => {
                escalated = Some(e.to_string());
                break;
            }
            _ = all_ready_rx.wait_for(|c| *c >= n), if scenario.stop_when_ready => break,
            _ = tokio::time::sleep_until(until) => {
                let c = *count_rx.borrow();
                series.push(((until - t0).as_secs_f64(), fraction(c)));
                if until >= deadline {
                    break;
                }
                next += every;
            }
        }
    }
    let end = Instant::now().min(deadline);
    let ready_at_end = *count_rx.borrow();
    if series
        .last()
        .is_some_and(|(t, _)| *t < (end - t0).as_secs_f64())
    {
        series.push(((end - t0).as_secs_f64(), fraction(ready_at_end)));
    }
    let metrics = rt.metrics();
    let stats = minus(cluster.stats(), base);
    let reached = tracker.lock().unwrap_or_else(|p| p.into_inner()).reached;
    observer.abort();
    // Why the rest is not Ready, from the API, before the runtime stops (faults off: this is
    // inspection, not the run; no virtual time passes).
    cluster.set_faults(Default::default());
    let not_ready = not_ready_reasons(&setup).await;
    rt.shutdown().await;

    let uncounted = uncounted.load(Ordering::Relaxed);
    // Millisecond resolution: enough, and it prints cleanly.
    let ms = |d: Duration| (d.as_secs_f64() * 1000.0).round() / 1000.0;
    let secs = |d: Option<Duration>| d.map(ms);
    Ok(PolicyResult {
        policy: name.to_string(),
        objects: n,
        ready_at_end,
        time_to_ready: Percentiles {
            p50: secs(reached[0]),
            p90: secs(reached[1]),
            p99: secs(reached[2]),
            p100: secs(reached[3]),
        },
        virtual_seconds: ms(end - t0),
        runs: metrics.reconciles,
        restarts: metrics.restarts,
        quarantined: metrics.quarantined,
        status_writes: metrics.status_writes,
        peak_in_flight: metrics.peak_in_flight,
        peak_live_actors: metrics.peak_live_actors,
        api_requests: stats.total.saturating_sub(uncounted),
        api_writes: (stats.create + stats.update + stats.patch + stats.delete)
            .saturating_sub(setup_writes),
        injected_errors: stats.injected_errors,
        injected_conflicts: stats.injected_conflicts,
        escalated,
        not_ready,
        wall_seconds: wall.elapsed().as_secs_f64(),
        series,
    })
}
