//! Combinator semantics: serial order and reverse deprovision, concurrent merge, conditional.
//! These provisioners do no I/O, so the context's client is never called; the resource step's
//! readiness and deletion run on an in-process cluster (the last test).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actorcile::prelude::*;
use actorcile::provisioners::Step;
use k8s_openapi::api::core::v1::ConfigMap;

type Trace = Arc<Mutex<Vec<String>>>;

/// A client whose every request fails: proves these combinators never touch the API.
fn offline_client() -> kube::Client {
    let svc = tower::service_fn(|_req: http::Request<kube::client::Body>| async {
        Err::<http::Response<kube::client::Body>, std::io::Error>(std::io::Error::other("offline"))
    });
    kube::Client::new(svc, "default")
}

fn cx(flag: &str) -> Context<ConfigMap> {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("cm".into());
    cm.metadata.namespace = Some("default".into());
    cm.data = Some([("flag".to_string(), flag.to_string())].into());
    Context::new(Arc::new(cm), offline_client())
}

/// A step that records its calls and returns `outcome` from provision and deprovision.
fn rec(name: &str, trace: &Trace, outcome: Outcome) -> Step<ConfigMap> {
    let (n1, t1, o1) = (name.to_string(), trace.clone(), outcome.clone());
    let (n2, t2, o2) = (name.to_string(), trace.clone(), outcome);
    step(name, move |_cx: Context<ConfigMap>| {
        let (n, t, o) = (n1.clone(), t1.clone(), o1.clone());
        async move {
            t.lock().unwrap().push(format!("+{n}"));
            o
        }
    })
    .on_delete(move |_cx: Context<ConfigMap>| {
        let (n, t, o) = (n2.clone(), t2.clone(), o2.clone());
        async move {
            t.lock().unwrap().push(format!("-{n}"));
            o
        }
    })
}

fn y(code: &'static str) -> Outcome {
    Outcome::yield_now(Reason::new(code, "not yet"))
}

fn taken(t: &Trace) -> Vec<String> {
    std::mem::take(&mut *t.lock().unwrap())
}

#[tokio::test]
async fn serial_provisions_in_order_and_deprovisions_in_reverse() {
    let t = Trace::default();
    let tree = serial![
        rec("a", &t, Outcome::Done),
        rec("b", &t, Outcome::Done),
        rec("c", &t, Outcome::Done)
    ];
    assert!(tree.provision(&cx("")).await.is_done());
    assert_eq!(taken(&t), ["+a", "+b", "+c"]);
    assert!(tree.deprovision(&cx("")).await.is_done());
    assert_eq!(taken(&t), ["-c", "-b", "-a"]);
}

#[tokio::test]
async fn serial_stops_at_the_first_non_done_child_both_ways() {
    let t = Trace::default();
    let tree = serial![
        rec("a", &t, Outcome::Done),
        rec("b", &t, y("B")),
        rec("c", &t, Outcome::Done)
    ];
    let o = tree.provision(&cx("")).await;
    assert_eq!(o.reason().unwrap().code(), "B");
    assert_eq!(taken(&t), ["+a", "+b"], "c untouched this reconcile");
    let o = tree.deprovision(&cx("")).await;
    assert_eq!(o.reason().unwrap().code(), "B");
    assert_eq!(taken(&t), ["-c", "-b"], "a untouched while b is not done");
}

#[tokio::test]
async fn concurrent_runs_every_child_even_when_one_yields_and_merges_deterministically() {
    let t = Trace::default();
    let tree = concurrent![
        rec("a", &t, y("A")),
        rec("b", &t, Outcome::Done),
        rec(
            "c",
            &t,
            Outcome::failed(Reason::new("C", "c failed"), std::io::Error::other("c-err"))
        ),
        rec(
            "d",
            &t,
            Outcome::failed(Reason::new("D", "d failed"), std::io::Error::other("d-err"))
        ),
    ];
    let o = tree.provision(&cx("")).await;
    let mut calls = taken(&t);
    calls.sort();
    assert_eq!(calls, ["+a", "+b", "+c", "+d"]);
    match o {
        Outcome::Failed { reason, errors } => {
            assert_eq!(reason.code(), "C", "first failing child's reason");
            let e: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
            assert_eq!(e, ["c-err", "d-err"], "every child's error kept");
        }
        other => panic!("expected Failed, got {other:?}"),
    }
    // terminal beats everything
    let tree = concurrent![
        rec("a", &t, y("A")),
        rec("b", &t, Outcome::Terminal(Reason::new("T", "bad"))),
        rec(
            "c",
            &t,
            Outcome::failed(Reason::new("C", ""), std::io::Error::other("x"))
        ),
    ];
    assert_eq!(tree.provision(&cx("")).await.reason().unwrap().code(), "T");
    // among yields the earliest wake-up wins
    let tree = concurrent![
        rec(
            "a",
            &t,
            Outcome::yield_after(Duration::from_secs(9), Reason::new("Late", ""))
        ),
        rec(
            "b",
            &t,
            Outcome::yield_after(Duration::from_secs(1), Reason::new("Soon", ""))
        ),
        rec("c", &t, Outcome::Done),
    ];
    assert_eq!(
        tree.provision(&cx("")).await.reason().unwrap().code(),
        "Soon"
    );
}

