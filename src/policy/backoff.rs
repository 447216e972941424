//! The backoffs of a policy: how failed actors are restarted ([`RestartPolicy`], with what
//! happens past the restart intensity, [`Exhausted`]), and how a delay grows ([`BackoffPolicy`]).

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use serde::{Deserialize, Serialize};

use super::{PolicyError, at_most_a_year};

/// Restart intensity and backoff for failed resource actors.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RestartPolicy {
    /// Restarts allowed within `window` before `on_exhausted` applies.
    pub max_restarts: u32,
    /// The intensity window.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// What happens past the intensity limit.
    pub on_exhausted: Exhausted,
    /// Delay before each restart.
    pub backoff: BackoffPolicy,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        Self {
            max_restarts: 5,
            window: Duration::from_secs(60),
            on_exhausted: Exhausted::Quarantine,
            backoff: BackoffPolicy::default(),
        }
    }
}

/// What the supervisor does when a resource's actor fails more often than the restart intensity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Exhausted {
    /// Phase Failed, reason Quarantined; no restarts until the object's generation changes.
    Quarantine,
    /// The kind's manager fails; the runtime stops with [`Error::Escalated`](crate::Error::Escalated).
    Escalate,
}

/// Exponential backoff with optional jitter.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BackoffPolicy {
    /// First delay.
    #[serde(with = "humantime_serde")]
    pub min: Duration,
    /// Largest delay.
    #[serde(with = "humantime_serde")]
    pub max: Duration,
    /// Growth factor (≥ 1).
    pub factor: f64,
    /// Add random jitter to each delay (up to +100 % of it, as backon does).
    pub jitter: bool,
    /// A quiet period this long resets the backoff to `min` (the restart backoff's; the error
    /// backoff ignores it and resets when a reconcile succeeds).
    #[serde(with = "humantime_serde")]
    pub reset_after: Duration,
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        Self {
            min: Duration::from_millis(100),
            max: Duration::from_secs(30),
            factor: 2.0,
            jitter: true,
            reset_after: Duration::from_secs(60),
        }
    }
}

impl BackoffPolicy {
    /// A fresh backoff sequence (endless), seeded when `seed` is given.
    pub fn sequence(&self, seed: Option<u64>) -> ExponentialBackoff {
        let mut b = ExponentialBuilder::default()
            .with_min_delay(self.min)
            .with_max_delay(self.max)
            .with_factor(self.factor as f32)
            .without_max_times();
        if self.jitter {
            b = b.with_jitter();
        }
        if let Some(seed) = seed {
            b = b.with_jitter_seed(seed);
        }
        b.build()
    }

    pub(super) fn validate(&self, field: &str) -> Result<(), PolicyError> {
        for (name, d) in [
            ("min", self.min),
            ("max", self.max),
            ("reset_after", self.reset_after),
        ] {
            at_most_a_year(&format!("{field}.{name}"), d)?;
        }
        if self.min.is_zero() {
            // A zero minimum stays zero however often it is multiplied: retries without pause.
            return Err(PolicyError::invalid(
                format!("{field}.min"),
                "must be longer than zero",
            ));
        }
        if !(self.factor.is_finite() && self.factor >= 1.0) {
            return Err(PolicyError::invalid(
                format!("{field}.factor"),
                "must be a number ≥ 1",
            ));
        }
        if self.min > self.max {
            return Err(PolicyError::invalid(
                format!("{field}.min"),
                "must not exceed max",
            ));
        }
        Ok(())
    }
}
