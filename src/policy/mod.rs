//! The supervisor policy: how resource actors are restarted, backed off, woken and limited.
//!
//! [`SupervisorPolicy`] is the runtime's ([`RuntimeBuilder::policy`]): every kind's defaults,
//! and the runtime-wide limits and Lease timings. [`KindPolicy`] is its per-kind part, which a
//! controller may set for its own kind ([`Controller::policy`]).
//!
//! [`RuntimeBuilder::policy`]: crate::runtime::RuntimeBuilder::policy
//! [`Controller::policy`]: crate::runtime::Controller::policy
//!
//! Modelled on OTP supervisors and Akka's backoff supervisor. Every knob has a default and can be
//! set in code or loaded from TOML, where durations are human-readable (`"250ms"`, `"10s"`,
//! `"5m"`):
//!
//! ```
//! use actorcile::policy::{SupervisorPolicy, Exhausted};
//! let p = SupervisorPolicy::from_toml(r#"
//!     yield_delay = "2s"
//!     max_concurrent_reconciles = 32
//!     [restart]
//!     max_restarts = 3
//!     window = "1m"
//!     on_exhausted = "quarantine"
//!     [restart.backoff]
//!     min = "100ms"
//!     max = "30s"
//! "#).unwrap();
//! assert_eq!(p.max_concurrent_reconciles, 32);
//! assert_eq!(p.restart.on_exhausted, Exhausted::Quarantine);
//!
//! let err = SupervisorPolicy::from_toml("yield_delay = \"soon\"").unwrap_err();
//! assert!(err.to_string().contains("yield_delay"));
//! ```
//!
//! | knob | default | meaning |
//! |---|---|---|
//! | `restart.max_restarts` / `restart.window` | 5 in 60 s | restart intensity: more failures than this within the window and `on_exhausted` applies |
//! | `restart.on_exhausted` | `quarantine` | `quarantine`: phase Failed, reason Quarantined, no restarts until the object's generation changes (an object being deleted is tried again after `error_backoff.max`, so its finalizer is not left behind); `escalate`: the kind's manager fails and the runtime stops with an error |
//! | `restart.backoff` | 100 ms … 30 s, ×2, jitter, reset after 60 s | delay before restarting a failed actor |
//! | `error_backoff` | 200 ms … 5 min, ×2, jitter | per-resource delay after a transient failure (a failed reconcile, or a failed write of its status); resets on success |
//! | `yield_delay` | 5 s | delay after a `Yield` without `after` |
//! | `poll_interval` | none | re-run Ready resources this often to detect drift (with `poll_jitter`, a fraction) |
//! | `dependency_poll` | 60 s | slow fallback re-check while waiting on a dependency (covers targets outside this runtime) |
//! | `dependency_watch_idle` | 5 m | a watch of a kind the runtime does not manage (started by `require_ready` on one of its objects) stops once nobody has waited on its objects for this long |
//! | `max_concurrent_reconciles` | 64 | provisioner runs in flight across the runtime |
//! | `max_live_actors` | none | live resource actors per kind beyond which new activations wait for one to passivate (one still starts every 10 ms, so actors that stay live cannot starve new objects): a hard bound on the memory of a burst of new objects (CPU-bound bursts are held back without it while reconciles run late). Slows bursts whose reconciles wait on I/O: try it in `actorcile simulate` first |
//! | `idle_timeout` | 30 s | an actor with nothing due within this long — no reconcile pending, no wake-up sooner — passivates as soon as its reconcile ends (hands its object back to the manager, which keeps its timer, and waits idle to serve the next activation; the object is re-activated by its next event, timer or message); `none` never |
//! | `shutdown_timeout` | 30 s | how long graceful shutdown waits for in-flight runs |
//! | `reconcile_timeout` | 10 m | a provision or deprovision reconcile still running after this long is stopped (its future dropped) and counts as a failure, reason `ReconcileTimeout`, retried with `error_backoff`; `none` never |
//! | `write_timeout` | 60 s | a write of the runtime's own (finalizer, status, shard label, reference release, Event) unanswered after this long is abandoned and retried with `error_backoff`, like any transient failure; `none` never |
//! | `lock_expiry` | 5 m | how long a guarded step's lock holds: a runtime that dies mid-task holds its object back this long at most; a task running past it is dropped |
//! | `lease_duration` | 15 s | leader election and sharding: how long a Lease whose record stood still blocks candidates (whole seconds) |
//! | `lease_renew_deadline` | 10 s | leader election and sharding: the leader (a shard's holder) stops every run (of the shard) once it has not renewed for this long (shorter than `lease_duration`: the difference is the fencing margin) |
//! | `lease_retry_period` | 2 s | leader election and sharding: how often candidates try and holders renew |

