//! `nodes(provider, desired)`: converge a cluster's nodes on an infrastructure
//! [`Provider`] to a desired set.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::{Context, Outcome, Provisioner, Reason};
use crate::providers::{NodeInfo, NodeRole, NodeSpec, NodeState, Provider, ProviderError};

/// How long a reconcile yields while nodes start, are deleted, or the provider does not answer.
const RECHECK: Duration = Duration::from_secs(1);

/// The nodes a cluster should have: how many of each role, all started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSet {
    /// The cluster's name on the provider.
    pub cluster: String,
    /// Nodes per role (a role not named has none).
    pub roles: BTreeMap<NodeRole, usize>,
    /// The template of every node (its name and role are set per node: `<cluster>-<role>-<i>`).
    pub template: NodeSpec,
}

impl NodeSet {
    /// `control_planes` control-plane and `workers` worker nodes of `cluster`, from `template`.
    pub fn new(
        cluster: impl Into<String>,
        control_planes: usize,
        workers: usize,
        template: NodeSpec,
    ) -> Self {
        Self {
            cluster: cluster.into(),
            roles: BTreeMap::from([
                (NodeRole::ControlPlane, control_planes),
                (NodeRole::Worker, workers),
            ]),
            template,
        }
    }

    /// The desired nodes, by name.
    fn specs(&self) -> BTreeMap<String, NodeSpec> {
        let mut out = BTreeMap::new();
        for (role, count) in &self.roles {
            for i in 0..*count {
                let name = format!("{}-{}-{i}", self.cluster, role);
                let mut spec = self.template.clone();
                spec.name = name.clone();
                spec.role = *role;
                out.insert(name, spec);
            }
        }
        out
    }
}

/// A cluster's nodes, converged by [`nodes`].
pub struct Nodes<K> {
    provider: Arc<dyn Provider>,
    desired: Box<dyn Fn(&K) -> NodeSet + Send + Sync>,
}

/// Converge the nodes of the cluster `desired(object)` names on `provider`: create the missing
/// ones, start the stopped ones, delete the extras (other names, or roles no longer wanted);
/// yield (reason `NodesStarting`) until every desired node runs, and (reason
/// `ProviderUnavailable`) while the provider does not answer. Deprovision deletes every node of
/// the cluster and yields (reason `NodesDeleting`) until none is left. A reconcile makes each call
/// once and never waits for a node to come up.
///
/// ```
/// use std::sync::Arc;
/// use actorcile::prelude::*;
/// use actorcile::providers::simulated::{ProviderFaults, SimulatedProvider};
/// use actorcile::providers::{NodeRole, NodeSpec};
/// use actorcile::provisioners::{NodeSet, nodes};
/// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
/// # #[kube(group = "example.com", version = "v1", kind = "DevCluster", namespaced, status = "ResourceStatus")]
/// # struct DevClusterSpec { workers: usize }
/// let provider = Arc::new(SimulatedProvider::new(1, ProviderFaults::default()));
/// let tree = nodes(provider, |c: &DevCluster| {
///     let name = c.metadata.name.clone().unwrap_or_default();
///     NodeSet::new(name, 1, c.spec.workers, NodeSpec::new("", NodeRole::Worker, "node:1"))
/// });
/// # let _ = serial![tree];
/// ```
pub fn nodes<K>(
    provider: Arc<dyn Provider>,
    desired: impl Fn(&K) -> NodeSet + Send + Sync + 'static,
) -> Nodes<K> {
    Nodes {
        provider,
        desired: Box::new(desired),
    }
}

/// The outcome of a provider error: a yield while it is unavailable, a failure otherwise.
fn on_error(e: ProviderError) -> Outcome {
    match e {
        ProviderError::ProviderUnavailable { .. } => {
            Outcome::yield_after(RECHECK, Reason::new("ProviderUnavailable", e.to_string()))
        }
        e => Outcome::failed(
            Reason::new(
                "ProviderFailed",
                "the infrastructure provider refused a node operation",
            ),
            e,
        ),
    }
}

impl<K> Nodes<K> {
    /// `ProviderUnavailable` before any call, while the provider says it cannot be used.
    async fn unavailable(&self) -> Option<Outcome> {
        (!self.provider.is_available().await).then(|| {
            Outcome::yield_after(
                RECHECK,
                Reason::new(
                    "ProviderUnavailable",
                    format!("provider {} is not available", self.provider.name()),
                ),
            )
        })
    }
}

#[async_trait]
impl<K: Send + Sync + 'static> Provisioner<K> for Nodes<K> {
    fn name(&self) -> &str {
        "nodes"
    }

    async fn provision(&self, cx: &Context<K>) -> Outcome {
        if let Some(wait) = self.unavailable().await {
            return wait;
        }
        let set = (self.desired)(cx.object());
        let want = set.specs();
        let have = match self.provider.list_nodes(&set.cluster).await {
            Ok(n) => n,
            Err(e) => return on_error(e),
        };
        for extra in have.iter().filter(|n| !want.contains_key(&n.name)) {
            if let Err(e) = self.provider.delete_node(extra).await {
                return on_error(e);
            }
        }
        let mut running = 0;
        let mut started = false;
        for (name, spec) in &want {
            let node: NodeInfo = match have.iter().find(|n| &n.name == name) {
                Some(n) => n.clone(),
                None => match self.provider.create_node(&set.cluster, spec).await {
                    Ok(n) => n,
                    Err(e) => return on_error(e),
                },
            };
            match node.state {
                NodeState::Running => running += 1,
                NodeState::Starting => {}
                NodeState::Created | NodeState::Stopped => {
                    if let Err(e) = self.provider.start_node(&node).await {
                        return on_error(e);
                    }
                    started = true;
                }
            }
        }
        if started {
            // A start that returned may already run the node: look once, without waiting.
            running = match self.provider.list_nodes(&set.cluster).await {
                Ok(now) => now
                    .iter()
                    .filter(|n| want.contains_key(&n.name) && n.state == NodeState::Running)
                    .count(),
                Err(e) => return on_error(e),
            };
        }
        if running == want.len() {
            Outcome::Done
        } else {
            Outcome::yield_after(
                RECHECK,
                Reason::new(
                    "NodesStarting",
                    format!(
                        "{running} of {} nodes of {} running",
                        want.len(),
                        set.cluster
                    ),
                ),
            )
        }
    }

    async fn deprovision(&self, cx: &Context<K>) -> Outcome {
        if let Some(wait) = self.unavailable().await {
            return wait;
        }
        let set = (self.desired)(cx.object());
        if let Err(e) = self.provider.delete_nodes(&set.cluster).await {
            return on_error(e);
        }
        match self.provider.list_nodes(&set.cluster).await {
            Ok(left) if left.is_empty() => Outcome::Done,
            Ok(left) => Outcome::yield_after(
                RECHECK,
                Reason::new(
                    "NodesDeleting",
                    format!("{} nodes of {} left", left.len(), set.cluster),
                ),
            ),
            Err(e) => on_error(e),
        }
    }
}
