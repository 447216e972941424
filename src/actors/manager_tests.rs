//! The manager's decisions, on one kind started through its seam under a paused clock: one
//! reconcile at a time per object, changes coalesced, the earliest wake-up kept, passivation and
//! re-activation, restart intensity.

use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::test_kind::{ReconcileLog, Widget, logging, start_kind, test_policy};
use crate::prelude::*;

#[tokio::test(start_paused = true)]
async fn changes_during_a_reconcile_coalesce_into_one_follow_up_reconcile() {
    let log = ReconcileLog::default();
    let (gate, entered) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let (l, g, e) = (log.clone(), gate.clone(), entered.clone());
    let tree = step("blocking", move |cx: Context<Widget>| {
        let (l, g, e) = (l.clone(), g.clone(), e.clone());
        async move {
            let n = l.start(&cx.object().name_any());
            if n == 0 {
                e.notify_one();
                g.notified().await;
            }
            l.end(n);
            Outcome::Done
        }
    });
    // Not cut by the changes (`cancel_on_change`): they arrive while it runs, and coalesce.
    let spec = super::KindSpec {
        cancel_on_change: false,
        ..super::KindSpec::new(Arc::new(tree))
    };
    let kind = super::test_kind::start_spec(spec, test_policy()).await;
    kind.create("c").await;
    entered.notified().await;
    for i in 0..100 {
        kind.set_note("c", &format!("n{i}")).await;
    }
    // Every change was written (each patch was answered) while the first reconcile held its gate;
    // under the paused clock this sleep ends only once every task is idle.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        log.count("c"),
        1,
        "no second reconcile while the first runs"
    );
    gate.notify_one();
    kind.wait_ready("c").await;
    // A wake-up an hour away would have run by now: nothing more is due.
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(
        log.count("c"),
        2,
        "100 changes during one reconcile: one follow-up reconcile"
    );
    log.assert_no_overlap("c");
    kind.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_new_generation_runs_at_once_and_cancels_the_pending_wake_up() {
    let log = ReconcileLog::default();
    let l = log.clone();
    let tree = step("slow", move |cx: Context<Widget>| {
        let l = l.clone();
        async move {
            let i = l.start(&cx.object().name_any());
            l.end(i);
            if cx.object().spec.note == "go" {
                Outcome::Done
            } else {
                Outcome::yield_after(Duration::from_secs(3600), Reason::new("Later", "an hour"))
            }
        }
    });
    let kind = start_kind(tree, test_policy()).await;
    kind.create("g").await;
    kind.wait_reason("g", "Later").await;
    let before = Instant::now();
    kind.set_note("g", "go").await;
    kind.wait_ready("g").await;
    assert!(
        Instant::now() - before < Duration::from_secs(5),
        "ran on the new generation at once"
    );
    assert_eq!(log.count("g"), 2);
    // The hour-long wake-up was replaced: no third reconcile an hour later.
    tokio::time::sleep(Duration::from_secs(7200)).await;
    assert_eq!(log.count("g"), 2);
    kind.stop().await;
}

