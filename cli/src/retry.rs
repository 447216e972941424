//! Requests of the command's own harness (set-up, clean-up, checks), retried so that it rides
//! out the faults it is used to inject: a restarted kube-apiserver or etcd, throttling.

use std::time::Duration;

use anyhow::{Context as _, Result};
use backon::{ExponentialBuilder, Retryable};

/// Whether a set-up request failed in a way worth trying again: the connection (a restarting
/// apiserver), a 5xx, or throttling.
fn transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code >= 500 || s.code == 429,
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

/// Runs an idempotent set-up or clean-up request, retrying transient failures for about a
/// minute: the harness must ride out the faults it is used to inject (a restarted apiserver).
/// `tolerated` is a status code that means done already (409 for a create, 404 for a delete).
pub async fn idempotent<T: Default, F, Fut>(what: &str, tolerated: Option<u16>, f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let done = f
        .retry(
            ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(100))
                .with_max_delay(Duration::from_secs(2))
                .with_max_times(40),
        )
        .when(transient)
        .notify(|e, after| tracing::warn!(error = %e, ?after, "{what}: retrying"))
        .await;
    match done {
        Err(kube::Error::Api(s)) if Some(s.code) == tolerated => Ok(T::default()),
        r => r.with_context(|| what.to_string()),
    }
}
