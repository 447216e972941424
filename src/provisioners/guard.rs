//! Guarded side effects: a step that mutates something outside Kubernetes (a DNS record, a
//! cloud volume, a container) runs it at most once per intent, never on a stale object, and
//! never while another run holds the lock (sequencer's `Guard`, with an expiry added).
//!
//! The lock and the result live in one condition of the object's status, of the type the guard
//! is given (one per guarded task):
//!
//! | condition | status | reason | message |
//! |---|---|---|---|
//! | locked | `Unknown` | `Locked` | `held by <holder> until <RFC 3339 time>` |
//! | provisioned | `True` | `Done` | the task's message |
//! | deprovisioned | `False` | `Deprovisioned` | the task's message |
//! | not done (yield, failure, …) | `False` | the outcome's reason | its message |
//!
//! Its `observedGeneration` is the generation the task ran for: the *intent* is that
//! generation (and provision or deprovision). A guard whose condition says the task is done for
//! the object's generation returns [`Outcome::Done`] without running it again.
//!
//! A lock held by another runtime is judged by this runtime's own clock, not by the time its
//! holder wrote (as client-go's leader election judges a Lease): it has expired once this
//! runtime has seen it unchanged for `lock_expiry` (replicas of one operator share their
//! policy), or once its `until` lies more than `lock_expiry` in the past by this runtime's
//! wall clock (a lock left long ago, found after a restart). A replica whose clock runs ahead
//! by less than `lock_expiry` never takes a live lock; one whose clock runs behind waits at most
//! `lock_expiry` after it first saw the lock.
//!
//! The task's result is written under the lock, retried for a few seconds when the API fails.
//! A reconcile cut before the result is recorded (the policy's `reconcile_timeout`, a write
//! that kept failing, a sharded replica's shard lost and taken back) leaves the lock behind, and
//! the runtime remembers that the task is done: its next reconcile of the object records the
//! result instead of running the task again. Only a process that stops between the task and the
//! record (killed, or a replica whose shard another replica then takes) lets the task run
//! again, once the lock expires. Write tasks that find their effect already there.

use std::future::Future;
use std::marker::PhantomData;
use std::time::Duration;

use async_trait::async_trait;
use backon::{ExponentialBuilder, Retryable};
use jiff::{SignedDuration, Timestamp};
use std::collections::HashMap;
use tokio::time::Instant;

use super::object_ops::WriteError;
use super::{Context, Outcome, Provisioner, Reason};
use crate::ManagedResource;
use crate::status::{Condition, ConditionStatus, ReadyReason, ResourceStatus};

/// The reason of a guard's condition while its task runs.
pub(crate) const LOCKED: &str = "Locked";
/// The reason of a guard's condition once its provision task is done for the generation.
pub(crate) const DONE: &str = "Done";
/// The reason of a guard's condition once its deprovision task is done for the generation.
pub(crate) const DEPROVISIONED: &str = "Deprovisioned";

/// How often a failed write of a task's result is retried (over about 6 s) before the reconcile
/// fails with `LockReleaseFailed` and the task runs again on the next reconcile.
const RESULT_WRITE_RETRIES: usize = 5;

/// A lock as its condition states it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lock {
    /// The runtime holding it ([`RuntimeHandle::holder`](crate::runtime::RuntimeHandle::holder)).
    pub holder: String,
    /// When it expires: after that, another run may take it.
    pub until: Timestamp,
}

impl Lock {
    /// The lock a condition states (`None`: the condition is not a lock, or not one this
    /// runtime wrote — then it does not hold anyone back).
    pub fn of(c: &Condition) -> Option<Lock> {
        if c.reason != LOCKED {
            return None;
        }
        let (holder, until) = c.message.strip_prefix("held by ")?.rsplit_once(" until ")?;
        let until: Timestamp = until.parse().ok()?;
        Some(Lock {
            holder: holder.to_string(),
            until,
        })
    }

    fn message(&self) -> String {
        format!("held by {} until {:.3}", self.holder, self.until)
    }
}

/// When this runtime first saw each lock held by another (see the module docs): object uid and
/// condition type → the lock's message and the (monotonic) time it was first seen. An entry
/// goes once its object's lock is seen gone or taken, and entries older than four expiries
/// go as others arrive (an object deleted meanwhile).
#[derive(Default)]
pub(crate) struct LockSightings(std::sync::Mutex<HashMap<(String, String), (String, Instant)>>);

