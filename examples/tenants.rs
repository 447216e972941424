//! Fair shares across tenants, measured: one tenant creates `--burst` objects at once; `--delay`
//! later, `--tenants` other tenants create `--each` objects each. Every reconcile makes a
//! `--work` external call and then writes the object's Ready status, at most `--concurrency`
//! at once. Each run reports each tenant class's time from create to Ready as a watch sees it
//! (p50, p99), the burst's time until its last object is Ready, wall time and this process's
//! CPU seconds, for:
//!
//! - `actorcile`: tenants are namespaces (the default);
//! - `actorcile-fifo`: one tenant for every object (`Controller::tenant(|_| "")`), the order
//!   actorcile had before tenants;
//! - `kube-runtime`: kube's `Controller`, its scheduler's order (by time).
//!
//! Each runtime runs `alone` (the small tenants only) and `burst` (with the burst), on the
//! in-process API server, or with `--envtest` on a real etcd + kube-apiserver (feature
//! `envtest`). controller-runtime is not run here: its bench child in `actorcile bench`
//! serves objects created before it starts.
//!
//! ```text
//! cargo run --release --example tenants --features cluster -- --burst 3000 --tenants 4 --each 5
//! cargo run --release --example tenants --features cluster,envtest -- --envtest --burst 1000
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actorcile::prelude::*;
use clap::Parser;
use futures::StreamExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{Controller as KubeController, controller::Action, watcher};
use kube::{Client, CustomResource, CustomResourceExt, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "tenants.actorcile.dev",
    version = "v1",
    kind = "Job",
    namespaced,
    status = "ResourceStatus"
)]
struct JobSpec {
    n: u32,
}

#[derive(Parser, Debug, Clone)]
struct Args {
    /// Objects the bursting tenant creates at once.
    #[arg(long, default_value_t = 3000)]
    burst: u32,
    /// Other tenants.
    #[arg(long, default_value_t = 4)]
    tenants: u32,
    /// Objects each other tenant creates.
    #[arg(long, default_value_t = 5)]
    each: u32,
    /// How long after the burst begins the other tenants create theirs.
    #[arg(long, value_parser = humantime_serde::re::humantime::parse_duration, default_value = "200ms")]
    delay: Duration,
    /// The external call each reconcile makes.
    #[arg(long, value_parser = humantime_serde::re::humantime::parse_duration, default_value = "2ms")]
    work: Duration,
    /// Reconciles at once.
    #[arg(long, default_value_t = 16)]
    concurrency: u16,
    /// Run on a real etcd + kube-apiserver (feature `envtest`).
    #[arg(long)]
    envtest: bool,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Contender {
    Actorcile,
    ActorcileFifo,
    Kube,
}

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Contender::Actorcile => "actorcile",
            Contender::ActorcileFifo => "actorcile-fifo",
            Contender::Kube => "kube-runtime",
        }
    }
}

/// When each object was created and first seen Ready.
#[derive(Default)]
struct Times {
    created: HashMap<String, Instant>,
    ready: HashMap<String, Instant>,
}

fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // After the command's closing parenthesis: utime and stime are fields 14 and 15.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

fn percentile(mut v: Vec<Duration>, p: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort();
    let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

fn ms(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1000.0)
}

/// The label that tells one run's objects from another's on a shared control plane.
const RUN: &str = "tenants.actorcile.dev/run";

async fn create(client: &Client, ns: &str, name: String, run: &str, times: &Mutex<Times>) {
    let api: Api<Job> = Api::namespaced(client.clone(), ns);
    let mut job = Job::new(&name, JobSpec { n: 1 });
    job.metadata.labels = Some([(RUN.to_string(), run.to_string())].into());
    let key = format!("{ns}/{name}");
    for _ in 0..5 {
        match api.create(&PostParams::default(), &job).await {
            Ok(_) => {
                times.lock().unwrap().created.insert(key, Instant::now());
                return;
            }
            Err(e) => eprintln!("create {key}: {e}; retrying"),
        }
    }
    panic!("could not create {key}");
}

async fn create_all(client: &Client, ns: &str, n: u32, run: &str, times: &Arc<Mutex<Times>>) {
    futures::stream::iter(0..n)
        .for_each_concurrent(64, |i| create(client, ns, format!("j{i}"), run, times))
        .await;
}

