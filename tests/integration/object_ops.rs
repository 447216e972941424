//! The object operations on `Context` (conditions of a step's own, extra finalizers, owned
//! children) and guarded side effects, on the in-process cluster with paused time. The guard's
//! races against a real API server are in `real_guard.rs`.

use crate::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actorcile::prelude::*;
use actorcile::provisioners::guard;
use actorcile::status::Condition;
use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};

const LIMIT: Duration = Duration::from_secs(120);
const EXTRA_FINALIZER: &str = "test.actorcile.dev/volume";

fn condition(w: &Widget, type_: &str) -> Option<Condition> {
    w.status.as_ref()?.condition(type_).cloned()
}

/// Two concurrent steps, each with a condition of its own, one with a finalizer of its own and
/// an owned child.
fn handle_tree(runs: Arc<AtomicU32>) -> impl Provisioner<Widget> {
    concurrent![
        step("alpha", move |cx: Context<Widget>| {
            let runs = runs.clone();
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                let r = Reason::new("AlphaUp", format!("size {}", cx.object().spec.size));
                match cx.set_condition("Alpha", true, &r).await {
                    Ok(()) => Outcome::Done,
                    Err(e) => Outcome::failed(Reason::new("AlphaWrite", "alpha"), e),
                }
            }
        }),
        step("beta", |cx: Context<Widget>| async move {
            if let Err(e) = cx.add_finalizer(EXTRA_FINALIZER).await {
                return Outcome::failed(Reason::new("BetaFinalizer", "beta"), e);
            }
            let mut cm = ConfigMap::default();
            cm.metadata.name = Some(format!("{}-beta", cx.object().name_any()));
            if let Err(e) = cx.create_owned(cm.clone()).await {
                return Outcome::failed(Reason::new("BetaChild", "beta"), e);
            }
            // idempotent: a second create returns the child as it is
            if let Err(e) = cx.create_owned(cm).await {
                return Outcome::failed(Reason::new("BetaChild", "beta"), e);
            }
            match cx
                .set_condition("Beta", false, &Reason::new("BetaWaiting", "not yet"))
                .await
            {
                Ok(()) => Outcome::Done,
                Err(e) => Outcome::failed(Reason::new("BetaWrite", "beta"), e),
            }
        })
        .on_delete(|cx: Context<Widget>| async move {
            let name = format!("{}-beta", cx.object().name_any());
            match cx.delete_owned::<ConfigMap>(None, &name).await {
                Ok(true) => {}
                Ok(false) => return Outcome::yield_now(Reason::new("ChildGoing", "child")),
                Err(e) => return Outcome::failed(Reason::new("BetaChild", "beta"), e),
            }
            match cx.remove_finalizer(EXTRA_FINALIZER).await {
                Ok(()) => Outcome::Done,
                Err(e) => Outcome::failed(Reason::new("BetaFinalizer", "beta"), e),
            }
        }),
    ]
}

#[tokio::test(start_paused = true)]
async fn steps_write_their_own_conditions_finalizers_and_children_without_clobbering() {
    let (_cluster, client) = cluster();
    let runs = Arc::new(AtomicU32::new(0));
    let rt = start_widgets(&client, test_policy(), handle_tree(runs.clone())).await;
    create(&client, "w", 3).await;
    wait_ready(&client, "w", LIMIT).await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    let w = widgets(&client).get("w").await.unwrap();
    // Ready (the runtime's) and both steps' conditions, side by side.
    let status = w.status.clone().unwrap();
    assert!(status.is_ready());
    let alpha = condition(&w, "Alpha").expect("Alpha");
    assert_eq!(
        (alpha.status.as_str(), alpha.reason.as_str()),
        ("True", "AlphaUp")
    );
    assert_eq!(alpha.observed_generation, Some(1));
    let beta = condition(&w, "Beta").expect("Beta");
    assert_eq!(
        (beta.status.as_str(), beta.reason.as_str()),
        ("False", "BetaWaiting")
    );
    assert!(w.finalizers().contains(&EXTRA_FINALIZER.to_string()));
    assert!(
        w.finalizers()
            .contains(&crate::common::FINALIZER.to_string())
    );
    let child = Api::<ConfigMap>::namespaced(client.clone(), "default")
        .get("w-beta")
        .await
        .unwrap();
    assert_eq!(
        child.owner_references()[0].uid,
        w.uid().unwrap(),
        "the child is owned by the widget"
    );
    // The steps' writes are the reconcile's own: their echoes ran no further reconcile.
    assert_eq!(runs.load(Ordering::SeqCst), 1, "one reconcile");

    // A new generation: Alpha changes (change-only: Beta's write is skipped), Ready stays.
    set_note(&client, "w", "again").await;
    widgets(&client)
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"size": 4}})),
        )
        .await
        .unwrap();
    eventually("Alpha says size 4", LIMIT, || async {
        let w = widgets(&client).get("w").await.ok()?;
        (condition(&w, "Alpha")?.message == "size 4" && w.status.as_ref()?.is_ready()).then_some(())
    })
    .await;
    let w = widgets(&client).get("w").await.unwrap();
    assert!(condition(&w, "Beta").is_some(), "Beta kept");

    // Deletion waits for the step's own finalizer, which its deprovision removes.
    delete(&client, "w").await;
    wait_gone(&client, "w", LIMIT).await;
    assert!(
        Api::<ConfigMap>::namespaced(client.clone(), "default")
            .get_opt("w-beta")
            .await
            .unwrap()
            .is_none()
    );
    rt.shutdown().await;
}