impl LockSightings {
    /// How long `lock`, held by another runtime, still holds, as this runtime sees it now
    /// (`None`: expired). `expiry` is the policy's `lock_expiry`.
    fn left(&self, key: (String, String), lock: &Lock, expiry: Duration) -> Option<Duration> {
        let now = Instant::now();
        let message = lock.message();
        let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if seen.len() >= 1024 && !seen.contains_key(&key) {
            seen.retain(|_, (_, at)| now.saturating_duration_since(*at) < expiry * 4);
        }
        let first = match seen.get(&key) {
            Some((m, at)) if *m == message => *at,
            _ => {
                seen.insert(key, (message, now));
                now
            }
        };
        let by_sight = expiry.saturating_sub(now.saturating_duration_since(first));
        // `until` plus one whole expiry, by this runtime's wall clock.
        let by_wall = SignedDuration::try_from(expiry.min(crate::policy::MAX_DURATION))
            .ok()
            .and_then(|d| lock.until.checked_add(d).ok())
            .and_then(|late| Duration::try_from(late.duration_since(Timestamp::now())).ok())
            .unwrap_or_default();
        let left = by_sight.min(by_wall);
        (!left.is_zero()).then_some(left)
    }

    /// Unless `held` (the lock of `key` still holds this runtime back), nothing of it is
    /// remembered: it is gone, expired, or this runtime's own.
    fn forget_unless(&self, held: bool, key: &(String, String)) {
        if !held {
            let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
            seen.remove(key);
        }
    }
}

/// Tasks this runtime ran to `Done` whose result it has not recorded yet: object uid, condition
/// type, generation and intent. A reconcile cut between the task and the record (by the
/// policy's `reconcile_timeout`, or a result write that kept failing) leaves its lock behind;
/// the next reconcile finds it here and records the result instead of running the task again.
/// An entry goes once the result is recorded, or the condition is seen done or held by another;
/// only a process that stops in between forgets it.
#[derive(Default)]
pub(crate) struct UnrecordedResults(std::sync::Mutex<std::collections::HashSet<ResultKey>>);

/// Object uid, condition type, generation, and whether the intent is deprovision.
type ResultKey = (String, String, Option<i64>, bool);

impl UnrecordedResults {
    fn insert(&self, key: ResultKey) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).insert(key);
    }

    fn remove(&self, key: &ResultKey) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
    }

    /// [`remove`](Self::remove) the key `key` makes, made only if anything is remembered.
    fn remove_with(&self, key: impl FnOnce() -> ResultKey) {
        let mut keys = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if !keys.is_empty() {
            keys.remove(&key());
        }
    }

    fn contains(&self, key: &ResultKey) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(key)
    }
}

/// Provision or deprovision: the two intents of one generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Intent {
    Provision,
    Deprovision,
}

impl Intent {
    fn done(self) -> (ConditionStatus, &'static str) {
        match self {
            Intent::Provision => (ConditionStatus::True, DONE),
            Intent::Deprovision => (ConditionStatus::False, DEPROVISIONED),
        }
    }
}

