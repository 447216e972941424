//! The result of one provision or deprovision reconcile, and how results of siblings merge.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::references::Target;
use crate::status::{Phase, ReadyReason, ResourceStatus};

/// A typed, user-readable explanation attached to a non-done [`Outcome`].
///
/// A reason has a machine-readable `code` and a message meant for the resource's owner. The
/// code becomes the `reason` of the object's `Ready` condition and the message its `message`,
/// verbatim, so `kubectl wait`, alerts and CD health checks can key on the code; the phase says
/// the category (see [`ResourceStatus::after_provision`]). It is **never** raw error text:
/// internal errors travel in [`Outcome::Failed::errors`] and go to logs and Events, not to status.
///
/// The code must be a valid Kubernetes condition reason (CamelCase: see
/// [`is_valid_reason`](crate::status::is_valid_reason)); [`Reason::try_new`] checks it when the
/// reason is made. A reason made with [`Reason::new`] and an invalid code is never written: the
/// runtime writes its own reason for the outcome instead, logs the invalid code and publishes a
/// Warning Event. Messages longer than
/// [`MAX_MESSAGE_LEN`](crate::status::MAX_MESSAGE_LEN) are cut.
///
/// ```
/// use actorcile::provisioners::Reason;
/// let r = Reason::new("ReplicasInvalid", "spec.replicas must be between 1 and 10");
/// assert_eq!(r.code(), "ReplicasInvalid");
/// assert!(Reason::try_new("Replicas invalid", "a space is not allowed").is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Reason {
    code: Cow<'static, str>,
    message: Cow<'static, str>,
}

/// A reason code that is not a valid Kubernetes condition reason.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{code:?} is not a valid condition reason (CamelCase letters, digits, '_', ',' and ':'; at most 1024)"
)]
pub struct InvalidReason {
    /// The code given.
    pub code: String,
}

impl Reason {
    /// A reason with a code and a human-readable message (cut at
    /// [`MAX_MESSAGE_LEN`](crate::status::MAX_MESSAGE_LEN)). The code is not checked here: see
    /// [`Reason::try_new`].
    pub fn new(code: impl Into<Cow<'static, str>>, message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            code: code.into(),
            message: bounded(message.into()),
        }
    }

    /// A reason whose code is checked against the Kubernetes condition-reason rule.
    pub fn try_new(
        code: impl Into<Cow<'static, str>>,
        message: impl Into<Cow<'static, str>>,
    ) -> Result<Self, InvalidReason> {
        let r = Self::new(code, message);
        if r.has_valid_code() {
            Ok(r)
        } else {
            Err(InvalidReason {
                code: r.code.into_owned(),
            })
        }
    }

    /// The machine-readable code, e.g. `WaitingForDatabase`.
    pub fn code(&self) -> &str {
        &self.code
    }

    /// The message shown to the resource's owner.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether the code is a valid condition reason (and so is written to status as it is).
    pub fn has_valid_code(&self) -> bool {
        crate::status::is_valid_reason(&self.code)
    }
}

