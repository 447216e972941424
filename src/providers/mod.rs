//! Infrastructure providers: what runs the nodes of a Kubernetes cluster (containers, VMs), the
//! contract of ksail's `pkg/provider` with a `create` added so a reconciler can converge a
//! desired node set. Providers know nothing of distributions, provisioners or actors; the
//! [`nodes`](crate::provisioners::nodes()) provisioner drives one from a tree.
//!
//! | provider | what runs the nodes |
//! |---|---|
//! | [`docker::DockerProvider`] (feature `docker`) | containers, through any Docker Engine API socket (Docker, Podman) |
//! | [`simulated::SimulatedProvider`] | nothing: in-memory nodes with seeded latency, failures and stuck nodes |
//!
//! Semantics every provider keeps: starting or stopping a cluster with no nodes is
//! [`ProviderError::NoNodes`]; deleting a missing cluster succeeds; the status of a cluster with
//! no nodes is `None` (not found, no error); a cluster's phase comes from its nodes' states
//! ([`ClusterStatus::from_nodes`]).
//!
//! ```
//! use actorcile::providers::simulated::{ProviderFaults, SimulatedProvider};
//! use actorcile::providers::{ClusterPhase, NodeRole, NodeSpec, Provider};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), actorcile::providers::ProviderError> {
//! let provider = SimulatedProvider::new(7, ProviderFaults::default());
//! provider.create_node("dev", &NodeSpec::new("dev-cp-0", NodeRole::ControlPlane, "node:1")).await?;
//! provider.start_nodes("dev").await?;
//! let status = provider.cluster_status("dev").await?.expect("the cluster exists");
//! assert_eq!(status.phase, ClusterPhase::Ready);
//! provider.delete_nodes("dev").await?;
//! assert!(provider.cluster_status("dev").await?.is_none());
//! # Ok(()) }
//! ```

#[cfg(feature = "docker")]
pub mod docker;
pub mod simulated;

use std::collections::BTreeMap;
use std::fmt;

use async_trait::async_trait;

/// What a node does in its cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NodeRole {
    /// Runs the control plane.
    ControlPlane,
    /// Runs workloads.
    Worker,
}

impl NodeRole {
    /// `control-plane` or `worker`.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeRole::ControlPlane => "control-plane",
            NodeRole::Worker => "worker",
        }
    }
}

impl fmt::Display for NodeRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a node is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NodeState {
    /// Created, never started.
    Created,
    /// Starting (or restarting), not running yet.
    Starting,
    /// Running: the node is ready.
    Running,
    /// Stopped (exited, paused, dead).
    Stopped,
}

/// One node, as its provider reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    /// The node's name (a container's name).
    pub name: String,
    /// The cluster it belongs to.
    pub cluster: String,
    /// Its role.
    pub role: NodeRole,
    /// Its state.
    pub state: NodeState,
    /// Where it can be reached from the provider's host, as `address:port`, where the provider
    /// knows it (a container's published ports); empty otherwise.
    pub endpoints: Vec<String>,
}

/// A cluster's phase, derived from its nodes' states.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClusterPhase {
    /// Every node is running.
    Ready,
    /// Some nodes are running, some not.
    Degraded,
    /// No node is running.
    Stopped,
}

/// A cluster's status as its provider reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterStatus {
    /// The phase.
    pub phase: ClusterPhase,
    /// Every node is running.
    pub ready: bool,
    /// Nodes in all.
    pub nodes_total: usize,
    /// Nodes running.
    pub nodes_ready: usize,
    /// The nodes.
    pub nodes: Vec<NodeInfo>,
    /// The provider's API endpoint of the cluster, for providers that have one.
    pub endpoint: Option<String>,
}

impl ClusterStatus {
    /// The status of a cluster with `nodes`: all running ⇒ Ready, some ⇒ Degraded, none ⇒
    /// Stopped; `None` without nodes (the cluster does not exist).
    pub fn from_nodes(nodes: Vec<NodeInfo>) -> Option<Self> {
        if nodes.is_empty() {
            return None;
        }
        let ready = nodes
            .iter()
            .filter(|n| n.state == NodeState::Running)
            .count();
        let phase = match ready {
            0 => ClusterPhase::Stopped,
            r if r == nodes.len() => ClusterPhase::Ready,
            _ => ClusterPhase::Degraded,
        };
        Some(Self {
            phase,
            ready: phase == ClusterPhase::Ready,
            nodes_total: nodes.len(),
            nodes_ready: ready,
            nodes,
            endpoint: None,
        })
    }
}

/// A node to create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSpec {
    /// Its name (unique on the provider).
    pub name: String,
    /// Its role.
    pub role: NodeRole,
    /// The image it runs.
    pub image: String,
    /// Labels besides the provider's own cluster and role labels.
    pub labels: BTreeMap<String, String>,
    /// The command (empty: the image's).
    pub command: Vec<String>,
    /// The container network mode (`None`: the engine's default; `"none"` keeps the engine
    /// off the host's network).
    pub network_mode: Option<String>,
}

impl NodeSpec {
    /// A node `name` of `role` running `image`.
    pub fn new(name: impl Into<String>, role: NodeRole, image: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            role,
            image: image.into(),
            labels: BTreeMap::new(),
            command: Vec::new(),
            network_mode: None,
        }
    }
}

