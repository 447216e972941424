//! An object that the API server accepts but the operator's Rust type cannot hold, on a real
//! etcd + kube-apiserver, with streaming lists and with list + watch: it halts nothing (the
//! other objects of its kind converge, a start-up list included), it is present (its status
//! says `Undecodable`, naming the field and not the value; it keeps blocking what it
//! references), its deletion waits with its finalizer until it can be read, and once changed
//! to a value the type holds it is reconciled and deleted as usual.
//!
//! Run with `cargo nextest run --release --all-features --test integration -E
//! 'test(/^real_undecodable::/)'` (needs `scripts/install-test-deps.sh`).
#![cfg(feature = "envtest")]

use crate::common::real;

use actorcile::prelude::*;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{CustomResource, CustomResourceExt, ResourceExt};
use real::*;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A kind whose CRD takes any spec (`x-kubernetes-preserve-unknown-fields`), while its Rust
/// type holds a size that is an `i32` only.
#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "test.actorcile.dev",
    version = "v1",
    kind = "Lax",
    plural = "laxes",
    namespaced,
    status = "ResourceStatus"
)]
pub struct LaxSpec {
    pub size: i32,
    /// Laxes this one references (names in its namespace).
    #[serde(default)]
    pub refs: Vec<String>,
}

fn lax_crd() -> CustomResourceDefinition {
    let mut v = serde_json::to_value(Lax::crd()).unwrap();
    v["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"] = serde_json::json!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    });
    serde_json::from_value(v).unwrap()
}

fn tree() -> impl Provisioner<Lax> {
    step("refs", |cx: Context<Lax>| async move {
        let ns = cx.object().namespace();
        let targets: Vec<Target> = cx
            .object()
            .spec
            .refs
            .iter()
            .map(|n| Target::for_kind::<Lax>(ns.as_deref(), n))
            .collect();
        match cx.hold_references(&targets).await {
            Ok(()) => Outcome::Done,
            Err(e) => Outcome::failed(Reason::new("Refs", "could not hold the references"), e),
        }
    })
}

async fn start(client: kube::Client, ns: &str, streaming: bool) -> RuntimeHandle {
    Runtime::builder(client, crate::common::names())
        .policy(real_policy())
        .events("undecodable-test")
        .controller(
            Controller::<Lax>::new(tree())
                .namespace(ns)
                .streaming_lists(streaming),
        )
        .start()
        .await
        .expect("start the runtime")
}

async fn create(api: &Api<Lax>, name: &str, spec: serde_json::Value) {
    let obj: Lax = serde_json::from_value(serde_json::json!({
        "apiVersion": "test.actorcile.dev/v1", "kind": "Lax",
        "metadata": {"name": name},
        "spec": {"size": 1},
    }))
    .unwrap();
    api.create(&PostParams::default(), &obj).await.unwrap();
    set_spec(api, name, spec).await;
}

async fn set_spec(api: &Api<Lax>, name: &str, spec: serde_json::Value) {
    // Read back leniently: the typed answer of a write that makes it undecodable is an error.
    let raw: Api<kube::api::DynamicObject> = Api::namespaced_with(
        api.clone().into_client(),
        api.namespace().unwrap_or("default"),
        &kube::api::ApiResource::erase::<Lax>(&()),
    );
    raw.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "spec": spec })),
    )
    .await
    .unwrap_or_else(|e| panic!("patch {name}: {e}"));
}

/// The status of `name` as the API server holds it (read untyped: the object may not decode).
async fn status(client: &kube::Client, ns: &str, name: &str) -> Option<ResourceStatus> {
    let raw: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        ns,
        &kube::api::ApiResource::erase::<Lax>(&()),
    );
    let o = raw.get_opt(name).await.unwrap()?;
    Some(serde_json::from_value(o.data.get("status")?.clone()).unwrap_or_default())
}

