//! `require_ready` on objects of a kind the runtime does not manage (in-process cluster, paused
//! clock): the waiting resource is woken by one shared watch of that kind, not by polling (the
//! fallback dependency poll and the yield delay are an hour), and the watch stops once nobody
//! waits on the kind.
//!
//! Here `Gadget`s stand for another operator's objects: the runtime manages only `Widget`s,
//! whose `needs` name the gadgets they wait on.

use crate::common;

use std::time::Duration;

use actorcile::cluster::ApiServer;
use actorcile::prelude::*;
use actorcile::status::Phase;
use common::*;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};

const LIMIT: Duration = Duration::from_secs(600);
const GADGETS: (&str, &str) = ("test.actorcile.dev/v1", "Gadget");

fn gadget_target(name: &str) -> Target {
    Target::for_kind::<Gadget>(Some("default"), name)
}

/// No polling, and a watch nobody waits on stops after a minute.
fn policy() -> SupervisorPolicy {
    let mut p = test_policy();
    p.kind.dependency_poll = Duration::from_secs(3600);
    p.kind.yield_delay = Duration::from_secs(3600);
    p.runtime.dependency_watch_idle = Duration::from_secs(60);
    p
}

/// Each widget waits on the gadgets its `needs` names: by their status, or, when its note is
/// `phase`, by the predicate "status.phase is Progressing".
async fn start(client: &Client) -> RuntimeHandle {
    let tree = step("gadgets", |cx: Context<Widget>| async move {
        for n in &cx.object().spec.needs {
            let wait = if cx.object().spec.note == "phase" {
                cx.require_ready_when(&gadget_target(n), |g| {
                    g.data["status"]["phase"] == "Progressing"
                })
                .await
            } else {
                cx.require_ready(&gadget_target(n)).await
            };
            if let Some(wait) = wait {
                return wait;
            }
        }
        Outcome::Done
    });
    start_widgets(client, policy(), tree).await
}

fn gadgets(client: &Client) -> Api<Gadget> {
    Api::namespaced(client.clone(), "default")
}

async fn create_widget(client: &Client, name: &str, needs: &str, note: &str) {
    let mut w = widget(name, 1);
    w.spec.needs = vec![needs.to_string()];
    w.spec.note = note.to_string();
    widgets(client)
        .create(&PostParams::default(), &w)
        .await
        .expect("create widget");
}

async fn create_gadget(client: &Client, name: &str) {
    let mut g = Gadget::new(name, GadgetSpec::default());
    g.metadata.namespace = Some("default".into());
    gadgets(client)
        .create(&PostParams::default(), &g)
        .await
        .expect("create gadget");
}

/// Write the gadget's status as its own controller would.
async fn set_gadget_status(client: &Client, name: &str, status: serde_json::Value) {
    gadgets(client)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "status": status })),
        )
        .await
        .expect("patch gadget status");
}

fn condition(type_: &str, status: &str, generation: i64) -> serde_json::Value {
    serde_json::json!({ "type": type_, "status": status, "reason": "ByTest", "message": "",
                        "observedGeneration": generation })
}

/// A cluster and a client for the runtime that records its requests (the test's own reads go
/// through the cluster's plain client).
fn recorded_cluster() -> (ApiServer, Client, Client, Requests) {
    let (cluster, client) = cluster();
    let requests = Requests::default();
    let runtime_client = requests.client(kube::client::ClientBuilder::new(
        cluster.service(),
        "default",
    ));
    (cluster, client, runtime_client, requests)
}

/// The runtime's GETs of one gadget and its LISTs of gadgets (polling would add to them).
fn gadget_reads(r: &Requests) -> (usize, usize) {
    let lists = r.count("GET", "/gadgets?") - r.watches("/gadgets?");
    (r.count("GET", "/gadgets/"), lists)
}

