//! Criterion benchmarks of the runtime's hot paths and of how a first reconcile scales with the
//! number of objects.
//!
//! ```text
//! cargo bench --features bench-internals --bench runtime                 # everything
//! cargo bench --features bench-internals --bench runtime -- scale        # 1k → 100k objects only
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use actorcile::bench_internals::{PendingWakeUp, Timers};
use actorcile::cluster::ApiServer;
use actorcile::prelude::*;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "bench.actorcile.dev",
    version = "v1",
    kind = "Thing",
    namespaced,
    status = "ResourceStatus"
)]
struct ThingSpec {
    n: u32,
}

fn offline_client() -> kube::Client {
    let svc = tower::service_fn(|_req: http::Request<kube::client::Body>| async {
        Err::<http::Response<kube::client::Body>, std::io::Error>(std::io::Error::other("offline"))
    });
    kube::Client::new(svc, "default")
}

fn hot_paths(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = rt.enter();

    // One provision reconcile of a small tree (no I/O): the per-run overhead of the combinators.
    let cx = Context::new(Arc::new(ConfigMap::default()), offline_client());
    let tree = serial![
        step("a", |_cx: Context<ConfigMap>| async { Outcome::Done }),
        concurrent![
            step("b", |_cx: Context<ConfigMap>| async { Outcome::Done }),
            step("c", |_cx: Context<ConfigMap>| async { Outcome::Done }),
        ],
        step("d", |_cx: Context<ConfigMap>| async { Outcome::Done }),
    ];
    c.bench_function("tree/one_reconcile_serial_with_concurrent", |b| {
        b.iter(|| rt.block_on(tree.provision(&cx)))
    });

    let outcomes: Vec<Outcome> = (0..8)
        .map(|i| Outcome::yield_after(Duration::from_millis(i * 10 + 1), Reason::new("Y", "y")))
        .collect();
    c.bench_function("outcome/merge_8", |b| {
        b.iter(|| Outcome::merge(outcomes.clone()))
    });

    // Timer scheduling: re-arming a resource's wake-up (earliest wins) and cancelling it.
    c.bench_function("timer/schedule_earlier_then_cancel", |b| {
        let mut slot = PendingWakeUp::default();
        b.iter(|| {
            let now = tokio::time::Instant::now();
            slot.schedule(now + Duration::from_secs(10));
            slot.schedule(now + Duration::from_secs(1));
            slot.cancel();
        })
    });

    // Timer delivery: arm a due wake-up on the controller's timer task and wait until the
    // actor has it (arm → DelayQueue → cast → actor).
    let (timers, actor, mut delivered) = rt.block_on(async {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let (actor, _) = ractor::Actor::spawn(None, Forward, tx).await.unwrap();
        (Timers::<u64>::start(), actor, rx)
    });
    c.bench_function("timer/arm_and_deliver", |b| {
        b.iter(|| {
            rt.block_on(async {
                timers.arm(&actor, tokio::time::Instant::now(), 1);
                delivered.recv().await
            })
        })
    });
}

/// An actor that forwards every message to a channel (the timer benchmark's receiver).
struct Forward;

impl ractor::Actor for Forward {
    type Msg = u64;
    type State = tokio::sync::mpsc::UnboundedSender<u64>;
    type Arguments = tokio::sync::mpsc::UnboundedSender<u64>;

    async fn pre_start(
        &self,
        _: ractor::ActorRef<u64>,
        tx: Self::Arguments,
    ) -> Result<Self::State, ractor::ActorProcessingErr> {
        Ok(tx)
    }

    async fn handle(
        &self,
        _: ractor::ActorRef<u64>,
        msg: u64,
        tx: &mut Self::State,
    ) -> Result<(), ractor::ActorProcessingErr> {
        let _ = tx.send(msg);
        Ok(())
    }
}

/// Event routing end to end: a spec change on the in-process cluster until the object's
/// actor has run on it (watch → feeder → route → actor → provision).
fn routing(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<u32>();
    let tx = Arc::new(std::sync::Mutex::new(tx));
    let (cluster, handle, api) = rt.block_on(async {
        let cluster = ApiServer::new();
        cluster.install_crd(&Thing::crd()).unwrap();
        let client = cluster.client();
        let api: Api<Thing> = Api::namespaced(client.clone(), "default");
        let mut t = Thing::new("t", ThingSpec { n: 0 });
        t.metadata.namespace = Some("default".into());
        api.create(&PostParams::default(), &t).await.unwrap();
        let tree = step("report", move |cx: Context<Thing>| {
            let tx = tx.clone();
            async move {
                let _ = tx.lock().unwrap().send(cx.object().spec.n);
                Outcome::Done
            }
        });
        let handle = Runtime::builder(
            client,
            OperatorNames::new("bench-operator", "bench.actorcile.dev"),
        )
        .controller(Controller::<Thing>::new(tree))
        .start()
        .await
        .unwrap();
        (cluster, handle, api)
    });
    while rx.recv_timeout(Duration::from_secs(10)).unwrap() != 0 {}
    let mut n = 0;
    c.bench_function("routing/spec_change_to_run_in_process", |b| {
        b.iter(|| {
            n += 1;
            rt.block_on(api.patch(
                "t",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(serde_json::json!({"spec": {"n": n}})),
            ))
            .unwrap();
            while rx.recv_timeout(Duration::from_secs(10)).unwrap() != n {}
        })
    });
    rt.block_on(handle.shutdown());
    drop(cluster);
}

/// First reconcile over N pre-existing objects (spawning every actor included), noop tree.
fn scale(c: &mut Criterion) {
    let mut group = c.benchmark_group("scale/noop_first_reconcile");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(20));
    for n in [1_000u64, 10_000, 100_000] {
        group.throughput(Throughput::Elements(n));
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let rt = tokio::runtime::Builder::new_multi_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    total += rt.block_on(async {
                        let cluster = ApiServer::new();
                        cluster.install_crd(&Thing::crd()).unwrap();
                        let client = cluster.client();
                        let api: Api<Thing> = Api::namespaced(client.clone(), "default");
                        for i in 0..n {
                            let mut t = Thing::new(&format!("t{i}"), ThingSpec { n: 0 });
                            t.metadata.namespace = Some("default".into());
                            api.create(&PostParams::default(), &t).await.unwrap();
                        }
                        let started = Instant::now();
                        let handle = Runtime::builder(
                            client,
                            OperatorNames::new("bench-operator", "bench.actorcile.dev"),
                        )
                        .policy(SupervisorPolicy {
                            runtime: actorcile::policy::RuntimePolicy {
                                max_concurrent_reconciles: 256,
                                ..Default::default()
                            },
                            ..Default::default()
                        })
                        .controller(Controller::<Thing>::new(step(
                            "noop",
                            |_cx: Context<Thing>| async { Outcome::Done },
                        )))
                        .start()
                        .await
                        .unwrap();
                        while handle.metrics().provision_reconciles < n {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                        let took = started.elapsed();
                        handle.shutdown().await;
                        took
                    });
                }
                total
            })
        });
    }
    group.finish();
}

criterion_group!(benches, hot_paths, routing, scale);
criterion_main!(benches);
