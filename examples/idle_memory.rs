//! Memory per idle managed object, with passivation.
//!
//! Creates N objects on the in-process cluster, reads RSS (baseline: cluster and objects only),
//! starts the runtime (noop tree, idle timeout 1 s), waits until every object has run once and
//! every actor has passivated, then reads RSS again. Prints the added RSS per object — the
//! runtime's own cost for an idle managed object: its cached copy (held encoded while passive,
//! unless `--encode-passive false`) and the cache's slot for it, the manager's entry and the
//! passive state in it. The allocator (mimalloc) keeps freed pages
//! resident after the actors stop, so the figure is read after every worker thread ran
//! `mi_collect` (the figure before the collect is printed too).
//!
//! With `--poll-secs S` every object also re-runs every S seconds, so each idle object keeps a
//! pending wake-up while passive (held by the manager's passive timers).
//!
//! ```text
//! cargo run --release --example idle_memory -- --objects 100000
//! cargo run --release --example idle_memory -- --objects 100000 --poll-secs 3600
//! cargo run --release --example idle_memory -- --objects 100000 --encode-passive false
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use actorcile::cluster::ApiServer;
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
    /// Re-run every object this often (`poll_interval`, seconds): each idle object then keeps a
    /// pending wake-up while passive.
    #[arg(long)]
    poll_secs: Option<u64>,
    /// Hold passive objects' cached copies encoded (`Controller::encode_passive`).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    encode_passive: bool,
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

/// Set when measuring: every worker thread returns its allocator's free pages when it parks.
static COLLECT: AtomicBool = AtomicBool::new(false);

/// Give free allocator pages back to the OS on every thread (mimalloc keeps per-thread heaps,
/// and a thread's freed pages are only returned by that thread), then let it settle.
async fn collect_everywhere() {
    COLLECT.store(true, Ordering::SeqCst);
    for _ in 0..3 {
        // wake every worker so each parks again and collects
        let tasks: Vec<_> = (0..64).map(|_| tokio::spawn(async {})).collect();
        for t in tasks {
            let _ = t.await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // SAFETY: mi_collect only releases the allocator's own free memory.
    unsafe { libmimalloc_sys::mi_collect(true) }
    COLLECT.store(false, Ordering::SeqCst);
}

fn main() {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_park(|| {
            if COLLECT.load(Ordering::Relaxed) {
                // SAFETY: as above.
                unsafe { libmimalloc_sys::mi_collect(true) }
            }
        })
        .build()
        .expect("tokio runtime")
        .block_on(run());
}

async fn run() {
    let args = Args::parse();
    let cluster = ApiServer::builder().history(1_000).build();
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
    // The in-process API server lives in this process: let it serve one full list first, so
    // the memory it keeps after serving one (as a real API server would, in its own process) is
    // in the baseline and not counted as the runtime's.
    let listed = api
        .list(&Default::default())
        .await
        .expect("list")
        .items
        .len();
    assert_eq!(listed, args.objects as usize);
    tokio::time::sleep(Duration::from_millis(500)).await;
    collect_everywhere().await;
    let baseline = rss_bytes();
    let started = Instant::now();
    let policy = SupervisorPolicy {
        kind: actorcile::policy::KindPolicy {
            idle_timeout: Some(Duration::from_secs(1)),
            poll_interval: args.poll_secs.map(Duration::from_secs),
            ..Default::default()
        },
        ..Default::default()
    };
    let handle = Runtime::builder(
        client,
        OperatorNames::new("idle-memory-operator", "idle.actorcile.dev"),
    )
    .policy(policy)
    .controller(
        Controller::<Idle>::new(step("noop", |_cx: Context<Idle>| async { Outcome::Done }))
            .without_finalizer()
            .without_status()
            .encode_passive(args.encode_passive),
    )
    .start()
    .await
    .expect("start");
    let n = u64::from(args.objects);
    loop {
        let m = handle.metrics();
        if m.provision_reconciles >= n && m.live_actors == 0 && m.passivations >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let settle = started.elapsed();
    // Let freed memory settle and the passive objects' copies be encoded, then read the
    // resident set.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle_untrimmed = rss_bytes();
    collect_everywhere().await;
    let idle = rss_bytes();
    let m = handle.metrics();
    let per_object = idle.saturating_sub(baseline) as f64 / n as f64;
    println!(
        "{}",
        serde_json::json!({
            "objects": n,
            "baseline_rss_bytes": baseline,
            "idle_rss_bytes": idle,
            "idle_rss_before_collect_bytes": idle_untrimmed,
            "idle_rss_per_object_bytes": per_object.round(),
            "seconds_to_all_passivated": settle.as_secs_f64(),
            "live_actors": m.live_actors,
            "passivations": m.passivations,
        })
    );
    handle.shutdown().await;
}
