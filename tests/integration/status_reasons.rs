//! The status users read, on the in-process cluster: a provisioner's reason code becomes the
//! `Ready` condition's reason, an invalid code never reaches the API, a dependency being deleted
//! says so, bulk references make exactly the named objects carry a reference, and a kind whose
//! status cannot hold what the runtime writes (no status subresource, or a status schema without
//! its fields) is reported as such.

use crate::common;

use std::time::Duration;

use actorcile::prelude::*;
use actorcile::references::{Selection, referrers_of};
use common::*;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, PostParams};
use kube::{CustomResourceExt, ResourceExt};

const LIMIT: Duration = Duration::from_secs(30);

fn wt(name: &str) -> Target {
    Target::new("test.actorcile.dev/v1", "Widget", Some("default"), name)
}

/// Reasons by size: -1 a typed Terminal, -2 an invalid code, anything else Done.
fn reasons_tree() -> impl Provisioner<Widget> {
    step("validate", |cx: Context<Widget>| async move {
        match cx.object().spec.size {
            -1 => Outcome::Terminal(Reason::new("SizeNegative", "spec.size must be at least 0")),
            -2 => Outcome::UserActionRequired(Reason::new("not a reason!", "fix the size")),
            _ => Outcome::Done,
        }
    })
}

/// A runtime running [`reasons_tree`] on widgets, publishing Events.
async fn start_reasons(client: &kube::Client) -> RuntimeHandle {
    Runtime::builder(client.clone(), crate::common::names())
        .policy(test_policy())
        .controller(Controller::<Widget>::new(reasons_tree()))
        .events("widget-operator")
        .start()
        .await
        .expect("start")
}

#[tokio::test]
async fn the_provisioners_reason_is_the_conditions_reason_and_an_invalid_one_is_replaced() {
    let (_cluster, client) = cluster();
    let rt = start_reasons(&client).await;
    create(&client, "typed", -1).await;
    create(&client, "invalid", -2).await;
    let s = wait_reason(&client, "typed", "SizeNegative", LIMIT).await;
    let c = s.ready().unwrap();
    assert_eq!(c.message, "spec.size must be at least 0", "verbatim");
    assert_eq!(s.phase, Some(Phase::Failed));
    // the invalid code is never written: the runtime's reason for the outcome stands in
    let s = wait_reason(&client, "invalid", "UserActionRequired", LIMIT).await;
    assert_eq!(s.ready().unwrap().message, "fix the size");
    assert_eq!(s.phase, Some(Phase::Failed));
    // Events carry the condition's reason; the invalid code is reported in a Warning Event
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let reasons = eventually("the transition Events", LIMIT, || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        let of = |name: &str| -> Vec<String> {
            list.items
                .iter()
                .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
                .filter_map(|e| e.reason.clone())
                .collect()
        };
        let (typed, invalid) = (of("typed"), of("invalid"));
        (!typed.is_empty() && invalid.len() >= 2).then_some((typed, invalid))
    })
    .await;
    assert_eq!(reasons.0, vec!["SizeNegative".to_string()]);
    assert!(
        reasons.1.contains(&"InvalidReason".to_string()),
        "{reasons:?}"
    );
    assert!(
        reasons.1.contains(&"UserActionRequired".to_string()),
        "{reasons:?}"
    );
    rt.shutdown().await;
}

#[tokio::test]
async fn waiting_on_a_dependency_that_is_being_deleted_says_so() {
    let (_cluster, client) = cluster();
    let tree = step("needs", |cx: Context<Widget>| async move {
        for n in &cx.object().spec.needs {
            if let Some(wait) = cx.require_ready(&wt(n)).await {
                return wait;
            }
        }
        Outcome::Done
    });
    let rt = start_widgets(&client, test_policy(), tree).await;
    // a foreign finalizer keeps the dependency in its deletion
    let mut db = widget("db", 1);
    db.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    widgets(&client)
        .create(&PostParams::default(), &db)
        .await
        .unwrap();
    wait_ready(&client, "db", LIMIT).await;
    delete(&client, "db").await;
    let mut app = widget("app", 1);
    app.spec.needs = vec!["db".into(), "nothing".into()];
    widgets(&client)
        .create(&PostParams::default(), &app)
        .await
        .unwrap();
    let s = wait_reason(&client, "app", "DependencyDeleting", LIMIT).await;
    let message = &s.ready().unwrap().message;
    assert!(message.contains("Widget default/db"), "{message}");
    rt.shutdown().await;
}

#[tokio::test]
async fn a_missing_dependency_is_named_as_not_found() {
    let (_cluster, client) = cluster();
    let tree = step("needs", |cx: Context<Widget>| async move {
        if cx.object().name_any() != "app" {
            return Outcome::Done;
        }
        match cx.require_ready(&wt("absent")).await {
            Some(wait) => wait,
            None => Outcome::Done,
        }
    });
    let rt = start_widgets(&client, test_policy(), tree).await;
    create(&client, "app", 1).await;
    let s = wait_reason(&client, "app", "DependencyNotFound", LIMIT).await;
    assert!(s.ready().unwrap().message.contains("absent"));
    // it is woken when the dependency appears (and then waits for it to be Ready)
    create(&client, "absent", 1).await;
    wait_ready(&client, "app", LIMIT).await;
    rt.shutdown().await;
}

