//! The supervisor policy: how resource actors are restarted, backed off, woken and limited.
//!
//! [`SupervisorPolicy`] is the runtime's ([`RuntimeBuilder::policy`]), made of three parts:
//! [`KindPolicy`], every kind's defaults (which a `[kinds.<Kind>]` section, or a controller's
//! own, [`Controller::policy`], replaces for one kind); [`RuntimePolicy`], the limits every kind
//! shares; and [`LeasePolicy`], the Lease timings. In a TOML file the three parts' keys stand
//! side by side at the top level.
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
//! assert_eq!(p.runtime.max_concurrent_reconciles, 32);
//! assert_eq!(p.kind.restart.on_exhausted, Exhausted::Quarantine);
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
//! | `max_concurrent_reconciles` | 64 | reconciles in flight across the runtime |
//! | `max_live_actors` | none | live resource actors per kind beyond which new activations wait for one to passivate (one still starts every 10 ms, so actors that stay live cannot starve new objects): a hard bound on the memory of a burst of new objects (CPU-bound bursts are held back without it while reconciles run late). Slows bursts whose reconciles wait on I/O: try it in `actorcile simulate` first |
//! | `idle_timeout` | 30 s | an actor with nothing due within this long — no reconcile pending, no wake-up sooner — passivates as soon as its reconcile ends (hands its object back to the manager, which keeps its timer, and waits idle to serve the next activation; the object is re-activated by its next event, timer or message); `none` never |
//! | `shutdown_timeout` | 30 s | how long graceful shutdown waits for in-flight reconciles |
//! | `reconcile_timeout` | 10 m | a provision or deprovision reconcile still running after this long is stopped (its future dropped) and counts as a failure, reason `ReconcileTimeout`, retried with `error_backoff`; `none` never |
//! | `write_timeout` | 60 s | a write of the runtime's own (finalizer, status, shard label, reference release, Event) unanswered after this long is abandoned and retried with `error_backoff`, like any transient failure; `none` never |
//! | `lock_expiry` | 5 m | how long a guarded step's lock holds: a runtime that dies mid-task holds its object back this long at most; a task running past it is dropped |
//! | `lease_duration` | 15 s | leader election and sharding: how long a Lease whose record stood still blocks candidates (whole seconds) |
//! | `lease_renew_deadline` | 10 s | leader election and sharding: the leader (a shard's holder) stops every reconcile (of the shard) once it has not renewed for this long (shorter than `lease_duration`: the difference is the fencing margin) |
//! | `lease_retry_period` | 2 s | leader election and sharding: how often candidates try and holders renew |

mod backoff;
mod kind;
pub(crate) mod restarts;
mod runtime_wide;

pub use backoff::{BackoffPolicy, Exhausted, RestartPolicy};
pub use kind::KindPolicy;
pub use runtime_wide::{LeasePolicy, RuntimePolicy};

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Everything the manager supervisors and the resource actors are tuned by, in three parts.
///
/// ```
/// use std::time::Duration;
/// use actorcile::policy::{KindPolicy, SupervisorPolicy};
///
/// let policy = SupervisorPolicy {
///     kind: KindPolicy {
///         yield_delay: Duration::from_secs(2),
///         ..Default::default()
///     },
///     ..Default::default()
/// };
/// assert_eq!(policy.runtime.max_concurrent_reconciles, 64);
/// ```
///
/// Deserializing it refuses keys none of its parts knows, naming them.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SupervisorPolicy {
    /// Every kind's knobs, unless a `[kinds.<Kind>]` section or the kind's controller
    /// ([`Controller::policy`](crate::runtime::Controller::policy)) sets its own.
    #[serde(flatten)]
    pub kind: KindPolicy,
    /// The limits every kind shares.
    #[serde(flatten)]
    pub runtime: RuntimePolicy,
    /// Leader election's and sharding's Lease timings.
    #[serde(flatten)]
    pub lease: LeasePolicy,
    /// One kind's own knobs, by the kind's name (`Database`): the `[kinds.Database]` section of
    /// a policy file. [`SupervisorPolicy::from_toml`] fills a section's missing fields from the
    /// file's top level. The controllers of that kind run by it, unless their
    /// [`Controller::policy`](crate::runtime::Controller::policy) sets one in code: then the
    /// runtime refuses to start (the two would contradict each other), as it does for a
    /// section that names no controller's kind.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub kinds: BTreeMap<String, KindPolicy>,
}

