//! The `restart` workload: a first runtime runs every object and stops; a second one starts and
//! lists them while objects change, and the bench waits until every change was seen.

use super::*;

/// `restart`: a first runtime runs every object once (the list alone, timed) and stops; a
/// second one starts while [`restart_driver`] changes objects until every listed object has run
/// again, then the bench waits until every change has been seen by a run.
pub(super) async fn measure_restart(
    args: &BenchArgs,
    runtime: RuntimeKind,
    target: &BenchCluster,
) -> Result<RunResult> {
    let (api, rss_before_objects) = set_up(args, runtime, target, None).await?;
    let config = WorkloadConfig {
        workload: Workload::Restart,
        objects: args.objects(),
        yields: args.yields,
        yield_interval: args.yield_interval,
    };
    let deadline = tokio::time::Instant::now() + args.timeout;
    let timed_out = |what: &str, recorder: &Recorder| {
        anyhow::anyhow!(
            "{runtime}: {what}: {} of {} objects ran after {:?} ({} runs, {} changes not seen)",
            recorder.seen_count(),
            args.objects(),
            args.timeout,
            recorder.runs(),
            recorder.pending_changes()
        )
    };

    // The list alone: every object runs once, nothing changes.
    let first = Recorder::start(config, target.counter.clone());
    let running = Running::start(args, runtime, target, &first).await?;
    let waited = tokio::time::timeout_at(deadline, first.wait_all_seen()).await;
    running.stop().await?;
    if waited.is_err() {
        return Err(timed_out("the list alone", &first));
    }
    let alone = first.all_seen().context("every object ran")?;

    // The restart, changes coming in until every listed object has run; memory read as in
    // `measure`: the harness's state in place, the first runtime's freed pages returned.
    let recorder = Recorder::prepared(config, target.counter.clone());
    let baseline_rss = baseline(runtime).await;
    let requests_before = target.counter.get();
    let server_pids = target.server_pids();
    let cpu_at_start = CpuReading::now(&server_pids);
    recorder.start_clock();
    let running = Running::start(args, runtime, target, &recorder).await?;
    let driver = tokio::spawn(restart_driver(
        api.clone(),
        args.objects(),
        args.churn_rate,
        recorder.clone(),
    ));
    let waited = tokio::time::timeout_at(deadline, async {
        recorder.wait_all_seen().await;
        while recorder.pending_changes() > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let all_changes = recorder.elapsed();
    let cpu = CpuReading::now(&server_pids).since(cpu_at_start);
    let api_requests = target.counter.get() - requests_before;
    if waited.is_err() {
        driver.abort();
        running.stop().await?;
        return Err(timed_out("the restart", &recorder));
    }
    let changes = driver.await.context("restart driver panicked")??;
    running.stop().await?;
    let listed = recorder.all_seen().context("every object ran")?;
    let seen = recorder.changes_seen();
    let watching_from = target
        .counter
        .last_watch_sent_micros()
        .context("the runtime sent no watch request")?;
    let mut watching: Vec<Duration> = seen
        .iter()
        .filter(|&&(written, _)| written >= watching_from)
        .map(|&(written, at)| Duration::from_micros(at - written))
        .collect();
    let measured = Measured {
        objects: args.objects(),
        // Until the last listed object ran (the changes seen after it are not counted).
        runs: listed.runs,
        seconds: listed.elapsed.as_secs_f64(),
        cpu,
        latencies: recorder.latencies(),
        api_requests,
        baseline_rss,
        rss_before_objects,
        peak_rss: None,
    };
    Ok(RunResult {
        restart: Some(RestartPhases {
            list_alone_seconds: alone.elapsed.as_secs_f64(),
            changes,
            all_changes_seconds: all_changes.as_secs_f64(),
            watching_changes: watching.len() as u64,
            watching_p50_ms: percentile(&mut watching, 50.0).map(millis),
            watching_p99_ms: percentile(&mut watching, 99.0).map(millis),
        }),
        ..measured.result(runtime)
    })
}

/// `restart`: from the runtime's start until every listed object has run, changes `rate`
/// objects per second (`spec.stampMicros`, told to the recorder first), in a shuffled order
/// that changes no object again before every other one has changed (so two changes of one
/// object are never in flight at once). Returns the number of changes written.
async fn restart_driver(
    api: Api<BenchObject>,
    objects: u32,
    rate: f64,
    recorder: Arc<Recorder>,
) -> Result<u64> {
    let order = shuffled(objects, 0x5eed);
    let begin = tokio::time::Instant::now();
    let written = stream::iter(0u64..)
        .then(|n| async move {
            let due = begin + Duration::from_secs_f64(n as f64 / rate);
            tokio::time::sleep_until(due).await;
            n
        })
        .take_while(|_| futures::future::ready(recorder.all_seen().is_none()))
        .map(|n| {
            let api = api.clone();
            let recorder = recorder.clone();
            let name = object_name(order[(n % u64::from(objects)) as usize]);
            async move {
                let stamp = recorder.change(&name);
                let patch = serde_json::json!({ "spec": { "stampMicros": stamp } });
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .with_context(|| format!("restart change of {name}"))
            }
        })
        .buffer_unordered(SETUP_PARALLELISM)
        .try_fold(0u64, |n, _| futures::future::ready(Ok(n + 1)))
        .await?;
    Ok(written)
}

/// `0..n` in an order shuffled by a fixed seed (repeatable runs).
fn shuffled(n: u32, seed: u64) -> Vec<u32> {
    let mut order: Vec<u32> = (0..n).collect();
    fastrand::Rng::with_seed(seed).shuffle(&mut order);
    order
}