/// The names of the widgets that carry `from`'s reference.
async fn carriers(client: &kube::Client, from: &str) -> Vec<String> {
    let from = wt(from);
    let mut names: Vec<String> = widgets(client)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|w| referrers_of(*w, &crate::common::names()).contains(&from))
        .map(|w| w.name_any())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn set_references_makes_exactly_the_named_objects_carry_the_reference() {
    let (_cluster, client) = cluster();
    // the widget "server" references the groups its note names (comma-separated; "-": clear)
    let tree = step("groups", |cx: Context<Widget>| async move {
        if cx.object().name_any() != "server" {
            return Outcome::Done;
        }
        let groups = Selection::new(
            "test.actorcile.dev/v1",
            "Widget",
            Some("default"),
            "role=group",
        );
        let note = cx.object().spec.note.clone();
        let result = match note.as_str() {
            "-" => cx.clear_references(&groups).await,
            names => cx.set_references(&groups, names.split(',')).await,
        };
        match result {
            Ok(()) => Outcome::Done,
            Err(
                e @ actorcile::provisioners::StepError::Reference(
                    actorcile::references::ReferenceError::TargetMissing(_),
                ),
            ) => Outcome::Terminal(Reason::new("GroupMissing", e.to_string())),
            Err(e) => Outcome::failed(Reason::new("References", "cannot reference"), e),
        }
    });
    let rt = start_widgets(&client, test_policy(), tree).await;
    for i in 0..8 {
        let mut g = widget(&format!("g{i}"), 1);
        g.metadata.labels = Some([("role".to_string(), "group".to_string())].into());
        widgets(&client)
            .create(&PostParams::default(), &g)
            .await
            .unwrap();
    }
    create(&client, "other", 1).await; // not selected
    let mut server = widget("server", 1);
    server.spec.note = "g0,g1,g2,g3,g4".into();
    widgets(&client)
        .create(&PostParams::default(), &server)
        .await
        .unwrap();
    wait_ready(&client, "server", LIMIT).await;
    assert_eq!(
        carriers(&client, "server").await,
        ["g0", "g1", "g2", "g3", "g4"]
    );

    set_note(&client, "server", "g3,g5,g7").await;
    eventually("three carriers", LIMIT, || async {
        (carriers(&client, "server").await == ["g3", "g5", "g7"]).then_some(())
    })
    .await;
    // a referenced group's deletion waits for the reference
    delete(&client, "g5").await;
    wait_reason(&client, "g5", "InUse", LIMIT).await;

    // a name outside the selection: an error naming it, and nothing written
    set_note(&client, "server", "g3,other").await;
    let s = wait_reason(&client, "server", "GroupMissing", LIMIT).await;
    assert!(s.ready().unwrap().message.contains("other"), "{s:?}");
    assert_eq!(carriers(&client, "server").await, ["g3", "g5", "g7"]);

    set_note(&client, "server", "-").await;
    eventually("no carriers", LIMIT, || async {
        carriers(&client, "server").await.is_empty().then_some(())
    })
    .await;
    // released by message: the deletion that waited proceeds
    wait_gone(&client, "g5", LIMIT).await;
    rt.shutdown().await;
}

/// Runs the reasons tree, with Events, on a cluster serving `crd` (the Widget CRD as an operator
/// might have got it wrong), creates widget `w`, and returns the note of the first Event with
/// `reason`, with the runtime.
async fn note_of_the_event_with(
    crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    reason: &str,
) -> (String, kube::Client, RuntimeHandle) {
    let cluster = actorcile::cluster::ApiServer::new();
    cluster.install_crd(&crd).expect("install CRD");
    let client = cluster.client();
    let rt = start_reasons(&client).await;
    create(&client, "w", 1).await;
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let note = eventually(&format!("a {reason} Event"), LIMIT, || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some(reason))
            .and_then(|e| e.note)
    })
    .await;
    (note, client, rt)
}

#[tokio::test]
async fn a_kind_without_a_status_subresource_is_reported_not_taken_for_deleted() {
    // The Widget CRD as a hand-written one often is: no `subresources: {status: {}}`. Every
    // status write is answered 404, as for a deleted object.
    let mut crd = Widget::crd();
    for v in &mut crd.spec.versions {
        v.subresources = None;
    }
    let (note, _client, rt) = note_of_the_event_with(crd, "StatusNotServed").await;
    assert!(
        note.contains("test.actorcile.dev/v1 widgets") && note.contains("without_status()"),
        "the Event says what is missing and how to fix it: {note}"
    );
    assert_eq!(
        rt.metrics().status_writes,
        0,
        "no status write went through"
    );
    rt.shutdown().await;
}