/// A step with an attached condition writes it without naming it and reads it back in the
/// next reconcile; a step without one is told so, as a typed error.
#[tokio::test(start_paused = true)]
async fn a_step_writes_and_reads_back_the_condition_attached_to_it() {
    let (_cluster, client) = cluster();
    let seen = Arc::new(Mutex::new(Vec::<Option<String>>::new()));
    let record = seen.clone();
    let tree = serial![
        step("dns", move |cx: Context<Widget>| {
            let record = record.clone();
            async move {
                // What the last reconcile wrote, read back before this one writes.
                record
                    .lock()
                    .unwrap()
                    .push(cx.attached_condition().map(|c| c.message));
                let r = Reason::new("RecordCreated", format!("size {}", cx.object().spec.size));
                match cx.update_condition(true, &r).await {
                    Ok(()) => Outcome::Done,
                    Err(e) => Outcome::failed(Reason::new("DnsWrite", "dns"), e),
                }
            }
        })
        .attached_condition("DnsRecord"),
        step("plain", |cx: Context<Widget>| async move {
            assert!(cx.attached_condition().is_none());
            match cx.update_condition(true, &Reason::new("Up", "up")).await {
                Err(actorcile::provisioners::StepError::Invalid {
                    field: actorcile::provisioners::Field::ConditionType,
                    ..
                }) => Outcome::Done,
                other => Outcome::Terminal(Reason::new("Unexpected", format!("{other:?}"))),
            }
        }),
    ];
    let rt = start_widgets(&client, test_policy(), tree).await;
    create(&client, "w", 3).await;
    wait_ready(&client, "w", LIMIT).await;
    let w = widgets(&client).get("w").await.unwrap();
    let dns = condition(&w, "DnsRecord").expect("the attached condition is written");
    assert_eq!(
        (
            dns.status.as_str(),
            dns.reason.as_str(),
            dns.message.as_str()
        ),
        ("True", "RecordCreated", "size 3")
    );
    widgets(&client)
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"size": 4}})),
        )
        .await
        .unwrap();
    eventually("DnsRecord says size 4", LIMIT, || async {
        let w = widgets(&client).get("w").await.ok()?;
        (condition(&w, "DnsRecord")?.message == "size 4").then_some(())
    })
    .await;
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.first(), Some(&None), "nothing before the first write");
    assert!(
        seen.contains(&Some("size 3".to_string())),
        "the second generation's reconcile read back the first's write: {seen:?}"
    );
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn bad_names_are_typed_errors_in_the_status_not_panics() {
    let (_cluster, client) = cluster();
    let tree = step("bad", |cx: Context<Widget>| async move {
        let e = cx
            .set_condition("Ready", true, &Reason::new("Mine", "no"))
            .await
            .expect_err("Ready is the runtime's");
        assert!(matches!(
            &e,
            actorcile::provisioners::StepError::Invalid {
                field: actorcile::provisioners::Field::ConditionType,
                ..
            }
        ));
        let e = cx
            .add_finalizer("no-prefix")
            .await
            .expect_err("unqualified");
        Outcome::Terminal(Reason::new("BadFinalizer", e.to_string()))
    });
    let rt = start_widgets(&client, test_policy(), tree).await;
    create(&client, "w", 1).await;
    let s = wait_reason(&client, "w", "BadFinalizer", LIMIT).await;
    assert!(s.ready().unwrap().message.contains("finalizer"));
    rt.shutdown().await;
}

