//! One runtime in one process: set up the cluster, create the objects, start the runtime, wait
//! until every object is done, and report (one JSON line on stdout).
//!
//! `operator` has two phases: once the observer has seen every object Ready, the bench deletes
//! them all (one delete-collection request on the uncounted set-up client) and waits until the
//! observer has seen every one gone; it then lists what is left (bench objects and their child
//! ConfigMaps) with the set-up client.

use std::{io::IsTerminal, sync::Arc, time::Duration};

use anyhow::{Context as _, Result, bail};
use futures::{StreamExt, TryStreamExt, stream, stream::BoxStream};
use http_body_util::BodyExt as _;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};

use super::{
    actorcile_rt,
    args::{BenchArgs, RuntimeKind, Workload},
    backend::BenchCluster,
    controller_rt, floor, kube_rt,
    report::{OperatorPhases, RestartPhases, RunResult},
    stats::{self, millis, percentile},
    workload::{
        BenchObject, BenchObjectSpec, OPERATOR_CHILD_SUFFIX, Recorder, WorkloadConfig, chain_spec,
        object_name, wall_micros,
    },
};

/// How many set-up requests (creates, churn updates) are in flight at once.
mod observer;
mod restart;
use observer::{observe, observe_events, primed_watch};
use restart::measure_restart;

const SETUP_PARALLELISM: usize = 64;

/// The field manager the bench objects are created by: someone other than the runtime under
/// test, as a user's `kubectl` or a GitOps tool would be. A runtime's first write to an object
/// then adds its own `managedFields` entry, as it does in a real cluster. Without a name, the
/// API server records both the creator and a runtime that sends none (kube-runtime's
/// `PatchParams::default()`) as `unknown` and merges their entries, which makes that runtime's
/// writes smaller and cheaper than actorcile's (which name their manager).
const SETUP_FIELD_MANAGER: &str = "actorcile-bench-setup";

/// Runs `runtime` on the workload of `args` in this process and returns its result.
pub fn run(args: &BenchArgs, runtime: RuntimeKind) -> Result<RunResult> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_park(stats::on_worker_park)
        .build()
        .context("starting the tokio runtime")?;
    rt.block_on(run_async(args, runtime))
}

async fn run_async(args: &BenchArgs, runtime: RuntimeKind) -> Result<RunResult> {
    let target = BenchCluster::open(&args.backend(), runtime).await?;
    let result = if args.workload == Workload::Restart {
        measure_restart(args, runtime, &target).await
    } else {
        measure(args, runtime, &target).await
    };
    let closed = target.close().await;
    let result = result?;
    closed.context("cleaning up")?;
    Ok(result)
}

fn progress_bar(len: u64, runtime: RuntimeKind, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{prefix:>12} [{bar:30}] {pos}/{len} {msg} ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_prefix(runtime.as_str());
    bar.set_message(what.to_string());
    bar
}

/// Creates the bench objects (`chain_length`: laid out as chains); returns their API and the
/// resident memory before they were created.
async fn set_up(
    args: &BenchArgs,
    runtime: RuntimeKind,
    target: &BenchCluster,
    chain_length: Option<u32>,
) -> Result<(Api<BenchObject>, u64)> {
    let api: Api<BenchObject> = Api::namespaced(target.setup.clone(), &target.namespace);
    let rss_before_objects = stats::current_rss_bytes().unwrap_or(0);
    let bar = progress_bar(u64::from(args.objects()), runtime, "created");
    create_objects(&api, args.objects(), chain_length, &bar).await?;
    bar.finish_and_clear();
    Ok((api, rss_before_objects))
}

