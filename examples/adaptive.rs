//! Adaptive concurrency, measured: `--objects` objects, each reconcile applying `--writes`
//! ConfigMaps (and then its status), on an in-process API server that serves `--seats`
//! requests at once in `--latency-ms` each and queues `--queue` more, answering 429 past that (as
//! API Priority and Fairness does). Each run starts with every object created and reports the
//! time until all are Ready, objects per second, the 429s the runtime was answered (each
//! attempt: the client is kube's, which retries a 429 after the server's `Retry-After`), and
//! this process's CPU seconds, for fixed reconcile slots (`--fixed`, each a run) and for the
//! adaptive limit (`actorcile::adaptive`, bounded by the largest fixed setting).
//!
//! With `--envtest` (feature `envtest`) the server is a real etcd + kube-apiserver, and the
//! runtime runs as a user of its own whose requests a FlowSchema sends to a priority level of
//! `--shares` nominal concurrency shares (no borrowing) with one queue of `--queue`; the run
//! reports the seats the server gave it. CPU is then this process's only.
//!
//! ```text
//! cargo run --release --example adaptive --features cluster -- --objects 2000
//! cargo run --release --example adaptive --features cluster,envtest -- --envtest --objects 1000
//! ```

use std::time::{Duration, Instant};

use actorcile::adaptive::{AdaptiveConcurrency, AimdPolicy};
use actorcile::cluster::{Apf, ApiServer, Faults};
use actorcile::prelude::*;
use actorcile::testing::CountThrottled;
use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::client::retry::RetryPolicy;
use kube::runtime::watcher;
use kube::{CustomResource, CustomResourceExt, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tower::retry::RetryLayer;

#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "adaptive.actorcile.dev",
    version = "v1",
    kind = "Site",
    namespaced,
    status = "ResourceStatus"
)]
struct SiteSpec {
    n: u32,
}

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 2000)]
    objects: u32,
    /// ConfigMaps each reconcile applies.
    #[arg(long, default_value_t = 3)]
    writes: u32,
    /// Requests the server serves at once.
    #[arg(long, default_value_t = 16)]
    seats: usize,
    /// Requests that wait for a seat; one more is answered 429.
    #[arg(long, default_value_t = 16)]
    queue: usize,
    /// How long each request holds its seat, in milliseconds.
    #[arg(long, default_value_t = 2.0)]
    latency_ms: f64,
    /// The fixed reconcile-slot settings, one run each.
    #[arg(long, value_delimiter = ',', default_value = "4,8,16,32,64,128")]
    fixed: Vec<usize>,
    /// Run on a real etcd + kube-apiserver (feature `envtest`).
    #[arg(long)]
    envtest: bool,
    /// With `--envtest`: the nominal concurrency shares of the runtime's priority level.
    #[arg(long, default_value_t = 4)]
    shares: u32,
}

/// The label that tells one run's objects from another's on a shared control plane.
const RUN: &str = "adaptive.actorcile.dev/run";

/// Where the runs go: a fresh in-process server each, or one control plane.
enum Backend {
    InProcess,
    #[cfg(feature = "envtest")]
    Envtest(Box<actorcile::envtest::Envtest>),
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

/// Each reconcile applies `writes` ConfigMaps of its own. The client retries a 429 after the
/// server's `Retry-After`; a write refused past its retries fails the reconcile, and the
/// runtime's error backoff runs it again.
fn tree(writes: u32) -> impl Provisioner<Site> {
    step("apply", move |cx: Context<Site>| async move {
        let ns = cx.object().namespace().unwrap_or_default();
        let api: Api<ConfigMap> = Api::namespaced(cx.client().clone(), &ns);
        for i in 0..writes {
            let name = format!("{}-{i}", cx.object().name_any());
            let cm = serde_json::json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": { "name": name },
                "data": { "n": cx.object().spec.n.to_string() },
            });
            let params = PatchParams::apply("adaptive-bench").force();
            if let Err(e) = api.patch(&name, &params, &Patch::Apply(&cm)).await {
                return Outcome::failed(Reason::new("WriteRefused", e.to_string()), e);
            }
        }
        Outcome::Done
    })
}

