//! The API server's own ceiling for status writes: N objects, then one merge patch on `/status`
//! per object with plain concurrent kube requests (no runtime at all). Compare with
//! `actorcile bench --workload status` on the same backend.
//!
//! ```text
//! cargo run --release --example write_ceiling --features envtest -- --objects 1000 --concurrency 32
//! cargo run --release --example write_ceiling -- --objects 1000          # in-process cluster
//! ```
//!
//! By default each write names no field manager and carries no precondition, as kube-runtime's
//! `PatchParams::default()` writes do. `--field-manager actorcile --precondition` sends what
//! actorcile's status writes send: its field manager, and the resourceVersion the write was
//! computed from.
//!
//! `--watchers 2` keeps two watches of the objects open during the writes, reading every event:
//! what the API server also serves while a runtime writes (its own watch, and the bench's
//! observer). That is the like-for-like ceiling for `actorcile bench --workload status`.
//!
//! The writes go through a client of their own, so their connections open within the measured
//! window, as a runtime's do. With `--envtest` the writes wait until the API server has published
//! the CRD's OpenAPI (it merges it in the background after the CRD is Established).

use std::time::Instant;

use actorcile::cluster::ApiServer;
use actorcile::prelude::*;
use clap::Parser;
use futures::StreamExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "ceiling.actorcile.dev",
    version = "v1",
    kind = "Slot",
    namespaced,
    status = "ResourceStatus"
)]
struct SlotSpec {
    n: u32,
}

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 1000)]
    objects: u32,
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Against a real etcd + kube-apiserver (needs `--features envtest`).
    #[arg(long)]
    envtest: bool,
    /// The field manager the status writes name (none by default).
    #[arg(long)]
    field_manager: Option<String>,
    /// Each status write carries the object's resourceVersion (from its creation) as a
    /// precondition.
    #[arg(long)]
    precondition: bool,
    /// Watches of the objects open during the writes, each reading every event, as a runtime's
    /// watch and the bench's observer do (none by default).
    #[arg(long, default_value_t = 0)]
    watchers: usize,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    #[cfg(feature = "envtest")]
    let mut _env = None;
    // Two clients: one creates the objects, a fresh one (no connection open yet, as a runtime
    // starting has none but its list and watch) sends the status writes.
    let (client, writer) = if args.envtest {
        #[cfg(feature = "envtest")]
        {
            let env = actorcile::envtest::Envtest::builder()
                .crds(vec![Slot::crd()])
                .start()
                .await
                .expect("start envtest");
            // The API server merges the CRD's OpenAPI in the background (about half a
            // CPU-second); not during the writes.
            let timeout = std::time::Duration::from_secs(60);
            actorcile::envtest::wait_for_openapi(env.client(), &[Slot::crd()], timeout)
                .await
                .expect("the CRD's OpenAPI published");
            let clients = (env.client(), env.client());
            _env = Some(env);
            clients
        }
        #[cfg(not(feature = "envtest"))]
        {
            eprintln!("--envtest needs --features envtest");
            std::process::exit(2);
        }
    } else {
        let cluster = ApiServer::new();
        cluster.install_crd(&Slot::crd()).expect("install CRD");
        (cluster.client(), cluster.client())
    };
    let api: Api<Slot> = Api::namespaced(client, "default");
    let mut versions: Vec<(u32, Option<String>)> = futures::stream::iter(0..args.objects)
        .map(|i| {
            let api = api.clone();
            async move {
                let mut s = Slot::new(&format!("s{i}"), SlotSpec { n: i });
                s.metadata.namespace = Some("default".into());
                // Created by another field manager than the writes below, as the bench's objects
                // are (`actorcile bench` creates them as `actorcile-bench-setup`): each status
                // write then adds its own `managedFields` entry, as a runtime's does.
                let created_by = PostParams {
                    field_manager: Some("actorcile-bench-setup".into()),
                    ..PostParams::default()
                };
                let created = api.create(&created_by, &s).await.expect("create");
                (i, created.metadata.resource_version)
            }
        })
        .buffer_unordered(args.concurrency)
        .collect()
        .await;
    versions.sort_by_key(|(i, _)| *i);
    let status = ResourceStatus::default().with_ready(
        Phase::Ready,
        true,
        ReadyReason::Provisioned,
        "provisioned",
        Some(1),
    );
    let params = PatchParams {
        field_manager: args.field_manager.clone(),
        ..PatchParams::default()
    };
    let patches: Vec<(u32, serde_json::Value)> = versions
        .into_iter()
        .map(|(i, version)| {
            let mut patch = status.patch();
            if args.precondition {
                patch["metadata"] = serde_json::json!({ "resourceVersion": version });
            }
            (i, patch)
        })
        .collect();
    let api: Api<Slot> = Api::namespaced(writer, "default");
    let mut watches = Vec::new();
    for _ in 0..args.watchers {
        let (opened_tx, opened_rx) = tokio::sync::oneshot::channel();
        let api = api.clone();
        watches.push(tokio::spawn(async move {
            // From now on: the writes' events only, not the objects' creation.
            let version = api
                .list_metadata(&Default::default())
                .await
                .expect("list")
                .metadata
                .resource_version
                .unwrap_or_default();
            let mut events = api
                .watch(&Default::default(), &version)
                .await
                .expect("watch")
                .boxed();
            let _ = opened_tx.send(());
            while let Some(event) = events.next().await {
                event.expect("watch event");
            }
        }));
        opened_rx.await.expect("the watch opened");
    }
    let started = Instant::now();
    futures::stream::iter(patches)
        .for_each_concurrent(args.concurrency, |(i, patch)| {
            let (api, params) = (api.clone(), &params);
            async move {
                api.patch_status(&format!("s{i}"), params, &Patch::Merge(&patch))
                    .await
                    .expect("patch status");
            }
        })
        .await;
    let secs = started.elapsed().as_secs_f64();
    for watch in watches {
        watch.abort();
    }
    println!(
        "{}",
        serde_json::json!({
            "backend": if args.envtest { "envtest" } else { "in-process" },
            "objects": args.objects,
            "concurrency": args.concurrency,
            "field_manager": args.field_manager,
            "precondition": args.precondition,
            "watchers": args.watchers,
            "seconds": secs,
            "status_writes_per_sec": f64::from(args.objects) / secs,
        })
    );
}