async fn measure(
    args: &BenchArgs,
    runtime: RuntimeKind,
    target: &BenchCluster,
) -> Result<RunResult> {
    let chain_length = (args.workload == Workload::Chain).then_some(args.chain_length);
    let (api, rss_before_objects) = set_up(args, runtime, target, chain_length).await?;

    // `chain`: the observer lists before the runtime starts, so it sees every Ready status in
    // the order written (a dependency's before its dependent's).
    let primed_observer = if args.workload == Workload::Chain {
        Some(primed_watch(api.clone()).await?)
    } else {
        None
    };

    let config = WorkloadConfig {
        workload: args.workload,
        objects: args.objects(),
        yields: args.yields,
        yield_interval: args.yield_interval,
    };
    let operator = args.workload == Workload::Operator;
    let recorder = Recorder::prepared(config, target.counter.clone());
    target.prime(&api).await?;
    let baseline_rss = baseline(runtime).await;
    // `operator`: each object counts once Ready and once deleted.
    let phases = if operator { 2 } else { 1 };
    let bar = progress_bar(u64::from(args.objects()) * phases, runtime, "done");

    let server_pids = target.server_pids();
    let cpu_at_start = CpuReading::now(&server_pids);
    recorder.start_clock();
    let running = Running::start(args, runtime, target, &recorder).await?;
    let driver = (args.workload == Workload::Churn).then(|| {
        tokio::spawn(churn_driver(
            target.setup.clone(),
            target.namespace.clone(),
            args.objects(),
            args.churn_updates,
            args.churn_rate,
            recorder.clone(),
        ))
    });
    let observer = match primed_observer {
        Some(stream) => Some(tokio::spawn(observe_events(stream, recorder.clone()))),
        None => matches!(args.workload, Workload::Status | Workload::Operator)
            .then(|| tokio::spawn(observe(api.clone(), recorder.clone()))),
    };
    let ticker = {
        let recorder = recorder.clone();
        let bar = bar.clone();
        tokio::spawn(async move {
            loop {
                bar.set_position((recorder.ready_count() + recorder.done_count()) as u64);
                bar.set_message(format!("done, {} runs", recorder.runs()));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    let deadline = tokio::time::Instant::now() + args.timeout;
    let mut deletion = None;
    let mut idle_rss = None;
    // `operator`: the idle memory is read at all Ready, and the wait for it is left out of the
    // seconds and CPU time.
    let mut settling = (Duration::ZERO, CpuUsed::default());
    if operator
        && let Ok(ready) = running
            .unless_exited(
                runtime,
                tokio::time::timeout_at(deadline, recorder.wait_ready()),
            )
            .await?
    {
        let (at, cpu) = (recorder.elapsed(), CpuReading::now(&server_pids));
        idle_rss = running.settle(args.concurrency).await;
        settling = (
            recorder.elapsed() - at,
            CpuReading::now(&server_pids).since(cpu),
        );
        let started = recorder.elapsed();
        deletion = Some((ready, started));
        crate::retry::idempotent("deleting the bench objects", None, || delete_all(&api)).await?;
    }
    let waited = running
        .unless_exited(
            runtime,
            tokio::time::timeout_at(deadline, recorder.wait_done()),
        )
        .await?;
    let cpu = CpuReading::now(&server_pids)
        .since(cpu_at_start)
        .minus(settling.1);
    if !operator && waited.is_ok() {
        idle_rss = running.settle(args.concurrency).await;
    }
    ticker.abort();
    if let Some(observer) = observer {
        observer.abort();
    }
    bar.finish_and_clear();
    let driver_result = match driver {
        Some(driver) if waited.is_ok() => Some(driver.await),
        Some(driver) => {
            driver.abort();
            None
        }
        None => None,
    };
    let own_report = running.stop().await?;
    let Ok(done) = waited else {
        if operator {
            bail!(
                "{runtime}: {} of {} objects Ready, {} deleted after {:?} ({} runs)",
                recorder.ready_count(),
                args.objects(),
                recorder.done_count(),
                args.timeout,
                recorder.runs()
            );
        }
        bail!(
            "{runtime}: only {} of {} objects done after {:?} ({} runs)",
            recorder.done_count(),
            args.objects(),
            args.timeout,
            recorder.runs()
        );
    };
    if let Some(driver_result) = driver_result {
        driver_result.context("churn driver panicked")??;
    }

    let phases = match deletion {
        Some((ready, deletion_started)) => Some(OperatorPhases {
            ready_seconds: ready.elapsed.as_secs_f64(),
            deleted_seconds: done.elapsed.saturating_sub(deletion_started).as_secs_f64(),
            objects_left: api
                .list_metadata(&ListParams::default())
                .await
                .context("listing the bench objects left")?
                .items
                .len() as u64,
            children_left: Api::<ConfigMap>::namespaced(target.setup.clone(), &target.namespace)
                .list_metadata(&ListParams::default())
                .await
                .context("listing the child ConfigMaps left")?
                .items
                .iter()
                .filter(|cm| {
                    cm.metadata.name.as_deref().is_some_and(|n| {
                        n.starts_with("bench-") && n.ends_with(OPERATOR_CHILD_SUFFIX)
                    })
                })
                .count() as u64,
        }),
        None => None,
    };
    let measured = Measured {
        objects: args.objects(),
        runs: done.runs,
        seconds: done.elapsed.saturating_sub(settling.0).as_secs_f64(),
        cpu,
        latencies: recorder.latencies(),
        api_requests: done.api_requests,
        baseline_rss,
        rss_before_objects,
        peak_rss: None,
    };
    let (measured, status_writes, status_write_seconds) = match own_report {
        Some(own) => (measured.in_own_process(&own), own.status_writes, None),
        None => {
            let writes = target.counter.status_writes();
            (measured, writes.count, writes.window_seconds())
        }
    };
    Ok(RunResult {
        idle_rss_bytes: idle_rss,
        status_writes,
        status_write_seconds,
        operator: phases,
        ..measured.result(runtime)
    })
}

/// The resident memory just before the runtime starts, which its memory is measured from:
/// read once every thread's free allocator pages are returned. The peak is reset there, so
/// the peak read at the end is the runtime's, not the set-up's (creating the objects can take
/// more than the runtime).
async fn baseline(runtime: RuntimeKind) -> u64 {
    stats::return_freed_memory().await;
    let rss = stats::current_rss_bytes().unwrap_or(0);
    let set_up_peak = stats::peak_rss_bytes();
    if stats::reset_peak_rss() {
        tracing::debug!(?set_up_peak, "{runtime}: peak RSS reset at the baseline");
    } else {
        tracing::warn!(
            "{runtime}: cannot reset the peak RSS (/proc/self/clear_refs): its peak includes \
             the set-up's"
        );
    }
    rss
}

/// CPU time read at one moment: this process's, and the control plane's where the bench can
/// read it (envtest: etcd and kube-apiserver).
#[derive(Debug, Clone, Copy)]
struct CpuReading {
    own: Option<f64>,
    server: Option<f64>,
}

impl CpuReading {
    fn now(server_pids: &[u32]) -> Self {
        Self {
            own: stats::process_cpu_seconds(),
            server: stats::processes_cpu_seconds(server_pids),
        }
    }

    /// The CPU used from `earlier` until this reading.
    fn since(self, earlier: CpuReading) -> CpuUsed {
        let used = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| (a - b).max(0.0));
        CpuUsed {
            own: used(self.own, earlier.own),
            server: used(self.server, earlier.server),
        }
    }
}

/// CPU seconds used over a window: this process's, and the control plane's (`None` where it
/// could not be read).
#[derive(Debug, Clone, Copy, Default)]
struct CpuUsed {
    own: Option<f64>,
    server: Option<f64>,
}

impl CpuUsed {
    /// This window without `part` (a wait left out of the measurement).
    fn minus(self, part: CpuUsed) -> CpuUsed {
        let less = |a: Option<f64>, b: Option<f64>| a.map(|a| (a - b.unwrap_or(0.0)).max(0.0));
        CpuUsed {
            own: less(self.own, part.own),
            server: less(self.server, part.server),
        }
    }
}

/// What every workload measures alike, from which its [`RunResult`] is made.
struct Measured {
    objects: u32,
    runs: u64,
    seconds: f64,
    cpu: CpuUsed,
    latencies: Vec<Duration>,
    api_requests: u64,
    baseline_rss: u64,
    rss_before_objects: u64,
    /// The runtime's peak RSS when it is not this process's (`None`: read this process's).
    peak_rss: Option<u64>,
}

impl Measured {
    /// A runtime in a process of its own: what it counted and used itself, beside this
    /// process's observer; all of its memory is the runtime's.
    fn in_own_process(self, own: &controller_rt::Report) -> Measured {
        Measured {
            runs: own.reconciles,
            api_requests: own.api_requests,
            cpu: CpuUsed {
                own: Some(self.cpu.own.unwrap_or(0.0) + own.cpu_seconds),
                ..self.cpu
            },
            baseline_rss: 0,
            rss_before_objects: 0,
            peak_rss: Some(own.peak_rss_bytes),
            ..self
        }
    }

    /// The result of `runtime`, its peak RSS read now; nothing workload-specific in it.
    fn result(mut self, runtime: RuntimeKind) -> RunResult {
        let peak_rss = self
            .peak_rss
            .unwrap_or_else(|| stats::peak_rss_bytes().unwrap_or(0));
        RunResult {
            runtime,
            objects: self.objects,
            runs: self.runs,
            seconds: self.seconds,
            runs_per_sec: if self.seconds > 0.0 {
                self.runs as f64 / self.seconds
            } else {
                0.0
            },
            cpu_seconds: self.cpu.own.unwrap_or(0.0),
            server_cpu_seconds: self.cpu.server,
            p50_ms: percentile(&mut self.latencies, 50.0).map(millis),
            p99_ms: percentile(&mut self.latencies, 99.0).map(millis),
            latency_samples: self.latencies.len() as u64,
            api_requests: self.api_requests,
            peak_rss_bytes: peak_rss,
            baseline_rss_bytes: self.baseline_rss,
            rss_per_object_bytes: peak_rss / u64::from(self.objects.max(1)),
            rss_before_objects_bytes: self.rss_before_objects,
            idle_rss_bytes: None,
            status_writes: 0,
            status_write_seconds: None,
            operator: None,
            restart: None,
            seconds_per_repeat: Vec::new(),
        }
    }
}

enum Running {
    Kube(kube_rt::KubeRuntimeRun),
    Actorcile(actorcile_rt::ActorcileRun),
    ControllerRuntime(controller_rt::ControllerRuntimeRun),
    Floor(floor::FloorRun),
}

/// After the runtime converged: how long resident memory is left to settle before it is read
/// (freed memory returned, background tasks done: actorcile encodes passive objects' cached
/// copies), alike for both runtimes.
const SETTLE: Duration = Duration::from_millis(300);

/// The longest wait for actorcile's actors to passivate before the idle memory is read.
const PASSIVATE_LIMIT: Duration = Duration::from_secs(30);

impl Running {
    /// Waits for `done`, failing early if the runtime's own process (controller-runtime) exited
    /// before: no object would converge after that.
    async fn unless_exited<T>(
        &self,
        runtime: RuntimeKind,
        done: impl Future<Output = T>,
    ) -> Result<T> {
        let Running::ControllerRuntime(run) = self else {
            return Ok(done.await);
        };
        tokio::select! {
            v = done => Ok(v),
            () = run.exited() => bail!("the {runtime} process exited before the objects converged (its stderr is above)"),
        }
    }

    /// Lets the runtime go idle (actorcile: its actors passivate), then reads resident memory
    /// as the process stands.
    async fn settle(&self, concurrency: u16) -> Option<u64> {
        if let Running::Actorcile(run) = self {
            run.wait_passive(concurrency, PASSIVATE_LIMIT).await;
        }
        tokio::time::sleep(SETTLE).await;
        stats::return_freed_memory().await;
        match self {
            Running::ControllerRuntime(run) => run.rss_bytes(),
            _ => stats::current_rss_bytes(),
        }
    }

    /// Starts `runtime` on the bench objects, reconciling through `recorder`.
    async fn start(
        args: &BenchArgs,
        runtime: RuntimeKind,
        target: &BenchCluster,
        recorder: &Arc<Recorder>,
    ) -> Result<Self> {
        Ok(match runtime {
            RuntimeKind::ControllerRuntime => {
                let kubeconfig = target.kubeconfig.as_deref().context(
                    "controller-runtime needs a real API server: --envtest or --kubeconfig",
                )?;
                Running::ControllerRuntime(controller_rt::start(
                    kubeconfig,
                    &target.namespace,
                    args.workload,
                    args.concurrency,
                )?)
            }
            RuntimeKind::KubeRuntime => Running::Kube(kube_rt::start(
                target.runtime.clone(),
                &target.namespace,
                args.concurrency,
                recorder.clone(),
                args.prune_kube_runtime,
            )?),
            RuntimeKind::Floor => {
                floor::check(args.workload, args.actorcile_defaults)?;
                Running::Floor(floor::start(
                    target.runtime.clone(),
                    &target.namespace,
                    args.concurrency,
                    recorder.clone(),
                ))
            }
            RuntimeKind::Actorcile => Running::Actorcile(
                actorcile_rt::start(
                    target.runtime.clone(),
                    &target.namespace,
                    args.concurrency,
                    recorder.clone(),
                    actorcile_rt::Writes {
                        finalizer: args.actorcile_defaults || args.workload == Workload::Operator,
                        status: args.actorcile_defaults
                            || matches!(
                                args.workload,
                                Workload::Status | Workload::Chain | Workload::Operator
                            ),
                    },
                    !args.no_streaming_lists,
                )
                .await?,
            ),
        })
    }

    /// Stops the runtime; controller-runtime's process then reports what it measured itself.
    async fn stop(self) -> Result<Option<controller_rt::Report>> {
        match self {
            Running::Kube(run) => run.stop(Duration::from_secs(5)).await,
            Running::Actorcile(run) => run.stop(Duration::from_secs(15)).await,
            Running::ControllerRuntime(run) => {
                return run.stop(Duration::from_secs(15)).await.map(Some);
            }
            Running::Floor(run) => run.stop(),
        }
        Ok(None)
    }
}

/// Deletes every bench object with one `DELETE` of the collection, reading its answer (every
/// deleted object) piece by piece without keeping it: `Api::delete_collection` would decode the
/// whole list in this process, the runtime's, and its peak memory would be the bench's. (The
/// in-process API server, which shares the process, still builds the answer whole.)
async fn delete_all(api: &Api<BenchObject>) -> Result<(), kube::Error> {
    let request = kube::core::Request::new(api.resource_url())
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .map_err(kube::Error::BuildRequest)?;
    let client: Client = api.clone().into_client();
    let response = client.send(request.map(kube::client::Body::from)).await?;
    let status = response.status();
    let mut body = response.into_body();
    if !status.is_success() {
        let text = body.collect().await?.to_bytes();
        let text = String::from_utf8_lossy(&text);
        let mut answer = serde_json::from_str::<kube::core::Status>(&text).unwrap_or_else(|_| {
            kube::core::Status::failure(text.trim(), "deleting the bench objects")
        });
        // Any JSON object parses as a `Status`; the HTTP status decides whether it is retried.
        if answer.code == 0 {
            answer.code = status.as_u16();
        }
        return Err(kube::Error::Api(answer.boxed()));
    }
    while let Some(frame) = body.frame().await {
        frame?;
    }
    Ok(())
}

fn setup_post_params() -> PostParams {
    PostParams {
        field_manager: Some(SETUP_FIELD_MANAGER.to_string()),
        ..PostParams::default()
    }
}

/// Creates `count` bench objects, `SETUP_PARALLELISM` at a time; with `chain_length`, as
/// dependency chains (see [`chain_spec`]), in index order: dependents first.
async fn create_objects(
    api: &Api<BenchObject>,
    count: u32,
    chain_length: Option<u32>,
    bar: &ProgressBar,
) -> Result<()> {
    stream::iter(0..count)
        .map(|i| {
            let api = api.clone();
            async move {
                let obj = BenchObject {
                    metadata: ObjectMeta {
                        name: Some(object_name(i)),
                        ..Default::default()
                    },
                    spec: match chain_length {
                        Some(length) => chain_spec(i, count, length),
                        None => BenchObjectSpec::default(),
                    },
                    status: None,
                };
                // A create retried after a lost answer finds its object there: 409 is done.
                let what = format!("creating {}", object_name(i));
                crate::retry::idempotent(&what, Some(409), || async {
                    api.create(&setup_post_params(), &obj).await.map(drop)
                })
                .await
            }
        })
        .buffer_unordered(SETUP_PARALLELISM)
        .try_for_each(|_| {
            bar.inc(1);
            futures::future::ready(Ok(()))
        })
        .await
}

/// `churn`: once every object has had its first run, writes `updates` spec updates per object,
/// round robin, `rate` updates per second in total; the last one per object sets `lastUpdate`.
async fn churn_driver(
    client: Client,
    namespace: String,
    objects: u32,
    updates: u32,
    rate: f64,
    recorder: Arc<Recorder>,
) -> Result<()> {
    recorder.wait_all_seen().await;
    let api: Api<BenchObject> = Api::namespaced(client, &namespace);
    let begin = tokio::time::Instant::now();
    let total = u64::from(objects) * u64::from(updates);
    stream::iter(0..total)
        .then(|n| async move {
            let due = begin + Duration::from_secs_f64(n as f64 / rate);
            tokio::time::sleep_until(due).await;
            n
        })
        .map(|n| {
            let api = api.clone();
            async move {
                let i = (n % u64::from(objects)) as u32;
                let last = n / u64::from(objects) + 1 == u64::from(updates);
                let mut spec = serde_json::json!({ "stampMicros": wall_micros() });
                if last {
                    spec["lastUpdate"] = serde_json::Value::Bool(true);
                }
                let patch = serde_json::json!({ "spec": spec });
                api.patch(
                    &object_name(i),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
                .with_context(|| format!("churn update of {}", object_name(i)))
            }
        })
        .buffer_unordered(SETUP_PARALLELISM)
        .try_for_each(|_| futures::future::ready(Ok(())))
        .await
}

#[cfg(test)]
mod tests;