struct Run {
    slots: String,
    wall: Duration,
    cpu: f64,
    throttled: u64,
    limit: Option<usize>,
}

async fn run(args: &Args, backend: &Backend, no: usize, fixed: Option<usize>, max: usize) -> Run {
    let server = ApiServer::new();
    let (client, ns) = match backend {
        Backend::InProcess => {
            server.install_crd(&Site::crd()).expect("install the CRD");
            (server.client(), "default".to_string())
        }
        #[cfg(feature = "envtest")]
        Backend::Envtest(env) => {
            let ns = format!("run-{no}");
            let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(env.client());
            let mut namespace = k8s_openapi::api::core::v1::Namespace::default();
            namespace.metadata.name = Some(ns.clone());
            api.create(&PostParams::default(), &namespace)
                .await
                .expect("create the run's namespace");
            (env.client(), ns)
        }
    };
    let sites: Api<Site> = Api::namespaced(client.clone(), &ns);
    futures::stream::iter(0..args.objects)
        .for_each_concurrent(32, |n| {
            let sites = sites.clone();
            async move {
                let mut site = Site::new(&format!("site-{n}"), SiteSpec { n });
                site.metadata.labels = Some([(RUN.to_string(), no.to_string())].into());
                sites
                    .create(&PostParams::default(), &site)
                    .await
                    .expect("create");
            }
        })
        .await;
    // Readiness is read from a watch (exempt from the limit), listed before the limit is set.
    let (listed_tx, listed) = tokio::sync::oneshot::channel::<()>();
    let objects = args.objects as usize;
    let all_ready = tokio::spawn({
        let sites = sites.clone();
        async move {
            let mut listed_tx = Some(listed_tx);
            let mut ready = std::collections::HashSet::new();
            let mut events = std::pin::pin!(watcher(sites, watcher::Config::default()));
            while let Some(event) = events.next().await {
                let site = match event {
                    Ok(watcher::Event::InitDone) => {
                        if let Some(tx) = listed_tx.take() {
                            let _ = tx.send(());
                        }
                        continue;
                    }
                    Ok(watcher::Event::Apply(s) | watcher::Event::InitApply(s)) => s,
                    _ => continue,
                };
                if site.status.as_ref().is_some_and(ResourceStatus::is_ready) {
                    ready.insert(site.name_any());
                    if ready.len() == objects {
                        return;
                    }
                }
            }
        }
    });
    listed.await.expect("the readiness watch listed");
    let adaptive = fixed
        .is_none()
        .then(|| AdaptiveConcurrency::new(AimdPolicy::default()));
    let throttled = CountThrottled::default();
    // kube's retries of 429s (which wait for the server's `Retry-After`) above the adaptive
    // layer and the count, so that both see every attempt: the stack
    // `AdaptiveConcurrency::client_with` builds, here with the adaptive layer optional.
    let retries = RetryLayer::new(RetryPolicy::server_retry());
    let runtime_client = match backend {
        Backend::InProcess => {
            server.set_apf(Some(Apf {
                seats: args.seats,
                queue: args.queue,
            }));
            server.set_faults(Faults {
                latency: Duration::from_secs_f64(args.latency_ms / 1000.0),
                ..Faults::default()
            });
            kube::Client::new(
                tower::ServiceBuilder::new()
                    .layer(retries)
                    .option_layer(adaptive.clone())
                    .layer(throttled.clone())
                    .map_err(tower::BoxError::from)
                    .service(server.service()),
                "default",
            )
        }
        #[cfg(feature = "envtest")]
        Backend::Envtest(env) => {
            let mut config = env.user_config();
            config.default_retry = false;
            kube::client::ClientBuilder::try_from(config)
                .expect("the user's client")
                .with_layer(&throttled)
                .with_layer(&tower::util::option_layer(adaptive.clone()))
                .with_layer(&tower::buffer::BufferLayer::new(1024))
                .with_layer(&retries)
                .build()
        }
    };
    let mut policy = SupervisorPolicy::default();
    policy.runtime.max_concurrent_reconciles = fixed.unwrap_or(max);
    let (cpu0, t0) = (cpu_seconds(), Instant::now());
    let mut builder = Runtime::builder(
        runtime_client,
        OperatorNames::new("adaptive-bench", "adaptive.actorcile.dev"),
    )
    .policy(policy)
    .controller(
        Controller::<Site>::new(tree(args.writes))
            .without_finalizer()
            .watcher_config(watcher::Config::default().labels(&format!("{RUN}={no}"))),
    );
    if let Some(a) = &adaptive {
        builder = builder.adaptive_concurrency(a.clone());
    }
    let handle = builder.start().await.expect("start actorcile");
    all_ready.await.expect("the readiness watch");
    let (wall, cpu) = (t0.elapsed(), cpu_seconds() - cpu0);
    let limit = adaptive.as_ref().map(AdaptiveConcurrency::limit);
    handle.shutdown().await;
    Run {
        slots: fixed.map_or_else(|| format!("adaptive (≤{max})"), |n| n.to_string()),
        wall,
        cpu,
        throttled: throttled.count(),
        limit,
    }
}

