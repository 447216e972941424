//! The decisions after a reconcile, one rule at a time.

use std::time::Duration;

use super::*;
use crate::provisioners::Reason;
use crate::references::Target;

const DELAYS: Delays = Delays {
    yield_delay: Duration::from_secs(1),
    dependency_poll: Duration::from_secs(60),
    conflict_retry: Duration::from_millis(10),
};

fn reason() -> Reason {
    Reason::new("Code", "message")
}

fn waiting() -> Outcome {
    Outcome::Waiting {
        target: Target::new("v1", "ConfigMap", Some("ns"), "cm"),
        reason: reason(),
    }
}

fn failed() -> Outcome {
    Outcome::failed(reason(), std::io::Error::other("boom"))
}

const AT: At = At {
    generation: Some(2),
    deleting: false,
    version: Some(7),
};

fn ended(outcome: &Outcome, ready: Option<bool>, write: StatusWrite) -> Ended<'_> {
    Ended {
        outcome,
        ready,
        write,
        announced: None,
        saw_others: false,
    }
}

#[test]
fn the_same_outcome_on_the_same_version_leaves_the_status_alone() {
    let status = ResourceStatus::default();
    let o = Outcome::yield_now(reason());
    let key = OutcomeKey::of(&o, AT.generation, AT.deleting, AT.version);
    let plan = |last: Option<&OutcomeKey>, at: At, fields: bool| {
        plan_status(last, &o, at, fields, &status, None, true)
    };
    assert_eq!(plan(Some(&key), AT, false), StatusPlan::Unchanged);
    // Not without a key, with status fields to write, on another version or generation, or
    // when the version is unknown.
    assert_ne!(plan(None, AT, false), StatusPlan::Unchanged);
    assert_ne!(plan(Some(&key), AT, true), StatusPlan::Unchanged);
    let other = At {
        version: Some(8),
        ..AT
    };
    assert_ne!(plan(Some(&key), other, false), StatusPlan::Unchanged);
    let newer = At {
        generation: Some(3),
        ..AT
    };
    assert_ne!(plan(Some(&key), newer, false), StatusPlan::Unchanged);
    let unknown = At {
        version: None,
        ..AT
    };
    let key = OutcomeKey::of(&o, AT.generation, AT.deleting, None);
    assert_ne!(plan(Some(&key), unknown, false), StatusPlan::Unchanged);
}

