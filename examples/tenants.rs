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
//! - `kube-runtime`: kube's `Controller`, its scheduler's order (by time);
//! - `controller-runtime` (with `--envtest` only: a Go process of its own, the `tenants`
//!   workload of `tools/bench-controller-runtime`, which `scripts/install-test-deps.sh` builds
//!   into the cache): its default queue.
//!
//! Each runtime runs `alone` (the small tenants only) and `burst` (with the burst), on the
//! in-process API server, or with `--envtest` on a real etcd + kube-apiserver (feature
//! `envtest`). Before each run's clock starts, the runtime has made one object Ready (so its
//! start-up is not measured), and the CPU is this process's plus, for controller-runtime, the
//! Go process's over the same time.
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
    ControllerRuntime,
}

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Contender::Actorcile => "actorcile",
            Contender::ActorcileFifo => "actorcile-fifo",
            Contender::Kube => "kube-runtime",
            Contender::ControllerRuntime => "controller-runtime",
        }
    }
}

/// A started runtime: how to stop it, and the process it runs in when not this one.
struct Started {
    stop: Box<dyn FnOnce() -> futures::future::BoxFuture<'static, ()>>,
    pid: Option<u32>,
}

/// When each object was created and first seen Ready.
#[derive(Default)]
struct Times {
    created: HashMap<String, Instant>,
    ready: HashMap<String, Instant>,
}

/// The CPU time of the process `pid` names (`self`: this one), user plus system.
fn cpu_seconds_of(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
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

/// This process's and `other`'s CPU time.
fn cpu_seconds(other: Option<u32>) -> f64 {
    cpu_seconds_of("self") + other.map_or(0.0, |pid| cpu_seconds_of(&pid.to_string()))
}

/// The Go program that runs the workload under controller-runtime: the bench's variable, else
/// the cache's build.
fn controller_runtime_binary() -> std::path::PathBuf {
    let cached = || {
        #[cfg(feature = "envtest")]
        return actorcile::envtest::cache_dir()
            .map(|d| d.join("bench").join("bench-controller-runtime"));
        #[cfg(not(feature = "envtest"))]
        None
    };
    std::env::var_os("ACTORCILE_BENCH_CONTROLLER_RUNTIME")
        .map(Into::into)
        .or_else(cached)
        .filter(|p| p.is_file())
        .expect(
            "controller-runtime's side is not built: run scripts/install-test-deps.sh, or set \
             ACTORCILE_BENCH_CONTROLLER_RUNTIME",
        )
}

/// Starts `runtime` over every namespace (controller-runtime with the cluster `kubeconfig`).
async fn start(
    runtime: Contender,
    client: Client,
    run: &str,
    args: &Args,
    kubeconfig: Option<&std::path::Path>,
) -> Started {
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
            Started {
                stop: Box::new(move || Box::pin(handle.shutdown())),
                pid: None,
            }
        }
        Contender::ControllerRuntime => {
            let kubeconfig = kubeconfig.expect("controller-runtime runs with --envtest");
            let mut child = std::process::Command::new(controller_runtime_binary())
                .arg("--kubeconfig")
                .arg(kubeconfig)
                .args(["--workload", "tenants"])
                .args(["--selector", &format!("{RUN}={run}")])
                .args(["--work", &format!("{}us", work.as_micros())])
                .args(["--concurrency", &args.concurrency.to_string()])
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("start the controller-runtime process");
            let pid = child.id();
            Started {
                stop: Box::new(move || {
                    Box::pin(async move {
                        let _ = child.kill();
                        let _ = child.wait();
                    })
                }),
                pid: Some(pid),
            }
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
            Started {
                stop: Box::new(move || {
                    Box::pin(async move {
                        let _ = stop.send(());
                        let _ = task.await;
                    })
                }),
                pid: None,
            }
        }
    }
}

/// One run: `runtime`, with the burst or `alone`; returns its report line.
async fn run(
    runtime: Contender,
    burst: bool,
    client: Client,
    prefix: &str,
    args: &Args,
    kubeconfig: Option<&std::path::Path>,
) -> String {
    let times = Arc::new(Mutex::new(Times::default()));
    let run_label = prefix.trim_end_matches('-').to_string();
    let expected = args.tenants * args.each + if burst { args.burst } else { 0 };
    let ready = |times: &Mutex<Times>| times.lock().unwrap().ready.len();
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
    let started = start(runtime, client.clone(), &run_label, args, kubeconfig).await;
    // One object Ready first: the runtime has started and listed.
    create(
        &client,
        &format!("{prefix}warm"),
        "w0".into(),
        &run_label,
        &times,
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while ready(&times) < 1 {
        assert!(
            Instant::now() < deadline,
            "{}: did not start",
            runtime.name()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (cpu0, t0) = (cpu_seconds(started.pid), Instant::now());
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
    while ready(&times) < expected as usize + 1 {
        assert!(
            Instant::now() < deadline,
            "{}: not every object Ready in 10 min",
            runtime.name()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (wall, cpu) = (t0.elapsed(), cpu_seconds(started.pid) - cpu0);
    (started.stop)().await;
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
    let names = [format!("{prefix}burst"), format!("{prefix}warm")]
        .into_iter()
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
    let mut contenders = vec![
        Contender::Actorcile,
        Contender::ActorcileFifo,
        Contender::Kube,
    ];
    if args.envtest {
        contenders.push(Contender::ControllerRuntime);
    }
    for runtime in contenders {
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
            #[cfg(feature = "envtest")]
            let kubeconfig = env.as_ref().map(|e| e.kubeconfig_path().to_path_buf());
            #[cfg(not(feature = "envtest"))]
            let kubeconfig: Option<std::path::PathBuf> = None;
            let line = run(
                runtime,
                burst,
                client,
                &prefix,
                &args,
                kubeconfig.as_deref(),
            )
            .await;
            println!("{line}");
        }
    }
}
