//! [`KindPolicy`]: the part of a [`SupervisorPolicy`] one controller may set for its own kind.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{
    BackoffPolicy, PolicyError, RestartPolicy, SupervisorPolicy, optional_duration, parse_toml,
    read_file,
};

/// The knobs of a [`SupervisorPolicy`] that tune one kind, for
/// [`Controller::policy`](crate::runtime::Controller::policy): restarts, backoffs, wake-ups,
/// passivation and timeouts. Each field means what the field of the same name of
/// [`SupervisorPolicy`] means. What is runtime-wide (`max_concurrent_reconciles`,
/// `dependency_watch_idle`, `shutdown_timeout`, the Lease timings) is not here: it is the
/// runtime's alone, so a controller cannot set it.
///
/// Start from the runtime's policy, or from a TOML file of these fields only:
///
/// ```
/// use std::time::Duration;
/// use actorcile::policy::{KindPolicy, SupervisorPolicy};
///
/// let runtime = SupervisorPolicy::default();
/// let slow_kind = KindPolicy {
///     reconcile_timeout: Some(Duration::from_secs(3600)),
///     ..runtime.kind_policy()
/// };
/// assert_eq!(slow_kind.yield_delay, runtime.yield_delay);
///
/// let from_file = KindPolicy::from_toml(r#"idle_timeout = "none""#).unwrap();
/// assert_eq!(from_file.idle_timeout, None);
/// // A runtime-wide knob is refused, named.
/// let err = KindPolicy::from_toml("max_concurrent_reconciles = 8").unwrap_err();
/// assert!(err.to_string().contains("max_concurrent_reconciles"));
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KindPolicy {
    /// [`SupervisorPolicy::restart`].
    pub restart: RestartPolicy,
    /// [`SupervisorPolicy::error_backoff`].
    pub error_backoff: BackoffPolicy,
    /// [`SupervisorPolicy::yield_delay`].
    #[serde(with = "humantime_serde")]
    pub yield_delay: Duration,
    /// [`SupervisorPolicy::poll_interval`].
    #[serde(with = "optional_duration")]
    pub poll_interval: Option<Duration>,
    /// [`SupervisorPolicy::poll_jitter`].
    pub poll_jitter: f64,
    /// [`SupervisorPolicy::dependency_poll`].
    #[serde(with = "humantime_serde")]
    pub dependency_poll: Duration,
    /// [`SupervisorPolicy::max_live_actors`].
    pub max_live_actors: Option<usize>,
    /// [`SupervisorPolicy::idle_timeout`].
    #[serde(with = "optional_duration")]
    pub idle_timeout: Option<Duration>,
    /// [`SupervisorPolicy::reconcile_timeout`].
    #[serde(with = "optional_duration", alias = "run_timeout")]
    pub reconcile_timeout: Option<Duration>,
    /// [`SupervisorPolicy::write_timeout`].
    #[serde(with = "optional_duration")]
    pub write_timeout: Option<Duration>,
    /// [`SupervisorPolicy::lock_expiry`].
    #[serde(with = "humantime_serde")]
    pub lock_expiry: Duration,
    /// [`SupervisorPolicy::seed`].
    pub seed: Option<u64>,
}

impl Default for KindPolicy {
    /// The per-kind part of [`SupervisorPolicy::default`].
    fn default() -> Self {
        SupervisorPolicy::default().kind_policy()
    }
}

impl KindPolicy {
    /// Parse a TOML policy of a kind: these fields only; missing ones take their defaults.
    pub fn from_toml(text: &str) -> Result<Self, PolicyError> {
        let p: KindPolicy = parse_toml(text)?;
        p.validate()?;
        Ok(p)
    }

    /// Read [`KindPolicy::from_toml`] from a file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, PolicyError> {
        read_file(path.as_ref(), Self::from_toml)
    }

    /// Check every field as [`SupervisorPolicy::validate`] does.
    pub fn validate(&self) -> Result<(), PolicyError> {
        SupervisorPolicy::default().with_kind(self).validate_own()
    }
}

impl SupervisorPolicy {
    /// The part of this policy that tunes each kind: where a controller's own
    /// [`KindPolicy`] starts from.
    pub fn kind_policy(&self) -> KindPolicy {
        KindPolicy {
            restart: self.restart.clone(),
            error_backoff: self.error_backoff.clone(),
            yield_delay: self.yield_delay,
            poll_interval: self.poll_interval,
            poll_jitter: self.poll_jitter,
            dependency_poll: self.dependency_poll,
            max_live_actors: self.max_live_actors,
            idle_timeout: self.idle_timeout,
            reconcile_timeout: self.reconcile_timeout,
            write_timeout: self.write_timeout,
            lock_expiry: self.lock_expiry,
            seed: self.seed,
        }
    }

    /// This policy with `kind`'s knobs instead of its own: what one kind's actors run by.
    pub(crate) fn with_kind(&self, kind: &KindPolicy) -> SupervisorPolicy {
        let KindPolicy {
            restart,
            error_backoff,
            yield_delay,
            poll_interval,
            poll_jitter,
            dependency_poll,
            max_live_actors,
            idle_timeout,
            reconcile_timeout,
            write_timeout,
            lock_expiry,
            seed,
        } = kind.clone();
        SupervisorPolicy {
            restart,
            error_backoff,
            yield_delay,
            poll_interval,
            poll_jitter,
            dependency_poll,
            max_live_actors,
            idle_timeout,
            reconcile_timeout,
            write_timeout,
            lock_expiry,
            seed,
            kinds: BTreeMap::new(),
            ..self.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kinds_policy_round_trips_through_the_runtimes() {
        let runtime = SupervisorPolicy {
            max_concurrent_reconciles: 3,
            yield_delay: Duration::from_secs(9),
            ..SupervisorPolicy::default()
        };
        let kind = KindPolicy {
            idle_timeout: None,
            ..runtime.kind_policy()
        };
        let merged = runtime.with_kind(&kind);
        // The kind's knobs, the runtime's limits.
        assert_eq!(merged.idle_timeout, None);
        assert_eq!(merged.yield_delay, Duration::from_secs(9));
        assert_eq!(merged.max_concurrent_reconciles, 3);
        assert_eq!(merged.kind_policy(), kind);
        assert_eq!(
            KindPolicy::default(),
            SupervisorPolicy::default().kind_policy()
        );
    }

    #[test]
    fn a_kinds_policy_file_refuses_runtime_wide_knobs_and_bad_values_naming_them() {
        for knob in [
            "max_concurrent_reconciles = 8",
            "lease_duration = \"15s\"",
            "shutdown_timeout = \"1s\"",
        ] {
            let err = KindPolicy::from_toml(knob).unwrap_err().to_string();
            let name = knob.split(' ').next().unwrap();
            assert!(err.contains(name), "{err}");
        }
        let err = KindPolicy::from_toml("poll_jitter = 2.0")
            .unwrap_err()
            .to_string();
        assert!(err.contains("poll_jitter"), "{err}");
        let p = KindPolicy::from_toml("yield_delay = \"2s\"\n[restart]\nmax_restarts = 1").unwrap();
        assert_eq!(
            (p.yield_delay, p.restart.max_restarts),
            (Duration::from_secs(2), 1)
        );
    }
}
