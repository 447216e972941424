//! Restart intensity, as in OTP and Akka: how often one object's actor failed within the
//! policy's window, how long to wait before the next restart, and when to give up.
//!
//! Plain data, driven by the manager with the time of each failure.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use backon::ExponentialBackoff;
use tokio::time::Instant;

use crate::policy::RestartPolicy;

/// One object's failures (kept only for objects whose actor ever failed).
#[derive(Default)]
pub(crate) struct RestartTracker {
    /// Failures within the window, oldest first.
    failures: VecDeque<Instant>,
    /// The restart backoff; reset after a quiet `reset_after`.
    backoff: Option<ExponentialBackoff>,
    last: Option<Instant>,
}

/// What to do after a failure.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum AfterFailure {
    /// Restart after this delay.
    Restart {
        /// Failures within the window, this one included.
        failures: usize,
        /// The restart backoff's next delay.
        delay: Duration,
    },
    /// More than `max_restarts` failures within the window: apply
    /// [`RestartPolicy::on_exhausted`].
    Exhausted {
        /// Failures within the window, this one included.
        failures: usize,
    },
}

impl RestartTracker {
    /// The actor failed at `now`. `seed` makes the backoff's jitter reproducible.
    pub(crate) fn failed(
        &mut self,
        policy: &RestartPolicy,
        now: Instant,
        seed: Option<u64>,
    ) -> AfterFailure {
        if self
            .last
            .is_some_and(|l| now.duration_since(l) >= policy.backoff.reset_after)
        {
            self.backoff = None;
        }
        self.last = Some(now);
        self.failures.push_back(now);
        while self
            .failures
            .front()
            .is_some_and(|t| now.duration_since(*t) > policy.window)
        {
            self.failures.pop_front();
        }
        let failures = self.failures.len();
        if failures > policy.max_restarts as usize {
            return AfterFailure::Exhausted { failures };
        }
        let delay = self
            .backoff
            .get_or_insert_with(|| policy.backoff.sequence(seed))
            .next()
            .unwrap_or(policy.backoff.max);
        AfterFailure::Restart { failures, delay }
    }
}

/// Why a manager stopped the runtime: one object's actor failed more often than the restart
/// intensity allows, and the policy says
/// [`Exhausted::Escalate`](crate::policy::Exhausted::Escalate).
#[derive(Clone, Debug, thiserror::Error)]
#[error(
    "restart intensity exceeded for {object} of kind {kind} ({failures} failures within {window:?})"
)]
pub struct Escalation {
    /// The kind whose manager escalated.
    pub kind: String,
    /// The object whose actor kept failing (`namespace/name`, or `name`).
    pub object: String,
    /// Failures within the window.
    pub failures: usize,
    /// The policy's restart window.
    pub window: Duration,
    /// The last failure: the panic or error that stopped the object's actor.
    #[source]
    pub cause: Arc<dyn std::error::Error + Send + Sync>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{BackoffPolicy, Exhausted};

    fn policy() -> RestartPolicy {
        RestartPolicy {
            max_restarts: 2,
            window: Duration::from_secs(10),
            on_exhausted: Exhausted::Quarantine,
            backoff: BackoffPolicy {
                min: Duration::from_millis(100),
                max: Duration::from_secs(1),
                factor: 2.0,
                jitter: false,
                reset_after: Duration::from_secs(60),
            },
        }
    }

    /// The restart delay in whole milliseconds (backon computes with an `f32` factor).
    fn delay(a: AfterFailure) -> u128 {
        match a {
            AfterFailure::Restart { delay, .. } => delay.as_millis(),
            other => panic!("expected a restart, got {other:?}"),
        }
    }

    #[test]
    fn backoff_grows_and_intensity_is_counted_within_the_window() {
        let p = policy();
        let mut r = RestartTracker::default();
        let t0 = Instant::now();
        assert_eq!(delay(r.failed(&p, t0, None)), 100);
        match r.failed(&p, t0 + Duration::from_secs(1), None) {
            AfterFailure::Restart { failures, delay } => {
                assert_eq!((failures, delay.as_millis()), (2, 200));
            }
            other => panic!("expected a restart, got {other:?}"),
        }
        assert_eq!(
            r.failed(&p, t0 + Duration::from_secs(2), None),
            AfterFailure::Exhausted { failures: 3 },
            "a third failure within 10 s exceeds max_restarts = 2"
        );
    }

    #[test]
    fn failures_older_than_the_window_do_not_count() {
        let p = policy();
        let mut r = RestartTracker::default();
        let t0 = Instant::now();
        r.failed(&p, t0, None);
        r.failed(&p, t0 + Duration::from_secs(1), None);
        // 11 s later the first failure has left the window: two within it
        match r.failed(&p, t0 + Duration::from_secs(11), None) {
            AfterFailure::Restart { failures, .. } => assert_eq!(failures, 2),
            other => panic!("expected a restart, got {other:?}"),
        }
    }

    #[test]
    fn a_quiet_period_resets_the_backoff() {
        let p = RestartPolicy {
            max_restarts: 100,
            window: Duration::from_secs(1),
            ..policy()
        };
        let mut r = RestartTracker::default();
        let t0 = Instant::now();
        assert_eq!(delay(r.failed(&p, t0, None)), 100);
        assert_eq!(delay(r.failed(&p, t0 + Duration::from_secs(1), None)), 200);
        // a failure after `reset_after` without one starts the backoff again
        let later = t0 + Duration::from_secs(1) + p.backoff.reset_after;
        assert_eq!(delay(r.failed(&p, later, None)), 100);
    }
}