/// Starts `runtime` over every namespace; returns a stop function.
async fn start(
    runtime: Contender,
    client: Client,
    run: &str,
    args: &Args,
) -> Box<dyn FnOnce() -> futures::future::BoxFuture<'static, ()>> {
    let work = args.work;
    let selected = watcher::Config::default().labels(&format!("{RUN}={run}"));
    match runtime {
        Contender::Actorcile | Contender::ActorcileFifo => {
            let tree = step("call", move |_cx: Context<Job>| async move {
                tokio::time::sleep(work).await;
                Outcome::Done
            });
            let mut controller = Controller::<Job>::new(tree)
                .without_finalizer()
                .watcher_config(selected.streaming_lists());
            if runtime == Contender::ActorcileFifo {
                controller = controller.tenant(|_| String::new());
            }
            let mut policy = SupervisorPolicy::default();
            policy.runtime.max_concurrent_reconciles = usize::from(args.concurrency);
            let handle = actorcile::runtime::Runtime::builder(
                client,
                OperatorNames::new("tenants-bench", "tenants.actorcile.dev"),
            )
            .policy(policy)
            .controller(controller)
            .start()
            .await
            .expect("start actorcile");
            Box::new(move || Box::pin(handle.shutdown()))
        }
        Contender::Kube => {
            let api: Api<Job> = Api::all(client.clone());
            let config = kube::runtime::controller::Config::default().concurrency(args.concurrency);
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let task = tokio::spawn(
                KubeController::new(api, selected)
                    .with_config(config)
                    .graceful_shutdown_on(async move {
                        let _ = stopped.await;
                    })
                    .run(
                        move |job: Arc<Job>, client: Arc<Client>| async move {
                            tokio::time::sleep(work).await;
                            let status = ResourceStatus::default()
                                .after_provision(&Outcome::Done, job.metadata.generation);
                            let api: Api<Job> = Api::namespaced(
                                (*client).clone(),
                                &job.namespace().unwrap_or_default(),
                            );
                            api.patch_status(
                                &job.name_any(),
                                &PatchParams::default(),
                                &Patch::Merge(serde_json::json!({ "status": status })),
                            )
                            .await?;
                            Ok::<_, kube::Error>(Action::await_change())
                        },
                        |_job, _e: &kube::Error, _| Action::requeue(Duration::from_millis(100)),
                        Arc::new(client),
                    )
                    .for_each(|_| async {}),
            );
            Box::new(move || {
                Box::pin(async move {
                    let _ = stop.send(());
                    let _ = task.await;
                })
            })
        }
    }
}

