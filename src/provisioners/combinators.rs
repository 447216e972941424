//! Serial, concurrent and conditional composition.
//!
//! Semantics follow the Go original (unikorn's `pkg/provisioners`) with its admitted flaws fixed:
//! the concurrent merge is deterministic and keeps every child's error, and a conditional whose
//! predicate turns false actively deprovisions its child.

use async_trait::async_trait;
use futures::future::join_all;

use super::{BoxProvisioner, Context, Outcome, Provisioner};

/// Children provisioned in order; see [`serial`].
pub struct Serial<K> {
    name: String,
    children: Vec<BoxProvisioner<K>>,
}

/// Provision `children` in order, stopping at the first that is not done (later children are
/// not touched in this pass). Deprovision in exact reverse order, stopping at the first that is
/// not done. The [`serial!`](crate::serial) macro builds one from a list.
pub fn serial<K>(name: impl Into<String>, children: Vec<BoxProvisioner<K>>) -> Serial<K> {
    Serial {
        name: name.into(),
        children,
    }
}

#[async_trait]
impl<K: Send + Sync + 'static> Provisioner<K> for Serial<K> {
    fn name(&self) -> &str {
        &self.name
    }

    fn rules(&self) -> Vec<crate::rbac::StepRule> {
        self.children.iter().flat_map(|c| c.rules()).collect()
    }

    async fn provision(&self, cx: &Context<K>) -> Outcome {
        for child in &self.children {
            let outcome = child.provision(cx).await;
            if !outcome.is_done() {
                tracing::trace!(step = child.name(), ?outcome, "serial: stopped");
                return outcome;
            }
        }
        Outcome::Done
    }

    async fn deprovision(&self, cx: &Context<K>) -> Outcome {
        for child in self.children.iter().rev() {
            let outcome = child.deprovision(cx).await;
            if !outcome.is_done() {
                return outcome;
            }
        }
        Outcome::Done
    }
}

/// Children run together; see [`concurrent`].
pub struct Concurrent<K> {
    name: String,
    children: Vec<BoxProvisioner<K>>,
}

/// Run every child in the same pass (on the resource actor's task, interleaved); none cancels
/// another, and the outcomes merge deterministically with [`Outcome::merge`] (terminal > failed
/// > user action > waiting/yield with the earliest wake-up > done), keeping every child's error.
pub fn concurrent<K>(name: impl Into<String>, children: Vec<BoxProvisioner<K>>) -> Concurrent<K> {
    Concurrent {
        name: name.into(),
        children,
    }
}

#[async_trait]
impl<K: Send + Sync + 'static> Provisioner<K> for Concurrent<K> {
    fn name(&self) -> &str {
        &self.name
    }

    fn rules(&self) -> Vec<crate::rbac::StepRule> {
        self.children.iter().flat_map(|c| c.rules()).collect()
    }

    async fn provision(&self, cx: &Context<K>) -> Outcome {
        Outcome::merge(join_all(self.children.iter().map(|c| c.provision(cx))).await)
    }

    async fn deprovision(&self, cx: &Context<K>) -> Outcome {
        Outcome::merge(join_all(self.children.iter().map(|c| c.deprovision(cx))).await)
    }
}

/// A child gated by a predicate; see [`conditional`].
pub struct Conditional<K> {
    name: String,
    predicate: Box<dyn Fn(&K) -> bool + Send + Sync>,
    child: BoxProvisioner<K>,
}

/// While `predicate(object)` is true, provision `child`; while it is false, actively
/// deprovision it (not skip it), so turning a feature off removes what it made. Deprovision of
/// the conditional always deprovisions the child.
pub fn conditional<K, P>(
    name: impl Into<String>,
    predicate: impl Fn(&K) -> bool + Send + Sync + 'static,
    child: P,
) -> Conditional<K>
where
    P: Provisioner<K> + 'static,
{
    Conditional {
        name: name.into(),
        predicate: Box::new(predicate),
        child: std::sync::Arc::new(child),
    }
}

#[async_trait]
impl<K: Send + Sync + 'static> Provisioner<K> for Conditional<K> {
    fn name(&self) -> &str {
        &self.name
    }

    fn rules(&self) -> Vec<crate::rbac::StepRule> {
        self.child.rules()
    }

    async fn provision(&self, cx: &Context<K>) -> Outcome {
        if (self.predicate)(cx.object()) {
            self.child.provision(cx).await
        } else {
            self.child.deprovision(cx).await
        }
    }

    async fn deprovision(&self, cx: &Context<K>) -> Outcome {
        self.child.deprovision(cx).await
    }
}
