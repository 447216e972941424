//! Serial, concurrent and conditional composition.
//!
//! Semantics follow the Go original (unikorn's `pkg/provisioners`) with its admitted flaws fixed:
//! the concurrent merge is deterministic and keeps every child's error, and a conditional whose
//! predicate turns false actively deprovisions its child.

use async_trait::async_trait;
use tracing::Instrument;

use super::{BoxProvisioner, Context, Outcome, Provisioner, Reason};

/// Children provisioned in order; see [`serial`].
pub struct Serial<K> {
    name: String,
    children: Vec<BoxProvisioner<K>>,
}

/// Provision `children` in order, stopping at the first that is not done (later children are
/// not touched in this reconcile). Deprovision in exact reverse order, stopping at the first that is
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

/// Run every child in the same reconcile, in parallel: each child is a task of its own on the
/// runtime's threads, so one that computes or blocks does not hold back its siblings. None
/// cancels another; the outcomes merge deterministically, in the children's order, with
/// [`Outcome::merge`] (terminal > failed > user action > waiting/yield with the earliest
/// wake-up > done), keeping every child's error. A child that panics is that child's failure
/// (reason `StepPanicked`, the panic's message as its error), not the reconcile's. When the reconcile
/// ends early (its `reconcile_timeout`, the runtime stopping), every child still running is
/// cancelled with it.
///
/// The children share the reconcile's [`Context`]: the object as the reconcile started, the reconcile's own
/// writes (each child's condition, finalizer or status field writes go through the runtime,
/// which orders them and retries conflicts, so none clobbers another's), and its client.
pub fn concurrent<K>(name: impl Into<String>, children: Vec<BoxProvisioner<K>>) -> Concurrent<K> {
    Concurrent {
        name: name.into(),
        children,
    }
}

/// Which half of a provisioner a task runs.
#[derive(Clone, Copy)]
enum Half {
    Provision,
    Deprovision,
}

impl<K: Send + Sync + 'static> Concurrent<K> {
    /// Every child's `half` as a task of its own; their outcomes merged in child order.
    async fn run_all(&self, cx: &Context<K>, half: Half) -> Outcome {
        // Dropping the set (the reconcile cancelled) aborts every child still running.
        let mut tasks = tokio::task::JoinSet::new();
        let mut index = std::collections::HashMap::new();
        for (i, child) in self.children.iter().enumerate() {
            let (child, cx) = (child.clone(), cx.clone());
            let handle = tasks.spawn(
                async move {
                    match half {
                        Half::Provision => child.provision(&cx).await,
                        Half::Deprovision => child.deprovision(&cx).await,
                    }
                }
                .in_current_span(),
            );
            index.insert(handle.id(), i);
        }
        let mut outcomes: Vec<Option<Outcome>> = vec![None; self.children.len()];
        while let Some(done) = tasks.join_next_with_id().await {
            let (id, outcome) = match done {
                Ok((id, outcome)) => (id, outcome),
                Err(e) => {
                    let id = e.id();
                    let name = index
                        .get(&id)
                        .map(|i| self.children[*i].name().to_string())
                        .unwrap_or_default();
                    let message = panic_message(e.is_panic().then(|| e.into_panic()));
                    let reason = Reason::new(
                        "StepPanicked",
                        format!("step {name} of {} panicked: {message}", self.name),
                    );
                    (id, Outcome::failed(reason, Panicked(message)))
                }
            };
            if let Some(i) = index.get(&id) {
                outcomes[*i] = Some(outcome);
            }
        }
        Outcome::merge(outcomes.into_iter().flatten())
    }
}

/// A panic's message, if it has one.
fn panic_message(panic: Option<Box<dyn std::any::Any + Send>>) -> String {
    match panic {
        Some(p) => match p.downcast::<String>() {
            Ok(s) => *s,
            Err(p) => p
                .downcast::<&'static str>()
                .map(|s| (*s).to_string())
                .unwrap_or_else(|_| "a panic without a message".into()),
        },
        None => "cancelled".into(),
    }
}

/// A child of [`concurrent`] panicked.
#[derive(Debug, thiserror::Error)]
#[error("panicked: {0}")]
struct Panicked(String);

#[async_trait]
impl<K: Send + Sync + 'static> Provisioner<K> for Concurrent<K> {
    fn name(&self) -> &str {
        &self.name
    }

    fn rules(&self) -> Vec<crate::rbac::StepRule> {
        self.children.iter().flat_map(|c| c.rules()).collect()
    }

    async fn provision(&self, cx: &Context<K>) -> Outcome {
        self.run_all(cx, Half::Provision).await
    }

    async fn deprovision(&self, cx: &Context<K>) -> Outcome {
        self.run_all(cx, Half::Deprovision).await
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

/// Builds a reconcile's tree from the object ([`per_reconcile`]).
type BuildTree<K> = Box<dyn Fn(&K) -> super::BoxProvisioner<K> + Send + Sync>;

/// A tree built for each reconcile; see [`per_reconcile`].
pub struct PerReconcile<K> {
    name: String,
    build: BuildTree<K>,
    rules: Vec<crate::rbac::StepRule>,
}

/// Build the tree for each reconcile from the object (unikorn's `ProvisionerCreateFunc`), where
/// what to provision follows the spec in ways [`conditional`] does not cover, such as one step
/// per add-on the spec lists. Provision and deprovision each build the tree from the object
/// as their reconcile sees it: deprovision runs the tree of the object's last spec. A tree's steps
/// are not known before a reconcile, so declare what they need with [`PerReconcile::needs`] for the
/// rendered roles and the preflight.
///
/// ```
/// use actorcile::prelude::*;
/// use actorcile::provisioners::per_reconcile;
/// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
/// # #[kube(group = "example.com", version = "v1", kind = "Cluster", namespaced, status = "ResourceStatus")]
/// # struct ClusterSpec { addons: Vec<String> }
/// let tree = per_reconcile("addons", |c: &Cluster| {
///     let steps: Vec<BoxProvisioner<Cluster>> = c
///         .spec
///         .addons
///         .iter()
///         .map(|a| boxed(step(a.clone(), |_cx: Context<Cluster>| async { Outcome::Done })))
///         .collect();
///     boxed(concurrent("addons", steps))
/// });
/// # let _ = tree;
/// ```
pub fn per_reconcile<K>(
    name: impl Into<String>,
    build: impl Fn(&K) -> super::BoxProvisioner<K> + Send + Sync + 'static,
) -> PerReconcile<K> {
    PerReconcile {
        name: name.into(),
        build: Box::new(build),
        rules: Vec::new(),
    }
}

impl<K> PerReconcile<K> {
    /// Declare what the trees it builds need ([`Provisioner::rules`]).
    pub fn needs(mut self, rules: Vec<crate::rbac::StepRule>) -> Self {
        self.rules.extend(rules);
        self
    }
}

#[async_trait]
impl<K: Send + Sync + 'static> Provisioner<K> for PerReconcile<K> {
    fn name(&self) -> &str {
        &self.name
    }

    fn rules(&self) -> Vec<crate::rbac::StepRule> {
        self.rules.clone()
    }

    async fn provision(&self, cx: &Context<K>) -> Outcome {
        (self.build)(cx.object()).provision(cx).await
    }

    async fn deprovision(&self, cx: &Context<K>) -> Outcome {
        (self.build)(cx.object()).deprovision(cx).await
    }
}
