//! The API server's own ceiling for status writes: N objects, then one merge patch on `/status`
//! per object with plain concurrent kube requests (no runtime at all). Compare with
//! `actorcile bench --workload status` on the same backend.
//!
//! ```text
//! cargo run --release --example write_ceiling --features envtest -- --objects 1000 --concurrency 32
//! cargo run --release --example write_ceiling -- --objects 1000          # in-process cluster
//! ```

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
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    #[cfg(feature = "envtest")]
    let mut _env = None;
    let client = if args.envtest {
        #[cfg(feature = "envtest")]
        {
            let env = actorcile::envtest::Envtest::builder()
                .crds(vec![Slot::crd()])
                .start()
                .await
                .expect("start envtest");
            let c = env.client();
            _env = Some(env);
            c
        }
        #[cfg(not(feature = "envtest"))]
        {
            eprintln!("--envtest needs --features envtest");
            std::process::exit(2);
        }
    } else {
        let cluster = ApiServer::new();
        cluster.install_crd(&Slot::crd()).expect("install CRD");
        cluster.client()
    };
    let api: Api<Slot> = Api::namespaced(client, "default");
    futures::stream::iter(0..args.objects)
        .for_each_concurrent(args.concurrency, |i| {
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
                api.create(&created_by, &s).await.expect("create");
            }
        })
        .await;
    let status = ResourceStatus::default().with_ready(
        Phase::Ready,
        true,
        ReadyReason::Provisioned,
        "provisioned",
        Some(1),
    );
    let patch = status.patch();
    let started = Instant::now();
    futures::stream::iter(0..args.objects)
        .for_each_concurrent(args.concurrency, |i| {
            let (api, patch) = (api.clone(), patch.clone());
            async move {
                api.patch_status(
                    &format!("s{i}"),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
                .expect("patch status");
            }
        })
        .await;
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{}",
        serde_json::json!({
            "backend": if args.envtest { "envtest" } else { "in-process" },
            "objects": args.objects,
            "concurrency": args.concurrency,
            "seconds": secs,
            "status_writes_per_sec": f64::from(args.objects) / secs,
        })
    );
}