/// A guarded task that counts its runs per object.
fn counting_guard(counts: Arc<Mutex<HashMap<String, u32>>>) -> impl Provisioner<Widget> {
    guard("External", move |cx: Context<Widget>| {
        let counts = counts.clone();
        async move {
            *counts
                .lock()
                .unwrap()
                .entry(cx.object().name_any())
                .or_default() += 1;
            // long enough for another replica's reconcile to meet the lock
            tokio::time::sleep(Duration::from_millis(200)).await;
            Outcome::Done
        }
    })
}

#[tokio::test(start_paused = true)]
async fn a_guard_runs_its_task_once_per_generation_and_records_the_result() {
    let (_cluster, client) = cluster();
    let counts: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let mut policy = test_policy();
    policy.kind.poll_interval = Some(Duration::from_secs(10));
    let rt = start_widgets(&client, policy, counting_guard(counts.clone())).await;
    create(&client, "w", 1).await;
    wait_ready(&client, "w", LIMIT).await;
    // Polls re-run the object; the task stays done for generation 1.
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(
        rt.metrics().provision_reconciles >= 4,
        "polled several times"
    );
    assert_eq!(counts.lock().unwrap()["w"], 1);
    let w = widgets(&client).get("w").await.unwrap();
    let c = condition(&w, "External").unwrap();
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "Done"));
    assert_eq!(c.observed_generation, Some(1));
    // A new generation is a new intent.
    widgets(&client)
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"size": 2}})),
        )
        .await
        .unwrap();
    eventually("the task ran for generation 2", LIMIT, || async {
        (counts.lock().unwrap()["w"] == 2).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(counts.lock().unwrap()["w"], 2);
    rt.shutdown().await;
}

/// A reconcile cut between a guarded task that finished and the record of its result (here:
/// every write fails until the reconcile timeout stops the retries) leaves its lock behind. The
/// next reconcile of the same runtime records the result; it does not run the task again.
#[tokio::test(start_paused = true)]
async fn a_guarded_task_whose_result_write_was_cut_is_recorded_not_run_again() {
    let (cluster, client) = cluster();
    let runs = Arc::new(AtomicU32::new(0));
    let tree = {
        let (runs, cluster) = (runs.clone(), cluster.clone());
        guard("External", move |_cx: Context<Widget>| {
            let (runs, cluster) = (runs.clone(), cluster.clone());
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                // The API fails from now on, for 5 s: longer than the reconcile may run.
                cluster.set_faults(actorcile::cluster::Faults {
                    error_rate: 1.0,
                    ..Default::default()
                });
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    cluster.set_faults(actorcile::cluster::Faults::default());
                });
                Outcome::Done
            }
        })
    };
    let mut policy = test_policy();
    policy.kind.reconcile_timeout = Some(Duration::from_secs(1));
    let rt = start_widgets(&client, policy, tree).await;
    create(&client, "w", 1).await;
    wait_ready(&client, "w", LIMIT).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the task ran once");
    let w = widgets(&client).get("w").await.unwrap();
    let c = condition(&w, "External").unwrap();
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "Done"));
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn two_runtimes_racing_on_fifty_objects_run_each_guarded_task_once() {
    let (_cluster, client) = cluster();
    let counts: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let a = start_widgets(&client, test_policy(), counting_guard(counts.clone())).await;
    let b = start_widgets(&client, test_policy(), counting_guard(counts.clone())).await;
    assert_ne!(a.holder(), b.holder());
    for i in 0..50 {
        create(&client, &format!("w{i}"), 1).await;
    }
    wait_all_ready(&client, 50, LIMIT).await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    let counts = counts.lock().unwrap().clone();
    assert_eq!(counts.len(), 50);
    assert!(
        counts.values().all(|&n| n == 1),
        "every task ran exactly once: {counts:?}"
    );
    a.shutdown().await;
    b.shutdown().await;
}