async fn wait_message(client: &kube::Client, ns: &str, name: &str, part: &str) -> ResourceStatus {
    loop {
        if let Some(s) = status(client, ns, name).await
            && s.ready().is_some_and(|c| c.message.contains(part))
        {
            return s;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

fn raw_api(client: &kube::Client, ns: &str) -> Api<kube::api::DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        ns,
        &kube::api::ApiResource::erase::<Lax>(&()),
    )
}

async fn exists(client: &kube::Client, ns: &str, name: &str) -> bool {
    raw_api(client, ns).get_opt(name).await.unwrap().is_some()
}

async fn one_undecodable_object(streaming: bool) {
    let env = shared_env().await;
    env.install_crds(&[lax_crd()])
        .await
        .expect("install the Lax CRD");
    let ns = format!("undecodable-{}", if streaming { "stream" } else { "list" });
    create_namespace(&env.client(), &ns).await;
    let client = env.client().clone();
    let api: Api<Lax> = Api::namespaced(client.clone(), &ns);

    // Before the runtime starts: a target, a referrer that holds it, both decodable.
    create(&api, "target", serde_json::json!({"size": 1})).await;
    create(
        &api,
        "holder",
        serde_json::json!({"size": 1, "refs": ["target"]}),
    )
    .await;
    let rt = start(client.clone(), &ns, streaming).await;
    ns_wait_ready(&client, &ns, "holder").await;
    ns_wait_ready(&client, &ns, "target").await;

    // The holder becomes undecodable: the value (secret-looking text) never reaches its status.
    set_spec(
        &api,
        "holder",
        serde_json::json!({"size": "hunter2-secret", "refs": ["target"]}),
    )
    .await;
    let s = wait_message(&client, &ns, "holder", "`spec.size`").await;
    let c = s.ready().unwrap();
    assert_eq!(c.reason, "Undecodable", "{c:?}");
    assert_eq!(c.status, "False");
    assert_eq!(s.phase, Some(Phase::Failed));
    assert!(!c.message.contains("hunter2"), "{c:?}");
    // The Event is published after the status is written: wait for it.
    let events = loop {
        let events = events_in(&client, &ns, "Undecodable").await;
        if !events.is_empty() {
            break events;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert!(events.iter().all(|e| e.type_.as_deref() == Some("Warning")
        && !e.note.as_deref().unwrap_or("").contains("hunter2")));

    // Restarted with it present: the start-up list takes in every other object (under list +
    // watch one undecodable object used to fail the whole list), and a new object converges.
    rt.shutdown().await;
    let rt = start(client.clone(), &ns, streaming).await;
    create(&api, "fresh", serde_json::json!({"size": 2})).await;
    ns_wait_ready(&client, &ns, "fresh").await;

    // Present, not gone: the target's deletion still waits for the undecodable holder.
    api.delete("target", &Default::default()).await.unwrap();
    wait_message(&client, &ns, "target", "holder").await;
    assert!(exists(&client, &ns, "target").await);

    // The holder's own deletion waits, with its finalizer, and says why.
    // (Deleted untyped: the typed answer, the object, would not decode.)
    raw_api(&client, &ns)
        .delete("holder", &Default::default())
        .await
        .unwrap();
    wait_message(&client, &ns, "holder", "its deletion waits").await;
    assert!(
        exists(&client, &ns, "holder").await,
        "the finalizer is kept"
    );

    // Readable again: deprovisioned, its finalizer removed, its reference released, the target
    // deleted after it.
    set_spec(
        &api,
        "holder",
        serde_json::json!({"size": 3, "refs": ["target"]}),
    )
    .await;
    while exists(&client, &ns, "holder").await || exists(&client, &ns, "target").await {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    rt.shutdown().await;
}

async fn ns_wait_ready(client: &kube::Client, ns: &str, name: &str) {
    while !status(client, ns, name).await.is_some_and(|s| s.is_ready()) {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn an_undecodable_object_is_present_and_halts_nothing_with_streaming_lists() {
    bounded("undecodable, streaming lists", one_undecodable_object(true)).await;
}

#[tokio::test]
async fn an_undecodable_object_is_present_and_halts_nothing_with_list_and_watch() {
    bounded("undecodable, list and watch", one_undecodable_object(false)).await;
}
