//! What follows a reconcile, decided as plain data: the status to write (or that none is
//! needed), the readiness to announce, the next wake-up and the error backoff's step. The
//! resource actor computes the inputs, calls these functions, and carries out what they return;
//! nothing here does I/O or reads a clock.
//!
//! The two steps, in the order the actor takes them:
//!
//! 1. [`plan_status`]: before any write. The same outcome on the same object version as the last
//!    reconcile that wrote its status leaves nothing to do ([`StatusPlan::Unchanged`]: a yield
//!    loop, an idle re-run); otherwise the status the reconcile leaves, and whether it must be
//!    written.
//! 2. [`after_write`]: once the write (if any) is answered. Ready is announced only once a Ready
//!    status is in the API (or the status is not the runtime's to write), not Ready at once; a
//!    conflicting write is retried soon; a failed reconcile or a failed status write grows the
//!    error backoff, and a reconcile that is done or yields with its status in place resets it;
//!    the outcome sets the next wake-up (none after a failed write: the backoff's alone, so a
//!    refused write is not sent again at a yield's pace).
//!
//! `outcome_key.rs` holds what the last reconcile left, that step 1 compares with.

mod outcome_key;
#[cfg(test)]
mod tests;

use std::time::Duration;

pub(crate) use outcome_key::OutcomeKey;

use crate::provisioners::Outcome;
use crate::references::Readiness;
use crate::status::ResourceStatus;

/// Where a reconcile ended: the object's generation, whether it is being deleted, and the
/// version of the object its status builds on (`None` when unknown).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct At {
    pub(crate) generation: Option<i64>,
    pub(crate) deleting: bool,
    pub(crate) version: Option<u64>,
}

/// What the status work of a reconcile is ([`plan_status`]).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum StatusPlan {
    /// Nothing can have changed since the last reconcile: no write, no announcement.
    Unchanged,
    /// The status stays as it is (it already says this, or it is not the runtime's to write);
    /// the object is Ready or not as `ready` says.
    Leave { ready: bool },
    /// Write `desired` (with the steps' status fields).
    Write { desired: ResourceStatus },
}

impl StatusPlan {
    /// The readiness those waiting on the object (`Context::require_ready`) are woken to once
    /// this plan's write (`write`) is answered, if they are: when the phase moved from
    /// `current`'s to one other than Ready (Failed, or Terminating or back to Progressing: not
    /// Ready). Ready wakes them itself, when it is announced; without this, a waiter would learn
    /// of a failure only at its next poll.
    pub(crate) fn wakes_waiters(
        &self,
        current: &ResourceStatus,
        write: StatusWrite,
    ) -> Option<Readiness> {
        use crate::status::Phase;
        match self {
            StatusPlan::Write { desired }
                if write == StatusWrite::Written
                    && desired.phase != current.phase
                    && desired.phase != Some(Phase::Ready) =>
            {
                Some(if desired.phase == Some(Phase::Failed) {
                    Readiness::Failed
                } else {
                    Readiness::NotReady
                })
            }
            _ => None,
        }
    }

    /// Whether the status the reconcile leaves says Ready (`None`: unchanged).
    pub(crate) fn ready(&self) -> Option<bool> {
        match self {
            StatusPlan::Unchanged => None,
            StatusPlan::Leave { ready } => Some(*ready),
            StatusPlan::Write { desired } => Some(desired.is_ready()),
        }
    }
}

/// The status work of a reconcile that ended with `outcome` at `at`, on an object whose status is
/// `status`. `last` is the key the last reconcile that wrote its status left; `fields` whether
/// steps set status fields the status does not hold yet; `desired` the status the reconcile
/// computed itself (a deletion does), else it is [`ResourceStatus::after_provision`];
/// `write_status` whether the status is the runtime's to write.
pub(crate) fn plan_status(
    last: Option<&OutcomeKey>,
    outcome: &Outcome,
    at: At,
    fields: bool,
    status: &ResourceStatus,
    desired: Option<ResourceStatus>,
    write_status: bool,
) -> StatusPlan {
    let unchanged = at.version.is_some()
        && !fields
        && last.is_some_and(|k| k.matches(outcome, at.generation, at.deleting, at.version));
    if unchanged {
        return StatusPlan::Unchanged;
    }
    if !write_status {
        // Only the readiness is needed, not the status.
        let ready = desired.map_or_else(|| ResourceStatus::ready_after(outcome), |d| d.is_ready());
        return StatusPlan::Leave { ready };
    }
    let desired = desired.unwrap_or_else(|| status.after_provision(outcome, at.generation));
    if desired != *status || fields {
        StatusPlan::Write { desired }
    } else {
        StatusPlan::Leave {
            ready: desired.is_ready(),
        }
    }
}

