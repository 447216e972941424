//! Quickstart: the runtime on the in-process cluster.
//!
//! Registers a sample CRD with a 3-step serial tree whose middle step yields twice before it
//! succeeds, creates N objects, waits until all are Ready, deletes them all, waits until they are
//! gone, and prints one JSON line:
//! `{"objects":N,"ready":R,"deleted":D,"leaked_finalizers":F,"seconds":S}`.
//!
//! ```text
//! cargo run --release --example quickstart -- --objects 1000
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use actorcile::cluster::ApiServer;
use actorcile::prelude::*;
use clap::Parser;
use dashmap::DashMap;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{CustomResource, CustomResourceExt, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A sample resource: a "database" that takes a moment to provision.
#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "quickstart.actorcile.dev",
    version = "v1",
    kind = "Database",
    namespaced,
    status = "ResourceStatus"
)]
pub struct DatabaseSpec {
    /// Storage in GiB.
    pub size_gib: u32,
}

#[derive(Parser)]
struct Args {
    /// How many objects to create.
    #[arg(long, default_value_t = 1000)]
    objects: usize,
    /// Runs in flight at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
}

/// validate → allocate (yields twice) → announce.
fn tree() -> impl Provisioner<Database> {
    let yields: Arc<DashMap<String, u32>> = Arc::default();
    serial![
        step("validate", |cx: Context<Database>| async move {
            if cx.object().spec.size_gib == 0 {
                return Outcome::Terminal(Reason::new("InvalidSize", "sizeGib must be at least 1"));
            }
            Outcome::Done
        }),
        step("allocate", move |cx: Context<Database>| {
            let yields = yields.clone();
            async move {
                let mut n = yields.entry(cx.object().name_any()).or_insert(0);
                if *n < 2 {
                    *n += 1;
                    return Outcome::yield_after(
                        Duration::from_millis(50),
                        Reason::new("Allocating", format!("allocating storage ({} of 2)", *n)),
                    );
                }
                Outcome::Done
            }
        }),
        step("announce", |_cx: Context<Database>| async { Outcome::Done }),
    ]
}

async fn count(api: &Api<Database>, f: impl Fn(&Database) -> bool) -> usize {
    let mut n = 0;
    let mut lp = ListParams::default().limit(500);
    loop {
        let page = api.list(&lp).await.expect("list");
        n += page.items.iter().filter(|d| f(d)).count();
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
            _ => return n,
        }
    }
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let cluster = ApiServer::new();
    cluster.install_crd(&Database::crd()).expect("install CRD");
    let client = cluster.client();
    let api: Api<Database> = Api::namespaced(client.clone(), "default");

    let policy = SupervisorPolicy {
        runtime: actorcile::policy::RuntimePolicy {
            max_concurrent_reconciles: args.concurrency,
            ..Default::default()
        },
        ..SupervisorPolicy::default()
    };
    let rt = Runtime::builder(
        client.clone(),
        OperatorNames::new("quickstart-operator", "quickstart.actorcile.dev"),
    )
    .policy(policy)
    .controller(Controller::<Database>::new(tree()))
    .start()
    .await
    .expect("start runtime");

    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.timeout);
    for i in 0..args.objects {
        let db = Database::new(&format!("db-{i}"), DatabaseSpec { size_gib: 10 });
        api.create(&PostParams::default(), &db)
            .await
            .expect("create");
    }
    let mut ready = 0;
    while Instant::now() < deadline {
        ready = count(&api, |d| d.status.as_ref().is_some_and(|s| s.is_ready())).await;
        if ready == args.objects {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "{ready} Ready after {:.2}s",
        started.elapsed().as_secs_f64()
    );

    for i in 0..args.objects {
        api.delete(&format!("db-{i}"), &DeleteParams::default())
            .await
            .expect("delete");
    }
    let mut left = args.objects;
    while Instant::now() < deadline {
        left = count(&api, |_| true).await;
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let leaked = count(&api, |d| !d.finalizers().is_empty()).await;
    let seconds = started.elapsed().as_secs_f64();
    eprintln!("metrics: {:?}", rt.metrics());
    rt.shutdown().await;
    println!(
        "{}",
        serde_json::json!({
            "objects": args.objects,
            "ready": ready,
            "deleted": args.objects - left,
            "leaked_finalizers": leaked,
            "seconds": (seconds * 1000.0).round() / 1000.0,
        })
    );
}