impl<K: ManagedResource> Context<K> {
    /// Run `task`, a side effect outside Kubernetes, under the lock of condition `type_`:
    ///
    /// 1. If the condition says the task is done for the object's generation, return
    ///    [`Outcome::Done`] without running it (at most once per intent).
    /// 2. If another runtime holds the lock and it has not expired, yield (reason `Locked`)
    ///    until it expires; the holder's result write wakes this object sooner. Expiry is
    ///    judged by this runtime's clock, not by the time the holder wrote: the lock holds until
    ///    this runtime has seen it unchanged for `lock_expiry`, or until its `until` lies more
    ///    than `lock_expiry` in the past. A lock this runtime holds itself is taken again at
    ///    once, unless the task ran to `Done` under it and only its result is missing (the
    ///    reconcile was cut before recording it): then the result is recorded and the task does
    ///    not run again.
    /// 3. Take the lock: write the condition (`Locked`, this runtime as the holder, expiry now
    ///    plus the policy's `lock_expiry`) with the resourceVersion this reconcile knows as a
    ///    precondition. If the object changed since, the write fails, the task does not run,
    ///    and the reconcile yields (reason `Conflict`): the runtime runs it again on the newest
    ///    version.
    /// 4. Run the task, for at most what is left of the lock (past the expiry it is dropped
    ///    and the reconcile fails with `LockExpired`: another run may hold the lock by then).
    /// 5. Record its outcome on the condition (`Done`, or the outcome's reason), retrying
    ///    conflicts on fresh reads as long as the lock is still this runtime's; return it.
    ///
    /// All of it runs [shielded](Context::shielded): a reconcile cancelled because its object
    /// moved on is cut after the result is recorded, never between the task and its record.
    ///
    /// A runtime that dies in the middle of a task leaves the lock behind; after its expiry the
    /// next run takes it and runs the task again. So the task must be idempotent, or look
    /// first whether its effect is already there (the DNS record exists), and `lock_expiry`
    /// must be longer than the task ever runs. Replicas' clocks may disagree by up to
    /// `lock_expiry` without one taking another's live lock.
    ///
    /// ```no_run
    /// # use actorcile::prelude::*;
    /// # async fn create_record(name: &str) -> Result<(), std::io::Error> { Ok(()) }
    /// # async fn f<K: ManagedResource>(cx: &Context<K>) -> Outcome {
    /// cx.guard("DnsRecord", || async {
    ///     match create_record("www.example.com").await {
    ///         Ok(()) => Outcome::Done,
    ///         Err(e) => Outcome::failed(Reason::new("DnsUnavailable", "cannot create the record"), e),
    ///     }
    /// })
    /// .await
    /// # }
    /// ```
    pub async fn guard<F, Fut>(&self, type_: &str, task: F) -> Outcome
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Outcome>,
    {
        // Shielded: a reconcile cut because its object moved on never falls between the
        // lock, the task and its record.
        self.shielded(self.guarded(type_, Intent::Provision, task))
            .await
    }

    /// [`Context::guard`] for a deprovision task: the condition records `Deprovisioned` when
    /// it is done.
    pub async fn guard_deprovision<F, Fut>(&self, type_: &str, task: F) -> Outcome
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Outcome>,
    {
        self.shielded(self.guarded(type_, Intent::Deprovision, task))
            .await
    }

    async fn guarded<F, Fut>(&self, type_: &str, intent: Intent, task: F) -> Outcome
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Outcome>,
    {
        if let Some(invalid) = invalid_type(type_) {
            return invalid;
        }
        let holder = self.parts().holder.clone();
        let generation = self.object().meta().generation;
        let current = self.condition(type_);
        let (done_status, done_reason) = intent.done();
        // Built only when needed: most reconciles find the task done and nothing unrecorded.
        let result_key = || -> ResultKey {
            (
                self.object().meta().uid.clone().unwrap_or_default(),
                type_.to_string(),
                generation,
                intent == Intent::Deprovision,
            )
        };
        let unrecorded = &self.parts().unrecorded;
        if let Some(c) = &current
            && c.status == done_status.as_str()
            && c.reason == done_reason
            && c.observed_generation == generation
        {
            unrecorded.remove_with(result_key);
            return Outcome::Done;
        }
        let own_lock = current
            .as_ref()
            .and_then(Lock::of)
            .is_some_and(|lock| *lock.holder == *holder);
        if own_lock && unrecorded.contains(&result_key()) {
            // This runtime ran the task to `Done` under this lock, and the reconcile was cut
            // before its result was recorded: record it now, do not run the task again.
            return self
                .record_result(type_, intent, generation, Outcome::Done, &result_key())
                .await;
        }
        if !own_lock {
            unrecorded.remove_with(result_key);
        }
        let expiry = self.parts().lock_expiry;
        let sighting = (
            self.object().meta().uid.clone().unwrap_or_default(),
            type_.to_string(),
        );
        let foreign = current
            .as_ref()
            .and_then(Lock::of)
            .filter(|lock| *lock.holder != *holder);
        let held = foreign.as_ref().and_then(|lock| {
            let left = self
                .parts()
                .locks_seen
                .left(sighting.clone(), lock, expiry)?;
            Some((lock, left))
        });
        self.parts()
            .locks_seen
            .forget_unless(held.is_some(), &sighting);
        if let Some((lock, left)) = held {
            return Outcome::yield_after(
                left + Duration::from_millis(50),
                Reason::new(
                    ReadyReason::Locked.as_str(),
                    format!("{type_} is locked: {}", lock.message()),
                ),
            );
        }
        let now = Timestamp::now();
        let lock = Lock {
            holder: holder.to_string(),
            // The policy holds at most a year (`SupervisorPolicy::validate`); bounded here too,
            // for a policy nobody validated.
            until: SignedDuration::try_from(expiry.min(crate::policy::MAX_DURATION))
                .ok()
                .and_then(|d| now.checked_add(d).ok())
                .unwrap_or(now),
        };
        let message = lock.message();
        // Others count the lock's expiry from when they first see it, at the earliest when
        // its write lands, which is before its answer comes back: the task's time counts from
        // the send, so that a slow answer cannot make it outlive the lock as others see it.
        let sent = tokio::time::Instant::now();
        let locked = self
            .write_conditions(false, |st| {
                st.with_condition(
                    type_,
                    ConditionStatus::Unknown,
                    LOCKED,
                    &message,
                    generation,
                )
            })
            .await;
        match locked {
            Ok(_) => {}
            Err(WriteError::Stale) => {
                return Outcome::yield_after(
                    Duration::from_secs(1),
                    Reason::new(
                        ReadyReason::Conflict.as_str(),
                        format!(
                            "the object changed before {type_} was locked; running again on the newest version"
                        ),
                    ),
                );
            }
            Err(WriteError::Failed(e)) => {
                return Outcome::failed(
                    Reason::new("LockFailed", format!("cannot lock {type_}")),
                    e,
                );
            }
        }
        let outcome = match tokio::time::timeout_at(sent + expiry, task()).await {
            Ok(o) => o,
            Err(elapsed) => Outcome::failed(
                Reason::new(
                    "LockExpired",
                    format!("the task of {type_} ran past its lock's expiry"),
                ),
                elapsed,
            ),
        };
        let result_key = result_key();
        if matches!(outcome, Outcome::Done) {
            unrecorded.insert(result_key.clone());
        }
        self.record_result(type_, intent, generation, outcome, &result_key)
            .await
    }