/// A [`SupervisorPolicy`] as serde reads it: the three parts, the sections, and whatever keys
/// none of them knows (`deny_unknown_fields` does not work beside `flatten`).
#[derive(Deserialize)]
struct Parts {
    #[serde(flatten)]
    kind: KindPolicy,
    #[serde(flatten)]
    runtime: RuntimePolicy,
    #[serde(flatten)]
    lease: LeasePolicy,
    #[serde(default)]
    kinds: BTreeMap<String, Strict<KindPolicy>>,
    #[serde(flatten)]
    unknown: BTreeMap<String, serde::de::IgnoredAny>,
}

impl<'de> Deserialize<'de> for SupervisorPolicy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let parts = Parts::deserialize(d)?;
        refuse_unknown(&parts.unknown)?;
        let kinds = parts
            .kinds
            .into_iter()
            .map(|(kind, section)| match section.known::<D::Error>() {
                Ok(p) => Ok((kind, p)),
                Err(e) => Err(serde::de::Error::custom(format!("[kinds.{kind}]: {e}"))),
            })
            .collect::<Result<_, D::Error>>()?;
        Ok(SupervisorPolicy {
            kind: parts.kind,
            runtime: parts.runtime,
            lease: parts.lease,
            kinds,
        })
    }
}

/// A `T` read with the keys it does not know beside it, refused by [`Strict::known`].
#[derive(Deserialize)]
pub(crate) struct Strict<T> {
    #[serde(flatten)]
    known: T,
    #[serde(flatten)]
    unknown: BTreeMap<String, serde::de::IgnoredAny>,
}

impl<T> Strict<T> {
    /// The `T`, if there was no key it does not know.
    pub(crate) fn known<E: serde::de::Error>(self) -> Result<T, E> {
        refuse_unknown(&self.unknown)?;
        Ok(self.known)
    }

    /// [`Strict::known`], its error a parse error.
    pub(crate) fn known_or_parse_error(self) -> Result<T, PolicyError> {
        self.known::<serde::de::value::Error>()
            .map_err(|e| PolicyError::Parse(e.to_string()))
    }
}

/// An error naming the first of `unknown`'s keys, if any.
fn refuse_unknown<E: serde::de::Error>(
    unknown: &BTreeMap<String, serde::de::IgnoredAny>,
) -> Result<(), E> {
    match unknown.keys().next() {
        Some(key) => Err(E::custom(format!("unknown field `{key}`"))),
        None => Ok(()),
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
        let policy = strict_kind(merged).map_err(|e| match e {
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

/// A [`KindPolicy`] from `table`, refusing keys it does not know: read on its own first, so
/// that a bad value's error names its key (see [`SupervisorPolicy::from_toml`]).
pub(crate) fn strict_kind(table: toml::Table) -> Result<KindPolicy, PolicyError> {
    deserialize::<KindPolicy>(table.clone())?;
    deserialize::<Strict<KindPolicy>>(table).and_then(Strict::known_or_parse_error)
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
#[non_exhaustive]
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
        // Each part read on its own first: a bad value's error then names its key (serde's
        // `flatten`, which reads the parts together, loses the key from the message).
        deserialize::<KindPolicy>(table.clone())?;
        deserialize::<RuntimePolicy>(table.clone())?;
        deserialize::<LeasePolicy>(table.clone())?;
        let mut p: Self = deserialize(table)?;
        if let Some(sections) = sections {
            p.kinds = kind_sections(sections, &p.kind)?;
        }
        p.validate()?;
        Ok(p)
    }

    /// Read [`SupervisorPolicy::from_toml`] from a file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, PolicyError> {
        read_file(path.as_ref(), Self::from_toml)
    }

    /// Check values a type cannot express, part by part and section by section.
    pub fn validate(&self) -> Result<(), PolicyError> {
        for (kind, policy) in &self.kinds {
            policy.validate().map_err(|e| match e {
                PolicyError::Invalid { field, reason } => PolicyError::Invalid {
                    field: format!("kinds.{kind}.{field}"),
                    reason,
                },
                other => other,
            })?;
        }
        self.kind.validate()?;
        self.runtime.validate()?;
        self.lease.validate()
    }

    /// The knobs of the kind named `kind`: its `[kinds.<kind>]` section, or the top level's.
    pub fn for_kind(&self, kind: &str) -> &KindPolicy {
        self.kinds.get(kind).unwrap_or(&self.kind)
    }
}

#[cfg(test)]
mod tests;