#[tokio::test(start_paused = true)]
async fn idle_actors_passivate_and_their_next_event_reactivates_them() {
    let log = ReconcileLog::default();
    let policy = SupervisorPolicy {
        kind: crate::policy::KindPolicy {
            idle_timeout: Some(Duration::from_secs(5)),
            ..test_policy().kind
        },
        ..test_policy()
    };
    let kind = start_kind(logging(log.clone()), policy).await;
    for i in 0..10 {
        kind.create(&format!("z{i}")).await;
    }
    for i in 0..10 {
        kind.wait_ready(&format!("z{i}")).await;
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    let m = kind.metrics();
    assert_eq!((m.live_actors, m.passivations), (0, 10), "{m:?}");
    assert_eq!(log.total(), 10, "passivation re-ran nothing");
    kind.set_note("z3", "wake").await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while log.count("z3") < 2 {
        assert!(Instant::now() < deadline, "z3 never ran again");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(log.total(), 11, "only the changed object ran");
    let m = kind.metrics();
    assert_eq!(
        m.live_actors, 0,
        "nothing due: passive again at once; {m:?}"
    );
    assert_eq!(m.activations, 11, "{m:?}");
    // A passive object's deletion still deprovisions it and removes the finalizer.
    kind.delete("z5").await;
    kind.wait_gone("z5").await;
    kind.stop().await;
}

#[tokio::test(start_paused = true)]
async fn past_restart_intensity_an_object_is_quarantined_until_its_spec_changes() {
    let tree = step("sometimes-panics", |cx: Context<Widget>| async move {
        if cx.object().name_any() == "bad" && cx.object().spec.note != "fixed" {
            panic!("always fails for bad");
        }
        Outcome::Done
    });
    let mut policy = test_policy();
    policy.kind.restart.max_restarts = 2;
    policy.kind.restart.backoff.min = Duration::from_millis(10);
    let kind = start_kind(tree, policy).await;
    kind.create("bad").await;
    for i in 0..5 {
        kind.create(&format!("good{i}")).await;
    }
    let s = kind.wait_reason("bad", "Quarantined").await;
    assert_eq!(s.phase, Some(Phase::Failed));
    for i in 0..5 {
        kind.wait_ready(&format!("good{i}")).await;
    }
    assert_eq!(
        (kind.metrics().restarts, kind.metrics().quarantined),
        (2, 1)
    );
    // No restart while quarantined, however long.
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(kind.metrics().restarts, 2);
    // A new generation lifts the quarantine.
    kind.set_note("bad", "fixed").await;
    kind.wait_ready("bad").await;
    kind.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_passive_object_is_cached_encoded_and_its_wake_up_reads_it_whole() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = seen.clone();
    let tree = step("wakes-once", move |cx: Context<Widget>| {
        let s = s.clone();
        async move {
            let o = cx.object();
            let mut seen = s.lock().unwrap();
            seen.push((
                o.uid(),
                o.spec.note.clone(),
                o.metadata.generation,
                o.metadata.creation_timestamp.clone(),
            ));
            if seen.len() == 1 {
                Outcome::yield_after(Duration::from_secs(3600), Reason::new("Later", "an hour"))
            } else {
                Outcome::Done
            }
        }
    });
    let policy = SupervisorPolicy {
        kind: crate::policy::KindPolicy {
            idle_timeout: Some(Duration::from_secs(5)),
            ..test_policy().kind
        },
        ..test_policy()
    };
    let kind = start_kind(tree, policy).await;
    kind.create("p").await;
    kind.wait_reason("p", "Later").await;
    // Passive with its wake-up an hour away; under the paused clock this sleep ends only once
    // every task is idle, the encoding task included.
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(kind.metrics().live_actors, 0);
    assert_eq!(kind.encoded(), 1, "the passive object is held encoded");
    tokio::time::sleep(Duration::from_secs(3600)).await;
    kind.wait_ready("p").await;
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0], seen[1], "the wake-up read the object as it was");
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(kind.encoded(), 1, "passive again, and encoded again");
    kind.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_tenants_burst_does_not_hold_other_tenants_objects_behind_it() {
    use kube::api::{Api, PostParams};
    let log = ReconcileLog::default();
    let l = log.clone();
    // Each reconcile takes 100 ms, two at a time: the burst alone takes two seconds.
    let tree = step("slow", move |cx: Context<Widget>| {
        let l = l.clone();
        async move {
            let _reconcile = l.record(&format!(
                "{}/{}",
                cx.object().namespace().unwrap_or_default(),
                cx.object().name_any()
            ));
            tokio::time::sleep(Duration::from_millis(100)).await;
            Outcome::Done
        }
    });
    let mut policy = test_policy();
    policy.runtime.max_concurrent_reconciles = 2;
    let kind = start_kind(tree, policy).await;
    let create = |ns: &'static str, name: String| {
        let api: Api<Widget> = Api::namespaced(kind.client.clone(), ns);
        async move {
            let w = Widget::new(&name, Default::default());
            api.create(&PostParams::default(), &w)
                .await
                .expect("create");
        }
    };
    for ns in ["burst", "small"] {
        let mut n = k8s_openapi::api::core::v1::Namespace::default();
        n.metadata.name = Some(ns.into());
        Api::all(kind.client.clone())
            .create(&PostParams::default(), &n)
            .await
            .expect("create the namespace");
    }
    for i in 0..40 {
        create("burst", format!("b{i}")).await;
    }
    for i in 0..2 {
        create("small", format!("s{i}")).await;
    }
    crate::testing::eventually(
        "every object reconciled",
        super::test_kind::LIMIT,
        || async { (log.total() == 42).then_some(()) },
    )
    .await;
    let order: Vec<String> = log.entries().into_iter().map(|e| e.name).collect();
    let last_small = order
        .iter()
        .rposition(|n| n.starts_with("small/"))
        .expect("the small tenant's objects ran");
    assert!(
        last_small < 8,
        "the small tenant's objects start within a few turns, not behind the burst: {order:?}"
    );
    kind.stop().await;
}
