//! One object's reconciles, on one kind started through its seam under a paused clock: a yield
//! becomes a wake-up after its delay, and errors back off, growing, until a success resets it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use kube::ResourceExt;

use super::test_kind::{LIMIT, ReconcileLog, Widget, start_kind, test_policy};
use crate::policy::KindPolicy;
use crate::prelude::*;

/// A tree that logs every reconcile and answers the `n`th with `outcome(n)`.
fn counting(
    log: ReconcileLog,
    outcome: impl Fn(u32) -> Outcome + Send + Sync + 'static,
) -> impl Provisioner<Widget> {
    let (calls, outcome) = (Arc::new(AtomicU32::new(0)), Arc::new(outcome));
    step("counting", move |cx: Context<Widget>| {
        let (log, calls, outcome) = (log.clone(), calls.clone(), outcome.clone());
        async move {
            let i = log.start(&cx.object().name_any());
            log.end(i);
            outcome(calls.fetch_add(1, Ordering::SeqCst))
        }
    })
}

/// The gaps between the reconciles of `name`.
fn gaps(log: &ReconcileLog, name: &str) -> Vec<Duration> {
    log.starts(name).windows(2).map(|w| w[1] - w[0]).collect()
}

#[tokio::test(start_paused = true)]
async fn a_yield_runs_again_after_its_delay_or_the_policys() {
    let log = ReconcileLog::default();
    let tree = counting(log.clone(), |n| match n {
        0 => Outcome::yield_after(Duration::from_secs(7), Reason::new("Wait", "seven seconds")),
        1 => Outcome::yield_now(Reason::new("Wait", "the policy's delay")),
        _ => Outcome::Done,
    });
    let policy = SupervisorPolicy {
        kind: crate::policy::KindPolicy {
            yield_delay: Duration::from_secs(3),
            ..test_policy().kind
        },
        ..test_policy()
    };
    let kind = start_kind(tree, policy).await;
    kind.create("y").await;
    kind.wait_ready("y").await;
    let gaps = gaps(&log, "y");
    assert_eq!(gaps.len(), 2, "two yields, then done");
    let near = |d: Duration, s: u64| {
        d >= Duration::from_secs(s) && d < Duration::from_millis(s * 1000 + 100)
    };
    assert!(near(gaps[0], 7) && near(gaps[1], 3), "{gaps:?}");
    kind.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_kinds_policy_section_tunes_its_reconciles() {
    let log = ReconcileLog::default();
    let tree = counting(log.clone(), |n| match n {
        0 => Outcome::yield_now(Reason::new("Wait", "the kind's delay")),
        _ => Outcome::Done,
    });
    let top = SupervisorPolicy {
        kind: crate::policy::KindPolicy {
            yield_delay: Duration::from_secs(3),
            ..test_policy().kind
        },
        ..test_policy()
    };
    let mut policy = top.clone();
    policy.kinds.insert(
        "Widget".into(),
        KindPolicy {
            yield_delay: Duration::from_secs(11),
            ..top.kind.clone()
        },
    );
    let kind = start_kind(tree, policy).await;
    kind.create("k").await;
    kind.wait_ready("k").await;
    let gaps = gaps(&log, "k");
    assert_eq!(gaps.len(), 1, "one yield, then done");
    assert!(
        gaps[0] >= Duration::from_secs(11) && gaps[0] < Duration::from_millis(11_100),
        "the section's yield delay, not the top level's: {gaps:?}"
    );
    kind.stop().await;
}

#[tokio::test(start_paused = true)]
async fn errors_back_off_growing_and_a_success_resets_the_backoff() {
    let log = ReconcileLog::default();
    // Four failures, a success (a yield), two failures, done.
    let tree = counting(log.clone(), |n| match n {
        0..=3 | 5 | 6 => Outcome::failed(
            Reason::new("Flaky", "transient"),
            std::io::Error::other("boom"),
        ),
        4 => Outcome::yield_after(Duration::from_millis(50), Reason::new("Ok", "progress")),
        _ => Outcome::Done,
    });
    let mut policy = test_policy();
    policy.kind.error_backoff.min = Duration::from_millis(100);
    policy.kind.error_backoff.max = Duration::from_secs(10);
    let kind = start_kind(tree, policy).await;
    kind.create("f").await;
    kind.wait_ready("f").await;
    let gaps = gaps(&log, "f");
    assert_eq!(gaps.len(), 7);
    let near =
        |d: Duration, ms: u64| d >= Duration::from_millis(ms) && d < Duration::from_millis(ms + 60);
    assert!(
        near(gaps[0], 100) && near(gaps[1], 200) && near(gaps[2], 400) && near(gaps[3], 800),
        "growing: {gaps:?}"
    );
    assert!(
        near(gaps[4], 50),
        "the yield's delay after the success: {gaps:?}"
    );
    assert!(
        near(gaps[5], 100) && near(gaps[6], 200),
        "reset by the success: {gaps:?}"
    );
    kind.stop().await;
}

/// When each phase of the slow-step tests happened.
#[derive(Clone, Default)]
struct Phases {
    slow_started: Arc<tokio::sync::Notify>,
    deprovision_started: Arc<std::sync::Mutex<Option<tokio::time::Instant>>>,
    deprovisioned: Arc<tokio::sync::Notify>,
    guard_runs: Arc<AtomicU32>,
}

/// A guarded task, then a step whose provision awaits a ten-minute call.
fn slow_tree(phases: Phases) -> impl Provisioner<Widget> {
    let (p1, p2) = (phases.clone(), phases);
    serial![
        crate::provisioners::guard("Record", move |_cx: Context<Widget>| {
            let p = p1.clone();
            async move {
                p.guard_runs.fetch_add(1, Ordering::SeqCst);
                Outcome::Done
            }
        }),
        step("slow-call", {
            let p = p2.clone();
            move |_cx: Context<Widget>| {
                let p = p.clone();
                async move {
                    p.slow_started.notify_one();
                    tokio::time::sleep(Duration::from_secs(600)).await;
                    Outcome::Done
                }
            }
        })
        .on_delete(move |_cx: Context<Widget>| {
            let p = p2.clone();
            async move {
                p.deprovision_started
                    .lock()
                    .unwrap()
                    .get_or_insert_with(tokio::time::Instant::now);
                p.deprovisioned.notify_one();
                Outcome::Done
            }
        }),
    ]
}

/// Create `w`, wait until its slow step awaits, delete it; how long after the deletion its
/// deprovision started, and the kind's cancelled reconciles.
async fn delete_during_the_slow_call(cancel_on_change: bool) -> (Duration, u32, u64) {
    let phases = Phases::default();
    let spec = super::KindSpec {
        cancel_on_change,
        ..super::KindSpec::new(Arc::new(slow_tree(phases.clone())))
    };
    let kind = super::test_kind::start_spec(spec, test_policy()).await;
    kind.create("w").await;
    phases.slow_started.notified().await;
    let deleted = tokio::time::Instant::now();
    kind.delete("w").await;
    tokio::time::timeout(Duration::from_secs(1200), phases.deprovisioned.notified())
        .await
        .expect("the deprovision runs");
    kind.wait_gone("w").await;
    let started = phases
        .deprovision_started
        .lock()
        .unwrap()
        .expect("the deprovision ran");
    let cancelled = kind.cancelled();
    kind.stop().await;
    (
        started - deleted,
        phases.guard_runs.load(Ordering::SeqCst),
        cancelled,
    )
}

#[tokio::test(start_paused = true)]
async fn a_deletion_cuts_a_slow_reconcile_and_deprovisions_at_once() {
    let (after, guard_runs, cancelled) = delete_during_the_slow_call(true).await;
    assert!(
        after < Duration::from_secs(1),
        "the deprovision starts within a scheduling round, not after the ten-minute call: {after:?}"
    );
    assert_eq!(guard_runs, 1, "the guarded task ran once");
    assert_eq!(cancelled, 1, "the cut reconcile counts as cancelled");
}

#[tokio::test(start_paused = true)]
async fn a_controller_that_opts_out_runs_its_reconcile_to_the_end() {
    let (after, guard_runs, cancelled) = delete_during_the_slow_call(false).await;
    assert!(
        after >= Duration::from_secs(600),
        "the ten-minute call ran to its end first: {after:?}"
    );
    assert_eq!((guard_runs, cancelled), (1, 0));
}

#[tokio::test(start_paused = true)]
async fn a_new_generation_never_cuts_a_guarded_task_between_its_effect_and_its_record() {
    // The task records which generation it ran for, after a minute's call.
    let started = Arc::new(tokio::sync::Notify::new());
    let finished = Arc::new(std::sync::Mutex::new(Vec::new()));
    let tree = {
        let (started, finished) = (started.clone(), finished.clone());
        crate::provisioners::guard("Record", move |cx: Context<Widget>| {
            let (started, finished) = (started.clone(), finished.clone());
            async move {
                started.notify_one();
                tokio::time::sleep(Duration::from_secs(60)).await;
                finished
                    .lock()
                    .unwrap()
                    .push(cx.object().metadata.generation);
                Outcome::Done
            }
        })
    };
    let kind = start_kind(tree, test_policy()).await;
    kind.create("g").await;
    started.notified().await;
    kind.set_note("g", "new intent").await;
    // The second generation's task starts after the first's ended and was recorded.
    started.notified().await;
    let status =
        crate::testing::eventually("g's guard recorded for generation 2", LIMIT, || async {
            let status = kind.wait_reason("g", "Provisioned").await;
            let recorded = status
                .condition("Record")
                .is_some_and(|c| c.reason == "Done" && c.observed_generation == Some(2));
            recorded.then_some(status)
        })
        .await;
    assert_eq!(
        *finished.lock().unwrap(),
        vec![Some(1), Some(2)],
        "the first task was not cut: each generation's ran once, to its end"
    );
    let record = status.condition("Record").expect("the guard's condition");
    assert_eq!(
        (record.reason.as_str(), record.observed_generation),
        ("Done", Some(2))
    );
    assert_eq!(kind.cancelled(), 0, "no reconcile was cut");
    kind.stop().await;
}

/// Waits (virtual time) until `name` has had `n` reconciles.
async fn reconciles(log: &ReconcileLog, name: &str, n: usize) {
    tokio::time::timeout(LIMIT, async {
        while log.starts(name).len() < n {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{name} had {} reconciles, not {n}", log.starts(name).len()));
}

#[tokio::test(start_paused = true)]
async fn each_reconcile_says_why_it_ran_in_its_span_and_its_count() {
    use crate::triggers::Trigger;
    let spans = crate::span_capture::Spans::default();
    let _capture = spans.capture();
    let log = ReconcileLog::default();
    let tree = counting(log.clone(), |n| match n {
        0 => Outcome::yield_after(Duration::from_secs(5), Reason::new("Wait", "five seconds")),
        _ => Outcome::Done,
    });
    let kind = start_kind(tree, test_policy()).await;
    kind.create("t").await;
    kind.wait_ready("t").await;
    kind.set_note("t", "second").await;
    reconciles(&log, "t", 3).await;
    kind.label("t", "x").await;
    reconciles(&log, "t", 4).await;
    kind.reconcile("t");
    reconciles(&log, "t", 5).await;
    kind.delete("t").await;
    kind.wait_gone("t").await;
    let seen: Vec<String> = spans
        .named("reconcile")
        .iter()
        .map(|s| s.field("trigger").unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        seen,
        [
            "created", "yield", "spec", "changed", "external", "deletion"
        ],
        "each reconcile's span names why it ran"
    );
    let mut counted = kind.triggers();
    counted.sort_by_key(|(t, _)| *t as usize);
    assert_eq!(
        counted,
        [
            (Trigger::Created, 1),
            (Trigger::Spec, 1),
            (Trigger::Deletion, 1),
            (Trigger::Changed, 1),
            (Trigger::External, 1),
            (Trigger::Yield, 1),
        ]
    );
    kind.stop().await;
}
