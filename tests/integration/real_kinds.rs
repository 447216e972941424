//! A kind that comes and goes, on a real etcd + kube-apiserver: a controller whose CRD is not
//! installed starts when it is, stops cleanly when the CRD is deleted (its objects
//! deprovisioned first, then no actor, no timer and no error storm, readiness naming the kind),
//! and starts again when the CRD comes back.
//!
//! Run with `cargo nextest run --release --all-features --test integration -E
//! 'test(/^real_kinds::/)'` (needs `scripts/install-test-deps.sh`).
#![cfg(feature = "envtest")]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use actorcile::metrics::{ApiMetrics, Registry};
use actorcile::prelude::*;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, PostParams};
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::eventually;
use crate::common::real::*;

/// A kind of this test's own: its CRD is installed and deleted while the control plane is
/// shared with other tests.
#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "kinds.test.actorcile.dev",
    version = "v1",
    kind = "Comet",
    namespaced,
    status = "ResourceStatus"
)]
pub struct CometSpec {
    pub period_ms: u64,
}

const NS: &str = "kinds-come-and-go";

fn comet(name: &str) -> Comet {
    let mut c = Comet::new(name, CometSpec { period_ms: 200 });
    c.metadata.namespace = Some(NS.into());
    c
}

/// Wait until the CRD of `Comet` is gone (deleting it first when `delete`).
async fn crd_gone(client: &kube::Client, delete: bool) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = Comet::crd_name();
    if delete {
        match crds.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => panic!("delete the CRD: {e}"),
        }
    }
    eventually("the Comet CRD gone", CONVERGE, || async {
        crds.get_opt(name).await.unwrap().is_none().then_some(())
    })
    .await;
}

/// The readiness probe's answer once it fails naming the kind as not served.
async fn not_served(handle: &RuntimeHandle) -> String {
    eventually("/readyz names Comet as not served", CONVERGE, || async {
        let probe = handle.health().ready();
        (!probe.ok && probe.detail.contains("Comet") && probe.detail.contains("does not serve"))
            .then_some(probe.detail)
    })
    .await
}

#[tokio::test]
async fn a_kind_whose_crd_goes_stops_cleanly_and_starts_again_when_it_comes_back() {
    bounded("a kind that comes and goes", async {
        let env = shared_env().await;
        let admin = env.client();
        crd_gone(&admin, true).await;
        create_namespace(&admin, NS).await;
        // The runtime's requests are counted: an error storm shows as many refused ones.
        let mut registry = Registry::default();
        let api_metrics = ApiMetrics::new(&mut registry);
        let client = kube::client::ClientBuilder::try_from(env.config())
            .unwrap()
            .with_layer(&api_metrics)
            .build();
        let refused = || {
            ["list", "watch", "get", "patch", "update", "create", "delete"]
                .iter()
                .map(|verb| api_metrics.count(verb, "404"))
                .sum::<u64>()
        };
        let (reconciles, deprovisions) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
        let tree = {
            let (r, d) = (reconciles.clone(), deprovisions.clone());
            step("orbit", move |cx: Context<Comet>| {
                let r = r.clone();
                async move {
                    r.fetch_add(1, Ordering::SeqCst);
                    // Never done: the object always has a wake-up armed.
                    Outcome::yield_after(
                        Duration::from_millis(cx.object().spec.period_ms),
                        Reason::new("Orbiting", "around again soon"),
                    )
                }
            })
            .on_delete(move |_cx: Context<Comet>| {
                let d = d.clone();
                async move {
                    d.fetch_add(1, Ordering::SeqCst);
                    Outcome::Done
                }
            })
        };
        let handle = Runtime::builder(client, crate::common::names())
            .policy(real_policy())
            .controller(Controller::<Comet>::new(tree).namespace(NS))
            .start()
            .await
            .expect("the runtime starts while the kind is not served");
        let detail = not_served(&handle).await;
        assert!(detail.contains("kinds.test.actorcile.dev/v1"), "{detail}");

        // The CRD appears: the controller starts by itself.
        env.install_crds(&[Comet::crd()]).await.unwrap();
        let comets: Api<Comet> = Api::namespaced(admin.clone(), NS);
        comets.create(&PostParams::default(), &comet("c1")).await.unwrap();
        eventually("c1 orbits", CONVERGE, || async {
            (reconciles.load(Ordering::SeqCst) >= 3).then_some(())
        })
        .await;
        eventually("/readyz passes", CONVERGE, || async { handle.health().ready().ok.then_some(()) }).await;

        // The CRD goes: its object is deprovisioned (the API server deletes objects before
        // their CRD, and waits for their finalizers), then nothing of the kind runs.
        crd_gone(&admin, true).await;
        assert_eq!(deprovisions.load(Ordering::SeqCst), 1, "c1 was deprovisioned");
        let detail = not_served(&handle).await;
        eventually("no object, actor or wake-up of the kind left", CONVERGE, || async {
            let kind = handle
                .kind_metrics()
                .into_iter()
                .find(|k| k.kind == "Comet")
                .expect("the kind's metrics");
            (kind.objects == 0 && kind.wake_ups == 0 && handle.metrics().live_actors == 0)
                .then_some(())
        })
        .await;
        // Nothing of the kind is armed, so nothing runs; the watch retries with its backoff.
        let (ran, refused_then) = (reconciles.load(Ordering::SeqCst), refused());
        tokio::time::sleep(Duration::from_secs(5)).await;
        let storm = refused() - refused_then;
        assert!(
            storm <= 8,
            "{storm} refused requests in 5 s while the kind is not served: an error storm ({detail})"
        );
        assert_eq!(reconciles.load(Ordering::SeqCst), ran, "no reconcile of a kind that is gone");

        // The CRD comes back: the controller starts again, on a new object.
        env.install_crds(&[Comet::crd()]).await.unwrap();
        comets.create(&PostParams::default(), &comet("c2")).await.unwrap();
        eventually("c2 orbits", CONVERGE, || async {
            let status = comets.get_opt("c2").await.unwrap().and_then(|c| c.status);
            status
                .and_then(|s| s.ready().map(|r| r.reason.clone()))
                .filter(|r| r == "Orbiting")
        })
        .await;
        eventually("/readyz passes again", CONVERGE, || async {
            handle.health().ready().ok.then_some(())
        })
        .await;
        assert!(reconciles.load(Ordering::SeqCst) > ran);
        // Deleted while the runtime runs: it removes c2's finalizer, which the deletion waits for.
        crd_gone(&admin, true).await;
        handle.shutdown().await;
    })
    .await;
}