#[tokio::test]
async fn concurrent_children_interleave_in_one_reconcile() {
    // both children must be in flight at once: each waits for the other to have started
    let a_started = Arc::new(tokio::sync::Notify::new());
    let b_started = Arc::new(tokio::sync::Notify::new());
    let (a1, b1) = (a_started.clone(), b_started.clone());
    let (a2, b2) = (a_started.clone(), b_started.clone());
    let tree = concurrent![
        step("a", move |_cx: Context<ConfigMap>| {
            let (a, b) = (a1.clone(), b1.clone());
            async move {
                a.notify_one();
                b.notified().await;
                Outcome::Done
            }
        }),
        step("b", move |_cx: Context<ConfigMap>| {
            let (a, b) = (a2.clone(), b2.clone());
            async move {
                b.notify_one();
                a.notified().await;
                Outcome::Done
            }
        }),
    ];
    let o = tokio::time::timeout(Duration::from_secs(5), tree.provision(&cx("")))
        .await
        .expect("children run concurrently, not one after the other");
    assert!(o.is_done());
}

#[tokio::test]
async fn conditional_provisions_when_true_and_actively_deprovisions_when_false() {
    let t = Trace::default();
    let tree = conditional(
        "feature",
        |cm: &ConfigMap| {
            cm.data
                .as_ref()
                .and_then(|d| d.get("flag"))
                .is_some_and(|f| f == "on")
        },
        rec("child", &t, Outcome::Done),
    );
    assert!(tree.provision(&cx("on")).await.is_done());
    assert_eq!(taken(&t), ["+child"]);
    assert!(tree.provision(&cx("off")).await.is_done());
    assert_eq!(taken(&t), ["-child"], "false deprovisions, not skips");
    assert!(tree.deprovision(&cx("on")).await.is_done());
    assert_eq!(
        taken(&t),
        ["-child"],
        "deprovision always deprovisions the child"
    );
}

