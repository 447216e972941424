//! The parsers the crate keeps private, opened to its fuzz targets (`fuzz/`) under the
//! `fuzzing` feature. Not part of the API: nothing here is stable.

use crate::provisioners::KubeconfigSecret;
use crate::provisioners::cd::AppHealth;

/// What the Argo CD driver reads of an Application (`argoproj.io/v1alpha1`).
pub fn argocd_health(app: &kube::api::DynamicObject) -> AppHealth {
    crate::provisioners::argocd::health_of(app)
}

/// The configuration a kubeconfig read from a Secret gives (`secret`'s key `key`), as
/// [`KubeconfigSecret`] reads it: `Err` with the message a user would see when it is refused.
pub async fn kubeconfig_from_secret(
    secret: KubeconfigSecret,
    bytes: &[u8],
) -> Result<kube::Config, String> {
    let access = secret.config_from(bytes).await.map_err(|e| e.to_string())?;
    access
        .kube_config()
        .cloned()
        .ok_or_else(|| "a kubeconfig gave no configuration".to_string())
}

/// The supervisor's decisions for one object's actor failing `gaps` apart (the first gap from
/// now): each failure's restart delay, or `None` where the restart intensity is exhausted.
/// Stops early where the clock cannot go that far.
pub fn restart_decisions(
    policy: &crate::policy::RestartPolicy,
    gaps: &[std::time::Duration],
    seed: u64,
) -> Vec<Option<std::time::Duration>> {
    use crate::policy::restarts::{AfterFailure, RestartTracker};
    let mut tracker = RestartTracker::default();
    let mut now = tokio::time::Instant::now();
    let mut decisions = Vec::new();
    for gap in gaps {
        let Some(at) = now.checked_add(*gap) else {
            break;
        };
        now = at;
        decisions.push(match tracker.failed(policy, now, Some(seed)) {
            AfterFailure::Restart { delay, .. } => Some(delay),
            AfterFailure::Exhausted { .. } => None,
        });
    }
    decisions
}

/// The next `n` delays of an object's error backoff after `attempts` failures, as a resource
/// actor draws them (also one re-activated after a passivation, which resumes the count).
pub fn error_backoff(
    policy: &crate::policy::BackoffPolicy,
    attempts: u32,
    n: usize,
    seed: Option<u64>,
) -> Vec<std::time::Duration> {
    let mut sequence = crate::actors::resource_actor::error_backoff(policy, seed, attempts);
    (0..n)
        .map(|_| sequence.next().unwrap_or(policy.max))
        .collect()
}

/// When a wake-up `delay` from now fires, as the runtime's timers hold it (a yield's delay, a
/// poll interval, a lock's time left): `None` if the clock cannot hold it.
pub fn wake_deadline(delay: std::time::Duration) -> Option<tokio::time::Instant> {
    tokio::time::Instant::now().checked_add(crate::scheduling::bounded_delay(delay))
}

/// `leaseDurationSeconds` as the leader election and the shard keeper write it for `policy`.
pub fn lease_seconds(policy: &crate::policy::SupervisorPolicy) -> i32 {
    crate::policy::lease_seconds(policy.lease.duration)
}