mod kind;
pub(crate) mod restarts;

pub use kind::KindPolicy;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use serde::{Deserialize, Serialize};

/// Everything the manager supervisor and the resource actors are tuned by.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SupervisorPolicy {
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
    /// A watch of a kind the runtime does not manage, started when a provisioner first waits
    /// on one of its objects, stops once nobody has waited on any of its objects for this long.
    /// (The runtime's policy applies; a controller's own policy does not.)
    #[serde(with = "humantime_serde")]
    pub dependency_watch_idle: Duration,
    /// Reconciles in flight across the runtime (`max_concurrent_runs` in older files).
    #[serde(alias = "max_concurrent_runs")]
    pub max_concurrent_reconciles: usize,
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
    /// How long graceful shutdown waits for in-flight runs.
    #[serde(with = "humantime_serde")]
    pub shutdown_timeout: Duration,
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
    /// Leader election and sharding ([`crate::sharding`]): how long a Lease whose record stood
    /// still blocks candidates. Whole seconds (the Lease API counts seconds).
    #[serde(with = "humantime_serde")]
    pub lease_duration: Duration,
    /// Leader election and sharding: the leader (a shard's holder) stops every run (of the
    /// shard) once it has not renewed the Lease for this long. Shorter than `lease_duration`.
    #[serde(with = "humantime_serde")]
    pub lease_renew_deadline: Duration,
    /// Leader election and sharding: how often candidates try to take a Lease and holders renew
    /// it.
    #[serde(with = "humantime_serde")]
    pub lease_retry_period: Duration,
    /// Seed for jitter (`None`: random). Set it for reproducible simulations.
    pub seed: Option<u64>,
    /// One kind's own knobs, by the kind's name (`Database`): the `[kinds.Database]` section of
    /// a policy file. [`SupervisorPolicy::from_toml`] fills a section's missing fields from the
    /// file's top level. The controllers of that kind run by it, unless their
    /// [`Controller::policy`](crate::runtime::Controller::policy) sets one in code: then the
    /// runtime refuses to start (the two would contradict each other), as it does for a
    /// section that names no controller's kind.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub kinds: BTreeMap<String, KindPolicy>,
}

impl Default for SupervisorPolicy {
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
            dependency_watch_idle: Duration::from_secs(300),
            max_concurrent_reconciles: 64,
            max_live_actors: None,
            idle_timeout: Some(Duration::from_secs(30)),
            shutdown_timeout: Duration::from_secs(30),
            reconcile_timeout: Some(Duration::from_secs(600)),
            write_timeout: Some(Duration::from_secs(60)),
            lock_expiry: Duration::from_secs(300),
            lease_duration: Duration::from_secs(15),
            lease_renew_deadline: Duration::from_secs(10),
            lease_retry_period: Duration::from_secs(2),
            seed: None,
            kinds: BTreeMap::new(),
        }
    }
}

/// `text` as TOML, its error named as a parse error.
fn parse_toml<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, PolicyError> {
    toml::from_str(text).map_err(|e| PolicyError::Parse(e.to_string()))
}

/// A policy from a parsed TOML table, its error named as a parse error.
fn deserialize<T: serde::de::DeserializeOwned>(table: toml::Table) -> Result<T, PolicyError> {
    T::deserialize(table).map_err(|e| PolicyError::Parse(e.to_string()))
}

/// The `[kinds.<Kind>]` sections, each over `base` (the top level's per-kind knobs): a field a
/// section does not set is the top level's (nested tables such as `restart` field by field).
fn kind_sections(
    sections: toml::Value,
    base: &KindPolicy,
) -> Result<BTreeMap<String, KindPolicy>, PolicyError> {
    let toml::Value::Table(sections) = sections else {
        return Err(PolicyError::Parse(
            "`kinds` must be a table of [kinds.<Kind>] sections".into(),
        ));
    };
    let base = toml::Table::try_from(base).map_err(|e| PolicyError::Parse(e.to_string()))?;
    let mut kinds = BTreeMap::new();
    for (kind, section) in sections {
        let toml::Value::Table(section) = section else {
            return Err(PolicyError::Parse(format!(
                "kinds.{kind} must be a table ([kinds.{kind}])"
            )));
        };
        let mut merged = base.clone();
        overlay(&mut merged, with_current_names(section));
        let policy = deserialize(merged).map_err(|e| match e {
            PolicyError::Parse(m) => PolicyError::Parse(format!("[kinds.{kind}]: {m}")),
            other => other,
        })?;
        kinds.insert(kind, policy);
    }
    Ok(kinds)
}