/// One run: `runtime`, with the burst or `alone`; returns its report line.
async fn run(runtime: Contender, burst: bool, client: Client, prefix: &str, args: &Args) -> String {
    let times = Arc::new(Mutex::new(Times::default()));
    let run_label = prefix.trim_end_matches('-').to_string();
    let expected = args.tenants * args.each + if burst { args.burst } else { 0 };
    // The observer: every object's first Ready, as a watch of all namespaces sees it.
    let observer = {
        let (times, api) = (times.clone(), Api::<Job>::all(client.clone()));
        let selected = watcher::Config::default().labels(&format!("{RUN}={run_label}"));
        tokio::spawn(async move {
            let mut events = watcher(api, selected).boxed();
            while let Some(event) = events.next().await {
                if let Ok(watcher::Event::Apply(job) | watcher::Event::InitApply(job)) = event {
                    let ready = job
                        .status
                        .as_ref()
                        .and_then(|s| s.ready())
                        .is_some_and(|c| c.status == "True");
                    if ready {
                        let key =
                            format!("{}/{}", job.namespace().unwrap_or_default(), job.name_any());
                        times
                            .lock()
                            .unwrap()
                            .ready
                            .entry(key)
                            .or_insert_with(Instant::now);
                    }
                }
            }
        })
    };
    let stop = start(runtime, client.clone(), &run_label, args).await;
    let (cpu0, t0) = (cpu_seconds(), Instant::now());
    let burst_ns = format!("{prefix}burst");
    let bursting = {
        let (client, times, n) = (
            client.clone(),
            times.clone(),
            if burst { args.burst } else { 0 },
        );
        let ns = burst_ns.clone();
        let run = run_label.clone();
        tokio::spawn(async move { create_all(&client, &ns, n, &run, &times).await })
    };
    tokio::time::sleep(args.delay).await;
    let small: Vec<String> = (0..args.tenants).map(|t| format!("{prefix}t{t}")).collect();
    futures::future::join_all(
        small
            .iter()
            .map(|ns| create_all(&client, ns, args.each, &run_label, &times)),
    )
    .await;
    bursting.await.expect("the burst's creates");
    let deadline = Instant::now() + Duration::from_secs(600);
    while times.lock().unwrap().ready.len() < expected as usize {
        assert!(
            Instant::now() < deadline,
            "{}: not every object Ready in 10 min",
            runtime.name()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (wall, cpu) = (t0.elapsed(), cpu_seconds() - cpu0);
    stop().await;
    observer.abort();
    let t = times.lock().unwrap();
    let latency = |ns: &str| -> Vec<Duration> {
        t.ready
            .iter()
            .filter(|(k, _)| k.split_once('/').is_some_and(|(n, _)| n == ns))
            .map(|(k, ready)| ready.saturating_duration_since(t.created[k]))
            .collect()
    };
    let small_lat: Vec<Duration> = small.iter().flat_map(|ns| latency(ns)).collect();
    let burst_lat = latency(&burst_ns);
    let burst_done = t
        .ready
        .iter()
        .filter(|(k, _)| k.starts_with(&format!("{burst_ns}/")))
        .map(|(_, r)| r.saturating_duration_since(t0))
        .max()
        .unwrap_or_default();
    format!(
        "| {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.2} |",
        runtime.name(),
        if burst { "burst" } else { "alone" },
        ms(percentile(small_lat.clone(), 0.5)),
        ms(percentile(small_lat, 0.99)),
        if burst {
            ms(percentile(burst_lat, 0.5))
        } else {
            "–".into()
        },
        if burst { ms(burst_done) } else { "–".into() },
        expected,
        wall.as_secs_f64(),
        cpu,
    )
}

async fn namespaces(client: &Client, prefix: &str, args: &Args) {
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let names = std::iter::once(format!("{prefix}burst"))
        .chain((0..args.tenants).map(|t| format!("{prefix}t{t}")));
    for name in names {
        let mut ns = k8s_openapi::api::core::v1::Namespace::default();
        ns.metadata.name = Some(name);
        api.create(&PostParams::default(), &ns)
            .await
            .expect("create a namespace");
    }
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "burst {} objects, {} tenants x {} objects {:?} later, {:?} per reconcile, {} at once; {} CPUs; {}",
        args.burst,
        args.tenants,
        args.each,
        args.delay,
        args.work,
        args.concurrency,
        cpus,
        if args.envtest {
            "etcd + kube-apiserver"
        } else {
            "in-process API server"
        }
    );
    println!(
        "| runtime | run | small tenants p50 ms | small p99 ms | burst p50 ms | burst done ms | objects | wall s | CPU s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    #[cfg(feature = "envtest")]
    let env = if args.envtest {
        Some(
            actorcile::envtest::Envtest::builder()
                .crds(vec![Job::crd()])
                .start()
                .await
                .expect("start etcd + kube-apiserver"),
        )
    } else {
        None
    };
    #[cfg(not(feature = "envtest"))]
    assert!(!args.envtest, "--envtest needs the feature envtest");
    let mut run_no = 0;
    for runtime in [
        Contender::Actorcile,
        Contender::ActorcileFifo,
        Contender::Kube,
    ] {
        for burst in [false, true] {
            run_no += 1;
            let prefix = format!("r{run_no}-");
            // A fresh in-process server per run; one control plane, fresh namespaces, with envtest.
            let server = actorcile::cluster::ApiServer::new();
            #[cfg(feature = "envtest")]
            let client = match &env {
                Some(env) => env.client(),
                None => {
                    server.install_crd(&Job::crd()).expect("install the CRD");
                    server.client()
                }
            };
            #[cfg(not(feature = "envtest"))]
            let client = {
                server.install_crd(&Job::crd()).expect("install the CRD");
                server.client()
            };
            namespaces(&client, &prefix, &args).await;
            println!("{}", run(runtime, burst, client, &prefix, &args).await);
        }
    }
}
