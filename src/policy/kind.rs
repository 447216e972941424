//! [`KindPolicy`]: the knobs that tune one kind, the part of a [`SupervisorPolicy`] a
//! controller may set for its own kind.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

#[cfg(doc)]
use super::SupervisorPolicy;
use super::{
    BackoffPolicy, MAX_CONCURRENCY, PolicyError, RestartPolicy, at_most_a_year, optional_duration,
    parse_toml, read_file, strict_kind,
};

/// The knobs that tune one kind: restarts, backoffs, wake-ups, passivation and timeouts. A
/// [`SupervisorPolicy`]'s `kind` part holds every kind's defaults; a `[kinds.<Kind>]` section
/// of a policy file, or a controller's own
/// ([`Controller::policy`](crate::runtime::Controller::policy)), replaces them for one kind.
/// What is runtime-wide ([`RuntimePolicy`](super::RuntimePolicy),
/// [`LeasePolicy`](super::LeasePolicy)) is not here: it is the runtime's alone, so a
/// controller cannot set it. The resource actors and their manager run by this part only.
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
///     ..runtime.kind.clone()
/// };
/// assert_eq!(slow_kind.yield_delay, runtime.kind.yield_delay);
///
/// let from_file = KindPolicy::from_toml(r#"idle_timeout = "none""#).unwrap();
/// assert_eq!(from_file.idle_timeout, None);
/// // A runtime-wide knob is refused, named.
/// let err = KindPolicy::from_toml("max_concurrent_reconciles = 8").unwrap_err();
/// assert!(err.to_string().contains("max_concurrent_reconciles"));
/// ```
///
/// Its `Deserialize` ignores keys it does not know (it is flattened into
/// [`SupervisorPolicy`], beside the other parts' keys); [`KindPolicy::from_toml`] refuses them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct KindPolicy {
    /// Restart of failed (erroring or panicking) resource actors.
    pub restart: RestartPolicy,
    /// Per-resource backoff after a transient failure: a reconcile that failed, or a status write
    /// that failed (a conflict is retried soon, on the newer object).
    pub error_backoff: BackoffPolicy,
    /// Delay after a `Yield` without an explicit `after`.
    #[serde(with = "humantime_serde")]
    pub yield_delay: Duration,
    /// Re-run Ready resources this often to detect drift (`None`: never; `"none"` in TOML).
    #[serde(with = "optional_duration")]
    pub poll_interval: Option<Duration>,
    /// Jitter of the poll interval, a fraction in `[0, 1]`.
    pub poll_jitter: f64,
    /// Slow fallback re-check while waiting on a dependency.
    #[serde(with = "humantime_serde")]
    pub dependency_poll: Duration,
    /// Live resource actors per kind beyond which activations (new objects, re-activations)
    /// wait in the manager's queue for a live actor to passivate (`None`: no cap). One still
    /// starts every 10 ms while the cap is reached, so actors that stay live (wake-ups due
    /// within the idle timeout) slow new objects down but cannot starve them. Idle actors kept
    /// for adoption (at most one per reconcile slot, never more than the cap) are not live: they
    /// serve no object.
    ///
    /// A cap bounds the memory a burst of new objects takes (every live actor holds its
    /// object and a task) and how many objects are in progress at once. When reconciles are
    /// CPU-bound, that is also how long each waits for its turn. When reconciles wait on I/O, fewer
    /// objects in progress means a burst takes longer: compare in `actorcile simulate` before
    /// setting it (BENCHMARKS.md has such a comparison).
    ///
    /// Without a cap, a CPU-bound burst is still worked through a part at a time: while reconciles
    /// start late because the workers fall behind, the runtime holds activations back by
    /// itself. Set a cap when memory needs a hard bound.
    pub max_live_actors: Option<usize>,
    /// Passivation horizon: a resource actor with no reconcile pending and no wake-up due within
    /// this long hands its object back as soon as its reconcile ends, instead of idling with it
    /// (`None`: never; `"none"` in TOML); the actor then adopts the next activation of its kind.
    /// An actor in a yield loop shorter than this stays live between reconciles.
    #[serde(with = "optional_duration")]
    pub idle_timeout: Option<Duration>,
    /// A provision or deprovision reconcile still running after this long is stopped (its future is
    /// dropped at its next await point) and counts as a transient failure with reason
    /// `ReconcileTimeout`, retried with the error backoff (`None`: never; `"none"` in TOML). A
    /// provisioner that hangs then holds a reconcile slot this long at most. Longer than the longest
    /// reconcile: a provisioner that waits on something slow yields instead.
    #[serde(with = "optional_duration", alias = "run_timeout")]
    pub reconcile_timeout: Option<Duration>,
    /// A write the runtime makes itself (the finalizer, the status subresource, the shard
    /// label, a reference's release, an Event) still unanswered after this long is abandoned
    /// and fails as a transient error, retried with the error backoff like any other (`None`:
    /// never; `"none"` in TOML). Without it a write can hold its object for minutes: kube's
    /// client retries 429, 503 and 504 answers itself (by default up to 15 times, waiting for
    /// the server's `Retry-After` or a backoff that grows to minutes; a starting kube-apiserver
    /// answers requests for custom resources 503 with `Retry-After: 10`), and sets no read
    /// timeout, so a request the server never answers waits for good. The default is kube-apiserver's own request timeout
    /// (`--request-timeout`, 60 s).
    #[serde(with = "optional_duration")]
    pub write_timeout: Option<Duration>,
    /// How long a lock taken by a guarded step
    /// ([`Context::guard`](crate::provisioners::Context::guard)) holds: a runtime that dies in
    /// the middle of the task holds the object back this long at most, and a task is dropped
    /// when it runs past it. Longer than the longest guarded task.
    #[serde(with = "humantime_serde")]
    pub lock_expiry: Duration,
    /// Seed for jitter (`None`: random). Set it for reproducible simulations.
    pub seed: Option<u64>,
}