/// The per-kind keys' names before `reconcile` became the one word (the fields' serde
/// aliases), and their names now.
const OLD_NAMES: &[(&str, &str)] = &[("run_timeout", "reconcile_timeout")];

/// `section` with its keys' current names, so that an old name in a section overrides the top
/// level's field rather than standing beside it.
fn with_current_names(mut section: toml::Table) -> toml::Table {
    for (old, new) in OLD_NAMES {
        if let Some(v) = section.remove(*old) {
            section.insert((*new).into(), v);
        }
    }
    section
}

/// `over`'s entries in `under`; tables in both are overlaid key by key.
fn overlay(under: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        match (under.get_mut(&key), value) {
            (Some(toml::Value::Table(u)), toml::Value::Table(o)) => overlay(u, o),
            (_, value) => {
                under.insert(key, value);
            }
        }
    }
}

/// `from_toml` of the file at `path`; a parse error names the file.
fn read_file<T>(
    path: &Path,
    from_toml: impl FnOnce(&str) -> Result<T, PolicyError>,
) -> Result<T, PolicyError> {
    let text = std::fs::read_to_string(path).map_err(|source| PolicyError::Io {
        path: path.display().to_string(),
        source,
    })?;
    from_toml(&text).map_err(|e| match e {
        PolicyError::Parse(m) => PolicyError::Parse(format!("{}: {m}", path.display())),
        other => other,
    })
}

/// An optional duration in TOML, which has no null: a humantime string (`"30s"`) or `"none"`.
mod optional_duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => {
                s.serialize_str(&humantime_serde::re::humantime::format_duration(*d).to_string())
            }
            None => s.serialize_str("none"),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let text = String::deserialize(d)?;
        match text.trim() {
            "none" | "never" | "off" => Ok(None),
            t => humantime_serde::re::humantime::parse_duration(t)
                .map(Some)
                .map_err(|e| serde::de::Error::custom(format!("{t:?}: {e} (or \"none\")"))),
        }
    }
}

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

    fn validate(&self, field: &str) -> Result<(), PolicyError> {
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

/// The longest duration a policy may hold: one year. Deadlines are computed from them
/// (`now + duration`), which overflows or outgrows the timers' range for absurd values; no
/// runtime setting needs more.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// The most runs at once a policy may allow (`max_concurrent_reconciles`), and live actors
/// (`max_live_actors`).
pub const MAX_CONCURRENCY: usize = 1 << 20;

fn at_most_a_year(field: &str, d: Duration) -> Result<(), PolicyError> {
    if d > MAX_DURATION {
        return Err(PolicyError::invalid(
            field,
            format!("{d:?} is longer than the most a policy holds, one year"),
        ));
    }
    Ok(())
}

/// An invalid policy.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The file could not be read.
    #[error("cannot read policy file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The TOML does not parse or names an unknown or mistyped field (the message names it).
    #[error("invalid policy: {0}")]
    Parse(String),
    /// A field has an invalid value.
    #[error("invalid policy: field `{field}` {reason}")]
    Invalid {
        /// Dotted path of the field.
        field: String,
        /// What is wrong.
        reason: String,
    },
}

impl PolicyError {
    fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        PolicyError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// A lease duration as a Lease's `leaseDurationSeconds` (whole seconds; a validated policy
/// holds at most a year, far below the field's `i32`).
pub(crate) fn lease_seconds(duration: Duration) -> i32 {
    i32::try_from(duration.as_secs()).unwrap_or(i32::MAX)
}

impl SupervisorPolicy {
    /// Check that the policy's lease timings fit together (leader election and sharding share
    /// them): the failing field and why.
    pub(crate) fn check_lease_timings(&self) -> Result<(), (&'static str, String)> {
        let (duration, deadline, retry) = (
            self.lease_duration,
            self.lease_renew_deadline,
            self.lease_retry_period,
        );
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

    /// Parse and validate a policy from TOML; missing fields take their defaults, and a
    /// `[kinds.<Kind>]` section's missing fields the top level's.
    ///
    /// ```
    /// use std::time::Duration;
    /// use actorcile::policy::SupervisorPolicy;
    ///
    /// let p = SupervisorPolicy::from_toml(r#"
    ///     yield_delay = "2s"
    ///     reconcile_timeout = "5m"
    ///     [kinds.Database]
    ///     reconcile_timeout = "1h"
    /// "#).unwrap();
    /// let db = &p.kinds["Database"];
    /// assert_eq!(db.reconcile_timeout, Some(Duration::from_secs(3600)));
    /// assert_eq!(db.yield_delay, Duration::from_secs(2)); // from the top level
    ///
    /// // A runtime-wide knob in a kind's section is refused, named.
    /// let err = SupervisorPolicy::from_toml("[kinds.Database]\nmax_concurrent_reconciles = 8")
    ///     .unwrap_err();
    /// assert!(err.to_string().contains("kinds.Database"), "{err}");
    /// ```
    pub fn from_toml(text: &str) -> Result<Self, PolicyError> {
        let mut table: toml::Table = parse_toml(text)?;
        let sections = table.remove("kinds");
        let mut p: Self = deserialize(table)?;
        if let Some(sections) = sections {
            p.kinds = kind_sections(sections, &p.kind_policy())?;
        }
        p.validate()?;
        Ok(p)
    }

    /// Read [`SupervisorPolicy::from_toml`] from a file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, PolicyError> {
        read_file(path.as_ref(), Self::from_toml)
    }

