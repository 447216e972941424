//! One object's reconciles, on one kind started through its seam under a paused clock: a yield
//! becomes a wake-up after its delay, and errors back off, growing, until a success resets it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use kube::ResourceExt;

use super::test_kind::{ReconcileLog, Widget, start_kind, test_policy};
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