    /// Record `outcome`, the task's, on the condition `type_` (only over this runtime's own
    /// lock: one taken by another runtime after ours expired is theirs), retried for a few
    /// seconds when the API fails; return it.
    async fn record_result(
        &self,
        type_: &str,
        intent: Intent,
        generation: Option<i64>,
        outcome: Outcome,
        result_key: &ResultKey,
    ) -> Outcome {
        let holder = self.parts().holder.clone();
        let (done_status, done_reason) = intent.done();
        let (status, reason, msg) = match &outcome {
            Outcome::Done => (done_status, done_reason.to_string(), String::new()),
            o => {
                let r = o.reason();
                let code = r
                    .filter(|r| r.has_valid_code())
                    .map_or(ReadyReason::Errored.as_str(), |r| r.code());
                (
                    ConditionStatus::False,
                    code.to_string(),
                    r.map(|r| r.message().to_string()).unwrap_or_default(),
                )
            }
        };
        let record = |st: &ResourceStatus| {
            let ours = st
                .condition(type_)
                .and_then(Lock::of)
                .is_some_and(|l| *l.holder == *holder);
            if ours {
                st.with_condition(type_, status, &reason, &msg, generation)
            } else {
                None
            }
        };
        // The task ran: a transient API error must not lose its result (the next reconcile would
        // run it again), so the write is retried for a few seconds before giving up.
        let recorded = (|| self.write_conditions(true, record))
            .retry(
                ExponentialBuilder::default()
                    .with_min_delay(Duration::from_millis(100))
                    .with_max_delay(Duration::from_secs(2))
                    .with_max_times(RESULT_WRITE_RETRIES),
            )
            .when(|e| matches!(e, WriteError::Failed(_)))
            .await;
        match recorded {
            Ok(_) | Err(WriteError::Stale) => {
                self.parts().unrecorded.remove(result_key);
                outcome
            }
            Err(WriteError::Failed(e)) => Outcome::failed(
                Reason::new(
                    "LockReleaseFailed",
                    format!("cannot record the result of {type_}"),
                ),
                e,
            ),
        }
    }
}

fn invalid_type(type_: &str) -> Option<Outcome> {
    let ok = type_ != crate::status::READY && crate::status::is_valid_condition_type(type_);
    (!ok).then(|| {
        Outcome::Terminal(Reason::new(
            "InvalidGuard",
            format!("{type_:?} cannot be a guard's condition type (a valid type other than Ready)"),
        ))
    })
}