#[tokio::test(start_paused = true)]
async fn a_dependency_of_another_operator_wakes_its_waiter_through_one_watch() {
    let (_cluster, client, runtime_client, requests) = recorded_cluster();
    let rt = start(&runtime_client).await;

    create_widget(&client, "app", "db", "").await;
    let s = wait_reason(&client, "app", "DependencyNotFound", LIMIT).await;
    assert!(
        s.ready().unwrap().message.contains("Gadget default/db"),
        "the status names the target: {s:?}"
    );
    assert_eq!(
        rt.dependency_watches(),
        vec![(GADGETS.0.into(), GADGETS.1.into())]
    );

    create_gadget(&client, "db").await;
    wait_reason(&client, "app", "DependencyNotReady", LIMIT).await;
    // An hour reconciles with the gadget not Ready: nothing reads it again.
    let waiting = gadget_reads(&requests);
    tokio::time::sleep(Duration::from_secs(3000)).await;
    assert_eq!(
        gadget_reads(&requests),
        waiting,
        "no GET or LIST while waiting"
    );
    assert_eq!(
        status_of(&client, "app")
            .await
            .unwrap()
            .ready()
            .unwrap()
            .reason,
        "DependencyNotReady"
    );

    let woken = tokio::time::Instant::now();
    set_gadget_status(
        &client,
        "db",
        serde_json::json!({ "conditions": [condition("Ready", "True", 1)] }),
    )
    .await;
    wait_ready(&client, "app", LIMIT).await;
    assert!(
        woken.elapsed() < Duration::from_secs(1),
        "woken by the watch, not a poll: {:?}",
        woken.elapsed()
    );
    let (gets, lists) = gadget_reads(&requests);
    assert_eq!(gets, 0, "no GET of the gadget at all");
    assert_eq!(lists, 1, "one LIST: the gadget watch's first");
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_stale_or_failed_dependency_is_not_ready_and_a_failed_one_fails_the_dependent_until_it_recovers()
 {
    let (_cluster, client) = cluster();
    let rt = start(&client).await;
    create_gadget(&client, "db").await;
    // Ready, but for an older generation than the gadget's: not Ready.
    set_gadget_status(
        &client,
        "db",
        serde_json::json!({ "conditions": [condition("Ready", "True", 0)] }),
    )
    .await;
    create_widget(&client, "app", "db", "").await;
    wait_reason(&client, "app", "DependencyNotReady", LIMIT).await;

    set_gadget_status(
        &client,
        "db",
        serde_json::json!({ "conditions": [condition("Ready", "False", 1), condition("Stalled", "True", 1)] }),
    )
    .await;
    let s = wait_reason(&client, "app", "DependencyFailed", LIMIT).await;
    assert_eq!(s.phase, Some(Phase::Failed));
    assert!(
        s.ready().unwrap().message.contains("Gadget default/db"),
        "{s:?}"
    );

    set_gadget_status(
        &client,
        "db",
        serde_json::json!({ "conditions": [condition("Ready", "True", 1), condition("Stalled", "False", 1)] }),
    )
    .await;
    wait_ready(&client, "app", LIMIT).await;
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_predicate_decides_readiness_and_sees_status_changes() {
    let (_cluster, client) = cluster();
    let rt = start(&client).await;
    create_gadget(&client, "db").await;
    // Ready by its condition, but the predicate asks for phase Progressing.
    set_gadget_status(
        &client,
        "db",
        serde_json::json!({ "conditions": [condition("Ready", "True", 1)] }),
    )
    .await;
    create_widget(&client, "app", "db", "phase").await;
    wait_reason(&client, "app", "DependencyNotReady", LIMIT).await;
    set_gadget_status(&client, "db", serde_json::json!({ "phase": "Progressing" })).await;
    wait_ready(&client, "app", LIMIT).await;
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn the_watch_of_a_kind_stops_once_nobody_waits_and_starts_again_when_needed() {
    let (_cluster, client, runtime_client, requests) = recorded_cluster();
    let rt = start(&runtime_client).await;
    create_widget(&client, "app", "db", "").await;
    wait_reason(&client, "app", "DependencyNotFound", LIMIT).await;
    // Someone waits: the watch stays, however long.
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(rt.dependency_watches().len(), 1, "kept while someone waits");

    create_gadget(&client, "db").await;
    set_gadget_status(
        &client,
        "db",
        serde_json::json!({ "conditions": [condition("Ready", "True", 1)] }),
    )
    .await;
    wait_ready(&client, "app", LIMIT).await;
    // Nobody waits now: gone within two idle periods.
    eventually(
        "the gadget watch stops",
        Duration::from_secs(150),
        || async { rt.dependency_watches().is_empty().then_some(()) },
    )
    .await;
    let watches_before = requests.watches("/gadgets?");
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(
        requests.watches("/gadgets?"),
        watches_before,
        "a stopped watch does not come back by itself"
    );

    create_widget(&client, "app2", "db", "").await;
    wait_ready(&client, "app2", LIMIT).await;
    create_widget(&client, "app3", "db3", "").await;
    wait_reason(&client, "app3", "DependencyNotFound", LIMIT).await;
    assert_eq!(
        rt.dependency_watches().len(),
        1,
        "started again by a new waiter"
    );
    rt.shutdown().await;
}
