//! The runtime on the in-process cluster, through `RuntimeBuilder`: lifecycle, supervision
//! across kinds, one run at a time under load, bad input, change-only status writes, reconcile slots
//! and passivation at scale. The decisions of one kind's manager and reconciles (coalescing, the
//! earliest wake-up, passivation, restart intensity, yield and error delays) are tested beside
//! their code, in `src/actors/`.
//!
//! Timer tests run on a paused tokio clock (auto-advancing), so delays are exact and fast.

use crate::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actorcile::prelude::*;
use common::*;
use kube::ResourceExt;
use tokio::sync::Notify;
use tokio::time::Instant;

const LIMIT: Duration = Duration::from_secs(120);

/// [`test_policy`] with passivation after `idle` (tests' default is never).
fn passivating(idle: Duration) -> SupervisorPolicy {
    SupervisorPolicy {
        kind: actorcile::policy::KindPolicy {
            idle_timeout: Some(idle),
            ..test_policy().kind
        },
        ..test_policy()
    }
}

/// A tree that logs every provision call of `Widget`s.
fn logging_step(log: ReconcileLog) -> impl Provisioner<Widget> {
    logging_step_with(log, |_| Outcome::Done)
}

/// A tree that logs every provision call of `Widget`s and ends it with `outcome`.
fn logging_step_with(
    log: ReconcileLog,
    outcome: impl Fn(&Context<Widget>) -> Outcome + Clone + Send + Sync + 'static,
) -> impl Provisioner<Widget> {
    step("log", move |cx: Context<Widget>| {
        let (log, outcome) = (log.clone(), outcome.clone());
        async move {
            let i = log.start(&cx.object().name_any());
            log.end(i);
            outcome(&cx)
        }
    })
}

#[tokio::test(start_paused = true)]
async fn lifecycle_provision_ready_delete_gone_without_leaks() {
    let (cluster, client) = cluster();
    let deprovisioned = Arc::new(AtomicU32::new(0));
    let d = deprovisioned.clone();
    let tree = serial![
        step("a", |_cx: Context<Widget>| async { Outcome::Done }),
        step("b", |_cx: Context<Widget>| async { Outcome::Done }).on_delete(
            move |_cx: Context<Widget>| {
                let d = d.clone();
                async move {
                    d.fetch_add(1, Ordering::SeqCst);
                    Outcome::Done
                }
            }
        ),
    ];
    let rt = start_widgets(&client, test_policy(), tree).await;
    for i in 0..20 {
        create(&client, &format!("w{i}"), 1).await;
    }
    wait_all_ready(&client, 20, LIMIT).await;
    let w = widgets(&client).get("w0").await.unwrap();
    assert!(
        w.finalizers()
            .contains(&crate::common::FINALIZER.to_string())
    );
    let s = w.status.unwrap();
    assert_eq!(s.phase, Some(Phase::Ready));
    assert_eq!(s.observed_generation, w.metadata.generation);
    for i in 0..20 {
        delete(&client, &format!("w{i}")).await;
    }
    for i in 0..20 {
        wait_gone(&client, &format!("w{i}"), LIMIT).await;
    }
    assert_eq!(deprovisioned.load(Ordering::SeqCst), 20);
    let left = widgets(&client).list(&Default::default()).await.unwrap();
    assert!(
        left.items.is_empty(),
        "no widget left behind (no leaked finalizer)"
    );
    drop(cluster);
    // every actor stopped and was forgotten
    eventually("actors stopped", LIMIT, || async {
        (rt.metrics().live_actors == 0).then_some(())
    })
    .await;
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn panicking_provisioner_is_restarted_with_growing_delay_then_ready() {
    let (_cluster, client) = cluster();
    let log = ReconcileLog::default();
    let calls = Arc::new(AtomicU32::new(0));
    let (l, c) = (log.clone(), calls.clone());
    let tree = step("panicky", move |cx: Context<Widget>| {
        let (l, c) = (l.clone(), c.clone());
        async move {
            l.start(&cx.object().name_any());
            if c.fetch_add(1, Ordering::SeqCst) < 3 {
                panic!("provisioner bug");
            }
            Outcome::Done
        }
    });
    let mut policy = test_policy();
    policy.kind.restart.max_restarts = 5;
    policy.kind.restart.backoff.min = Duration::from_millis(100);
    let rt = start_widgets(&client, policy, tree).await;
    create(&client, "p", 1).await;
    wait_ready(&client, "p", LIMIT).await;
    assert_eq!(rt.metrics().restarts, 3);
    let s = log.starts("p");
    assert_eq!(s.len(), 4);
    let gaps: Vec<Duration> = s.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps[0] >= Duration::from_millis(100), "{gaps:?}");
    assert!(
        gaps[1] >= Duration::from_millis(200) && gaps[1] > gaps[0],
        "{gaps:?}"
    );
    assert!(
        gaps[2] >= Duration::from_millis(400) && gaps[2] > gaps[1],
        "{gaps:?}"
    );
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_hung_reconcile_is_stopped_at_the_reconcile_timeout_and_retried_with_backoff() {
    let (_cluster, client) = cluster();
    let log = ReconcileLog::default();
    let calls = Arc::new(AtomicU32::new(0));
    let (l, c) = (log.clone(), calls.clone());
    // The first two reconciles hang; the third finishes.
    let tree = step("hangs", move |cx: Context<Widget>| {
        let (l, c) = (l.clone(), c.clone());
        async move {
            l.start(&cx.object().name_any());
            if c.fetch_add(1, Ordering::SeqCst) < 2 {
                std::future::pending::<()>().await;
            }
            Outcome::Done
        }
    });
    let mut policy = test_policy();
    policy.kind.reconcile_timeout = Some(Duration::from_secs(3));
    policy.kind.error_backoff.min = Duration::from_millis(100);
    let rt = start_widgets(&client, policy, tree).await;
    create(&client, "h", 1).await;
    wait_reason(&client, "h", "ReconcileTimeout", LIMIT).await;
    wait_ready(&client, "h", LIMIT).await;
    let s = log.starts("h");
    assert_eq!(
        s.len(),
        3,
        "two stopped reconciles, then the one that finished"
    );
    let gaps: Vec<Duration> = s.windows(2).map(|w| w[1] - w[0]).collect();
    // 3 s of hanging, then the error backoff (100 ms, then 200 ms).
    assert!(
        gaps[0] >= Duration::from_millis(3100) && gaps[0] < Duration::from_millis(3200),
        "{gaps:?}"
    );
    assert!(
        gaps[1] >= Duration::from_millis(3200) && gaps[1] < Duration::from_millis(3300),
        "{gaps:?}"
    );
    assert_eq!(
        rt.metrics().restarts,
        0,
        "a timeout is a failure, not a crash"
    );
    rt.shutdown().await;
}

/// What a test's client does with a request (see [`client_with`]).
enum Fate {
    Pass,
    /// Never answered.
    Hold,
    /// Failed, as a connection error would fail it.
    Refuse,
    /// Sent to the server, its answer replaced by a failure (the write landed; the client
    /// cannot know).
    Lose,
}

/// A client of `cluster` that does with each request what `fate` says.
fn client_with(
    cluster: &actorcile::cluster::ApiServer,
    fate: impl Fn(&http::Request<kube::client::Body>) -> Fate + Send + Sync + 'static,
) -> kube::Client {
    use tower::ServiceExt;
    type BoxError = Box<dyn std::error::Error + Send + Sync>;
    let svc = cluster.service();
    let faulty = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let (svc, fate) = (svc.clone(), fate(&req));
        async move {
            match fate {
                Fate::Pass => svc.oneshot(req).await.map_err(BoxError::from),
                Fate::Hold => std::future::pending().await,
                Fate::Refuse => Err("refused by the test".into()),
                Fate::Lose => {
                    svc.oneshot(req).await.map_err(BoxError::from)?;
                    Err("the answer was lost".into())
                }
            }
        }
    });
    kube::Client::new(faulty, "default")
}

/// A client of `cluster` that leaves unanswered, once each, the requests `held` names
/// (`"PATCH /widgets/w/status"`: method and the end of the path); each is removed as it is met.
fn holding_client(
    cluster: &actorcile::cluster::ApiServer,
    held: Arc<Mutex<Vec<&'static str>>>,
) -> kube::Client {
    client_with(cluster, move |req| {
        let mut held = held.lock().unwrap();
        let at = held.iter().position(|h| {
            let (method, path) = h.split_once(' ').unwrap();
            req.method().as_str() == method && req.uri().path().ends_with(path)
        });
        match at.map(|i| held.remove(i)) {
            Some(_) => Fate::Hold,
            None => Fate::Pass,
        }
    })
}

