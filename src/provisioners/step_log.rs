//! What each step of a reconcile returned and how long it took, kept only while the runtime's
//! introspection is on ([`RuntimeBuilder::introspection`](crate::runtime::RuntimeBuilder::introspection)):
//! a step then runs inside a timing wrapper, and without it runs as it is (no extra box).

use std::sync::Mutex;
use std::time::Duration;

use super::{Context, Outcome};
use crate::counters::ReconcileResult;

/// One step's run in a reconcile.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StepRun {
    /// The step's name.
    pub name: String,
    /// How it ended: `done`, `yield`, `waiting`, `failed`, `terminal`, `user_action_required`.
    pub outcome: String,
    /// Its reason code, when it gave one.
    pub reason: Option<String>,
    /// How long it ran.
    #[serde(with = "humantime_serde")]
    pub took: Duration,
}

/// The steps of one reconcile, in the order they ended (at most [`StepLog::MAX`]: a tree
/// of more steps keeps its first ones).
#[derive(Debug, Default)]
pub(crate) struct StepLog(Mutex<Vec<StepRun>>);

impl StepLog {
    /// The most steps one reconcile's log keeps.
    pub(crate) const MAX: usize = 64;

    fn push(&self, run: StepRun) {
        let mut runs = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if runs.len() < Self::MAX {
            runs.push(run);
        }
    }

    /// The steps logged so far (taken: the log starts over for the next reconcile).
    pub(crate) fn take(&self) -> Vec<StepRun> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// `fut`, the run of the step `name`, logged in `cx`'s step log if it has one.
pub(crate) fn logged<'r, K: Send + Sync + 'static>(
    cx: &Context<K>,
    name: &str,
    fut: futures::future::BoxFuture<'r, Outcome>,
) -> futures::future::BoxFuture<'r, Outcome> {
    if cx.step_log().is_none() {
        return fut;
    }
    let (cx, name) = (cx.clone(), name.to_string());
    Box::pin(async move {
        let started = tokio::time::Instant::now();
        let outcome = fut.await;
        if let Some(log) = cx.step_log() {
            log.push(StepRun {
                name,
                outcome: ReconcileResult::of(&outcome).as_str().into(),
                reason: outcome.reason().map(|r| r.code().to_string()),
                took: started.elapsed(),
            });
        }
        outcome
    })
}