/// A provisioner that runs a side effect under [`Context::guard`] (and, with
/// [`Guard::deprovision_with`], its undoing under [`Context::guard_deprovision`]).
///
/// ```
/// use actorcile::prelude::*;
/// use actorcile::provisioners::guard;
/// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
/// # #[kube(group = "example.com", version = "v1", kind = "Site", namespaced, status = "ResourceStatus")]
/// # struct SiteSpec { host: String }
/// let dns = guard("DnsRecord", |cx: Context<Site>| async move {
///     // create the record for cx.object().spec.host, or find it there already
///     Outcome::Done
/// })
/// .deprovision_with(|_cx: Context<Site>| async move {
///     // delete the record, or find it gone
///     Outcome::Done
/// });
/// # let _ = serial![dns];
/// ```
pub fn guard<K, F, Fut>(type_: impl Into<String>, task: F) -> Guard<K, F, NoTask<K>>
where
    F: Fn(Context<K>) -> Fut,
{
    Guard {
        type_: type_.into(),
        provision: task,
        deprovision: NoTask(PhantomData),
        _k: PhantomData,
    }
}

/// See [`guard`].
pub struct Guard<K, P, D> {
    type_: String,
    provision: P,
    deprovision: D,
    _k: PhantomData<fn(K)>,
}

/// A guard without a deprovision task (deprovision is done at once).
pub struct NoTask<K>(PhantomData<fn(K)>);

impl<K, P, D> Guard<K, P, D> {
    /// Undo the side effect on deletion with `task`, under the same condition's lock.
    pub fn deprovision_with<D2, Fut>(self, task: D2) -> Guard<K, P, D2>
    where
        D2: Fn(Context<K>) -> Fut,
    {
        Guard {
            type_: self.type_,
            provision: self.provision,
            deprovision: task,
            _k: PhantomData,
        }
    }
}

/// The deprovision side of a [`Guard`]: none, or a task.
#[async_trait]
pub trait DeprovisionTask<K>: Send + Sync {
    /// Deprovision under the guard's condition `type_`.
    async fn run(&self, type_: &str, cx: &Context<K>) -> Outcome;
}

#[async_trait]
impl<K: ManagedResource> DeprovisionTask<K> for NoTask<K> {
    async fn run(&self, _type_: &str, _cx: &Context<K>) -> Outcome {
        Outcome::Done
    }
}

#[async_trait]
impl<K, D, Fut> DeprovisionTask<K> for D
where
    K: ManagedResource,
    D: Fn(Context<K>) -> Fut + Send + Sync,
    Fut: Future<Output = Outcome> + Send,
{
    async fn run(&self, type_: &str, cx: &Context<K>) -> Outcome {
        cx.guard_deprovision(type_, || self(cx.clone())).await
    }
}

#[async_trait]
impl<K, P, D, Fut> Provisioner<K> for Guard<K, P, D>
where
    K: ManagedResource,
    P: Fn(Context<K>) -> Fut + Send + Sync,
    Fut: Future<Output = Outcome> + Send,
    D: DeprovisionTask<K>,
{
    fn name(&self) -> &str {
        &self.type_
    }

    async fn provision(&self, cx: &Context<K>) -> Outcome {
        cx.guard(&self.type_, || (self.provision)(cx.clone())).await
    }

    async fn deprovision(&self, cx: &Context<K>) -> Outcome {
        self.deprovision.run(&self.type_, cx).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_reads_back_from_the_message_it_writes() {
        let lock = Lock {
            holder: "pod-a-0000beef".into(),
            until: "2026-11-25T10:00:00.250Z".parse().unwrap(),
        };
        let c = Condition {
            type_: "DnsRecord".into(),
            status: "Unknown".into(),
            reason: LOCKED.into(),
            message: lock.message(),
            last_transition_time: None,
            observed_generation: Some(1),
        };
        assert_eq!(Lock::of(&c), Some(lock));
        // not a lock: another reason, or a message this runtime did not write
        let done = Condition {
            reason: DONE.into(),
            ..c.clone()
        };
        assert_eq!(Lock::of(&done), None);
        let foreign = Condition {
            message: "locked by someone".into(),
            ..c
        };
        assert_eq!(Lock::of(&foreign), None);
    }
}
