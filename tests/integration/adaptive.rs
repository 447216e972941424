//! Adaptive concurrency on the in-process cluster acting as an API server under API Priority and
//! Fairness (a few seats, a short queue, 429 past it): the same objects with fixed reconcile
//! slots far past what the server takes, and with the adaptive limit under the same ceiling.

use crate::common;

use std::time::Duration;

use actorcile::adaptive::{AdaptiveConcurrency, AimdPolicy};
use actorcile::cluster::{Apf, Faults};
use actorcile::prelude::*;
use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};

const OBJECTS: usize = 200;
const CEILING: usize = 64;
const LIMIT: Duration = Duration::from_secs(120);

/// Two ConfigMaps per reconcile; a refused write fails it (the error backoff runs it again).
fn tree() -> impl Provisioner<Widget> {
    step("apply", |cx: Context<Widget>| async move {
        let api: Api<ConfigMap> = Api::namespaced(cx.client().clone(), "default");
        for i in 0..2 {
            let name = format!("{}-{i}", cx.object().name_any());
            let cm = serde_json::json!({
                "apiVersion": "v1", "kind": "ConfigMap", "metadata": { "name": name },
            });
            let params = PatchParams::apply("adaptive-test").force();
            if let Err(e) = api.patch(&name, &params, &Patch::Apply(&cm)).await {
                return Outcome::failed(Reason::new("WriteRefused", e.to_string()), e);
            }
        }
        Outcome::Done
    })
}

/// Every object Ready under `adaptive` (or fixed slots at the ceiling): the 429s the server
/// answered meanwhile, and the limit at the end.
async fn run(adaptive: Option<AdaptiveConcurrency>) -> (u64, Option<usize>) {
    let (cluster, client) = cluster();
    for n in 0..OBJECTS {
        create(&client, &format!("w{n}"), 1).await;
    }
    let all_ready = all_ready(&client).await;
    cluster.set_apf(Some(Apf { seats: 4, queue: 4 }));
    cluster.set_faults(Faults {
        latency: Duration::from_millis(2),
        ..Faults::default()
    });
    let runtime_client = match &adaptive {
        Some(a) => kube::Client::new(
            tower::ServiceBuilder::new()
                .layer(a)
                .service(cluster.service()),
            "default",
        ),
        None => client.clone(),
    };
    let mut policy = test_policy();
    policy.runtime.max_concurrent_reconciles = CEILING;
    policy.kind.error_backoff.min = Duration::from_millis(20);
    policy.kind.error_backoff.max = Duration::from_millis(500);
    let mut builder = Runtime::builder(runtime_client, crate::common::names())
        .policy(policy)
        .controller(Controller::<Widget>::new(tree()));
    if let Some(a) = &adaptive {
        builder = builder.adaptive_concurrency(a.clone());
    }
    let rt = builder.start().await.expect("start the runtime");
    tokio::time::timeout(LIMIT, all_ready)
        .await
        .expect("every object Ready")
        .expect("the readiness watch");
    let throttled = cluster.stats().throttled;
    let limit = adaptive.as_ref().map(AdaptiveConcurrency::limit);
    rt.shutdown().await;
    (throttled, limit)
}

/// A watch of the Widgets (watches are exempt from the limit), listed before it returns: ends
/// once every one is Ready.
async fn all_ready(client: &kube::Client) -> tokio::task::JoinHandle<()> {
    use futures::StreamExt;
    use kube::runtime::watcher;
    let (listed_tx, listed) = tokio::sync::oneshot::channel::<()>();
    let widgets = widgets(client);
    let task = tokio::spawn(async move {
        let mut listed_tx = Some(listed_tx);
        let mut ready = std::collections::HashSet::new();
        let mut events = std::pin::pin!(watcher(widgets, watcher::Config::default()));
        while let Some(event) = events.next().await {
            let w = match event {
                Ok(watcher::Event::InitDone) => {
                    if let Some(tx) = listed_tx.take() {
                        let _ = tx.send(());
                    }
                    continue;
                }
                Ok(watcher::Event::Apply(w) | watcher::Event::InitApply(w)) => w,
                _ => continue,
            };
            if w.status.as_ref().is_some_and(ResourceStatus::is_ready) {
                ready.insert(w.name_any());
                if ready.len() == OBJECTS {
                    return;
                }
            }
        }
    });
    listed.await.expect("the readiness watch listed");
    task
}

#[tokio::test]
async fn an_adaptive_limit_finds_what_the_server_takes_without_a_storm_of_429s() {
    let (fixed, _) = run(None).await;
    let adaptive = AdaptiveConcurrency::new(AimdPolicy::default());
    let (adapted, limit) = run(Some(adaptive)).await;
    assert!(
        fixed > 0,
        "64 reconciles at once against 8 places: the server refuses some"
    );
    assert!(
        adapted * 5 < fixed,
        "adaptive: {adapted} 429s, fixed at {CEILING}: {fixed}"
    );
    let limit = limit.expect("a limit");
    assert!(
        limit < CEILING,
        "the limit stayed below the ceiling: {limit}"
    );
}
