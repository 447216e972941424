//! The runtime's introspection ("why is it not Ready?") on the in-process cluster: one object's
//! live state served as JSON on an address of its own — its last reconcile's cause, outcome and
//! steps, its next wake-up, what it waits on and what holds it — and nothing of it on the probes'.
//!
//! Run with `cargo test --release --features operator --test integration introspection::`.
#![cfg(feature = "operator")]

use crate::common;

use std::time::Duration;

use actorcile::introspect::ObjectReport;
use actorcile::prelude::*;
use actorcile::triggers::Trigger;
use common::*;
use kube::api::{Patch, PatchParams, PostParams};

const LIMIT: Duration = Duration::from_secs(30);

/// `validate` (a negative size is terminal), then `deps` (`common::deps_step`).
fn tree() -> impl Provisioner<Widget> {
    serial![
        step("validate", |cx: Context<Widget>| async move {
            if cx.object().spec.size < 0 {
                return Outcome::Terminal(Reason::new("NegativeSize", "size must be >= 0"));
            }
            Outcome::Done
        }),
        deps_step(),
    ]
}

/// The report of `name` once `until` holds of it.
async fn report_when(
    addr: std::net::SocketAddr,
    name: &str,
    until: impl Fn(&ObjectReport) -> bool,
) -> ObjectReport {
    let path = format!("/objects/Widget/default/{name}");
    let mut last = None;
    let found = tokio::time::timeout(LIMIT, async {
        loop {
            let (status, body) = get(addr, &path).await;
            if status == 200 {
                let report: ObjectReport = serde_json::from_str(&body).expect("a report");
                if until(&report) {
                    return report;
                }
                last = Some(report);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    found.unwrap_or_else(|_| panic!("{name}'s report never matched; last: {last:#?}"))
}

#[tokio::test]
async fn the_introspection_says_why_an_object_is_not_ready_from_the_runtimes_memory() {
    let (_cluster, client) = cluster();
    let mut policy = test_policy();
    policy.kind.dependency_poll = Duration::from_secs(3600);
    let rt = Runtime::builder(client.clone(), crate::common::names())
        .policy(policy)
        .controller(Controller::<Widget>::new(tree()))
        .admin("127.0.0.1:0".parse().unwrap())
        .introspection("127.0.0.1:0".parse().unwrap())
        .start()
        .await
        .unwrap();
    let probes = rt.admin_addr().expect("an admin server");
    let addr = rt.introspection_addr().expect("an introspection server");
    assert_ne!(addr, probes, "an address of its own");
    assert_eq!(
        get(probes, "/objects").await.0,
        404,
        "not on the probes' address"
    );
    assert_eq!(get(addr, "/objects").await, (200, r#"["Widget"]"#.into()));

    create(&client, "db", -1).await;
    let mut app = widget("app", 1);
    app.spec.needs = vec!["db".into()];
    widgets(&client)
        .create(&PostParams::default(), &app)
        .await
        .unwrap();
    create(&client, "store", 1).await;
    let mut cache = widget("cache", 1);
    cache.spec.refs = vec!["store".into()];
    widgets(&client)
        .create(&PostParams::default(), &cache)
        .await
        .unwrap();

    let waiting = |r: &ObjectReport| {
        r.last_reconcile
            .as_ref()
            .is_some_and(|l| l.outcome == "waiting")
    };
    let report = report_when(addr, "app", waiting).await;
    let last = report.last_reconcile.as_ref().unwrap();
    assert_eq!(last.trigger, Trigger::Created, "{report:#?}");
    let steps: Vec<(&str, &str)> = last
        .steps
        .iter()
        .map(|s| (s.name.as_str(), s.outcome.as_str()))
        .collect();
    assert_eq!(steps, [("validate", "done"), ("deps", "waiting")]);
    assert_eq!(report.waits_on, ["Widget default/db"]);
    assert_eq!(report.actor, "live", "a wake-up is armed: the actor stays");
    let wake = report
        .next_wake
        .as_ref()
        .expect("the dependency's fallback re-check");
    assert_eq!(wake.trigger, Trigger::Requeue);
    assert!(wake.due_in <= Duration::from_secs(3600), "{wake:?}");
    let ready = report.ready.as_ref().expect("a Ready condition");
    assert_eq!(ready.status, "False");

    let db = report_when(addr, "db", |r| r.last_reconcile.is_some()).await;
    let last = db.last_reconcile.as_ref().unwrap();
    assert_eq!(last.outcome, "terminal");
    assert_eq!(last.steps[0].reason.as_deref(), Some("NegativeSize"));

    let cache = report_when(addr, "cache", |r| !r.holds.is_empty()).await;
    assert_eq!(cache.holds, ["Widget default/store"]);
    let store = report_when(addr, "store", |r| !r.referrers.is_empty()).await;
    assert_eq!(store.referrers, ["Widget default/cache"]);

    // A spec change: the next reconcile says so.
    widgets(&client)
        .patch(
            "app",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "spec": { "note": "second" } })),
        )
        .await
        .unwrap();
    let report = report_when(addr, "app", |r| {
        r.last_reconcile
            .as_ref()
            .is_some_and(|l| l.trigger == Trigger::Spec)
    })
    .await;
    assert_eq!(report.generation, Some(2));
    let from_handle = rt
        .introspect("widget", Some("default"), "app")
        .expect("the handle reads the same memory");
    assert_eq!(from_handle.last_reconcile.unwrap().trigger, Trigger::Spec);
    assert!(
        report.tree().contains("last reconcile: waiting after"),
        "{}",
        report.tree()
    );

    assert_eq!(get(addr, "/objects/Widget/default/nope").await.0, 404);
    assert_eq!(get(addr, "/objects/Gizmo/default/app").await.0, 404);
    rt.shutdown().await;
}