/// `message` cut to at most [`MAX_MESSAGE_LEN`](crate::status::MAX_MESSAGE_LEN) bytes, at a
/// character boundary.
fn bounded(message: Cow<'static, str>) -> Cow<'static, str> {
    let end = crate::status::prefix_within(&message, crate::status::MAX_MESSAGE_LEN).len();
    if end == message.len() {
        return message;
    }
    match message {
        Cow::Borrowed(s) => Cow::Borrowed(&s[..end]),
        Cow::Owned(mut s) => {
            s.truncate(end);
            Cow::Owned(s)
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

/// An internal error carried by [`Outcome::Failed`], for logs and Events only.
pub type ProvisionError = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// What one reconcile of a provisioner achieved.
///
/// Provisioners are revisited on every reconcile and must be idempotent; a provisioner that would
/// block on something external returns [`Outcome::Yield`] instead of waiting.
#[derive(Clone, Debug)]
pub enum Outcome {
    /// The step is in its desired state.
    Done,
    /// Not finished; try again later. `after: None` means the policy's default yield delay.
    Yield {
        /// When to look again (`None`: the policy's default yield delay).
        after: Option<Duration>,
        /// Why the step is not finished.
        reason: Reason,
    },
    /// Waiting until another managed resource is Ready (see [`Context::require_ready`](super::Context::require_ready)).
    /// The resource actor is woken by a message when it is.
    Waiting {
        /// The resource waited on.
        target: Target,
        /// Why it is waited on.
        reason: Reason,
    },
    /// A user error that retrying will not fix; no retry until the object changes.
    Terminal(Reason),
    /// The user must act (e.g. provide a secret); no retry until the object changes.
    UserActionRequired(Reason),
    /// A transient failure; retried with the per-resource error backoff.
    Failed {
        /// The user-facing summary.
        reason: Reason,
        /// Every underlying error (for logs and Events; never written to status).
        errors: Vec<ProvisionError>,
    },
}

impl Outcome {
    /// Yield with the policy's default delay.
    pub fn yield_now(reason: Reason) -> Self {
        Outcome::Yield {
            after: None,
            reason,
        }
    }

    /// Yield and look again after `after`.
    pub fn yield_after(after: Duration, reason: Reason) -> Self {
        Outcome::Yield {
            after: Some(after),
            reason,
        }
    }

    /// A transient failure from an error, with a typed reason for status.
    pub fn failed(reason: Reason, error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Outcome::Failed {
            reason,
            errors: vec![Arc::new(error)],
        }
    }

    /// A dependency outside Kubernetes that the provisioner names (a cloud volume, a DNS
    /// zone, an endpoint) is not ready yet: phase Progressing, reason `DependencyNotReady`, the
    /// message naming it; looked at again after `retry` (nothing watches it).
    ///
    /// ```
    /// use actorcile::provisioners::Outcome;
    /// use actorcile::status::{Phase, ResourceStatus};
    /// use std::time::Duration;
    /// let o = Outcome::dependency_not_ready("volume vol-0a1b", "attaching", Duration::from_secs(10));
    /// let s = ResourceStatus::default().after_provision(&o, Some(1));
    /// assert_eq!(s.ready().unwrap().reason, "DependencyNotReady");
    /// assert_eq!(s.ready().unwrap().message, "volume vol-0a1b: attaching");
    /// assert_eq!(s.phase, Some(Phase::Progressing));
    /// ```
    pub fn dependency_not_ready(
        dependency: impl fmt::Display,
        message: impl fmt::Display,
        retry: Duration,
    ) -> Self {
        Self::dependency(ReadyReason::DependencyNotReady, dependency, message, retry)
    }

    /// A dependency the provisioner names does not exist: phase Progressing, reason
    /// `DependencyNotFound`; looked at again after `retry`.
    pub fn dependency_not_found(
        dependency: impl fmt::Display,
        message: impl fmt::Display,
        retry: Duration,
    ) -> Self {
        Self::dependency(ReadyReason::DependencyNotFound, dependency, message, retry)
    }

    /// A dependency the provisioner names has failed: phase **Failed**, reason
    /// `DependencyFailed`; still looked at again after `retry`, since it may recover.
    ///
    /// ```
    /// use actorcile::provisioners::Outcome;
    /// use actorcile::status::{Phase, ResourceStatus};
    /// use std::time::Duration;
    /// let o = Outcome::dependency_failed("zone example.org", "delegation revoked", Duration::from_secs(60));
    /// let s = ResourceStatus::default().after_provision(&o, Some(1));
    /// assert_eq!(s.ready().unwrap().reason, "DependencyFailed");
    /// assert_eq!(s.phase, Some(Phase::Failed));
    /// ```
    pub fn dependency_failed(
        dependency: impl fmt::Display,
        message: impl fmt::Display,
        retry: Duration,
    ) -> Self {
        Self::dependency(ReadyReason::DependencyFailed, dependency, message, retry)
    }

    fn dependency(
        reason: ReadyReason,
        dependency: impl fmt::Display,
        message: impl fmt::Display,
        retry: Duration,
    ) -> Self {
        Outcome::Yield {
            after: Some(retry),
            reason: Reason::new(reason.as_str(), format!("{dependency}: {message}")),
        }
    }

    /// Whether this outcome says a dependency has failed (reason `DependencyFailed`): its
    /// status phase is Failed although the runtime looks again.
    fn dependency_failed_reason(&self) -> bool {
        matches!(self, Outcome::Yield { reason, .. } | Outcome::Waiting { reason, .. }
            if reason.code() == ReadyReason::DependencyFailed.as_str())
    }

    /// `true` for [`Outcome::Done`].
    pub fn is_done(&self) -> bool {
        matches!(self, Outcome::Done)
    }

    /// The reason of a non-done outcome.
    pub fn reason(&self) -> Option<&Reason> {
        match self {
            Outcome::Done => None,
            Outcome::Yield { reason, .. }
            | Outcome::Waiting { reason, .. }
            | Outcome::Terminal(reason)
            | Outcome::UserActionRequired(reason)
            | Outcome::Failed { reason, .. } => Some(reason),
        }
    }

    /// Rank used by [`Outcome::merge`]: higher wins.
    fn rank(&self) -> u8 {
        match self {
            Outcome::Done => 0,
            Outcome::Yield { .. } | Outcome::Waiting { .. } => 1,
            Outcome::UserActionRequired(_) => 2,
            Outcome::Failed { .. } => 3,
            Outcome::Terminal(_) => 4,
        }
    }

    /// Deterministically merge the outcomes of siblings that ran in the same reconcile.
    ///
    /// Precedence: `Terminal` > `Failed` > `UserActionRequired` > `Yield`/`Waiting` > `Done`.
    /// Among yields and waits the earliest wake-up wins (a wait on a dependency counts as "as soon
    /// as notified", a yield without `after` as the default delay, which sorts after explicit
    /// delays of zero only). Among failures, every child's errors are kept, in child order; the
    /// first failing child's reason is reported. Ties otherwise keep the earliest child.
    ///
    /// ```
    /// use actorcile::provisioners::{Outcome, Reason};
    /// use std::time::Duration;
    /// let merged = Outcome::merge(vec![
    ///     Outcome::Done,
    ///     Outcome::yield_after(Duration::from_secs(5), Reason::new("Slow", "slow")),
    ///     Outcome::yield_after(Duration::from_secs(1), Reason::new("Fast", "fast")),
    /// ]);
    /// assert_eq!(merged.reason().unwrap().code(), "Fast");
    /// ```
    pub fn merge(outcomes: impl IntoIterator<Item = Outcome>) -> Outcome {
        let mut best: Option<Outcome> = None;
        let mut all_errors: Vec<ProvisionError> = Vec::new();
        for o in outcomes {
            if let Outcome::Failed { errors, .. } = &o {
                all_errors.extend(errors.iter().cloned());
            }
            best = Some(match best {
                None => o,
                Some(b) => {
                    let wins = o.rank() > b.rank()
                        || (o.rank() == b.rank() && o.rank() == 1 && wake_key(&o) < wake_key(&b));
                    if wins { o } else { b }
                }
            });
        }
        match best {
            None => Outcome::Done,
            Some(Outcome::Failed { reason, .. }) => Outcome::Failed {
                reason,
                errors: all_errors,
            },
            Some(o) => o,
        }
    }
}

/// Sort key for "which of these wakes first": waits are woken by message, so they come first.
fn wake_key(o: &Outcome) -> (u8, Duration) {
    match o {
        Outcome::Waiting { .. } => (0, Duration::ZERO),
        Outcome::Yield { after: Some(d), .. } => (1, *d),
        Outcome::Yield { after: None, .. } => (2, Duration::ZERO),
        _ => (3, Duration::ZERO),
    }
}

/// The status an outcome leaves: defined here, beside [`Outcome`], so that [`crate::status`]
/// depends on nothing else of the crate.
///
/// The condition's reason is the outcome's [`Reason::code`] and its message the reason's message,
/// verbatim; the runtime's own [`ReadyReason`] stands in when the outcome has no reason
/// ([`Outcome::Done`]) or an invalid code. The phase carries the category.
impl ResourceStatus {
    /// The status a provision reconcile with `outcome` should leave:
    ///
    /// | outcome | phase | Ready | reason (runtime's, if none or invalid) |
    /// |---|---|---|---|
    /// | `Done` | Ready | True | `Provisioned` |
    /// | `Yield` | Progressing | False | the code (`Provisioning`) |
    /// | `Waiting` | Progressing | False | the code (`DependencyNotReady`) |
    /// | `Yield` or `Waiting` with reason `DependencyFailed` | Failed | False | `DependencyFailed` |
    /// | `Failed` | Progressing | False | the code (`Errored`) |
    /// | `Terminal` | Failed | False | the code (`Terminal`) |
    /// | `UserActionRequired` | Failed | False | the code (`UserActionRequired`) |
    ///
    /// ```
    /// use actorcile::provisioners::{Outcome, Reason};
    /// use actorcile::status::{Phase, ResourceStatus};
    /// let s = ResourceStatus::default().after_provision(
    ///     &Outcome::Terminal(Reason::new("SecretMissing", "create the secret db-password")),
    ///     Some(1),
    /// );
    /// let ready = s.ready().unwrap();
    /// assert_eq!((ready.reason.as_str(), ready.message.as_str()),
    ///            ("SecretMissing", "create the secret db-password"));
    /// assert_eq!(s.phase, Some(Phase::Failed));
    /// ```
    pub fn after_provision(&self, outcome: &Outcome, generation: Option<i64>) -> Self {
        let (phase, ready, fallback) = match outcome {
            Outcome::Done => (Phase::Ready, true, ReadyReason::Provisioned),
            o if o.dependency_failed_reason() => {
                (Phase::Failed, false, ReadyReason::DependencyFailed)
            }
            Outcome::Yield { .. } => (Phase::Progressing, false, ReadyReason::Provisioning),
            Outcome::Waiting { .. } => (Phase::Progressing, false, ReadyReason::DependencyNotReady),
            Outcome::Failed { .. } => (Phase::Progressing, false, ReadyReason::Errored),
            Outcome::Terminal(_) => (Phase::Failed, false, ReadyReason::Terminal),
            Outcome::UserActionRequired(_) => {
                (Phase::Failed, false, ReadyReason::UserActionRequired)
            }
        };
        let (reason, message) = condition_of(outcome, fallback, "provisioned");
        self.with_ready(phase, ready, reason, message, generation)
    }

    /// Whether [`ResourceStatus::after_provision`] with `outcome` is Ready (only a done reconcile
    /// is), without building the status.
    pub fn ready_after(outcome: &Outcome) -> bool {
        outcome.is_done()
    }

    /// The status a deprovision reconcile that is not done yet leaves: phase Terminating, the
    /// outcome's reason (the runtime's: `Errored`, `Terminal`, `UserActionRequired`,
    /// `DependencyNotReady` or `Deprovisioning`, when it has none or an invalid one).
    pub fn after_deprovision(&self, outcome: &Outcome, generation: Option<i64>) -> Self {
        let fallback = match outcome {
            Outcome::Failed { .. } => ReadyReason::Errored,
            Outcome::Terminal(_) => ReadyReason::Terminal,
            Outcome::UserActionRequired(_) => ReadyReason::UserActionRequired,
            Outcome::Waiting { .. } => ReadyReason::DependencyNotReady,
            Outcome::Done | Outcome::Yield { .. } => ReadyReason::Deprovisioning,
        };
        let (reason, message) = condition_of(outcome, fallback, "deprovisioning");
        self.while_deprovisioning(reason, message, generation)
    }
}

/// The condition reason and message of `outcome`: its reason's code and message when the code
/// is valid, else `fallback` with the message (`done_message` for an outcome without a reason).
fn condition_of<'a>(
    outcome: &'a Outcome,
    fallback: ReadyReason,
    done_message: &'static str,
) -> (&'a str, &'a str) {
    match outcome.reason() {
        Some(r) if r.has_valid_code() => (r.code(), r.message()),
        Some(r) => (fallback.as_str(), r.message()),
        None => (fallback.as_str(), done_message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::Condition;

    fn err(msg: &str) -> Outcome {
        Outcome::failed(
            Reason::new("E", msg.to_string()),
            std::io::Error::other(msg.to_string()),
        )
    }

    #[test]
    fn precedence_terminal_over_failure_over_user_action_over_yield() {
        let y = Outcome::yield_now(Reason::new("Y", "y"));
        let u = Outcome::UserActionRequired(Reason::new("U", "u"));
        let t = Outcome::Terminal(Reason::new("T", "t"));
        let m = Outcome::merge(vec![y.clone(), u.clone(), Outcome::Done]);
        assert_eq!(m.reason().unwrap().code(), "U");
        let m = Outcome::merge(vec![y.clone(), err("a"), u.clone()]);
        assert_eq!(m.reason().unwrap().code(), "E");
        let m = Outcome::merge(vec![err("a"), t, y]);
        assert_eq!(m.reason().unwrap().code(), "T");
        assert!(Outcome::merge(vec![Outcome::Done, Outcome::Done]).is_done());
        assert!(Outcome::merge(Vec::new()).is_done());
    }

    #[test]
    fn failures_keep_every_error_in_child_order() {
        let m = Outcome::merge(vec![err("first"), Outcome::Done, err("second")]);
        match m {
            Outcome::Failed { reason, errors } => {
                assert_eq!(reason.message(), "first");
                let texts: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
                assert_eq!(texts, vec!["first", "second"]);
            }
            other => panic!("expected Failed, got {other:?}"),
        }
    }

    #[test]
    fn earliest_yield_wins_and_waits_beat_yields() {
        let a = Outcome::yield_after(Duration::from_secs(3), Reason::new("A", ""));
        let b = Outcome::yield_now(Reason::new("B", ""));
        let c = Outcome::yield_after(Duration::from_millis(10), Reason::new("C", ""));
        assert_eq!(
            Outcome::merge(vec![a.clone(), b.clone(), c])
                .reason()
                .unwrap()
                .code(),
            "C"
        );
        assert_eq!(
            Outcome::merge(vec![b.clone(), a.clone()])
                .reason()
                .unwrap()
                .code(),
            "A"
        );
        let w = Outcome::Waiting {
            target: Target::new("example.com/v1", "Db", Some("ns"), "db"),
            reason: Reason::new("W", ""),
        };
        assert_eq!(Outcome::merge(vec![a, w]).reason().unwrap().code(), "W");
    }

    #[test]
    fn ready_after_agrees_with_the_status_after_provision() {
        let r = || Reason::new("Code", "message");
        let outcomes = [
            Outcome::Done,
            Outcome::yield_after(std::time::Duration::from_secs(1), r()),
            Outcome::Waiting {
                target: crate::references::Target::new("v1", "ConfigMap", Some("ns"), "cm"),
                reason: r(),
            },
            Outcome::failed(r(), std::io::Error::other("boom")),
            Outcome::Terminal(r()),
            Outcome::UserActionRequired(r()),
        ];
        for before in [
            ResourceStatus::default(),
            ResourceStatus::default().after_provision(&Outcome::Done, Some(1)),
        ] {
            for o in &outcomes {
                assert_eq!(
                    ResourceStatus::ready_after(o),
                    before.after_provision(o, Some(2)).is_ready(),
                    "{o:?}"
                );
            }
        }
    }

    #[test]
    fn same_outcome_gives_equal_status_so_nothing_is_written() {
        let o = Outcome::yield_now(Reason::new("Waiting", "for a volume"));
        let s = ResourceStatus::default().after_provision(&o, Some(3));
        assert_eq!(s.after_provision(&o, Some(3)), s);
        assert_ne!(s.after_provision(&Outcome::Done, Some(3)), s);
        assert_eq!(s.phase, Some(Phase::Progressing));
        assert_eq!(s.ready().unwrap().message, "for a volume");
    }

    /// (reason, message, phase) of the `Ready` condition a status carries.
    fn condition(s: &ResourceStatus) -> (String, String, Option<Phase>) {
        let c = s.ready().expect("a Ready condition");
        (c.reason.clone(), c.message.clone(), s.phase)
    }

    #[test]
    fn the_provisioners_reason_is_the_conditions_reason_and_the_phase_its_category() {
        let r = || Reason::new("SecretMissing", "create the secret db");
        let t = crate::references::Target::new("v1", "Secret", Some("ns"), "db");
        let cases = [
            (Outcome::yield_now(r()), Phase::Progressing),
            (
                Outcome::Waiting {
                    target: t,
                    reason: r(),
                },
                Phase::Progressing,
            ),
            (
                Outcome::failed(r(), std::io::Error::other("x")),
                Phase::Progressing,
            ),
            (Outcome::Terminal(r()), Phase::Failed),
            (Outcome::UserActionRequired(r()), Phase::Failed),
        ];
        for (o, phase) in cases {
            let s = ResourceStatus::default().after_provision(&o, Some(1));
            assert_eq!(
                condition(&s),
                (
                    "SecretMissing".into(),
                    "create the secret db".into(),
                    Some(phase)
                ),
                "{o:?}"
            );
            assert!(!s.is_ready());
            let d = ResourceStatus::default().after_deprovision(&o, Some(1));
            assert_eq!(
                condition(&d),
                (
                    "SecretMissing".into(),
                    "create the secret db".into(),
                    Some(Phase::Terminating)
                ),
                "{o:?}"
            );
        }
        let done = ResourceStatus::default().after_provision(&Outcome::Done, Some(1));
        assert_eq!(
            condition(&done),
            (
                "Provisioned".into(),
                "provisioned".into(),
                Some(Phase::Ready)
            )
        );
    }

    #[test]
    fn an_invalid_code_is_never_written_the_runtimes_reason_stands_in() {
        let bad = || Reason::new("secret missing!", "create the secret db");
        assert!(!bad().has_valid_code());
        assert_eq!(
            Reason::try_new("secret missing!", "m"),
            Err(InvalidReason {
                code: "secret missing!".into()
            })
        );
        let cases = [
            (Outcome::yield_now(bad()), "Provisioning", "Deprovisioning"),
            (
                Outcome::failed(bad(), std::io::Error::other("x")),
                "Errored",
                "Errored",
            ),
            (Outcome::Terminal(bad()), "Terminal", "Terminal"),
            (
                Outcome::UserActionRequired(bad()),
                "UserActionRequired",
                "UserActionRequired",
            ),
        ];
        for (o, provision, deprovision) in cases {
            let s = ResourceStatus::default().after_provision(&o, Some(1));
            assert_eq!(condition(&s).0, provision, "{o:?}");
            assert_eq!(condition(&s).1, "create the secret db", "the message stays");
            let d = ResourceStatus::default().after_deprovision(&o, Some(1));
            assert_eq!(condition(&d).0, deprovision, "{o:?}");
        }
        for code in ["", "1Leading", "Trailing,", "has space", "dash-ed"] {
            assert!(!crate::status::is_valid_reason(code), "{code:?}");
        }
        assert!(!crate::status::is_valid_reason(&"A".repeat(1025)));
        assert!(crate::status::is_valid_reason(&"A".repeat(1024)));
    }

    #[test]
    fn messages_are_cut_at_32_kib_on_a_character_boundary() {
        let long = "é".repeat(20_000); // 40 000 bytes
        let r = Reason::new("Long", long.clone());
        assert!(r.message().len() <= crate::status::MAX_MESSAGE_LEN);
        assert!(long.starts_with(r.message()));
        assert_eq!(r.message().len(), crate::status::MAX_MESSAGE_LEN);
        let r: &'static str = Box::leak(long.into_boxed_str());
        assert_eq!(Reason::new("Long", r).message().len(), 32 * 1024);
    }

    #[test]
    fn the_status_of_a_concurrent_group_shows_the_merge_winners_reason() {
        let merged = Outcome::merge(vec![
            Outcome::yield_now(Reason::new("Slow", "a")),
            Outcome::Terminal(Reason::new("BadSpec", "b")),
            Outcome::failed(Reason::new("Flaky", "c"), std::io::Error::other("x")),
        ]);
        let s = ResourceStatus::default().after_provision(&merged, Some(1));
        assert_eq!(
            condition(&s),
            ("BadSpec".into(), "b".into(), Some(Phase::Failed))
        );
    }

    #[test]
    fn foreign_conditions_are_kept() {
        let mut s = ResourceStatus::default();
        s.conditions.push(Condition {
            type_: "Other".into(),
            status: "True".into(),
            reason: "X".into(),
            message: String::new(),
            last_transition_time: None,
            observed_generation: None,
        });
        let s = s.after_provision(&Outcome::Done, Some(1));
        assert_eq!(s.conditions.len(), 2);
        assert!(s.is_ready());
        let failed = Outcome::failed(
            Reason::new("DbDown", "database unreachable"),
            std::io::Error::other("secret internal detail"),
        );
        let s = s.after_provision(&failed, Some(1));
        assert!(
            !serde_json::to_string(&s)
                .unwrap()
                .contains("secret internal detail")
        );
    }
}
