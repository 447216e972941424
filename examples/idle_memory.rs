//! Memory per idle managed object, with passivation.
//!
//! Creates N objects on the in-process cluster, reads RSS (baseline: cluster and objects only),
//! starts the runtime (noop tree, idle timeout 1 s), waits until every object has run once and
//! every actor has passivated, then reads RSS again. Prints the added RSS per object — the
//! runtime's own cost for an idle managed object: reflector store copy, manager slot, passive
//! state, reference index entry. glibc keeps freed heap resident after the actors stop, so the
//! figure is read after `malloc_trim(0)` (the untrimmed one is printed too).
//!
//! ```text
//! cargo run --release --example idle_memory -- --objects 100000
//! ```

use std::time::{Duration, Instant};

use actorcile::cluster::Cluster;
use actorcile::prelude::*;
use clap::Parser;
use kube::api::{Api, PostParams};
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "idle.actorcile.dev",
    version = "v1",
    kind = "Idle",
    namespaced,
    status = "ResourceStatus"
)]
struct IdleSpec {
    n: u32,
}

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 100_000)]
    objects: u32,
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let cluster = Cluster::builder().history(1_000).build();
    cluster.install_crd(&Idle::crd()).expect("install CRD");
    let client = cluster.client();
    let api: Api<Idle> = Api::namespaced(client.clone(), "default");
    for i in 0..args.objects {
        let mut o = Idle::new(&format!("o{i}"), IdleSpec { n: i });
        o.metadata.namespace = Some("default".into());
        api.create(&PostParams::default(), &o)
            .await
            .expect("create");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let baseline = rss_bytes();
    let started = Instant::now();
    let policy = SupervisorPolicy {
        idle_timeout: Some(Duration::from_secs(1)),
        ..Default::default()
    };
    let handle = Runtime::builder(client)
        .policy(policy)
        .controller(
            Controller::<Idle>::new(step("noop", |_cx: Context<Idle>| async { Outcome::Done }))
                .without_finalizer()
                .without_status(),
        )
        .start()
        .await
        .expect("start");
    let n = u64::from(args.objects);
    loop {
        let m = handle.metrics();
        if m.provision_runs >= n && m.live_actors == 0 && m.passivations >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let settle = started.elapsed();
    // let freed memory settle, then read the resident set
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle_untrimmed = rss_bytes();
    // glibc keeps freed heap pages resident; give them back so RSS shows what is live.
    // SAFETY: malloc_trim only releases free memory of the process's own heap.
    unsafe {
        libc::malloc_trim(0);
    }
    let idle = rss_bytes();
    let m = handle.metrics();
    let per_object = idle.saturating_sub(baseline) as f64 / n as f64;
    println!(
        "{}",
        serde_json::json!({
            "objects": n,
            "baseline_rss_bytes": baseline,
            "idle_rss_bytes": idle,
            "idle_rss_before_malloc_trim_bytes": idle_untrimmed,
            "idle_rss_per_object_bytes": per_object.round(),
            "seconds_to_all_passivated": settle.as_secs_f64(),
            "live_actors": m.live_actors,
            "passivations": m.passivations,
        })
    );
    handle.shutdown().await;
}
