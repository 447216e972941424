//! A provider-config change fanned out to every object of a controller, measured side by side in
//! one run on the in-process cluster:
//!
//! - `actorcile`: `Controller::config` — the change wakes every object (passive ones included),
//!   and their reconciles wait for the runtime's reconcile slots (`max_concurrent_reconciles`, 64 by default);
//! - `kube-runtime`: the openmcp way — `Controller::reconcile_all_on` with a stream of the
//!   config's changes enqueues every object at once (kube-runtime's default concurrency: none);
//! - `kube-runtime, concurrency 64`: the same with the limit actorcile has, for a like-for-like
//!   time.
//!
//! Every reconcile reads the config (actorcile: `cx.config()`; kube-runtime: a reflector store
//! of it, as its users would) and then waits `--work-ms` for an external call. No runtime writes
//! a finalizer or status here: only the fan-out is measured. For each: seconds from the config
//! write until every object ran with the new config, the most reconciles in flight at once,
//! and the process's CPU seconds over that window (`getrusage`).
//!
//! ```text
//! cargo run --release --example config_fanout -- --objects 10000
//! ```
//! Prints a table, then one JSON line.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use actorcile::cluster::ApiServer;
use actorcile::prelude::*;
use actorcile::triggers::ConfigRef;
use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller as KubeController};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "fanout.actorcile.dev",
    version = "v1",
    kind = "Site",
    namespaced,
    status = "ResourceStatus"
)]
struct SiteSpec {
    /// The object's index (0..objects).
    index: usize,
}

#[derive(Parser)]
struct Args {
    /// Objects the change fans out to.
    #[arg(long, default_value_t = 10_000)]
    objects: usize,
    /// Each reconcile's external call, in milliseconds.
    #[arg(long, default_value_t = 2)]
    work_ms: u64,
}

/// What every reconcile of one run records: the config version each object last ran with, and
/// reconciles in flight.
struct Probe {
    seen: Vec<AtomicU8>,
    /// Objects that ran with config version 2.
    done: AtomicUsize,
    in_flight: AtomicU64,
    peak: AtomicU64,
    work: Duration,
}

impl Probe {
    fn new(objects: usize, work: Duration) -> Arc<Self> {
        Arc::new(Self {
            seen: (0..objects).map(|_| AtomicU8::new(0)).collect(),
            done: AtomicUsize::new(0),
            in_flight: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            work,
        })
    }