/// A control plane whose user (the runtime's) may do anything, in a priority level of
/// `shares` nominal shares with one queue of `queue`; returns it and the level's seats.
#[cfg(feature = "envtest")]
async fn control_plane(shares: u32, queue: usize) -> (actorcile::envtest::Envtest, u64) {
    use actorcile::envtest::{Envtest, PriorityLevel};
    use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
    let env = Envtest::builder()
        .crds(vec![Site::crd()])
        .start()
        .await
        .expect("start etcd + kube-apiserver");
    let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "adaptive-bench" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin" },
        "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": env.user_name() }],
    }))
    .expect("a ClusterRoleBinding");
    Api::<ClusterRoleBinding>::all(env.client())
        .create(&PostParams::default(), &binding)
        .await
        .expect("bind the user");
    let level = PriorityLevel {
        shares,
        queue: queue as u32,
    };
    let seats = env
        .limit_user(env.user_name(), level)
        .await
        .expect("the user's priority level");
    (env, seats)
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let max = args.fixed.iter().copied().max().unwrap_or(64);
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let backend = if args.envtest {
        #[cfg(feature = "envtest")]
        {
            let (env, seats) = control_plane(args.shares, args.queue).await;
            println!(
                "{} objects × {} writes; etcd + kube-apiserver {}: the runtime's priority level {} \
                 shares, {seats} seats, a queue of {}; {cpus} CPUs",
                args.objects,
                args.writes,
                env.version(),
                args.shares,
                args.queue
            );
            Backend::Envtest(Box::new(env))
        }
        #[cfg(not(feature = "envtest"))]
        panic!("--envtest needs the feature envtest")
    } else {
        println!(
            "{} objects × {} writes; the server: {} seats, {} queued, {} ms a request; {cpus} CPUs",
            args.objects, args.writes, args.seats, args.queue, args.latency_ms
        );
        Backend::InProcess
    };
    println!(
        "{:>16} {:>9} {:>11} {:>8} {:>7} {:>11}",
        "slots", "wall s", "objects/s", "429s", "CPU s", "final limit"
    );
    let mut settings: Vec<Option<usize>> = args.fixed.iter().copied().map(Some).collect();
    settings.push(None);
    for (no, fixed) in settings.into_iter().enumerate() {
        let r = run(&args, &backend, no, fixed, max).await;
        println!(
            "{:>16} {:>9.2} {:>11.0} {:>8} {:>7.2} {:>11}",
            r.slots,
            r.wall.as_secs_f64(),
            f64::from(args.objects) / r.wall.as_secs_f64(),
            r.throttled,
            r.cpu,
            r.limit.map_or("-".into(), |l| l.to_string()),
        );
    }
}
