//! A chain of N resources, each requiring the previous one to be Ready: time from creating all
//! of them (dependents first, the worst order) until all are Ready, with readiness waits done
//! two ways side by side in one run:
//!
//! - `messages`: `cx.require_ready(prev)` — the waiting actor is woken by a message the moment
//!   its dependency becomes Ready;
//! - `polling`: the Go original's way — read the dependency, and if it is not Ready yield with
//!   the default yield delay and look again.
//!
//! ```text
//! cargo run --release --example chain -- --links 50
//! cargo run --release --example chain --features envtest -- --links 50 --envtest
//! ```
//! Prints a table, then one JSON line.

use std::time::{Duration, Instant};

use actorcile::cluster::ApiServer;
use actorcile::prelude::*;
use clap::Parser;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{CustomResource, CustomResourceExt, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "chain.actorcile.dev",
    version = "v1",
    kind = "Link",
    namespaced,
    status = "ResourceStatus"
)]
struct LinkSpec {
    /// The previous link (none for the head).
    after: Option<String>,
}

#[derive(Parser)]
struct Args {
    /// Links in the chain.
    #[arg(long, default_value_t = 50)]
    links: usize,
    /// The default yield delay the polling variant waits between looks.
    #[arg(long, default_value = "5s", value_parser = humantime_parse)]
    yield_delay: Duration,
    /// Run against a real etcd + kube-apiserver (needs `--features envtest` and
    /// scripts/install-test-deps.sh).
    #[arg(long)]
    envtest: bool,
}

fn humantime_parse(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .strip_suffix("ms")
        .map(|v| v.parse::<f64>().map(|v| v / 1000.0))
        .or_else(|| s.strip_suffix('s').map(|v| v.parse::<f64>()))
        .ok_or_else(|| format!("{s}: use e.g. 500ms or 5s"))?
        .map_err(|e| e.to_string())?;
    Ok(Duration::from_secs_f64(secs))
}

fn tree(polling: bool) -> impl Provisioner<Link> {
    step("after", move |cx: Context<Link>| async move {
        let Some(prev) = cx.object().spec.after.clone() else {
            return Outcome::Done;
        };
        let ns = cx.object().namespace();
        let target = Target::for_kind::<Link>(ns.as_deref(), &prev);
        if polling {
            // read the dependency; if it is not Ready, yield with the default delay
            let api: Api<Link> =
                Api::namespaced(cx.client().clone(), ns.as_deref().unwrap_or("default"));
            match api.get_opt(&prev).await {
                Ok(Some(l)) if l.status.as_ref().is_some_and(|s| s.is_ready()) => Outcome::Done,
                _ => Outcome::yield_now(Reason::new(
                    "DependencyNotReady",
                    format!("{prev} is not Ready"),
                )),
            }
        } else {
            cx.require_ready(&target).await.unwrap_or(Outcome::Done)
        }
    })
}

async fn run(
    client: kube::Client,
    ns: &str,
    links: usize,
    polling: bool,
    yield_delay: Duration,
) -> Duration {
    let api: Api<Link> = Api::namespaced(client.clone(), ns);
    let policy = SupervisorPolicy {
        kind: actorcile::policy::KindPolicy {
            yield_delay,
            ..Default::default()
        },
        ..Default::default()
    };
    let handle = Runtime::builder(
        client.clone(),
        OperatorNames::new("chain-operator", "chain.actorcile.dev"),
    )
    .policy(policy)
    .controller(Controller::<Link>::new(tree(polling)).namespace(ns))
    .start()
    .await
    .expect("start runtime");
    let started = Instant::now();
    for i in (0..links).rev() {
        let mut l = Link::new(
            &format!("l{i}"),
            LinkSpec {
                after: (i > 0).then(|| format!("l{}", i - 1)),
            },
        );
        l.metadata.namespace = Some(ns.to_string());
        api.create(&PostParams::default(), &l)
            .await
            .expect("create");
    }
    loop {
        let list = api.list(&ListParams::default()).await.expect("list");
        if list
            .items
            .iter()
            .filter(|l| l.status.as_ref().is_some_and(|s| s.is_ready()))
            .count()
            == links
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = started.elapsed();
    for i in 0..links {
        let _ = api.delete(&format!("l{i}"), &DeleteParams::default()).await;
    }
    while !api
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .is_empty()
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    handle.shutdown().await;
    took
}

async fn ensure_namespace(client: &kube::Client, ns: &str) {
    use k8s_openapi::api::core::v1::Namespace;
    let api: Api<Namespace> = Api::all(client.clone());
    let mut n = Namespace::default();
    n.metadata.name = Some(ns.to_string());
    let _ = api.create(&PostParams::default(), &n).await;
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    #[cfg(feature = "envtest")]
    let mut _envtest = None;
    let (backend, client) = if args.envtest {
        #[cfg(feature = "envtest")]
        {
            let env = actorcile::envtest::Envtest::builder()
                .crds(vec![Link::crd()])
                .start()
                .await
                .expect("start envtest");
            let c = env.client();
            _envtest = Some(env);
            ("envtest", c)
        }
        #[cfg(not(feature = "envtest"))]
        {
            eprintln!("--envtest needs: cargo run --release --example chain --features envtest");
            std::process::exit(2);
        }
    } else {
        let cluster = ApiServer::new();
        cluster.install_crd(&Link::crd()).expect("install CRD");
        ("in-process", cluster.client())
    };
    ensure_namespace(&client, "chain-messages").await;
    ensure_namespace(&client, "chain-polling").await;
    let messages = run(
        client.clone(),
        "chain-messages",
        args.links,
        false,
        args.yield_delay,
    )
    .await;
    let polling = run(
        client.clone(),
        "chain-polling",
        args.links,
        true,
        args.yield_delay,
    )
    .await;
    println!(
        "chain of {} links on {backend} (yield delay {:?}):",
        args.links, args.yield_delay
    );
    println!(
        "  messages (require_ready)  {:>10.3} s",
        messages.as_secs_f64()
    );
    println!(
        "  polling (yield + re-read) {:>10.3} s",
        polling.as_secs_f64()
    );
    println!(
        "{}",
        serde_json::json!({
            "links": args.links,
            "backend": backend,
            "yield_delay_ms": args.yield_delay.as_millis() as u64,
            "messages_seconds": messages.as_secs_f64(),
            "polling_seconds": polling.as_secs_f64(),
        })
    );
}