#[tokio::test(start_paused = true)]
async fn a_runtime_write_left_unanswered_is_abandoned_at_the_write_timeout_and_retried() {
    let (cluster, client) = cluster();
    let held = Arc::new(Mutex::new(vec!["PATCH /widgets/w/status"]));
    let runtime_client = holding_client(&cluster, held.clone());
    let mut policy = test_policy();
    policy.kind.write_timeout = Some(Duration::from_secs(5));
    let tree = step("done", |_cx: Context<Widget>| async { Outcome::Done });
    let rt = start_widgets(&runtime_client, policy, tree).await;

    // The Ready status write is never answered: abandoned after 5 s, then written again.
    let start = Instant::now();
    create(&client, "w", 1).await;
    wait_ready(&client, "w", LIMIT).await;
    assert!(held.lock().unwrap().is_empty(), "the status write was held");
    let took = start.elapsed();
    assert!(
        took >= Duration::from_secs(5) && took < Duration::from_secs(6),
        "Ready after the write timeout and one error backoff: {took:?}"
    );

    // The finalizer's removal (the first PATCH of the object itself once it is deleted) too.
    held.lock().unwrap().push("PATCH /widgets/w");
    let start = Instant::now();
    delete(&client, "w").await;
    wait_gone(&client, "w", LIMIT).await;
    assert!(
        held.lock().unwrap().is_empty(),
        "the finalizer removal was held"
    );
    assert!(
        start.elapsed() >= Duration::from_secs(5),
        "gone only after the held removal was abandoned: {:?}",
        start.elapsed()
    );
    assert_eq!(
        rt.metrics().write_timeouts,
        2,
        "both abandoned writes are counted"
    );
    rt.shutdown().await;
}

/// A deletion's tree runs once although the finalizer's removal fails: refused before it
/// reached the server, or landed with its answer lost. The next reconcile retries the removal
/// alone.
#[tokio::test(start_paused = true)]
async fn a_failed_finalizer_removal_is_retried_without_deprovisioning_again() {
    for fate in ["refused", "lost"] {
        let (cluster, client) = cluster();
        let failed = Arc::new(AtomicU32::new(0));
        let f = failed.clone();
        let runtime_client = client_with(&cluster, move |req| {
            // The finalizer's removal: the first JSON patch of the object itself.
            let removal = req.method() == http::Method::PATCH
                && req.uri().path().ends_with("/widgets/w")
                && req
                    .headers()
                    .get(http::header::CONTENT_TYPE)
                    .is_some_and(|t| t == "application/json-patch+json");
            if removal && f.fetch_add(1, Ordering::SeqCst) == 0 {
                if fate == "refused" {
                    Fate::Refuse
                } else {
                    Fate::Lose
                }
            } else {
                Fate::Pass
            }
        });
        let deprovisioned = Arc::new(AtomicU32::new(0));
        let d = deprovisioned.clone();
        let tree = step("done", |_cx: Context<Widget>| async { Outcome::Done }).on_delete(
            move |_cx: Context<Widget>| {
                let d = d.clone();
                async move {
                    d.fetch_add(1, Ordering::SeqCst);
                    Outcome::Done
                }
            },
        );
        let rt = start_widgets(&runtime_client, test_policy(), tree).await;
        create(&client, "w", 1).await;
        wait_ready(&client, "w", LIMIT).await;
        // Another finalizer keeps the object after ours goes, so a removal that landed leaves
        // it in the API for the runtime to look at again.
        let patch = serde_json::json!({"metadata": {"finalizers": [crate::common::FINALIZER, "test/keep"]}});
        widgets(&client)
            .patch(
                "w",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .unwrap();
        delete(&client, "w").await;
        eventually("our finalizer removed", LIMIT, || async {
            let w = widgets(&client).get("w").await.ok()?;
            (w.finalizers() == ["test/keep"]).then_some(())
        })
        .await;
        assert!(
            failed.load(Ordering::SeqCst) >= 1,
            "{fate}: the removal was failed once"
        );
        // A refused removal is retried, so ours going proves the retry ran. A lost answer's
        // failed reconcile schedules a retry one error backoff later: give it (paused) time.
        eventually("the failed reconcile counted", LIMIT, || async {
            let failed =
                rt.kind_metrics()[0].reconciles_with(actorcile::runtime::ReconcileResult::Failed);
            (failed >= 1).then_some(())
        })
        .await;
        tokio::time::sleep(test_policy().kind.error_backoff.max * 2).await;
        assert_eq!(
            deprovisioned.load(Ordering::SeqCst),
            1,
            "{fate}: the tree ran once for one deletion"
        );
        let clear = serde_json::json!({"metadata": {"finalizers": null}});
        widgets(&client)
            .patch(
                "w",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&clear),
            )
            .await
            .unwrap();
        wait_gone(&client, "w", LIMIT).await;
        rt.shutdown().await;
    }
}

/// A client of `cluster` that fails every status write while `refuse` is set, counting them
/// in `refused`.
fn refusing_client(
    cluster: &actorcile::cluster::ApiServer,
    refuse: Arc<std::sync::atomic::AtomicBool>,
    refused: Arc<AtomicU32>,
) -> kube::Client {
    client_with(cluster, move |req| {
        let status_write =
            req.method() == http::Method::PATCH && req.uri().path().ends_with("/status");
        if status_write && refuse.load(Ordering::SeqCst) {
            refused.fetch_add(1, Ordering::SeqCst);
            Fate::Refuse
        } else {
            Fate::Pass
        }
    })
}

