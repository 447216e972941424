//! Shared fixtures for the runtime's integration tests: a sample CRD, an in-process cluster
//! with it installed, and bounded waiting helpers.
#![allow(dead_code)]

pub mod argo;
#[cfg(feature = "envtest")]
pub mod envtest_support;
pub mod plain;
#[cfg(feature = "docker")]
pub mod podman;
#[cfg(feature = "envtest")]
pub mod real;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actorcile::cluster::ApiServer;
use actorcile::prelude::*;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, CustomResource, CustomResourceExt, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The sample kind the runtime tests manage.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "test.actorcile.dev",
    version = "v1",
    kind = "Widget",
    namespaced,
    status = "ResourceStatus"
)]
pub struct WidgetSpec {
    /// Must be ≥ 0; negative sizes are rejected as Terminal by the test trees.
    pub size: i32,
    #[serde(default)]
    pub note: String,
    /// Widgets this one takes references on (names in the same namespace).
    #[serde(default)]
    pub refs: Vec<String>,
    /// Widgets that must be Ready before this one is.
    #[serde(default)]
    pub needs: Vec<String>,
}

/// A second kind, for cross-kind readiness and references.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "test.actorcile.dev",
    version = "v1",
    kind = "Gadget",
    namespaced,
    status = "ResourceStatus"
)]
pub struct GadgetSpec {
    /// Widgets that must be Ready before this gadget is.
    #[serde(default)]
    pub needs: Vec<String>,
    /// Widgets this gadget references.
    #[serde(default)]
    pub refs: Vec<String>,
}

/// The test operator's finalizer: its names' ([`names`]).
pub const FINALIZER: &str = "test.actorcile.dev/finalizer";
/// The test operator's field manager: its names' ([`names`]).
pub const FIELD_MANAGER: &str = "test-operator";

/// The names of the operator the tests run.
pub fn names() -> OperatorNames {
    let names = OperatorNames::new(FIELD_MANAGER, "test.actorcile.dev");
    assert_eq!(names.finalizer(), FINALIZER);
    names
}

/// An in-process cluster with the Widget CRD installed.
pub fn cluster() -> (ApiServer, Client) {
    with_crds(ApiServer::new())
}

/// `cluster` with the Widget and Gadget CRDs installed.
pub fn with_crds(cluster: ApiServer) -> (ApiServer, Client) {
    cluster.install_crd(&Widget::crd()).expect("install CRD");
    cluster.install_crd(&Gadget::crd()).expect("install CRD");
    let client = cluster.client();
    (cluster, client)
}

/// Faults that make every request take one second (virtual under a paused clock). With a small
/// [`pages_of`] a runtime's first list then arrives a page a second.
pub fn one_second_requests() -> actorcile::cluster::Faults {
    actorcile::cluster::Faults {
        latency: Duration::from_secs(1),
        ..Default::default()
    }
}

/// A watcher that lists `n` objects per request.
pub fn pages_of(n: u32) -> kube::runtime::watcher::Config {
    kube::runtime::watcher::Config::default().page_size(n)
}

pub fn widgets(client: &Client) -> Api<Widget> {
    Api::namespaced(client.clone(), "default")
}

pub fn widget(name: &str, size: i32) -> Widget {
    let mut w = Widget::new(
        name,
        WidgetSpec {
            size,
            ..Default::default()
        },
    );
    w.metadata.namespace = Some("default".into());
    w
}

pub async fn create(client: &Client, name: &str, size: i32) -> Widget {
    widgets(client)
        .create(&PostParams::default(), &widget(name, size))
        .await
        .expect("create widget")
}

pub async fn set_note(client: &Client, name: &str, note: &str) {
    set_note_in(&widgets(client), name, note).await
}

/// [`set_note`] through `api` (of any namespace).
pub async fn set_note_in(api: &Api<Widget>, name: &str, note: &str) {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"note": note}})),
    )
    .await
    .expect("patch widget");
}

pub async fn delete(client: &Client, name: &str) {
    let _ = widgets(client).delete(name, &DeleteParams::default()).await;
}

pub use actorcile::testing::eventually;

pub async fn status_of(client: &Client, name: &str) -> Option<ResourceStatus> {
    actorcile::testing::status_of(&widgets(client), name).await
}

pub async fn wait_ready(client: &Client, name: &str, limit: Duration) {
    actorcile::testing::wait_ready(&widgets(client), name, limit).await;
}

pub async fn wait_all_ready(client: &Client, n: usize, limit: Duration) {
    eventually(&format!("{n} widgets Ready"), limit, || async {
        let list = widgets(client).list(&ListParams::default()).await.ok()?;
        let ready = list
            .items
            .iter()
            .filter(|w| w.status.as_ref().is_some_and(|s| s.is_ready()))
            .count();
        (ready == n).then_some(())
    })
    .await
}