#[test]
fn a_status_is_written_when_it_changes_or_fields_are_due_and_left_when_it_says_the_same() {
    let empty = ResourceStatus::default();
    let done = empty.after_provision(&Outcome::Done, AT.generation);
    match plan_status(None, &Outcome::Done, AT, false, &empty, None, true) {
        StatusPlan::Write { desired } => assert_eq!(desired, done),
        other => panic!("{other:?}"),
    }
    // Already saying so: left, and Ready.
    assert_eq!(
        plan_status(None, &Outcome::Done, AT, false, &done, None, true),
        StatusPlan::Leave { ready: true }
    );
    // The steps' status fields are written even when the condition says the same.
    assert!(matches!(
        plan_status(None, &Outcome::Done, AT, true, &done, None, true),
        StatusPlan::Write { .. }
    ));
    // A status the reconcile computed itself (a deletion's) is the one planned.
    let deleting = empty.after_deprovision(&waiting(), AT.generation);
    match plan_status(
        None,
        &waiting(),
        AT,
        false,
        &empty,
        Some(deleting.clone()),
        true,
    ) {
        StatusPlan::Write { desired } => assert_eq!(desired, deleting),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_status_not_the_runtimes_to_write_is_left_and_readiness_follows_the_outcome() {
    let status = ResourceStatus::default();
    for (o, ready) in [
        (Outcome::Done, true),
        (Outcome::yield_now(reason()), false),
        (waiting(), false),
        (failed(), false),
    ] {
        assert_eq!(
            plan_status(None, &o, AT, false, &status, None, false),
            StatusPlan::Leave { ready },
            "{o:?}"
        );
    }
}

#[test]
fn ready_is_announced_once_its_status_is_written_and_not_ready_at_once() {
    let done = Outcome::Done;
    let announce = |ready, write, announced| {
        after_write(
            Ended {
                announced,
                ..ended(&done, Some(ready), write)
            },
            DELAYS,
        )
        .announce
    };
    assert_eq!(announce(true, StatusWrite::Written, None), Some(true));
    assert_eq!(announce(true, StatusWrite::Conflicted, None), None);
    assert_eq!(announce(true, StatusWrite::Failed, None), None);
    assert_eq!(announce(false, StatusWrite::Failed, None), Some(false));
    assert_eq!(
        announce(false, StatusWrite::Conflicted, Some(true)),
        Some(false)
    );
    // Said before: not again.
    assert_eq!(announce(true, StatusWrite::Written, Some(true)), None);
    assert_eq!(announce(false, StatusWrite::Written, Some(false)), None);
    // Unchanged: nothing is announced, remembered or retried.
    let next = after_write(ended(&done, None, StatusWrite::Written), DELAYS);
    assert_eq!(
        (next.announce, next.remember, next.retry),
        (None, None, None)
    );
}

#[test]
fn a_written_status_is_remembered_and_a_conflict_is_retried_soon() {
    let o = Outcome::yield_now(reason());
    let next = |write| after_write(ended(&o, Some(false), write), DELAYS);
    assert_eq!(next(StatusWrite::Written).remember, Some(true));
    assert_eq!(next(StatusWrite::Written).retry, None);
    assert_eq!(next(StatusWrite::Conflicted).remember, Some(false));
    assert_eq!(
        next(StatusWrite::Conflicted).retry,
        Some(DELAYS.conflict_retry)
    );
    assert_eq!(next(StatusWrite::Failed).remember, Some(false));
    assert_eq!(next(StatusWrite::Failed).retry, None);
}

#[test]
fn each_outcome_sets_its_wake_up_and_its_backoff_step() {
    let yield_in = Duration::from_millis(250);
    let cases = [
        (Outcome::Done, Some(Wake::Poll), Backoff::Reset),
        (
            Outcome::yield_now(reason()),
            Some(Wake::After(DELAYS.yield_delay)),
            Backoff::Reset,
        ),
        (
            Outcome::yield_after(yield_in, reason()),
            Some(Wake::After(yield_in)),
            Backoff::Reset,
        ),
        (
            waiting(),
            Some(Wake::After(DELAYS.dependency_poll)),
            Backoff::Keep,
        ),
        (failed(), None, Backoff::Grow),
        (Outcome::Terminal(reason()), None, Backoff::Keep),
        (Outcome::UserActionRequired(reason()), None, Backoff::Keep),
    ];
    for (o, wake, backoff) in cases {
        let next = after_write(ended(&o, Some(false), StatusWrite::Written), DELAYS);
        assert_eq!((next.wake, next.backoff), (wake, backoff), "{o:?}");
        // Unchanged (no status work) decides the same.
        let next = after_write(ended(&o, None, StatusWrite::Written), DELAYS);
        assert_eq!((next.wake, next.backoff), (wake, backoff), "{o:?}");
    }
}

#[test]
fn a_failed_status_write_backs_off_alone() {
    // Whatever the outcome asks for, a refused write waits for the error backoff only.
    for o in [Outcome::Done, Outcome::yield_now(reason()), waiting()] {
        let next = after_write(ended(&o, Some(false), StatusWrite::Failed), DELAYS);
        assert_eq!((next.wake, next.backoff), (None, Backoff::Grow), "{o:?}");
    }
}

#[test]
fn a_step_that_met_someone_elses_write_runs_again() {
    let o = Outcome::Done;
    let met = Ended {
        saw_others: true,
        ..ended(&o, None, StatusWrite::Written)
    };
    assert!(after_write(met, DELAYS).reconcile_again);
    assert!(!after_write(ended(&o, None, StatusWrite::Written), DELAYS).reconcile_again);
}

#[test]
fn a_written_change_of_phase_other_than_to_ready_wakes_the_waiters() {
    use crate::references::Readiness;
    use crate::status::Phase;
    let with = |phase| ResourceStatus {
        phase,
        ..Default::default()
    };
    let write = |phase| StatusPlan::Write {
        desired: with(phase),
    };
    let progressing = with(Some(Phase::Progressing));
    let written = StatusWrite::Written;
    assert_eq!(
        write(Some(Phase::Failed)).wakes_waiters(&progressing, written),
        Some(Readiness::Failed)
    );
    assert_eq!(
        write(Some(Phase::Terminating)).wakes_waiters(&progressing, written),
        Some(Readiness::NotReady)
    );
    assert_eq!(
        write(Some(Phase::Progressing)).wakes_waiters(&with(Some(Phase::Ready)), written),
        Some(Readiness::NotReady)
    );
    // Ready wakes them when it is announced; an unchanged phase, a write not made, no plan: none.
    let none = |plan: StatusPlan, write| plan.wakes_waiters(&progressing, write).is_none();
    assert!(none(write(Some(Phase::Ready)), written));
    assert!(none(write(Some(Phase::Progressing)), written));
    assert!(none(write(Some(Phase::Failed)), StatusWrite::Conflicted));
    assert!(none(write(Some(Phase::Failed)), StatusWrite::Failed));
    assert!(none(StatusPlan::Leave { ready: false }, written));
    assert!(none(StatusPlan::Unchanged, written));
}