/// A lock held by another runtime is judged by this runtime's clock: written by a holder whose
/// clock runs behind (its `until` already past here) it holds for the whole expiry after this
/// runtime first saw it; written by one whose clock runs an hour ahead it holds no longer; one
/// whose `until` lies more than an expiry in the past is taken at once. Paused time: how long a
/// lock holds is measured on the runtime's monotonic clock.
#[tokio::test(start_paused = true)]
async fn a_lock_held_elsewhere_holds_for_its_expiry_by_this_runtimes_clock_not_the_holders() {
    let expiry = Duration::from_secs(10);
    for (case, offset, holds) in [
        (
            "the holder's clock behind",
            jiff::SignedDuration::from_secs(-2),
            true,
        ),
        (
            "the holder's clock an hour ahead",
            jiff::SignedDuration::from_hours(1),
            true,
        ),
        (
            "a lock left long ago",
            jiff::SignedDuration::from_secs(-60),
            false,
        ),
    ] {
        let (_cluster, client) = cluster();
        create(&client, "w", 1).await;
        let until = jiff::Timestamp::now() + offset;
        let lock = serde_json::json!({"status": {"conditions": [{
            "type": "External", "status": "Unknown", "reason": "Locked",
            "message": format!("held by other-replica until {until:.3}"),
            "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1,
        }]}});
        widgets(&client)
            .patch_status("w", &PatchParams::default(), &Patch::Merge(lock))
            .await
            .unwrap();
        let ran = Arc::new(Mutex::new(None));
        let r = ran.clone();
        let tree = guard("External", move |_cx: Context<Widget>| {
            let r = r.clone();
            async move {
                *r.lock().unwrap() = Some(tokio::time::Instant::now());
                Outcome::Done
            }
        });
        let mut policy = test_policy();
        policy.kind.lock_expiry = expiry;
        let start = tokio::time::Instant::now();
        let rt = start_widgets(&client, policy, tree).await;
        wait_ready(&client, "w", LIMIT).await;
        let waited = ran.lock().unwrap().expect("the task ran") - start;
        if holds {
            assert!(
                waited >= expiry && waited < expiry * 2,
                "{case}: the task ran {waited:?} after the runtime started"
            );
        } else {
            assert!(waited < expiry, "{case}: the task ran after {waited:?}");
        }
        let w = widgets(&client).get("w").await.unwrap();
        assert_eq!(condition(&w, "External").unwrap().reason, "Done", "{case}");
        rt.shutdown().await;
    }
}

/// The lock's expiry counts from when its write was sent, not answered: others first see the
/// lock when it lands, so a task that ran for the whole expiry after a slow answer would still
/// run after they take the lock. With every status write answered 4 s after it lands and a lock
/// of 10 s, a task of 8 s is cut (6 s after the answer) and recorded as such.
#[tokio::test(start_paused = true)]
async fn a_guarded_tasks_time_counts_from_the_lock_writes_send() {
    use tower::ServiceExt;
    type BoxError = Box<dyn std::error::Error + Send + Sync>;
    let (cluster, _) = cluster();
    let svc = cluster.service();
    let slow = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let svc = svc.clone();
        let status_patch =
            req.method() == http::Method::PATCH && req.uri().path().ends_with("/status");
        async move {
            let answer = svc.oneshot(req).await.map_err(BoxError::from)?;
            if status_patch {
                tokio::time::sleep(Duration::from_secs(4)).await;
            }
            Ok::<_, BoxError>(answer)
        }
    });
    let client = kube::Client::new(slow, "default");
    let ran = Arc::new(AtomicU32::new(0));
    let tree = {
        let ran = ran.clone();
        guard("External", move |_cx: Context<Widget>| {
            let ran = ran.clone();
            async move {
                tokio::time::sleep(Duration::from_secs(8)).await;
                ran.fetch_add(1, Ordering::SeqCst);
                Outcome::Done
            }
        })
    };
    let mut policy = test_policy();
    policy.kind.lock_expiry = Duration::from_secs(10);
    policy.kind.reconcile_timeout = None;
    let rt = start_widgets(&client, policy, tree).await;
    create(&client, "w", 1).await;
    let deadline = tokio::time::Instant::now() + LIMIT;
    let c = loop {
        let w = widgets(&client).get("w").await.unwrap();
        if let Some(c) = condition(&w, "External").filter(|c| c.reason != "Locked") {
            break c;
        }
        assert!(tokio::time::Instant::now() < deadline, "no result recorded");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "LockExpired"),
        "{c:?}"
    );
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "the task was cut before it finished"
    );
    rt.shutdown().await;
}