#[tokio::test]
async fn a_status_schema_without_the_runtimes_fields_is_reported() {
    // A status type of the operator's own that does not hold `ResourceStatus`: the schema of
    // `status` declares none of its fields, so the API server prunes them from every write.
    let mut crd = Widget::crd();
    for v in &mut crd.spec.versions {
        let schema = v
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut());
        let properties = schema.and_then(|s| s.properties.as_mut()).unwrap();
        properties.insert(
            "status".into(),
            serde_json::from_value(serde_json::json!({
                "type": "object",
                "properties": {"replicas": {"type": "integer"}},
            }))
            .unwrap(),
        );
    }
    let (note, client, rt) = note_of_the_event_with(crd, "StatusPruned").await;
    assert!(
        note.contains("test.actorcile.dev/v1 widgets") && note.contains("ResourceStatus"),
        "the Event says what is missing and how to fix it: {note}"
    );
    assert!(
        status_of(&client, "w")
            .await
            .is_some_and(|s| s.ready().is_none()),
        "the write went through, without the runtime's fields"
    );
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_object_another_finalizer_holds_says_it_is_deprovisioned_not_ready() {
    let (_cluster, client) = cluster();
    let rt = start_widgets(
        &client,
        test_policy(),
        step("noop", |_cx: Context<Widget>| async { Outcome::Done }),
    )
    .await;
    let api = widgets(&client);
    let mut w = widget("held", 1);
    w.metadata.finalizers = Some(vec!["example.com/keep".into()]);
    api.create(&PostParams::default(), &w).await.unwrap();
    wait_ready(&client, "held", LIMIT).await;
    delete(&client, "held").await;
    let status = eventually("deprovisioned, still held", LIMIT, || async {
        let w = api.get_opt("held").await.ok()??;
        let ours = w.finalizers().iter().any(|f| f == crate::common::FINALIZER);
        let status = ResourceStatus::of(&w);
        (!ours && status.ready()?.reason == "Deprovisioned").then_some(status)
    })
    .await;
    assert_eq!(status.phase, Some(Phase::Terminating));
    assert!(!status.is_ready());
    assert!(
        status.ready().unwrap().message.contains("example.com/keep"),
        "{status:?}"
    );
    rt.shutdown().await;
}

#[tokio::test]
async fn events_carry_no_value_an_error_or_a_panic_quotes_and_a_steps_events_keep_the_budget() {
    let (_cluster, client) = cluster();
    let tree = step("leaky", |cx: Context<Widget>| async move {
        match cx.object().spec.size {
            0 => {
                let e = serde_json::from_str::<i32>("\"s3cr3t-error\"").unwrap_err();
                Outcome::failed(Reason::new("Decode", "cannot decode the settings"), e)
            }
            1 => panic!("the password is 's3cr3t-panic'"),
            _ => {
                // A step that publishes many Events of its own: the object's budget holds.
                for _ in 0..40 {
                    cx.event(
                        kube::runtime::events::EventType::Normal,
                        "Chatty",
                        "Provision",
                        Some("token \"s3cr3t-note\" seen".into()),
                    )
                    .await;
                }
                Outcome::Done
            }
        }
    });
    let rt = Runtime::builder(client.clone(), crate::common::names())
        .policy(test_policy())
        .controller(Controller::<Widget>::new(tree))
        .events("widget-operator")
        .start()
        .await
        .expect("start");
    create(&client, "failing", 0).await;
    create(&client, "panicking", 1).await;
    create(&client, "chatty", 2).await;
    wait_reason(&client, "chatty", "Provisioned", LIMIT).await;
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let all = eventually("the failure's and the restart's Events", LIMIT, || async {
        let list = events.list(&ListParams::default()).await.ok()?.items;
        let has = |r: &str| list.iter().any(|e| e.reason.as_deref() == Some(r));
        (has("Decode") && has("Restarted")).then_some(list)
    })
    .await;
    for e in &all {
        let note = e.note.clone().unwrap_or_default();
        assert!(!note.contains("s3cr3t"), "{:?}: {note}", e.reason);
    }
    let restarted = all
        .iter()
        .find(|e| e.reason.as_deref() == Some("Restarted"))
        .unwrap();
    assert!(
        restarted
            .note
            .as_deref()
            .unwrap_or_default()
            .contains("the password is"),
        "{restarted:?}"
    );
    // At most the budget's burst of the step's own Events (of one object), counted as a series
    // of repeats.
    let chatty: i32 = all
        .iter()
        .filter(|e| {
            e.reason.as_deref() == Some("Chatty")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("chatty")
        })
        .map(|e| e.series.as_ref().map_or(1, |s| s.count))
        .sum();
    assert!((1..=25).contains(&chatty), "{chatty} Chatty Events");
    rt.shutdown().await;
}