/// What became of a reconcile's status write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StatusWrite {
    /// Written, or nothing to write (unchanged, left as it is, or the object is gone).
    Written,
    /// Refused with a conflict: the object changed since the reconcile read it.
    Conflicted,
    /// Failed otherwise (the API server refused it, or did not answer).
    Failed,
}

/// What a reconcile ended with, as far as what follows depends on it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ended<'a> {
    pub(crate) outcome: &'a Outcome,
    /// What [`plan_status`] said the status is ([`StatusPlan::ready`]).
    pub(crate) ready: Option<bool>,
    pub(crate) write: StatusWrite,
    /// The readiness last announced for the object (`None`: none yet).
    pub(crate) announced: Option<bool>,
    /// Whether a step's write met someone else's (the object changed under it).
    pub(crate) saw_others: bool,
}

/// The delays [`after_write`] chooses from (the policy's, and the conflict retry).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Delays {
    /// After a yield that gives no delay of its own.
    pub(crate) yield_delay: Duration,
    /// The fallback re-check of a reconcile waiting on a dependency.
    pub(crate) dependency_poll: Duration,
    /// After a status write that conflicted.
    pub(crate) conflict_retry: Duration,
}

/// The next wake-up an outcome asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wake {
    /// After this long.
    After(Duration),
    /// At the poll interval (the config's or the policy's, jittered; none if neither sets one).
    Poll,
}

/// What to do with the object's error backoff.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Backoff {
    /// Take its next step, and wake up after it.
    Grow,
    /// Start it over at the next failure.
    Reset,
    /// Leave it as it is.
    Keep,
}

/// What follows a reconcile ([`after_write`]); the actor carries it out. Every wake-up given is
/// armed: the earliest wins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Next {
    /// Readiness to announce to the reference index: `Some(true)` Ready of the generation
    /// reconciled, `Some(false)` not Ready.
    pub(crate) announce: Option<bool>,
    /// Whether the reconcile's key is remembered (`Some(true)`: keyed on the version the
    /// reconcile ended with; `Some(false)`: forgotten, so the next reconcile writes again;
    /// `None`: kept as it is).
    pub(crate) remember: Option<bool>,
    /// A retry soon, after a conflicting status write.
    pub(crate) retry: Option<Duration>,
    pub(crate) backoff: Backoff,
    /// The wake-up the outcome asks for.
    pub(crate) wake: Option<Wake>,
    /// Run again at once (a step's write met someone else's: on what they wrote).
    pub(crate) reconcile_again: bool,
}

/// What follows a reconcile that `ended` so, with the delays of `delays`.
pub(crate) fn after_write(ended: Ended<'_>, delays: Delays) -> Next {
    let written = ended.write == StatusWrite::Written;
    let announce = ended
        .ready
        .filter(|&ready| ended.announced != Some(ready) && (written || !ready));
    let planned = ended.ready.is_some();
    let failed = matches!(ended.outcome, Outcome::Failed { .. });
    let write_failed = ended.write == StatusWrite::Failed;
    let backoff = if write_failed || failed {
        Backoff::Grow
    } else if matches!(ended.outcome, Outcome::Done | Outcome::Yield { .. }) {
        Backoff::Reset
    } else {
        Backoff::Keep
    };
    let wake = match ended.outcome {
        _ if write_failed => None,
        Outcome::Done => Some(Wake::Poll),
        Outcome::Yield { after, .. } => Some(Wake::After(after.unwrap_or(delays.yield_delay))),
        Outcome::Waiting { .. } => Some(Wake::After(delays.dependency_poll)),
        Outcome::Terminal(_) | Outcome::UserActionRequired(_) | Outcome::Failed { .. } => None,
    };
    Next {
        announce,
        remember: planned.then_some(written),
        retry: (planned && ended.write == StatusWrite::Conflicted).then_some(delays.conflict_retry),
        backoff,
        wake,
        reconcile_again: ended.saw_others,
    }
}