impl Default for KindPolicy {
    fn default() -> Self {
        Self {
            restart: RestartPolicy::default(),
            error_backoff: BackoffPolicy {
                min: Duration::from_millis(200),
                max: Duration::from_secs(300),
                factor: 2.0,
                jitter: true,
                reset_after: Duration::from_secs(300),
            },
            yield_delay: Duration::from_secs(5),
            poll_interval: None,
            poll_jitter: 0.1,
            dependency_poll: Duration::from_secs(60),
            max_live_actors: None,
            idle_timeout: Some(Duration::from_secs(30)),
            reconcile_timeout: Some(Duration::from_secs(600)),
            write_timeout: Some(Duration::from_secs(60)),
            lock_expiry: Duration::from_secs(300),
            seed: None,
        }
    }
}

impl KindPolicy {
    /// Parse a TOML policy of a kind: these fields only; missing ones take their defaults.
    pub fn from_toml(text: &str) -> Result<Self, PolicyError> {
        let p = strict_kind(parse_toml(text)?)?;
        p.validate()?;
        Ok(p)
    }

    /// Read [`KindPolicy::from_toml`] from a file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, PolicyError> {
        read_file(path.as_ref(), Self::from_toml)
    }

    /// Check values a type cannot express.
    pub fn validate(&self) -> Result<(), PolicyError> {
        self.restart.backoff.validate("restart.backoff")?;
        self.error_backoff.validate("error_backoff")?;
        let optional = |d: Option<Duration>| d.unwrap_or_default();
        for (field, d) in [
            ("yield_delay", self.yield_delay),
            ("poll_interval", optional(self.poll_interval)),
            ("dependency_poll", self.dependency_poll),
            ("idle_timeout", optional(self.idle_timeout)),
            ("reconcile_timeout", optional(self.reconcile_timeout)),
            ("write_timeout", optional(self.write_timeout)),
            ("lock_expiry", self.lock_expiry),
            ("restart.window", self.restart.window),
        ] {
            at_most_a_year(field, d)?;
        }
        // Each re-runs objects after it: zero would re-run them without pause.
        for (field, d) in [
            ("yield_delay", self.yield_delay),
            ("dependency_poll", self.dependency_poll),
        ] {
            if d.is_zero() {
                return Err(PolicyError::invalid(field, "must be longer than zero"));
            }
        }
        if self.max_live_actors.is_some_and(|n| n > MAX_CONCURRENCY) {
            return Err(PolicyError::invalid(
                "max_live_actors",
                format!("must be at most {MAX_CONCURRENCY}"),
            ));
        }
        if self.max_live_actors == Some(0) {
            return Err(PolicyError::invalid(
                "max_live_actors",
                "must be at least 1",
            ));
        }
        let positive = [
            (
                "lock_expiry",
                Some(self.lock_expiry),
                "must be longer than zero",
            ),
            (
                "restart.window",
                Some(self.restart.window),
                "must be longer than zero",
            ),
            (
                "poll_interval",
                self.poll_interval,
                "must be longer than zero (or none)",
            ),
            (
                "idle_timeout",
                self.idle_timeout,
                "must be longer than zero (or omitted)",
            ),
            (
                "reconcile_timeout",
                self.reconcile_timeout,
                "must be longer than zero (or \"none\")",
            ),
            (
                "write_timeout",
                self.write_timeout,
                "must be longer than zero (or \"none\")",
            ),
        ];
        if let Some((field, _, problem)) = positive
            .iter()
            .find(|(_, d, _)| d.is_some_and(|d| d.is_zero()))
        {
            return Err(PolicyError::invalid(*field, *problem));
        }
        if !(0.0..=1.0).contains(&self.poll_jitter) {
            return Err(PolicyError::invalid("poll_jitter", "must be within [0, 1]"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::SupervisorPolicy;

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
        assert_eq!(KindPolicy::default(), SupervisorPolicy::default().kind);
    }
}