    /// Check values a type cannot express.
    pub fn validate(&self) -> Result<(), PolicyError> {
        for (kind, policy) in &self.kinds {
            self.with_kind(policy).validate_own().map_err(|e| match e {
                PolicyError::Invalid { field, reason } => PolicyError::Invalid {
                    field: format!("kinds.{kind}.{field}"),
                    reason,
                },
                other => other,
            })?;
        }
        self.validate_own()
    }

    /// [`SupervisorPolicy::validate`] without the `kinds` sections.
    fn validate_own(&self) -> Result<(), PolicyError> {
        self.restart.backoff.validate("restart.backoff")?;
        self.error_backoff.validate("error_backoff")?;
        let optional = |d: Option<Duration>| d.unwrap_or_default();
        for (field, d) in [
            ("yield_delay", self.yield_delay),
            ("poll_interval", optional(self.poll_interval)),
            ("dependency_poll", self.dependency_poll),
            ("dependency_watch_idle", self.dependency_watch_idle),
            ("idle_timeout", optional(self.idle_timeout)),
            ("shutdown_timeout", self.shutdown_timeout),
            ("reconcile_timeout", optional(self.reconcile_timeout)),
            ("write_timeout", optional(self.write_timeout)),
            ("lock_expiry", self.lock_expiry),
            ("lease_duration", self.lease_duration),
            ("lease_renew_deadline", self.lease_renew_deadline),
            ("lease_retry_period", self.lease_retry_period),
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
        if self.max_concurrent_reconciles == 0 || self.max_concurrent_reconciles > MAX_CONCURRENCY {
            return Err(PolicyError::invalid(
                "max_concurrent_reconciles",
                format!("must be 1 to {MAX_CONCURRENCY}"),
            ));
        }
        if self.max_live_actors.is_some_and(|n| n > MAX_CONCURRENCY) {
            return Err(PolicyError::invalid(
                "max_live_actors",
                format!("must be at most {MAX_CONCURRENCY}"),
            ));
        }
        if self.lock_expiry.is_zero() {
            return Err(PolicyError::invalid(
                "lock_expiry",
                "must be longer than zero",
            ));
        }
        if self.poll_interval.is_some_and(|p| p.is_zero()) {
            return Err(PolicyError::invalid(
                "poll_interval",
                "must be longer than zero (or none)",
            ));
        }
        if self.dependency_watch_idle.is_zero() {
            return Err(PolicyError::invalid(
                "dependency_watch_idle",
                "must be longer than zero",
            ));
        }
        if self.max_live_actors == Some(0) {
            return Err(PolicyError::invalid(
                "max_live_actors",
                "must be at least 1",
            ));
        }
        if self.restart.window.is_zero() {
            return Err(PolicyError::invalid(
                "restart.window",
                "must be longer than zero",
            ));
        }
        if !(0.0..=1.0).contains(&self.poll_jitter) {
            return Err(PolicyError::invalid("poll_jitter", "must be within [0, 1]"));
        }
        if self.idle_timeout.is_some_and(|d| d.is_zero()) {
            return Err(PolicyError::invalid(
                "idle_timeout",
                "must be longer than zero (or omitted)",
            ));
        }
        if self.reconcile_timeout.is_some_and(|d| d.is_zero()) {
            return Err(PolicyError::invalid(
                "reconcile_timeout",
                "must be longer than zero (or \"none\")",
            ));
        }
        if self.write_timeout.is_some_and(|d| d.is_zero()) {
            return Err(PolicyError::invalid(
                "write_timeout",
                "must be longer than zero (or \"none\")",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