#[tokio::test]
async fn resource_step_reports_api_failures_as_typed_failed_outcomes() {
    let tree = resource("child", |_cm: &ConfigMap| ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some("child".into()),
            ..Default::default()
        },
        ..Default::default()
    });
    match tree.provision(&cx("")).await {
        Outcome::Failed { reason, errors } => {
            assert_eq!(reason.code(), "ApplyFailed");
            assert!(
                !reason.message().contains("offline"),
                "raw error text stays out of the reason"
            );
            assert!(errors[0].to_string().contains("offline"));
        }
        other => panic!("expected Failed, got {other:?}"),
    }
    let nameless = resource("child", |_cm: &ConfigMap| ConfigMap::default());
    assert!(matches!(
        nameless.provision(&cx("")).await,
        Outcome::Terminal(_)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_children_run_in_parallel_so_a_blocking_one_does_not_stall_its_siblings() {
    // Each child blocks its thread until the other arrives: on one task the first would wait
    // for ever for a sibling that is never polled.
    let barrier = Arc::new(std::sync::Barrier::new(2));
    let child = |name: &'static str| {
        let barrier = barrier.clone();
        step(name, move |_cx: Context<ConfigMap>| {
            let barrier = barrier.clone();
            async move {
                barrier.wait();
                Outcome::Done
            }
        })
    };
    let tree = concurrent![child("a"), child("b")];
    let outcome = tokio::time::timeout(Duration::from_secs(60), tree.provision(&cx("")))
        .await
        .expect("both children ran at once");
    assert!(matches!(outcome, Outcome::Done), "{outcome:?}");
}

#[tokio::test]
async fn a_panicking_concurrent_child_is_its_own_failure_and_its_siblings_still_count() {
    let t = Trace::default();
    let tree = concurrent![
        rec("a", &t, Outcome::Done),
        step("boom", |_cx: Context<ConfigMap>| async {
            panic!("the disk is on fire");
        }),
        rec("c", &t, y("C")),
    ];
    match tree.provision(&cx("")).await {
        Outcome::Failed { reason, errors } => {
            assert_eq!(reason.code(), "StepPanicked");
            assert!(reason.message().contains("boom"), "{}", reason.message());
            assert!(
                errors[0].to_string().contains("the disk is on fire"),
                "{errors:?}"
            );
        }
        other => panic!("expected the panic as a failure, got {other:?}"),
    }
    let mut calls = taken(&t);
    calls.sort();
    assert_eq!(calls, ["+a", "+c"], "the siblings ran");
}

#[tokio::test]
async fn a_tree_built_per_reconcile_follows_the_object() {
    let t = Trace::default();
    let tree = actorcile::provisioners::per_reconcile("addons", {
        let t = t.clone();
        move |cm: &ConfigMap| {
            let addons = cm
                .data
                .as_ref()
                .and_then(|d| d.get("addons"))
                .cloned()
                .unwrap_or_default();
            let steps: Vec<BoxProvisioner<ConfigMap>> = addons
                .split(',')
                .filter(|a| !a.is_empty())
                .map(|a| boxed(rec(a, &t, Outcome::Done)))
                .collect();
            boxed(serial("addons", steps))
        }
    });
    let with = |addons: &str| {
        let cm = ConfigMap {
            data: Some([("addons".to_string(), addons.to_string())].into()),
            ..Default::default()
        };
        Context::new(Arc::new(cm), offline_client())
    };
    assert!(matches!(
        tree.provision(&with("dns,ingress")).await,
        Outcome::Done
    ));
    assert_eq!(taken(&t), ["+dns", "+ingress"]);
    assert!(matches!(
        tree.deprovision(&with("dns")).await,
        Outcome::Done
    ));
    assert_eq!(taken(&t), ["-dns"]);
}

/// `resource(..).ready_when` yields `ChildNotReady` until the applied child satisfies the
/// predicate; deprovision deletes the child and yields `ChildDeleting` while another
/// controller's finalizer holds it, `Done` once it is gone (in-process cluster).
#[tokio::test]
async fn a_resource_is_ready_by_its_predicate_and_its_deletion_waits_until_it_is_gone() {
    use actorcile::provisioners::resource;
    use kube::api::{Api, Patch, PatchParams, PostParams};
    let cluster = actorcile::cluster::ApiServer::new();
    let client = cluster.client();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let mut parent = ConfigMap::default();
    parent.metadata.name = Some("parent".into());
    let parent = cms
        .create(&PostParams::default(), &parent)
        .await
        .expect("create the parent");
    let child = resource("child", |_p: &ConfigMap| {
        let mut c = ConfigMap::default();
        c.metadata.name = Some("child".into());
        c.metadata.namespace = Some("default".into());
        c.data = Some([("made".to_string(), "by the parent".to_string())].into());
        c
    })
    .ready_when(|c: &ConfigMap| {
        c.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("ready"))
            .is_some_and(|v| v == "yes")
    });
    let cx = Context::new(Arc::new(parent), client.clone());
    let code = |o: &Outcome| o.reason().map(|r| r.code().to_string());
    let out = child.provision(&cx).await;
    assert_eq!(code(&out).as_deref(), Some("ChildNotReady"), "{out:?}");
    assert!(cms.get_opt("child").await.unwrap().is_some(), "applied");
    // Its own controller says it is ready.
    let params = PatchParams::default();
    let mark = serde_json::json!({ "metadata": { "annotations": { "ready": "yes" } } });
    cms.patch("child", &params, &Patch::Merge(mark))
        .await
        .unwrap();
    let out = child.provision(&cx).await;
    assert!(out.is_done(), "{out:?}");

    // Another controller's finalizer holds the child: deletion waits for it to go.
    let hold = serde_json::json!({ "metadata": { "finalizers": ["example.com/hold"] } });
    cms.patch("child", &params, &Patch::Merge(hold))
        .await
        .unwrap();
    let out = child.deprovision(&cx).await;
    assert_eq!(code(&out).as_deref(), Some("ChildDeleting"), "{out:?}");
    let out = child.deprovision(&cx).await;
    assert_eq!(
        code(&out).as_deref(),
        Some("ChildDeleting"),
        "still there: {out:?}"
    );
    let release = serde_json::json!({ "metadata": { "finalizers": null } });
    cms.patch("child", &params, &Patch::Merge(release))
        .await
        .unwrap();
    assert!(cms.get_opt("child").await.unwrap().is_none(), "gone");
    let out = child.deprovision(&cx).await;
    assert!(out.is_done(), "{out:?}");
}