pub async fn wait_gone(client: &Client, name: &str, limit: Duration) {
    actorcile::testing::wait_gone(&widgets(client), name, limit).await;
}

pub async fn wait_reason(
    client: &Client,
    name: &str,
    reason: &str,
    limit: Duration,
) -> ResourceStatus {
    actorcile::testing::wait_reason(&widgets(client), name, reason, limit).await
}

pub use actorcile::testing::ReconcileLog;

/// A gate that steps wait at until the test opens it; once open it stays open, so every
/// reconcile that waits there, now or later, goes through. Clones share one gate.
#[derive(Clone)]
pub struct Gate(Arc<tokio::sync::watch::Sender<bool>>);

impl Default for Gate {
    fn default() -> Self {
        Gate(Arc::new(tokio::sync::watch::Sender::new(false)))
    }
}

impl Gate {
    /// Waits until the gate is open.
    pub async fn wait(&self) {
        let _ = self.0.subscribe().wait_for(|open| *open).await;
    }

    /// Opens the gate for good.
    pub fn open(&self) {
        self.0.send_replace(true);
    }
}

/// A policy for fast, deterministic tests.
pub fn test_policy() -> SupervisorPolicy {
    actorcile::testing::deterministic_policy()
}

/// A runtime managing `Widget`s with `tree` under `policy`.
pub async fn start_widgets(
    client: &Client,
    policy: SupervisorPolicy,
    tree: impl Provisioner<Widget> + 'static,
) -> RuntimeHandle {
    Runtime::builder(client.clone(), crate::common::names())
        .policy(policy)
        .controller(Controller::<Widget>::new(tree))
        .start()
        .await
        .expect("start the runtime")
}

pub fn name_of(w: &Widget) -> String {
    w.name_any()
}

/// The requests a client sent, as `METHOD path?query`, recorded by a layer put in front of it
/// with [`Requests::client`].
#[derive(Clone, Default)]
pub struct Requests(Arc<Mutex<Vec<String>>>);

impl Requests {
    /// A client talking through `builder` (e.g. a real apiserver's, or
    /// `ClientBuilder::new(cluster.service(), "default")`) that records every request here.
    pub fn client<S, B>(&self, builder: kube::client::ClientBuilder<S>) -> Client
    where
        S: tower::Service<http::Request<kube::client::Body>, Response = http::Response<B>>
            + Send
            + 'static,
        S::Future: Send + 'static,
        S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
        B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let log = self.0.clone();
        builder
            .with_layer(&tower::util::MapRequestLayer::new(
                move |r: http::Request<kube::client::Body>| {
                    log.lock()
                        .unwrap()
                        .push(format!("{} {}", r.method(), r.uri()));
                    r
                },
            ))
            .build()
    }

    /// Every request whose path contains `path`, in order (also for a failed assertion's
    /// message).
    pub fn matching(&self, path: &str) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.contains(path))
            .cloned()
            .collect()
    }

    /// How many requests of `method` had a path containing `path`.
    pub fn count(&self, method: &str, path: &str) -> usize {
        let prefix = format!("{method} ");
        self.matching(path)
            .iter()
            .filter(|r| r.starts_with(&prefix))
            .count()
    }

    /// Requests whose path contains `path` and whose query has `watch=true`.
    pub fn watches(&self, path: &str) -> usize {
        self.matching(path)
            .iter()
            .filter(|r| r.contains("watch=true"))
            .count()
    }
}

/// `GET path` on `addr` over plain HTTP/1.1 (an admin address): the status and the body.
pub async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.unwrap();
    let status = buf.split(' ').nth(1).unwrap().parse().unwrap();
    (status, buf.split_once("\r\n\r\n").unwrap().1.to_string())
}

/// A step `deps`: each of the Widget's `needs` (in `default`) must be Ready; then it takes a
/// reference on each of its `refs` (a refused reference yields for 100 ms).
pub fn deps_step() -> actorcile::provisioners::Step<Widget> {
    let wt = |name: &str| Target::for_kind::<Widget>(Some("default"), name);
    step("deps", move |cx: Context<Widget>| async move {
        for n in &cx.object().spec.needs {
            if let Some(wait) = cx.require_ready(&wt(n)).await {
                return wait;
            }
        }
        for n in &cx.object().spec.refs {
            if let Err(e) = cx.add_reference(&wt(n)).await {
                return Outcome::yield_after(
                    Duration::from_millis(100),
                    Reason::new("ReferencePending", e.to_string()),
                );
            }
        }
        Outcome::Done
    })
}
