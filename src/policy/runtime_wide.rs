//! The runtime-wide parts of a [`SupervisorPolicy`](super::SupervisorPolicy): the limits
//! shared by every kind ([`RuntimePolicy`]) and the Lease timings of leader election and
//! sharding ([`LeasePolicy`]). No controller sets them for its own kind.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{MAX_CONCURRENCY, PolicyError, at_most_a_year};

/// The limits every kind shares: reconciles in flight, the watches of kinds the runtime does
/// not manage, graceful shutdown.
///
/// Its `Deserialize` ignores keys it does not know (it is flattened into
/// [`SupervisorPolicy`](super::SupervisorPolicy), whose `from_toml` refuses them).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RuntimePolicy {
    /// A watch of a kind the runtime does not manage, started when a provisioner first waits
    /// on one of its objects, stops once nobody has waited on any of its objects for this long.
    #[serde(with = "humantime_serde")]
    pub dependency_watch_idle: Duration,
    /// Reconciles in flight across the runtime (`max_concurrent_runs` in older files).
    #[serde(alias = "max_concurrent_runs")]
    pub max_concurrent_reconciles: usize,
    /// How long graceful shutdown waits for in-flight reconciles.
    #[serde(with = "humantime_serde")]
    pub shutdown_timeout: Duration,
}

impl Default for RuntimePolicy {
    fn default() -> Self {
        Self {
            dependency_watch_idle: Duration::from_secs(300),
            max_concurrent_reconciles: 64,
            shutdown_timeout: Duration::from_secs(30),
        }
    }
}

impl RuntimePolicy {
    /// Check values a type cannot express.
    pub fn validate(&self) -> Result<(), PolicyError> {
        at_most_a_year("dependency_watch_idle", self.dependency_watch_idle)?;
        at_most_a_year("shutdown_timeout", self.shutdown_timeout)?;
        if self.max_concurrent_reconciles == 0 || self.max_concurrent_reconciles > MAX_CONCURRENCY {
            return Err(PolicyError::invalid(
                "max_concurrent_reconciles",
                format!("must be 1 to {MAX_CONCURRENCY}"),
            ));
        }
        if self.dependency_watch_idle.is_zero() {
            return Err(PolicyError::invalid(
                "dependency_watch_idle",
                "must be longer than zero",
            ));
        }
        Ok(())
    }
}

/// The Lease timings of leader election and sharding ([`crate::sharding`]), in a policy file as
/// `lease_duration`, `lease_renew_deadline` and `lease_retry_period`.
///
/// ```
/// use std::time::Duration;
/// use actorcile::policy::SupervisorPolicy;
///
/// let p = SupervisorPolicy::from_toml("lease_duration = \"30s\"").unwrap();
/// assert_eq!(p.lease.duration, Duration::from_secs(30));
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LeasePolicy {
    /// How long a Lease whose record stood still blocks candidates. Whole seconds (the Lease
    /// API counts seconds).
    #[serde(rename = "lease_duration", with = "humantime_serde")]
    pub duration: Duration,
    /// The leader (a shard's holder) stops every reconcile (of the shard) once it has not
    /// renewed the Lease for this long. Shorter than `duration`: the difference is the fencing
    /// margin.
    #[serde(rename = "lease_renew_deadline", with = "humantime_serde")]
    pub renew_deadline: Duration,
    /// How often candidates try to take a Lease and holders renew it.
    #[serde(rename = "lease_retry_period", with = "humantime_serde")]
    pub retry_period: Duration,
}

impl Default for LeasePolicy {
    fn default() -> Self {
        Self {
            duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

impl LeasePolicy {
    /// Check that each timing is at most a year (whether they fit together is checked where
    /// they are used: by leader election and the shard keeper).
    pub fn validate(&self) -> Result<(), PolicyError> {
        at_most_a_year("lease_duration", self.duration)?;
        at_most_a_year("lease_renew_deadline", self.renew_deadline)?;
        at_most_a_year("lease_retry_period", self.retry_period)
    }

    /// Check that the timings fit together (leader election and sharding share them): the
    /// failing key and why.
    pub(crate) fn check_timings(&self) -> Result<(), (&'static str, String)> {
        let (duration, deadline, retry) = (self.duration, self.renew_deadline, self.retry_period);
        if duration < Duration::from_secs(1) || duration.subsec_nanos() != 0 {
            return Err((
                "lease_duration",
                "must be whole seconds, at least 1 (the Lease API counts seconds)".into(),
            ));
        }
        if deadline >= duration {
            return Err((
                "lease_renew_deadline",
                "must be shorter than lease_duration (the difference is the fencing margin)".into(),
            ));
        }
        if retry.is_zero() || retry >= deadline {
            return Err((
                "lease_retry_period",
                "must be longer than zero and shorter than lease_renew_deadline".into(),
            ));
        }
        Ok(())
    }
}