#[tokio::test(start_paused = true)]
async fn a_status_write_that_keeps_failing_is_retried_with_the_error_backoff() {
    let (cluster, client) = cluster();
    let refuse = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let refused = Arc::new(AtomicU32::new(0));
    let runtime_client = refusing_client(&cluster, refuse.clone(), refused.clone());
    let mut policy = test_policy();
    policy.kind.error_backoff.min = Duration::from_millis(200);
    policy.kind.error_backoff.max = Duration::from_secs(300);
    policy.kind.error_backoff.factor = 2.0;
    let tree = step("done", |_cx: Context<Widget>| async { Outcome::Done });
    let rt = start_widgets(&runtime_client, policy, tree).await;
    create(&client, "w", 1).await;
    eventually("a first status write", LIMIT, || async {
        (refused.load(Ordering::SeqCst) > 0).then_some(())
    })
    .await;
    // A minute of refusals: retried after 0.2, 0.4, 0.8 … 25.6 s (nine writes), not every
    // 200 ms (three hundred).
    tokio::time::sleep(Duration::from_secs(60)).await;
    let writes = refused.load(Ordering::SeqCst);
    assert!(
        (8..=10).contains(&writes),
        "{writes} status writes in a minute"
    );
    // Once the API server takes them, the next retry lands.
    refuse.store(false, Ordering::SeqCst);
    wait_ready(&client, "w", LIMIT).await;
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn the_error_backoff_resumes_after_passivation() {
    let (_cluster, client) = cluster();
    let log = ReconcileLog::default();
    // Fails every reconcile: a dependency that stays down.
    let tree = logging_step_with(log.clone(), |_| {
        Outcome::failed(
            Reason::new("Down", "the dependency is down"),
            std::io::Error::other("down"),
        )
    });
    // Backoffs past a second passivate the actor between attempts.
    let mut policy = passivating(Duration::from_secs(1));
    policy.kind.error_backoff.min = Duration::from_millis(200);
    policy.kind.error_backoff.max = Duration::from_secs(60);
    policy.kind.error_backoff.factor = 2.0;
    let rt = start_widgets(&client, policy, tree).await;
    create(&client, "f", 1).await;
    wait_reason(&client, "f", "Down", LIMIT).await;
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert!(
        rt.metrics().passivations > 0,
        "the actor passivated between attempts"
    );
    // 0.2, 0.4 … 51.2 s, then every 60 s: about 17 attempts in ten minutes. Restarting the
    // backoff at each re-activation would make it hundreds.
    let starts = log.starts("f");
    assert!(
        (15..=20).contains(&starts.len()),
        "{} attempts in ten minutes",
        starts.len()
    );
    let last = starts[starts.len() - 1] - starts[starts.len() - 2];
    assert!(
        last >= Duration::from_secs(60) && last < Duration::from_secs(61),
        "at the longest backoff: {last:?}"
    );
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_deleting_object_past_restart_intensity_is_tried_again_until_its_finalizer_goes() {
    let (_cluster, client) = cluster();
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    // Deprovision panics three times in a row, then succeeds.
    let tree = step("deploy", |_cx: Context<Widget>| async { Outcome::Done }).on_delete(
        move |_cx: Context<Widget>| {
            let c = c.clone();
            async move {
                if c.fetch_add(1, Ordering::SeqCst) < 3 {
                    panic!("deprovision bug");
                }
                Outcome::Done
            }
        },
    );
    let mut policy = test_policy();
    policy.kind.restart.max_restarts = 2;
    policy.kind.restart.backoff.min = Duration::from_millis(10);
    policy.kind.error_backoff.max = Duration::from_secs(30);
    let rt = start_widgets(&client, policy, tree).await;
    create(&client, "d", 1).await;
    wait_ready(&client, "d", LIMIT).await;
    delete(&client, "d").await;
    let s = wait_reason(&client, "d", "Quarantined", LIMIT).await;
    assert!(
        s.ready().unwrap().message.contains("while deleting"),
        "{s:?}"
    );
    let quarantined_at = Instant::now();
    wait_gone(&client, "d", LIMIT).await;
    assert!(
        quarantined_at.elapsed() >= Duration::from_secs(30),
        "tried again after the longest error backoff, not at once"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    assert_eq!(rt.metrics().quarantined, 1);
    rt.shutdown().await;
}

/// Ten objects, forty spec updates each, one every millisecond while each run takes two (paused
/// clock: the interleaving is the same on every run, whatever the machine's load). Updates so keep
/// arriving while runs are in progress: no run of an object starts before its previous one ended,
/// every object's latest run saw its last update, and the updates that arrived during a run were
/// folded into follow-up runs (more runs than the ten first ones, at most one per event).
#[tokio::test(start_paused = true)]
async fn never_two_reconciles_of_one_object_at_once_under_heavy_event_load() {
    let (_cluster, client) = cluster();
    let log = ReconcileLog::default();
    // the note each object's latest run saw
    let seen: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let (l, s) = (log.clone(), seen.clone());
    let tree = step("slowish", move |cx: Context<Widget>| {
        let (l, s) = (l.clone(), s.clone());
        async move {
            let name = cx.object().name_any();
            // Ends when the step's future does: a reconcile cut because a newer note arrived
            // (`cancel_on_change`) ends where it is cut, and must end before the next starts.
            let _reconcile = l.record(&name);
            tokio::time::sleep(Duration::from_millis(2)).await;
            s.lock()
                .unwrap()
                .insert(name, cx.object().spec.note.clone());
            Outcome::Done
        }
    });
    let rt = start_widgets(&client, test_policy(), tree).await;
    for i in 0..10 {
        create(&client, &format!("h{i}"), 1).await;
    }
    // 10 writers, 40 spec updates each, 1 ms apart: faster than a run, so updates arrive while
    // runs are in progress (unpaced, the in-process cluster takes all 400 before most actors
    // have run once, and coalescing rightly folds them into one run each)
    let mut writers = Vec::new();
    for i in 0..10 {
        let client = client.clone();
        writers.push(tokio::spawn(async move {
            for j in 0..40 {
                set_note(&client, &format!("h{i}"), &format!("v{j}")).await;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    // no update is lost: every object's latest run saw its last note
    eventually("every object ran with its last note", LIMIT, || async {
        let seen = seen.lock().unwrap();
        (0..10)
            .all(|i| seen.get(&format!("h{i}")).is_some_and(|n| n == "v39"))
            .then_some(())
    })
    .await;
    wait_all_ready(&client, 10, LIMIT).await;
    // On the paused clock this sleep returns only once every task is idle: any run still to
    // come has started (and, 2 ms long, ended) by then.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for i in 0..10 {
        let name = format!("h{i}");
        let runs = log.count(&name);
        // more than the first run: updates that arrived during a run were followed by another
        // run; at most one run per event (the create and 40 updates)
        assert!(runs > 1 && runs <= 41, "{name} ran {runs} times");
        log.assert_no_overlap(&name);
    }
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn invalid_spec_is_terminal_with_typed_reason_and_bounded_runs() {
    let (_cluster, client) = cluster();
    let log = ReconcileLog::default();
    let l = log.clone();
    let tree = step("validate", move |cx: Context<Widget>| {
        let l = l.clone();
        async move {
            l.start(&cx.object().name_any());
            if cx.object().spec.size < 0 {
                return Outcome::Terminal(Reason::new(
                    "InvalidSize",
                    "spec.size must not be negative",
                ));
            }
            Outcome::Done
        }
    });
    let rt = start_widgets(&client, test_policy(), tree).await;
    create(&client, "neg", -5).await;
    let s = wait_reason(&client, "neg", "InvalidSize", LIMIT).await;
    assert_eq!(s.phase, Some(Phase::Failed));
    let msg = &s.ready().unwrap().message;
    assert_eq!(msg, "spec.size must not be negative");
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(
        log.count("neg"),
        1,
        "terminal: no retries until the object changes"
    );
    // deleting a terminal object still cleans up (no leaked finalizer)
    delete(&client, "neg").await;
    wait_gone(&client, "neg", LIMIT).await;
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_idle_rerun_writes_no_status() {
    let (_cluster, client) = cluster();
    let log = ReconcileLog::default();
    let rt = start_widgets(&client, test_policy(), logging_step(log.clone())).await;
    create(&client, "i", 1).await;
    wait_ready(&client, "i", LIMIT).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        log.count("i"),
        1,
        "the echoes of our own writes do not re-run"
    );
    let writes = rt.metrics().status_writes;
    // a label change re-runs the tree, but the status it computes is unchanged
    widgets(&client)
        .patch(
            "i",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    eventually("re-run", LIMIT, || async {
        (log.count("i") == 2).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        rt.metrics().status_writes,
        writes,
        "idle re-run wrote nothing"
    );
    rt.shutdown().await;
}

/// The idle timeout is a horizon: an actor whose next wake-up is due sooner stays live between
/// reconciles; one whose next wake-up is further away passivates and its timer is kept by the
/// manager.
#[tokio::test(start_paused = true)]
async fn an_actor_stays_live_only_while_a_wake_up_is_due_within_the_idle_timeout() {
    let (_cluster, client) = cluster();
    let log = ReconcileLog::default();
    let policy = passivating(Duration::from_secs(5));
    let l = log.clone();
    let tree = step("yield", move |cx: Context<Widget>| {
        let log = l.clone();
        async move {
            let name = cx.object().name_any();
            let i = log.start(&name);
            log.end(i);
            // "near" yields 1 s apart, "far" 10 s apart; both three times.
            let after = if name == "near" { 1 } else { 10 };
            if log.count(&name) <= 3 {
                Outcome::yield_after(Duration::from_secs(after), Reason::new("More", "again"))
            } else {
                Outcome::Done
            }
        }
    });
    let rt = start_widgets(&client, policy, tree).await;
    create(&client, "near", 1).await;
    eventually("near's first run", LIMIT, || async {
        (log.count("near") == 1).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let m = rt.metrics();
    assert_eq!(
        m.live_actors, 1,
        "a wake-up due in 1 s keeps it live; {m:?}"
    );
    wait_ready(&client, "near", LIMIT).await;
    assert_eq!(log.count("near"), 4);
    eventually("near passive after its last reconcile", LIMIT, || async {
        (rt.metrics().live_actors == 0).then_some(())
    })
    .await;
    let m = rt.metrics();
    assert_eq!(
        (m.activations, m.passivations),
        (1, 1),
        "one activation for four reconciles; {m:?}"
    );

    create(&client, "far", 1).await;
    eventually("far's first run", LIMIT, || async {
        (log.count("far") == 1).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let m = rt.metrics();
    assert_eq!(
        m.live_actors, 0,
        "its wake-up is 10 s away: passive at once; {m:?}"
    );
    wait_ready(&client, "far", Duration::from_secs(60)).await;
    assert_eq!(log.count("far"), 4);
    eventually("far passive after its last reconcile", LIMIT, || async {
        (rt.metrics().live_actors == 0).then_some(())
    })
    .await;
    let m = rt.metrics();
    assert_eq!(
        (m.activations, m.passivations),
        (5, 5),
        "far passivated between its reconciles and its timers woke it; {m:?}"
    );
    rt.shutdown().await;
}

/// An object gets a live actor only when it gets a reconcile slot: with reconciles blocked, new objects
/// wait in the manager's queue, not as live actors.
#[tokio::test(start_paused = true)]
async fn objects_get_a_live_actor_only_when_a_reconcile_slot_is_free() {
    let (_cluster, client) = cluster();
    let log = ReconcileLog::default();
    let gate = Gate::default();
    let mut policy = passivating(Duration::from_secs(5));
    policy.runtime.max_concurrent_reconciles = 2;
    let (l, g) = (log.clone(), gate.clone());
    let tree = step("blocked", move |cx: Context<Widget>| {
        let (log, gate) = (l.clone(), g.clone());
        async move {
            let i = log.start(&cx.object().name_any());
            gate.wait().await;
            log.end(i);
            Outcome::Done
        }
    });
    let rt = start_widgets(&client, policy, tree).await;
    for i in 0..20 {
        create(&client, &format!("q{i}"), 1).await;
    }
    eventually("two reconciles blocked", LIMIT, || async {
        (log.total() == 2).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let m = rt.metrics();
    assert_eq!(log.total(), 2, "{m:?}");
    assert_eq!(m.live_actors, 2, "18 objects wait without an actor; {m:?}");
    // Let every reconcile through: all converge, one actor at a time per reconcile slot.
    gate.open();
    wait_all_ready(&client, 20, LIMIT).await;
    let m = rt.metrics();
    assert_eq!(log.total(), 20, "one reconcile each");
    assert!(m.peak_in_flight <= 2, "{m:?}");
    assert_eq!(m.activations, 20, "{m:?}");
    rt.shutdown().await;
}

/// Reconciles of one step, waiting at `gate`: how many run at once now, and at most.
#[derive(Clone, Default)]
struct InFlight(Arc<(AtomicU32, AtomicU32, AtomicU32)>);

impl InFlight {
    fn step<K: ManagedResource>(&self, gate: Gate) -> impl Provisioner<K> + use<K> {
        let me = self.clone();
        step("blocked", move |_cx: Context<K>| {
            let (me, gate) = (me.clone(), gate.clone());
            async move {
                let (now, peak, total) = &*me.0;
                let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(n, Ordering::SeqCst);
                total.fetch_add(1, Ordering::SeqCst);
                gate.wait().await;
                now.fetch_sub(1, Ordering::SeqCst);
                Outcome::Done
            }
        })
    }
    fn now(&self) -> u32 {
        self.0.0.load(Ordering::SeqCst)
    }
    fn peak(&self) -> u32 {
        self.0.1.load(Ordering::SeqCst)
    }
    fn total(&self) -> u32 {
        self.0.2.load(Ordering::SeqCst)
    }
}

/// A kind's own limit (`Controller::max_concurrent_reconciles`) bounds its reconciles within the
/// runtime's, and the runtime's other slots stay free for other kinds: with widgets limited
/// to 2 of 4 slots, 2 gadgets still run beside 2 widgets while 4 more widgets wait.
#[tokio::test(start_paused = true)]
async fn a_kinds_own_limit_bounds_its_reconciles_and_leaves_the_rest_to_other_kinds() {
    let (_cluster, client) = cluster();
    let gate = Gate::default();
    let (widgets_in, gadgets_in) = (InFlight::default(), InFlight::default());
    let mut policy = test_policy();
    policy.runtime.max_concurrent_reconciles = 4;
    let rt = Runtime::builder(client.clone(), crate::common::names())
        .policy(policy)
        .controller(
            Controller::<Widget>::new(widgets_in.step(gate.clone())).max_concurrent_reconciles(2),
        )
        .controller(Controller::<Gadget>::new(gadgets_in.step(gate.clone())))
        .start()
        .await
        .expect("start the runtime");
    for i in 0..6 {
        create(&client, &format!("w{i}"), 1).await;
    }
    let gadgets: kube::Api<Gadget> = kube::Api::namespaced(client.clone(), "default");
    for i in 0..2 {
        gadgets
            .create(
                &kube::api::PostParams::default(),
                &Gadget::new(&format!("g{i}"), GadgetSpec::default()),
            )
            .await
            .expect("create gadget");
    }
    eventually("2 widgets and 2 gadgets running", LIMIT, || async {
        (widgets_in.now() == 2 && gadgets_in.now() == 2).then_some(())
    })
    .await;
    // Paused clock: the runtime is idle before the clock moves, so every reconcile that could
    // start has.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        (widgets_in.total(), gadgets_in.total()),
        (2, 2),
        "4 widgets wait for the kind's slots"
    );
    gate.open();
    wait_all_ready(&client, 6, LIMIT).await;
    assert_eq!(widgets_in.total(), 6, "one reconcile each");
    assert_eq!(widgets_in.peak(), 2, "never more than the kind's limit");
    rt.shutdown().await;
}

/// A controller of several namespaces watches each (one cache each): its objects there run
/// and are deleted through their finalizer, and an object in another namespace is never
/// seen.
#[tokio::test(start_paused = true)]
async fn a_controller_of_two_namespaces_runs_the_objects_of_both_and_no_other() {
    let (_cluster, client) = cluster();
    let log = ReconcileLog::default();
    let l = log.clone();
    let tree = step("record", move |cx: Context<Widget>| {
        let log = l.clone();
        async move {
            let i = log.start(&format!(
                "{}/{}",
                cx.object().namespace().unwrap_or_default(),
                cx.object().name_any()
            ));
            log.end(i);
            Outcome::Done
        }
    });
    let rt = Runtime::builder(client.clone(), crate::common::names())
        .policy(test_policy())
        .controller(Controller::<Widget>::new(tree).namespaces(["b", "a", "b"]))
        .start()
        .await
        .expect("start the runtime");
    let api = |ns: &str| kube::Api::<Widget>::namespaced(client.clone(), ns);
    for ns in ["a", "b", "c"] {
        let namespace = k8s_openapi::api::core::v1::Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(ns.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        kube::Api::all(client.clone())
            .create(&kube::api::PostParams::default(), &namespace)
            .await
            .expect("create the namespace");
        let mut w = widget("w", 1);
        w.metadata.namespace = Some(ns.into());
        api(ns)
            .create(&kube::api::PostParams::default(), &w)
            .await
            .expect("create");
    }
    for ns in ["a", "b"] {
        eventually(&format!("{ns}/w Ready"), LIMIT, || async {
            let w = api(ns).get("w").await.ok()?;
            w.status
                .as_ref()
                .is_some_and(|s| s.is_ready())
                .then_some(())
        })
        .await;
    }
    // Paused clock: idle before it moves, so whatever could run has.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        (log.count("a/w"), log.count("b/w"), log.count("c/w")),
        (1, 1, 0)
    );
    let c = api("c").get("w").await.unwrap();
    assert!(
        c.status.is_none() && c.finalizers().is_empty(),
        "c is not watched: {c:?}"
    );
    // Deleting in one namespace goes through its finalizer; the other's object stays.
    api("a").delete("w", &Default::default()).await.unwrap();
    eventually("a/w gone", LIMIT, || async {
        api("a").get_opt("w").await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(
        api("b")
            .get("w")
            .await
            .unwrap()
            .status
            .is_some_and(|s| s.is_ready())
    );
    assert_eq!(
        rt.metrics().activations,
        2,
        "a/w and b/w only: {:?}",
        rt.metrics()
    );
    rt.shutdown().await;
}

/// A step that yields `times` times, `every` apart, then is done.
fn yielding(times: u32, every: Duration) -> impl Provisioner<Widget> {
    let counts: Arc<Mutex<std::collections::HashMap<String, u32>>> = Arc::default();
    step("yielding", move |cx: Context<Widget>| {
        let counts = counts.clone();
        async move {
            let mut counts = counts.lock().unwrap();
            let n = counts.entry(cx.object().name_any()).or_default();
            if *n < times {
                *n += 1;
                Outcome::yield_after(every, Reason::new("Working", "not yet"))
            } else {
                Outcome::Done
            }
        }
    })
}

/// A burst of new objects is worked through a part at a time: live actors stay at the cap
/// (plus the one activation per 10 ms past it), and every object still finishes.
#[tokio::test(start_paused = true)]
async fn live_actors_stay_at_the_cap_and_every_object_finishes() {
    let (_cluster, client) = cluster();
    let mut policy = passivating(Duration::from_secs(30));
    policy.kind.max_live_actors = Some(4);
    let rt = start_widgets(&client, policy, yielding(3, Duration::from_millis(1))).await;
    for i in 0..40 {
        create(&client, &format!("b{i}"), 1).await;
    }
    wait_all_ready(&client, 40, LIMIT).await;
    let m = rt.metrics();
    assert_eq!(m.activations, 40, "{m:?}");
    assert!(
        m.peak_live_actors <= 6,
        "at most the cap and an activation or two past it: {m:?}"
    );
    rt.shutdown().await;
}

/// A burst of 300 CPU-bound objects (each reconcile keeps the only worker busy for 250 µs, then
/// yields for 1 ms) on real time: every object is activated exactly once and ends Ready, with
/// fewer actors live at once than there are objects. That the runtime was saturated, and that it
/// held activations back to a share of the reconcile slots, is not checked here (the timer's unit
/// tests check the order); this test checks that under such a load no object starves.
#[tokio::test]
async fn a_saturated_runtime_still_starts_and_finishes_every_object() {
    let (_cluster, client) = cluster();
    let objects = 300;
    for i in 0..objects {
        create(&client, &format!("h{i}"), 1).await;
    }
    let yields = yielding(10, Duration::from_millis(1));
    let busy = step("busy", |_: Context<Widget>| async {
        std::thread::sleep(Duration::from_micros(250));
        Outcome::Done
    });
    let policy = passivating(Duration::from_secs(30));
    let rt = start_widgets(&client, policy, serial![busy, yields]).await;
    wait_all_ready(&client, objects, LIMIT).await;
    let m = rt.metrics();
    assert_eq!(m.activations, objects as u64, "{m:?}");
    assert!(m.peak_live_actors < objects as u64, "{m:?}");
    rt.shutdown().await;
}

/// Actors that never passivate fill the cap for good; new objects still get actors, one per
/// 10 ms, instead of waiting forever.
#[tokio::test(start_paused = true)]
async fn a_cap_full_of_actors_that_stay_live_does_not_starve_new_objects() {
    let (_cluster, client) = cluster();
    let mut policy = test_policy();
    assert_eq!(
        policy.kind.idle_timeout, None,
        "actors never passivate here"
    );
    policy.kind.max_live_actors = Some(2);
    let log = ReconcileLog::default();
    let rt = start_widgets(&client, policy, logging_step(log.clone())).await;
    for i in 0..8 {
        create(&client, &format!("s{i}"), 1).await;
    }
    wait_all_ready(&client, 8, LIMIT).await;
    let m = rt.metrics();
    assert_eq!((m.live_actors, m.activations), (8, 8), "{m:?}");
    // Each object's first reconcile runs as its actor starts: past the cap of two, one start per
    // 10 ms (paused clock: exactly).
    let mut firsts: Vec<Instant> = (0..8).map(|i| log.starts(&format!("s{i}"))[0]).collect();
    firsts.sort();
    let gaps: Vec<Duration> = firsts.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        gaps[2..].iter().all(|g| *g == Duration::from_millis(10)),
        "one start per 10 ms past the cap: {gaps:?}"
    );
    rt.shutdown().await;
}

/// A reconcile that finds every reconcile slot taken waits without blocking its actor: events that arrive
/// meanwhile are taken in, and the reconcile that runs once a slot is free runs once, on the newest
/// version (not one reconcile per event, not on the version that first asked for a slot).
#[tokio::test(start_paused = true)]
async fn a_reconcile_waiting_for_a_slot_is_one_reconcile_of_the_newest_version() {
    let (_cluster, client) = cluster();
    let seen: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let gate = Arc::new(Notify::new());
    let entered = Arc::new(Notify::new());
    let mut policy = test_policy();
    policy.runtime.max_concurrent_reconciles = 1;
    let (s, g, e) = (seen.clone(), gate.clone(), entered.clone());
    let tree = step("record", move |cx: Context<Widget>| {
        let (s, g, e) = (s.clone(), g.clone(), e.clone());
        async move {
            let name = cx.object().name_any();
            let note = cx.object().spec.note.clone();
            s.lock().unwrap().push((name.clone(), note));
            if name == "holder" {
                e.notify_one();
                g.notified().await;
            }
            Outcome::Done
        }
    });
    let rt = start_widgets(&client, policy, tree).await;
    create(&client, "waiter", 1).await;
    wait_ready(&client, "waiter", LIMIT).await;
    create(&client, "holder", 1).await;
    entered.notified().await;
    // The one slot is held: each update makes the waiter's reconcile due, with no slot to run on.
    for note in ["v2", "v3", "v4"] {
        set_note(&client, "waiter", note).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let runs_of = |name: &str| -> Vec<String> {
        seen.lock()
            .unwrap()
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, note)| note.clone())
            .collect()
    };
    assert_eq!(runs_of("waiter"), vec![""], "no reconcile without a slot");
    gate.notify_one();
    wait_ready(&client, "holder", LIMIT).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        runs_of("waiter"),
        vec!["", "v4"],
        "one reconcile once the slot is free, on the newest version"
    );
    assert!(rt.metrics().peak_in_flight <= 1);
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn graceful_shutdown_lets_an_in_flight_reconcile_finish() {
    let (_cluster, client) = cluster();
    let finished = Arc::new(AtomicU32::new(0));
    let entered = Arc::new(Notify::new());
    let (f, e) = (finished.clone(), entered.clone());
    let tree = step("long", move |_cx: Context<Widget>| {
        let (f, e) = (f.clone(), e.clone());
        async move {
            e.notify_one();
            tokio::time::sleep(Duration::from_secs(2)).await;
            f.fetch_add(1, Ordering::SeqCst);
            Outcome::Done
        }
    });
    let mut policy = test_policy();
    policy.runtime.shutdown_timeout = Duration::from_secs(10);
    let rt = start_widgets(&client, policy, tree).await;
    create(&client, "s", 1).await;
    entered.notified().await;
    rt.shutdown().await;
    assert_eq!(
        finished.load(Ordering::SeqCst),
        1,
        "the in-flight run completed before shutdown returned"
    );
}

#[tokio::test(start_paused = true)]
async fn objects_that_exist_before_the_runtime_starts_are_provisioned() {
    let (_cluster, client) = cluster();
    for i in 0..5 {
        create(&client, &format!("pre{i}"), 1).await;
    }
    let log = ReconcileLog::default();
    let rt = start_widgets(&client, test_policy(), logging_step(log.clone())).await;
    wait_all_ready(&client, 5, LIMIT).await;
    create(&client, "post", 1).await;
    wait_ready(&client, "post", LIMIT).await;
    assert_eq!(log.total(), 6);
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn poll_timers_survive_passivation() {
    let (_cluster, client) = cluster();
    let log = ReconcileLog::default();
    let mut policy = passivating(Duration::from_secs(1));
    policy.kind.poll_interval = Some(Duration::from_secs(10));
    policy.kind.poll_jitter = 0.0;
    let rt = start_widgets(&client, policy, logging_step(log.clone())).await;
    create(&client, "poll", 1).await;
    wait_ready(&client, "poll", LIMIT).await;
    tokio::time::sleep(Duration::from_secs(35)).await;
    assert!(rt.metrics().passivations >= 3, "{:?}", rt.metrics());
    assert!(
        log.count("poll") >= 4,
        "the poll ran while passive: {} runs",
        log.count("poll")
    );
    rt.shutdown().await;
}

/// A re-list tells the manager about every object again, unchanged: a passive object's poll
/// stays when it was due, rather than being re-armed from the re-list.
#[tokio::test(start_paused = true)]
async fn a_relist_does_not_postpone_a_passive_objects_poll() {
    // A short watch history: a watch resumed after other kinds' writes filled it answers 410,
    // and the watcher lists again.
    let (cluster, client) = with_crds(actorcile::cluster::ApiServer::builder().history(10).build());
    let log = ReconcileLog::default();
    let mut policy = passivating(Duration::from_secs(1));
    policy.kind.poll_interval = Some(Duration::from_secs(600));
    policy.kind.poll_jitter = 0.0;
    let mut watcher = kube::runtime::watcher::Config::default().timeout(30);
    watcher.bookmarks = false; // a bookmark would move the watch past the other kinds' writes
    let rt = Runtime::builder(client.clone(), crate::common::names())
        .policy(policy)
        .controller(
            Controller::<Widget>::new(logging_step(log.clone()))
                .without_finalizer()
                .without_status()
                .watcher_config(watcher),
        )
        .start()
        .await
        .unwrap();
    let t0 = Instant::now();
    create(&client, "w", 1).await;
    eventually("w ran and passivated", LIMIT, || async {
        (log.count("w") == 1 && rt.metrics().passivations == 1).then_some(())
    })
    .await;
    // Twenty writes of another kind, after the watch's first 30 s restart and before its second.
    tokio::time::sleep_until(t0 + Duration::from_secs(45)).await;
    let maps: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(client.clone(), "default");
    for i in 0..20 {
        let mut cm = k8s_openapi::api::core::v1::ConfigMap::default();
        cm.metadata.name = Some(format!("fill{i}"));
        maps.create(&Default::default(), &cm).await.unwrap();
    }
    eventually("the watcher listed again", LIMIT, || async {
        (cluster.stats().list >= 2).then_some(())
    })
    .await;
    assert_eq!(log.count("w"), 1, "the re-list found nothing new");
    // The poll is due 600 s after w passivated (at ≈ 0 s), not 600 s after the re-list (≈ 60 s).
    tokio::time::sleep_until(t0 + Duration::from_secs(605)).await;
    assert_eq!(log.count("w"), 2, "the poll ran when it was due");
    rt.shutdown().await;
}

/// Status writes that fail (409) are retried: while every write to an existing object
/// conflicts, each object has run and none has a status; once writes go through, all are Ready.
#[tokio::test(start_paused = true)]
async fn failed_status_writes_are_retried_until_they_land() {
    let (cluster, client) = cluster();
    let log = ReconcileLog::default();
    let rt = Runtime::builder(client.clone(), crate::common::names())
        .policy(test_policy())
        // no finalizer: the status write is the only write, and its failure must not be final
        .controller(Controller::<Widget>::new(logging_step(log.clone())).without_finalizer())
        .start()
        .await
        .unwrap();
    // every write to an existing object conflicts for a while: status writes fail
    cluster.set_faults(actorcile::cluster::Faults {
        conflict_rate: 1.0,
        seed: 3,
        ..Default::default()
    });
    for i in 0..5 {
        create(&client, &format!("fw{i}"), 1).await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    for i in 0..5 {
        let name = format!("fw{i}");
        assert!(log.count(&name) >= 1, "{name} ran");
        let s = status_of(&client, &name).await.expect("it exists");
        assert!(s.ready().is_none(), "{name}: no status write landed: {s:?}");
    }
    assert!(
        cluster.stats().injected_conflicts >= 5,
        "the status writes failed"
    );
    cluster.set_faults(actorcile::cluster::Faults::default());
    wait_all_ready(&client, 5, LIMIT).await;
    rt.shutdown().await;
}

/// A runtime logging every reconcile (no finalizer, no status: reconciles make no writes) whose watcher
/// lists `page` objects per request.
async fn start_logging_listed_in_pages(
    client: &kube::Client,
    log: &ReconcileLog,
    page: u32,
) -> RuntimeHandle {
    Runtime::builder(client.clone(), crate::common::names())
        .policy(test_policy())
        .controller(
            Controller::<Widget>::new(logging_step(log.clone()))
                .without_finalizer()
                .without_status()
                .watcher_config(pages_of(page)),
        )
        .start()
        .await
        .unwrap()
}

/// The first list goes into the store as it arrives: an object's first reconcile runs while later
/// pages are still being listed. (kube-runtime's reflector makes a list visible only once every
/// page is in, which is when its `Controller` starts.)
#[tokio::test(start_paused = true)]
async fn first_reconciles_start_while_the_first_list_is_still_arriving() {
    let (cluster, client) = cluster();
    for i in 0..10 {
        create(&client, &format!("p{i}"), 1).await;
    }
    // Five pages of two objects, each answered after one second: the list is complete at 5 s.
    cluster.set_faults(one_second_requests());
    let log = ReconcileLog::default();
    let t0 = Instant::now();
    let rt = start_logging_listed_in_pages(&client, &log, 2).await;
    eventually("every object ran", LIMIT, || async {
        (log.total() >= 10).then_some(())
    })
    .await;
    let first = log.entries().iter().map(|r| r.started).min().unwrap() - t0;
    assert!(
        first < Duration::from_secs(3),
        "the first reconcile came {first:?} after start: it waited for the whole list"
    );
    assert_eq!(rt.metrics().activations, 10);
    rt.shutdown().await;
}

/// A first list that fails part-way leaves the objects it had listed in the store, with
/// actors. The retry is buffered like any re-list: when it is in, it replaces the store, and an
/// object deleted in between (so never seen deleted by a watch) is forgotten, its actor stopped.
#[tokio::test(start_paused = true)]
async fn an_interrupted_first_list_is_retried_and_forgets_what_went_meanwhile() {
    let (cluster, client) = cluster();
    for i in 0..4 {
        create(&client, &format!("p{i}"), 1).await;
    }
    cluster.set_faults(one_second_requests());
    let log = ReconcileLog::default();
    let t0 = Instant::now();
    let rt = start_logging_listed_in_pages(&client, &log, 1).await;
    // Pages are asked for at 0, 1, 2 and 3 s (each answered a second later). From 2.5 s every
    // request fails: the fourth page does, at 4 s, after three objects were listed.
    tokio::time::sleep_until(t0 + Duration::from_millis(2500)).await;
    cluster.set_faults(actorcile::cluster::Faults {
        error_rate: 1.0,
        ..one_second_requests()
    });
    tokio::time::sleep_until(t0 + Duration::from_millis(4100)).await;
    assert_eq!(
        log.total(),
        3,
        "the three listed objects ran: {:?}",
        log.entries()
    );
    // Before the watcher's retry (its backoff starts at 800 ms): `p1` goes.
    cluster.set_faults(Default::default());
    delete(&client, "p1").await;
    eventually("the retried list started p3", LIMIT, || async {
        (log.count("p3") == 1).then_some(())
    })
    .await;
    eventually("p1's actor stopped", LIMIT, || async {
        (rt.metrics().live_actors == 3).then_some(())
    })
    .await;
    assert_eq!(log.total(), 4, "{:?}", log.entries());
    rt.shutdown().await;
}

/// An object that ran before and is woken again (here: its dependency turned Ready) is
/// activated before new objects that were queued earlier, so a burst of new objects does not
/// delay each step of the ones already going; new objects still get every fourth start.
#[tokio::test(start_paused = true)]
async fn a_woken_object_is_activated_before_a_burst_of_new_ones() {
    let (_cluster, client) = cluster();
    let gate = Arc::new(Notify::new());
    let entered = Arc::new(Notify::new());
    let log = ReconcileLog::default();
    let mut policy = passivating(Duration::from_secs(30));
    policy.runtime.max_concurrent_reconciles = 1;
    policy.kind.dependency_poll = Duration::from_secs(3600);
    let (g, e, l) = (gate.clone(), entered.clone(), log.clone());
    let tree = step("gated", move |cx: Context<Widget>| {
        let (g, e, l) = (g.clone(), e.clone(), l.clone());
        async move {
            let name = cx.object().name_any();
            l.start(&name);
            if name == "holder" {
                e.notify_one();
                g.notified().await;
            }
            for dep in &cx.object().spec.needs {
                let target = Target::for_kind::<Widget>(Some("default"), dep);
                if let Some(wait) = cx.require_ready(&target).await {
                    return wait;
                }
            }
            Outcome::Done
        }
    });
    let rt = start_widgets(&client, policy, tree).await;
    let mut app = widget("app", 1);
    app.spec.needs = vec!["db".into()];
    widgets(&client)
        .create(&Default::default(), &app)
        .await
        .unwrap();
    // `app` waits for `db` (which does not exist yet) and passivates.
    eventually("app passivated", LIMIT, || async {
        (rt.metrics().passivations == 1).then_some(())
    })
    .await;
    // The one reconcile slot is held while `db` and a burst of new objects queue behind it.
    create(&client, "holder", 1).await;
    entered.notified().await;
    create(&client, "db", 1).await;
    for i in 0..12 {
        create(&client, &format!("n{i:02}"), 1).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    gate.notify_one();
    wait_all_ready(&client, 15, LIMIT).await;
    let order: Vec<String> = log.entries().into_iter().map(|r| r.name).collect();
    let after_db = &order[order.iter().position(|n| n == "db").unwrap()..];
    let app_at = after_db.iter().position(|n| n == "app").unwrap();
    assert!(
        app_at <= 2,
        "app ran again only after {app_at} later reconciles: {order:?}"
    );
    let news = after_db.iter().filter(|n| n.starts_with('n')).count();
    assert_eq!(news, 12, "every new object ran: {order:?}");
    rt.shutdown().await;
}

/// A restart with many objects: every listed object is queued for its first reconcile, and a change
/// that comes meanwhile (an object changed, an object created) runs ahead of the rest of the
/// list, which still gets every second start and finishes.
#[tokio::test(start_paused = true)]
async fn changes_during_the_start_up_list_run_ahead_of_it() {
    let (_cluster, client) = cluster();
    for i in 0..40 {
        create(&client, &format!("w{i:02}"), 1).await;
    }
    let gate = Arc::new(Notify::new());
    let entered = Arc::new(Notify::new());
    let held = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let log = ReconcileLog::default();
    let mut policy = passivating(Duration::from_secs(30));
    policy.runtime.max_concurrent_reconciles = 1;
    let (g, e, h, l) = (gate.clone(), entered.clone(), held.clone(), log.clone());
    let tree = step("gated", move |cx: Context<Widget>| {
        let (g, e, h, l) = (g.clone(), e.clone(), h.clone(), l.clone());
        async move {
            l.start(&cx.object().name_any());
            // The first reconcile holds the one reconcile slot while the rest of the list queues.
            if !h.swap(true, Ordering::SeqCst) {
                e.notify_one();
                g.notified().await;
            }
            Outcome::Done
        }
    });
    let rt = start_widgets(&client, policy, tree).await;
    entered.notified().await;
    let first = log.entries()[0].name.clone();
    let changed = if first == "w39" { "w38" } else { "w39" };
    set_note(&client, changed, "changed while listed").await;
    create(&client, "created", 1).await;
    // Paused clock: it advances only once every task is idle, so the runtime has seen both.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(log.total(), 1, "the reconcile slot was held");
    gate.notify_one();
    wait_all_ready(&client, 41, LIMIT).await;
    let order: Vec<String> = log.entries().into_iter().map(|r| r.name).collect();
    let at = |name: &str| order.iter().position(|n| n == name).unwrap();
    assert!(
        at(changed) <= 2 && at("created") <= 4,
        "the changes waited behind the list: {order:?}"
    );
    assert_eq!(order.len(), 41, "each object ran once: {order:?}");
    rt.shutdown().await;
}

/// A runtime with two reconcile slots over sixty objects `r0`…`r59`, each Ready and passive.
async fn sixty_passive_objects(
    client: &kube::Client,
    tree: impl Provisioner<Widget> + 'static,
) -> RuntimeHandle {
    let mut policy = passivating(Duration::from_secs(5));
    policy.runtime.max_concurrent_reconciles = 2;
    let rt = start_widgets(client, policy, tree).await;
    for i in 0..60 {
        create(client, &format!("r{i}"), 1).await;
    }
    wait_all_ready(client, 60, LIMIT).await;
    eventually("all passive", LIMIT, || async {
        (rt.metrics().live_actors == 0).then_some(())
    })
    .await;
    rt
}

/// Passivated actors adopt the next activations instead of new actors being spawned: sixty
/// objects through two reconcile slots spawn a handful of actors, every object still runs once per
/// change, and no two runs of one object overlap.
#[tokio::test(start_paused = true)]
async fn passivated_actors_adopt_the_next_objects() {
    let (_cluster, client) = cluster();
    let log = ReconcileLog::default();
    let rt = sixty_passive_objects(&client, logging_step(log.clone())).await;
    let m = rt.metrics();
    assert_eq!((m.activations, m.passivations), (60, 60), "{m:?}");
    assert!(
        m.spawns <= 6,
        "activations were adopted, not spawned: {m:?}"
    );
    assert_eq!(log.total(), 60);
    // Re-activations are adopted too.
    for i in 0..60 {
        set_note(&client, &format!("r{i}"), "again").await;
    }
    eventually("every object ran again", LIMIT, || async {
        (log.total() == 120).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let m2 = rt.metrics();
    assert_eq!(log.total(), 120, "one run per change");
    assert!(
        m2.spawns <= m.spawns + 6,
        "re-activations adopted idle actors: {m2:?}"
    );
    for i in 0..60 {
        let name = format!("r{i}");
        assert_eq!(log.starts(&name).len(), 2, "{name}");
        log.assert_no_overlap(&name);
    }
    rt.shutdown().await;
}

/// A deleted object's actor goes back to the manager idle instead of stopping: sixty objects
/// deleted through two reconcile slots are deprovisioned once each by a handful of actors, and an
/// object created again under a deleted one's name runs as a new object.
#[tokio::test(start_paused = true)]
async fn deleted_objects_hand_their_actors_back_to_the_next_activations() {
    let (_cluster, client) = cluster();
    let deprovisioned = Arc::new(AtomicU32::new(0));
    let d = deprovisioned.clone();
    let log = ReconcileLog::default();
    let l = log.clone();
    let tree = step("log", move |cx: Context<Widget>| {
        let log = l.clone();
        async move {
            let i = log.start(&cx.object().name_any());
            log.end(i);
            Outcome::Done
        }
    })
    .on_delete(move |_cx: Context<Widget>| {
        let d = d.clone();
        async move {
            d.fetch_add(1, Ordering::SeqCst);
            Outcome::Done
        }
    });
    let rt = sixty_passive_objects(&client, tree).await;
    let before = rt.metrics();
    for i in 0..60 {
        delete(&client, &format!("r{i}")).await;
    }
    for i in 0..60 {
        wait_gone(&client, &format!("r{i}"), LIMIT).await;
    }
    eventually("no live actor", LIMIT, || async {
        (rt.metrics().live_actors == 0).then_some(())
    })
    .await;
    let m = rt.metrics();
    assert_eq!(deprovisioned.load(Ordering::SeqCst), 60);
    assert!(
        m.spawns <= before.spawns + 6,
        "the deletions were served by actors handed back, not new ones: {before:?} then {m:?}"
    );
    create(&client, "r0", 1).await;
    wait_ready(&client, "r0", LIMIT).await;
    assert_eq!(log.count("r0"), 2, "the new r0 ran");
    assert_eq!(
        rt.metrics().spawns,
        m.spawns,
        "the new r0 adopted an idle actor"
    );
    rt.shutdown().await;
}

/// An actor that passivated with a wake-up pending hands the wake-up to the manager; when the
/// actor then adopts another object, the earlier object's timer reaches the earlier object (by
/// way of the manager), never the one the actor serves now.
#[tokio::test(start_paused = true)]
async fn an_adopting_actor_gets_no_timer_of_the_object_it_served_before() {
    let (_cluster, client) = cluster();
    let log = ReconcileLog::default();
    let mut policy = passivating(Duration::from_secs(5));
    policy.runtime.max_concurrent_reconciles = 1;
    let l = log.clone();
    let tree = step("log", move |cx: Context<Widget>| {
        let log = l.clone();
        async move {
            let name = cx.object().name_any();
            let i = log.start(&name);
            log.end(i);
            if name == "a" && log.count("a") == 1 {
                return Outcome::yield_after(
                    Duration::from_secs(60),
                    Reason::new("Later", "come back in a minute"),
                );
            }
            Outcome::Done
        }
    });
    let rt = start_widgets(&client, policy, tree).await;
    let t0 = Instant::now();
    create(&client, "a", 1).await;
    eventually("a passive", LIMIT, || async {
        let m = rt.metrics();
        (log.count("a") == 1 && m.passivations == 1).then_some(())
    })
    .await;
    create(&client, "b", 1).await;
    wait_ready(&client, "b", LIMIT).await;
    assert_eq!(rt.metrics().spawns, 1, "b adopted a's actor");
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!((log.count("a"), log.count("b")), (1, 1), "no stray wake-up");
    wait_ready(&client, "a", LIMIT).await;
    let a = log.starts("a");
    assert_eq!(a.len(), 2);
    assert!(
        a[1] >= t0 + Duration::from_secs(60),
        "a's wake-up came when due"
    );
    assert_eq!(log.count("b"), 1, "b never ran for a's timer");
    assert_eq!(rt.metrics().spawns, 1, "{:?}", rt.metrics());
    rt.shutdown().await;
}

/// A provisioner that panics in an actor that had adopted its object: the failed actor is
/// replaced (never handed out again), the object is restarted per policy and gets Ready, and the
/// idle actors keep serving the other objects.
#[tokio::test(start_paused = true)]
async fn a_panic_in_an_adopted_actor_restarts_its_object_and_spares_the_others() {
    let (_cluster, client) = cluster();
    let log = ReconcileLog::default();
    let boom_runs = Arc::new(AtomicU32::new(0));
    let (l, p) = (log.clone(), boom_runs.clone());
    let tree = step("panics-once-on-a-change", move |cx: Context<Widget>| {
        let (l, p) = (l.clone(), p.clone());
        async move {
            let name = cx.object().name_any();
            l.start(&name);
            if cx.object().spec.note == "boom" && p.fetch_add(1, Ordering::SeqCst) == 0 {
                panic!("provisioner bug on the second activation");
            }
            Outcome::Done
        }
    });
    let mut policy = passivating(Duration::from_secs(5));
    policy.runtime.max_concurrent_reconciles = 1;
    policy.kind.restart.backoff.min = Duration::from_millis(100);
    let rt = start_widgets(&client, policy, tree).await;
    for name in ["a", "b"] {
        create(&client, name, 1).await;
        wait_ready(&client, name, LIMIT).await;
    }
    eventually("both passive", LIMIT, || async {
        (rt.metrics().live_actors == 0).then_some(())
    })
    .await;
    let before = rt.metrics();
    set_note(&client, "a", "boom").await;
    eventually("a ran after its restart", LIMIT, || async {
        (log.count("a") == 3).then_some(())
    })
    .await;
    wait_ready(&client, "a", LIMIT).await;
    set_note(&client, "b", "after").await;
    eventually("b ran again", LIMIT, || async {
        (log.count("b") == 2).then_some(())
    })
    .await;
    eventually("all passive again", LIMIT, || async {
        (rt.metrics().live_actors == 0).then_some(())
    })
    .await;
    let m = rt.metrics();
    assert_eq!(m.restarts, before.restarts + 1, "{m:?}");
    assert_eq!(
        boom_runs.load(Ordering::SeqCst),
        2,
        "a's \"boom\" version ran twice: the panic, then the restart"
    );
    assert_eq!(
        m.spawns,
        before.spawns + 1,
        "only the failed actor was replaced: {m:?}"
    );
    rt.shutdown().await;
}

/// Sets its flag when dropped.
struct DropFlag(Arc<std::sync::atomic::AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test(start_paused = true)]
async fn shutdown_releases_the_provisioner_tree() {
    let (_cluster, client) = cluster();
    let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = DropFlag(dropped.clone());
    let tree = step("holds-a-flag", move |_cx: Context<Widget>| {
        let _held = &flag;
        async { Outcome::Done }
    });
    let rt = start_widgets(&client, test_policy(), tree).await;
    create(&client, "w", 1).await;
    wait_ready(&client, "w", LIMIT).await;
    assert!(
        !dropped.load(Ordering::SeqCst),
        "the running runtime holds its tree"
    );
    rt.shutdown().await;
    // Nothing of the runtime keeps the tree (and so the controller's state) alive once stopped.
    eventually("the tree dropped after shutdown", LIMIT, || async {
        dropped.load(Ordering::SeqCst).then_some(())
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn escalation_stops_the_runtime_with_the_object_and_its_last_failure() {
    let (_cluster, client) = cluster();
    let tree = step("always-panics", |_cx: Context<Widget>| async move {
        panic!("the disk is on fire")
    });
    let mut policy = test_policy();
    policy.kind.restart.max_restarts = 1;
    policy.kind.restart.on_exhausted = Exhausted::Escalate;
    policy.kind.restart.backoff.min = Duration::from_millis(10);
    let mut rt = start_widgets(&client, policy, tree).await;
    create(&client, "doomed", 1).await;
    let err = tokio::time::timeout(LIMIT, rt.escalated())
        .await
        .expect("the runtime escalates");
    let actorcile::Error::Escalated(e) = &err else {
        panic!("expected an escalation, got {err:?}");
    };
    assert_eq!(e.kind, "Widget");
    assert_eq!(e.object, "Widget.v1.test.actorcile.dev/doomed.default");
    assert_eq!(e.failures, 2);
    let cause = std::error::Error::source(&err).expect("the escalation is the source");
    let last = cause
        .source()
        .expect("the actor's last failure is its source");
    assert!(last.to_string().contains("the disk is on fire"), "{last}");
    rt.shutdown().await;
}

/// No status the runtime writes speaks of an older generation than the object it is written
/// on: a reconcile of generation 1 that is still running when the spec changes (generation 2)
/// does not land its status on generation 2 (its write carries the resourceVersion it read, and
/// conflicts); generation 2's reconcile writes the status that stays. Every version of the
/// object the watch shows whose status changed carries `observedGeneration` (and the Ready
/// condition's) equal to its own generation.
#[tokio::test(start_paused = true)]
async fn no_status_of_an_old_generation_is_written_on_a_newer_one() {
    use futures::StreamExt;
    use kube::runtime::watcher;
    let (_cluster, client) = cluster();
    let started = Arc::new(Notify::new());
    let tree = {
        let started = started.clone();
        step("slow", move |cx: Context<Widget>| {
            let started = started.clone();
            async move {
                if cx.object().spec.size == 1 {
                    started.notify_one();
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
                Outcome::Done
            }
        })
    };
    // Every version of the widget, as the watch shows them.
    let seen: Arc<Mutex<Vec<Widget>>> = Arc::default();
    let recorder = {
        let (api, seen) = (widgets(&client), seen.clone());
        tokio::spawn(async move {
            let events = watcher::watcher(api, watcher::Config::default());
            futures::pin_mut!(events);
            while let Some(e) = events.next().await {
                if let Ok(watcher::Event::Apply(w) | watcher::Event::InitApply(w)) = e {
                    seen.lock().unwrap().push(w);
                }
            }
        })
    };
    let rt = start_widgets(&client, test_policy(), tree).await;
    create(&client, "w", 1).await;
    started.notified().await;
    // Generation 2 while generation 1's reconcile runs.
    let patch = kube::api::Patch::Merge(serde_json::json!({"spec": {"size": 2}}));
    widgets(&client)
        .patch("w", &kube::api::PatchParams::default(), &patch)
        .await
        .unwrap();
    eventually("Ready at generation 2", LIMIT, || async {
        let w = widgets(&client).get("w").await.ok()?;
        let s = w.status.as_ref()?;
        (s.is_ready() && s.observed_generation == Some(2) && w.metadata.generation == Some(2))
            .then_some(())
    })
    .await;
    // Long past generation 1's reconcile: its status had its chance to land.
    tokio::time::sleep(Duration::from_secs(10)).await;
    rt.shutdown().await;
    recorder.abort();
    let seen = seen.lock().unwrap().clone();
    let mut last_status = None;
    let mut changes = 0;
    for w in &seen {
        let status = w.status.clone().unwrap_or_default();
        if last_status.as_ref() != Some(&status) && w.status.is_some() {
            changes += 1;
            assert_eq!(
                status.observed_generation, w.metadata.generation,
                "a status of another generation was written: {status:?} on generation {:?}",
                w.metadata.generation
            );
            if let Some(c) = status.ready() {
                assert_eq!(c.observed_generation, w.metadata.generation, "{c:?}");
            }
        }
        last_status = Some(status);
    }
    assert!(changes >= 1, "the statuses were seen: {seen:?}");
    let last = seen.last().unwrap();
    assert_eq!(last.metadata.generation, Some(2));
    assert_eq!(last.status.as_ref().unwrap().observed_generation, Some(2));
}
