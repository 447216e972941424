//! The policy's `reconcile_timeout`: a reconcile still running after it is stopped and becomes a
//! transient failure, so a hung provisioner holds its reconcile slot (and its object) for a bounded
//! time.
//!
//! The clock is only armed when the reconcile does not finish at its first poll: a reconcile that makes no
//! request (every reconcile of a yield loop) pays nothing for it.

use std::future::Future;
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use crate::provisioners::{Outcome, Reason};
use crate::status::ReadyReason;

/// The error a stopped reconcile fails with (in logs and the failure's errors, never in status).
#[derive(Debug, thiserror::Error)]
#[error("the reconcile ran for {0:?} (the policy's reconcile_timeout) and was stopped")]
pub(crate) struct ReconcileTimedOut(pub(crate) Duration);

/// `reconcile`, or a `ReconcileTimeout` failure once it has run for `limit`.
pub(crate) async fn within(
    limit: Option<Duration>,
    reconcile: impl Future<Output = Outcome>,
) -> Outcome {
    let Some(limit) = limit else {
        return reconcile.await;
    };
    let mut reconcile = pin!(reconcile);
    let mut clock = None;
    std::future::poll_fn(|cx| {
        if let Poll::Ready(outcome) = reconcile.as_mut().poll(cx) {
            return Poll::Ready(outcome);
        }
        let clock = clock.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match clock.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Outcome::failed(
                Reason::new(
                    ReadyReason::ReconcileTimeout.as_str(),
                    format!(
                        "a reconcile ran for {} and was stopped; retried with backoff",
                        humantime_serde::re::humantime::format_duration(limit)
                    ),
                ),
                ReconcileTimedOut(limit),
            )),
            Poll::Pending => Poll::Pending,
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_reconcile_past_the_limit_is_stopped() {
        let start = tokio::time::Instant::now();
        let outcome = within(Some(Duration::from_secs(3)), std::future::pending()).await;
        assert_eq!(start.elapsed(), Duration::from_secs(3));
        let Outcome::Failed { reason, errors } = outcome else {
            panic!("expected a failure, got {outcome:?}");
        };
        assert_eq!(reason.code(), "ReconcileTimeout");
        assert_eq!(errors.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reconcile_within_the_limit_keeps_its_outcome() {
        let slow = async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            Outcome::Done
        };
        assert!(within(Some(Duration::from_secs(3)), slow).await.is_done());
        assert!(
            within(None, std::future::ready(Outcome::Done))
                .await
                .is_done()
        );
    }
}