    /// One reconcile of object `index` with config `version`.
    async fn reconcile(&self, index: usize, version: u8) {
        let now = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak.fetch_max(now, Ordering::Relaxed);
        tokio::time::sleep(self.work).await;
        if version == 2 && self.seen[index].swap(version, Ordering::Relaxed) != 2 {
            self.done.fetch_add(1, Ordering::Relaxed);
        } else {
            self.seen[index].store(version, Ordering::Relaxed);
        }
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    fn all_saw(&self, version: u8) -> bool {
        self.seen
            .iter()
            .all(|s| s.load(Ordering::Relaxed) == version)
    }
}

fn version_of(cm: &ConfigMap) -> u8 {
    cm.data
        .as_ref()
        .and_then(|d| d.get("version"))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

async fn write_config(client: &Client, version: u8) {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("provider".into());
    cm.data = Some([("version".to_string(), version.to_string())].into());
    Api::<ConfigMap>::namespaced(client.clone(), "default")
        .patch(
            "provider",
            &PatchParams::apply("fanout").force(),
            &Patch::Apply(&cm),
        )
        .await
        .expect("write the config");
}

/// A cluster with `objects` Sites and the config at version 1.
async fn cluster(objects: usize) -> (ApiServer, Client) {
    let server = ApiServer::new();
    server.install_crd(&Site::crd()).expect("install the CRD");
    let client = server.client();
    write_config(&client, 1).await;
    let api: Api<Site> = Api::namespaced(client.clone(), "default");
    for index in 0..objects {
        let site = Site::new(&format!("s{index}"), SiteSpec { index });
        api.create(&PostParams::default(), &site)
            .await
            .expect("create a site");
    }
    (server, client)
}

async fn wait(what: &str, limit: Duration, check: impl Fn() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

fn cpu_seconds() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: `getrusage` writes one `rusage` to the pointer, which points to one.
    let usage = unsafe {
        if libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) != 0 {
            return f64::NAN;
        }
        usage.assume_init()
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// One side's figures.
#[derive(Serialize)]
struct Figures {
    name: &'static str,
    seconds: f64,
    cpu_seconds: f64,
    peak_in_flight: u64,
}

/// Change the config to version 2 once every object ran with version 1, and measure until every
/// object ran with version 2.
async fn measure(name: &'static str, client: &Client, probe: &Probe) -> Figures {
    wait("the first reconciles", Duration::from_secs(600), || {
        probe.all_saw(1)
    })
    .await;
    // Let the first wave settle (actorcile passivates its actors) before the change.
    tokio::time::sleep(Duration::from_millis(500)).await;
    probe.peak.store(0, Ordering::Relaxed);
    let (t0, cpu0) = (Instant::now(), cpu_seconds());
    write_config(client, 2).await;
    wait("the fan-out", Duration::from_secs(600), || {
        probe.done.load(Ordering::Relaxed) == probe.seen.len()
    })
    .await;
    Figures {
        name,
        seconds: t0.elapsed().as_secs_f64(),
        cpu_seconds: cpu_seconds() - cpu0,
        peak_in_flight: probe.peak.load(Ordering::Relaxed),
    }
}

async fn actorcile_side(args: &Args) -> Figures {
    let (_server, client) = cluster(args.objects).await;
    let probe = Probe::new(args.objects, Duration::from_millis(args.work_ms));
    let p = probe.clone();
    let tree = step("provider", move |cx: Context<Site>| {
        let p = p.clone();
        async move {
            let version = cx.config::<ConfigMap>().map_or(0, |c| version_of(&c));
            p.reconcile(cx.object().spec.index, version).await;
            Outcome::Done
        }
    });
    let policy = SupervisorPolicy {
        kind: actorcile::policy::KindPolicy {
            idle_timeout: Some(Duration::from_millis(100)),
            ..Default::default()
        },
        ..Default::default()
    };
    let rt = Runtime::builder(
        client.clone(),
        OperatorNames::new("config-fanout-operator", "fanout.actorcile.dev"),
    )
    .policy(policy)
    .controller(
        Controller::<Site>::new(tree)
            .without_finalizer()
            .without_status()
            .config(ConfigRef::<ConfigMap>::namespaced("default", "provider")),
    )
    .start()
    .await
    .expect("start actorcile");
    let figures = measure("actorcile", &client, &probe).await;
    rt.shutdown().await;
    figures
}

type Reconcile = Pin<Box<dyn Future<Output = Result<Action, kube::Error>> + Send>>;

async fn kube_runtime_side(args: &Args, concurrency: u16, name: &'static str) -> Figures {
    let (_server, client) = cluster(args.objects).await;
    let probe = Probe::new(args.objects, Duration::from_millis(args.work_ms));
    // The config, as a kube-runtime operator reads it: a reflector store, and its changes as
    // the trigger of `reconcile_all_on`.
    let (store, writer) = reflector::store::<ConfigMap>();
    let configs = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let changes = reflector(
        writer,
        watcher(
            configs,
            watcher::Config::default().fields("metadata.name=provider"),
        ),
    )
    .applied_objects()
    .filter_map(|o| async move { o.ok().map(|_| ()) })
    .skip(1); // the first list: every object runs at start-up anyway
    let ctx = Arc::new((probe.clone(), store));
    let reconcile =
        |site: Arc<Site>, ctx: Arc<(Arc<Probe>, reflector::Store<ConfigMap>)>| -> Reconcile {
            Box::pin(async move {
                let version = ctx
                    .1
                    .get(&reflector::ObjectRef::new("provider").within("default"))
                    .map_or(0, |c| version_of(&c));
                ctx.0.reconcile(site.spec.index, version).await;
                Ok(Action::await_change())
            })
        };
    let controller =
        KubeController::new(Api::<Site>::all(client.clone()), watcher::Config::default())
            .with_config(ControllerConfig::default().concurrency(concurrency))
            .reconcile_all_on(changes)
            .run(
                reconcile,
                |_site, _e: &kube::Error, _ctx| Action::requeue(Duration::from_secs(1)),
                ctx,
            )
            .for_each(|_| async {});
    let task = tokio::spawn(controller);
    let figures = measure(name, &client, &probe).await;
    task.abort();
    figures
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let figures = vec![
        actorcile_side(&args).await,
        kube_runtime_side(&args, 0, "kube-runtime reconcile_all_on").await,
        kube_runtime_side(&args, 64, "kube-runtime reconcile_all_on, concurrency 64").await,
    ];
    println!(
        "config change fanned out to {} objects ({} ms of work each), in-process cluster:",
        args.objects, args.work_ms
    );
    println!(
        "  {:<48} {:>9} {:>9} {:>16}",
        "", "seconds", "CPU s", "peak in flight"
    );
    for f in &figures {
        println!(
            "  {:<48} {:>9.3} {:>9.3} {:>16}",
            f.name, f.seconds, f.cpu_seconds, f.peak_in_flight
        );
    }
    println!(
        "{}",
        serde_json::json!({"objects": args.objects, "work_ms": args.work_ms, "runs": figures})
    );
}