/// What a provider can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProviderError {
    /// Start or stop of a cluster that has no nodes.
    #[error("no nodes found for cluster {cluster}")]
    NoNodes {
        /// The cluster.
        cluster: String,
    },
    /// The provider does not answer (no socket, refused, or no answer within its timeout).
    #[error("provider {provider} is not available: {reason}")]
    ProviderUnavailable {
        /// The provider (e.g. its socket).
        provider: String,
        /// Why.
        reason: String,
    },
    /// An operation on one cluster whose nodes do not exist.
    #[error("cluster {cluster} not found")]
    ClusterNotFound {
        /// The cluster.
        cluster: String,
    },
    /// A label scheme the provider does not know.
    #[error("unknown label scheme {name:?} (known: kind, k3d, talos, actorcile)")]
    UnknownLabelScheme {
        /// The name given.
        name: String,
    },
    /// The engine refused an operation on a node.
    #[error("{operation} of node {node} failed: {message}")]
    Refused {
        /// The operation (create, start, stop, delete, list).
        operation: &'static str,
        /// The node (or cluster, for a list).
        node: String,
        /// The engine's message.
        message: String,
    },
}

/// The nodes of clusters: start, stop, list, create and delete them. Implementations must be
/// idempotent where the semantics say so (see the module docs).
#[async_trait]
pub trait Provider: Send + Sync {
    /// A short name for logs and errors.
    fn name(&self) -> &str;

    /// Create node `spec` in `cluster` (not started). A node of that name that exists already
    /// is returned as it is.
    async fn create_node(&self, cluster: &str, spec: &NodeSpec) -> Result<NodeInfo, ProviderError>;

    /// The nodes of `cluster` (none if it does not exist), sorted by name.
    async fn list_nodes(&self, cluster: &str) -> Result<Vec<NodeInfo>, ProviderError>;

    /// Every cluster that has nodes, sorted.
    async fn list_clusters(&self) -> Result<Vec<String>, ProviderError>;

    /// Whether the provider can be used now (its engine answers), without touching any
    /// cluster, so that a controller can say `ProviderUnavailable` before it calls anything.
    /// Default: whether [`Provider::list_clusters`] succeeds.
    async fn is_available(&self) -> bool {
        self.list_clusters().await.is_ok()
    }

    /// Start one node (a no-op if it runs).
    async fn start_node(&self, node: &NodeInfo) -> Result<(), ProviderError>;

    /// Stop one node (a no-op if it is stopped).
    async fn stop_node(&self, node: &NodeInfo) -> Result<(), ProviderError>;

    /// Delete one node, running or not (a no-op if it is gone).
    async fn delete_node(&self, node: &NodeInfo) -> Result<(), ProviderError>;

    /// Start every node of `cluster`, in name order; [`ProviderError::NoNodes`] without nodes.
    async fn start_nodes(&self, cluster: &str) -> Result<(), ProviderError> {
        for n in &nodes_not_in(self, cluster, NodeState::Running).await? {
            self.start_node(n).await?;
        }
        Ok(())
    }

    /// Stop every node of `cluster`, in name order; [`ProviderError::NoNodes`] without nodes.
    async fn stop_nodes(&self, cluster: &str) -> Result<(), ProviderError> {
        for n in &nodes_not_in(self, cluster, NodeState::Stopped).await? {
            self.stop_node(n).await?;
        }
        Ok(())
    }

    /// Whether `cluster` has nodes.
    async fn nodes_exist(&self, cluster: &str) -> Result<bool, ProviderError> {
        Ok(!self.list_nodes(cluster).await?.is_empty())
    }

    /// Delete every node of `cluster`; a missing cluster is fine.
    async fn delete_nodes(&self, cluster: &str) -> Result<(), ProviderError> {
        for n in self.list_nodes(cluster).await? {
            self.delete_node(&n).await?;
        }
        Ok(())
    }

    /// The status of `cluster`, `None` if it has no nodes.
    async fn cluster_status(&self, cluster: &str) -> Result<Option<ClusterStatus>, ProviderError> {
        Ok(ClusterStatus::from_nodes(self.list_nodes(cluster).await?))
    }
}

/// The nodes of `cluster` not in `state` yet, in name order; [`ProviderError::NoNodes`] when
/// it has none (what [`Provider::start_nodes`] and [`Provider::stop_nodes`] work through).
pub(crate) async fn nodes_not_in<P: Provider + ?Sized>(
    provider: &P,
    cluster: &str,
    state: NodeState,
) -> Result<Vec<NodeInfo>, ProviderError> {
    let mut nodes = provider.list_nodes(cluster).await?;
    if nodes.is_empty() {
        return Err(ProviderError::NoNodes {
            cluster: cluster.into(),
        });
    }
    nodes.retain(|n| n.state != state);
    Ok(nodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, state: NodeState) -> NodeInfo {
        NodeInfo {
            name: name.into(),
            cluster: "c".into(),
            role: NodeRole::Worker,
            state,
            endpoints: Vec::new(),
        }
    }

    #[test]
    fn the_phase_comes_from_the_nodes() {
        assert_eq!(ClusterStatus::from_nodes(vec![]), None);
        let all = ClusterStatus::from_nodes(vec![
            node("a", NodeState::Running),
            node("b", NodeState::Running),
        ])
        .unwrap();
        assert_eq!(
            (all.phase, all.ready, all.nodes_ready),
            (ClusterPhase::Ready, true, 2)
        );
        let some = ClusterStatus::from_nodes(vec![
            node("a", NodeState::Running),
            node("b", NodeState::Stopped),
        ])
        .unwrap();
        assert_eq!((some.phase, some.ready), (ClusterPhase::Degraded, false));
        let none = ClusterStatus::from_nodes(vec![
            node("a", NodeState::Created),
            node("b", NodeState::Stopped),
        ])
        .unwrap();
        assert_eq!((none.phase, none.nodes_total), (ClusterPhase::Stopped, 2));
    }
}
