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

//! # A cloud provider
//!
//! ksail also drives Hetzner Cloud servers and Sidero Omni machines. Neither can be reached
//! from the machines this crate is built and tested on, so neither is here; a cloud provider
//! implements the same contract against its API. Its clusters are objects of their own, so an
//! operation on one it does not have is [`ProviderError::ClusterNotFound`]; its machines are
//! ready when the API says so, which [`ClusterStatus::build`] takes as the ready state; and
//! its API reports the cluster's endpoint. With the cloud's API stood in by a map:
//!
//! ```
//! use std::collections::BTreeMap;
//! use std::sync::Mutex;
//! use actorcile::providers::*;
//!
//! /// Servers by name; a server's cluster and whether the cloud reports it running.
//! #[derive(Default)]
//! struct Cloud {
//!     servers: Mutex<BTreeMap<String, NodeInfo>>,
//!     clusters: Mutex<BTreeMap<String, String>>, // cluster → its API endpoint
//! }
//!
//! #[async_trait::async_trait]
//! impl Provider for Cloud {
//!     fn name(&self) -> &str { "cloud" }
//!     async fn create_node(&self, cluster: &str, spec: &NodeSpec) -> Result<NodeInfo, ProviderError> {
//!         self.clusters.lock().unwrap().entry(cluster.into())
//!             .or_insert_with(|| format!("https://{cluster}.api.cloud.example:6443"));
//!         let node = NodeInfo {
//!             name: spec.name.clone(), cluster: cluster.into(), role: spec.role,
//!             state: NodeState::Created, endpoints: vec![], api_endpoint: None,
//!         };
//!         Ok(self.servers.lock().unwrap().entry(spec.name.clone()).or_insert(node).clone())
//!     }
//!     async fn list_nodes(&self, cluster: &str) -> Result<Vec<NodeInfo>, ProviderError> {
//!         Ok(self.servers.lock().unwrap().values().filter(|n| n.cluster == cluster).cloned().collect())
//!     }
//!     async fn list_clusters(&self) -> Result<Vec<String>, ProviderError> {
//!         Ok(self.clusters.lock().unwrap().keys().cloned().collect())
//!     }
//!     async fn start_node(&self, node: &NodeInfo) -> Result<(), ProviderError> {
//!         self.set(node, NodeState::Running)
//!     }
//!     async fn stop_node(&self, node: &NodeInfo) -> Result<(), ProviderError> {
//!         self.set(node, NodeState::Stopped)
//!     }
//!     async fn delete_node(&self, node: &NodeInfo) -> Result<(), ProviderError> {
//!         let mut servers = self.servers.lock().unwrap();
//!         servers.remove(&node.name);
//!         if !servers.values().any(|n| n.cluster == node.cluster) {
//!             self.clusters.lock().unwrap().remove(&node.cluster);
//!         }
//!         Ok(())
//!     }
//!     /// The cloud knows its clusters: one it does not have is not found.
//!     async fn cluster_status(&self, cluster: &str) -> Result<Option<ClusterStatus>, ProviderError> {
//!         let Some(endpoint) = self.clusters.lock().unwrap().get(cluster).cloned() else {
//!             return Ok(None);
//!         };
//!         let mut status = ClusterStatus::build(self.list_nodes(cluster).await?, NodeState::Running)
//!             .ok_or_else(|| ProviderError::ClusterNotFound { cluster: cluster.into() })?;
//!         status.endpoint = Some(endpoint);
//!         Ok(Some(status))
//!     }
//!     async fn start_nodes(&self, cluster: &str) -> Result<(), ProviderError> {
//!         if !self.clusters.lock().unwrap().contains_key(cluster) {
//!             return Err(ProviderError::ClusterNotFound { cluster: cluster.into() });
//!         }
//!         let nodes = self.list_nodes(cluster).await?;
//!         for_each_node(&nodes, |n| async move {
//!             if n.state == NodeState::Running {
//!                 return Err(ProviderError::Skip { node: n.name.clone() }); // nothing to do
//!             }
//!             self.start_node(n).await
//!         })
//!         .await?;
//!         Ok(())
//!     }
//! }
//!
//! impl Cloud {
//!     fn set(&self, node: &NodeInfo, state: NodeState) -> Result<(), ProviderError> {
//!         match self.servers.lock().unwrap().get_mut(&node.name) {
//!             Some(n) => { n.state = state; Ok(()) }
//!             None => Err(ProviderError::ClusterNotFound { cluster: node.cluster.clone() }),
//!         }
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), ProviderError> {
//! let cloud = Cloud::default();
//! assert!(matches!(cloud.start_nodes("prod").await, Err(ProviderError::ClusterNotFound { .. })));
//! cloud.create_node("prod", &NodeSpec::new("prod-cp-0", NodeRole::ControlPlane, "ubuntu-24.04")).await?;
//! cloud.start_nodes("prod").await?;
//! let status = cloud.cluster_status("prod").await?.expect("the cluster exists");
//! assert_eq!(status.phase, ClusterPhase::Ready);
//! assert_eq!(status.endpoint.as_deref(), Some("https://prod.api.cloud.example:6443"));
//! cloud.delete_nodes("prod").await?;
//! assert!(cloud.cluster_status("prod").await?.is_none());
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
    /// The URL of the Kubernetes API server the node serves, as reached from the provider's
    /// host (`https://127.0.0.1:41234`: a control-plane container's published API port), where
    /// the provider knows it.
    pub api_endpoint: Option<String>,
}

/// A cluster's phase, derived from its nodes' states.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClusterPhase {
    /// Every node is ready.
    Ready,
    /// Nodes are starting, none is stopped: the cluster is on its way up.
    Starting,
    /// Some nodes are ready, some not (and none is starting).
    Degraded,
    /// No node is ready or starting.
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
    /// The cluster's Kubernetes API endpoint: a control-plane node's
    /// [`api_endpoint`](NodeInfo::api_endpoint) (a ready one's first), or the endpoint a cloud
    /// provider's API reports.
    pub endpoint: Option<String>,
}

impl ClusterStatus {
    /// [`ClusterStatus::build`] with running nodes counted as ready.
    pub fn from_nodes(nodes: Vec<NodeInfo>) -> Option<Self> {
        Self::build(nodes, NodeState::Running)
    }

    /// The status of a cluster with `nodes`, counting those in `ready_state` as ready (ksail's
    /// `BuildClusterStatus(nodes, readyState)`: a provider whose nodes are ready in another
    /// state than running says which). All ready ⇒ Ready; else any starting and none stopped
    /// ⇒ Starting; else some ready ⇒ Degraded; else Stopped. `None` without nodes (the cluster
    /// does not exist).
    ///
    /// ```
    /// use actorcile::providers::{ClusterPhase, ClusterStatus, NodeInfo, NodeRole, NodeState};
    /// let node = |name: &str, state| NodeInfo {
    ///     name: name.into(),
    ///     cluster: "dev".into(),
    ///     role: NodeRole::ControlPlane,
    ///     state,
    ///     endpoints: vec![],
    ///     api_endpoint: Some(format!("https://{name}:6443")),
    /// };
    /// let s = ClusterStatus::build(vec![node("a", NodeState::Running), node("b", NodeState::Starting)], NodeState::Running)
    ///     .expect("the cluster has nodes");
    /// assert_eq!((s.phase, s.nodes_ready, s.nodes_total), (ClusterPhase::Starting, 1, 2));
    /// assert_eq!(s.endpoint.as_deref(), Some("https://a:6443"));
    /// ```
    pub fn build(nodes: Vec<NodeInfo>, ready_state: NodeState) -> Option<Self> {
        if nodes.is_empty() {
            return None;
        }
        let in_state = |s: NodeState| nodes.iter().filter(|n| n.state == s).count();
        let ready = in_state(ready_state);
        let starting = ready_state != NodeState::Starting && in_state(NodeState::Starting) > 0;
        let stopped = ready_state != NodeState::Stopped && in_state(NodeState::Stopped) > 0;
        let phase = match ready {
            r if r == nodes.len() => ClusterPhase::Ready,
            _ if starting && !stopped => ClusterPhase::Starting,
            0 => ClusterPhase::Stopped,
            _ => ClusterPhase::Degraded,
        };
        let control_planes = || nodes.iter().filter(|n| n.role == NodeRole::ControlPlane);
        let endpoint = control_planes()
            .filter(|n| n.state == ready_state)
            .chain(control_planes())
            .find_map(|n| n.api_endpoint.clone());
        Some(Self {
            phase,
            ready: phase == ClusterPhase::Ready,
            nodes_total: nodes.len(),
            nodes_ready: ready,
            nodes,
            endpoint,
        })
    }
}

/// A named volume mounted into a node ([`NodeSpec::volumes`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeMount {
    /// The volume's name (created with the cluster's labels when missing).
    pub volume: String,
    /// Where it is mounted in the node.
    pub target: String,
    /// Mounted read-only.
    pub read_only: bool,
}

impl VolumeMount {
    /// Volume `volume` mounted read-write at `target`.
    pub fn new(volume: impl Into<String>, target: impl Into<String>) -> Self {
        Self {
            volume: volume.into(),
            target: target.into(),
            read_only: false,
        }
    }
}

/// The protocol of a published port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PortProtocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

impl PortProtocol {
    /// `tcp` or `udp`.
    pub fn as_str(self) -> &'static str {
        match self {
            PortProtocol::Tcp => "tcp",
            PortProtocol::Udp => "udp",
        }
    }
}

/// A node's port published on the provider's host ([`NodeSpec::ports`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortMapping {
    /// The port in the node.
    pub container_port: u16,
    /// The port on the host (`None`: the engine picks a free one, as kind does for the API
    /// server).
    pub host_port: Option<u16>,
    /// The host address it is published on: loopback unless set, so a node is not reachable
    /// from other machines by default.
    pub host_ip: String,
    /// The protocol.
    pub protocol: PortProtocol,
}

impl PortMapping {
    /// TCP port `container_port` published on a free port of the host's loopback.
    pub fn tcp(container_port: u16) -> Self {
        Self {
            container_port,
            host_port: None,
            host_ip: "127.0.0.1".into(),
            protocol: PortProtocol::Tcp,
        }
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
    /// The container network mode (`None`: the first of [`networks`](Self::networks), else the
    /// engine's default; `"none"` keeps the engine off the host's network).
    pub network_mode: Option<String>,
    /// Named networks the node joins, each created with the cluster's labels when missing
    /// and removed with the cluster's last node (kind's `kind` network, k3d's
    /// `k3d-<cluster>`).
    pub networks: Vec<String>,
    /// Named volumes mounted into the node, each created with the cluster's labels when
    /// missing and removed with the cluster's last node.
    pub volumes: Vec<VolumeMount>,
    /// Ports published on the provider's host (the API server's, for the cluster's
    /// [`endpoint`](ClusterStatus::endpoint)).
    pub ports: Vec<PortMapping>,
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
            networks: Vec::new(),
            volumes: Vec::new(),
            ports: Vec::new(),
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
    /// An operation on one cluster that does not exist, from a provider whose clusters are
    /// objects of their own (a cloud's clusters, Omni's; ksail's `ErrClusterNotFound`). A
    /// provider whose clusters are only their nodes answers [`ProviderError::NoNodes`]
    /// instead; both say there is nothing to act on.
    #[error("cluster {cluster} not found")]
    ClusterNotFound {
        /// The cluster.
        cluster: String,
    },
    /// Nothing to do for this node (ksail's `ErrSkipAction`): returned by a per-node action
    /// of a bulk operation ([`for_each_node`]), which goes on to the next node at once.
    #[error("nothing to do for node {node}")]
    Skip {
        /// The node.
        node: String,
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
        let nodes = nodes_not_in(self, cluster, NodeState::Running).await?;
        for_each_node(&nodes, |n| self.start_node(n)).await?;
        Ok(())
    }

    /// Stop every node of `cluster`, in name order; [`ProviderError::NoNodes`] without nodes.
    async fn stop_nodes(&self, cluster: &str) -> Result<(), ProviderError> {
        let nodes = nodes_not_in(self, cluster, NodeState::Stopped).await?;
        for_each_node(&nodes, |n| self.stop_node(n)).await?;
        Ok(())
    }

    /// Whether `cluster` has nodes.
    async fn nodes_exist(&self, cluster: &str) -> Result<bool, ProviderError> {
        Ok(!self.list_nodes(cluster).await?.is_empty())
    }

    /// Delete every node of `cluster`; a missing cluster is fine.
    async fn delete_nodes(&self, cluster: &str) -> Result<(), ProviderError> {
        let nodes = self.list_nodes(cluster).await?;
        for_each_node(&nodes, |n| self.delete_node(n)).await?;
        Ok(())
    }

    /// The status of `cluster`, `None` if it has no nodes.
    async fn cluster_status(&self, cluster: &str) -> Result<Option<ClusterStatus>, ProviderError> {
        Ok(ClusterStatus::from_nodes(self.list_nodes(cluster).await?))
    }
}

/// Run `action` on each of `nodes` in order, stopping at the first error; a node whose action
/// answers [`ProviderError::Skip`] is passed over (what a bulk operation does with ksail's
/// skip sentinel). How many nodes were acted on, the skipped ones not counted.
///
/// ```
/// use actorcile::providers::{NodeInfo, NodeRole, NodeState, ProviderError, for_each_node};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let node = |name: &str, state| NodeInfo {
///     name: name.into(), cluster: "dev".into(), role: NodeRole::Worker, state,
///     endpoints: vec![], api_endpoint: None,
/// };
/// let nodes = [node("a", NodeState::Running), node("b", NodeState::Stopped)];
/// let started = for_each_node(&nodes, |n| async move {
///     if n.state == NodeState::Running {
///         return Err(ProviderError::Skip { node: n.name.clone() });
///     }
///     Ok(())
/// })
/// .await;
/// assert_eq!(started.unwrap(), 1);
/// # }
/// ```
pub async fn for_each_node<'a, F, Fut>(
    nodes: &'a [NodeInfo],
    mut action: F,
) -> Result<usize, ProviderError>
where
    F: FnMut(&'a NodeInfo) -> Fut,
    Fut: std::future::Future<Output = Result<(), ProviderError>>,
{
    let mut acted = 0;
    for n in nodes {
        match action(n).await {
            Ok(()) => acted += 1,
            Err(ProviderError::Skip { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(acted)
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
            api_endpoint: None,
        }
    }

    #[test]
    fn the_ready_state_is_a_parameter_and_starting_nodes_make_a_starting_cluster() {
        let starting = ClusterStatus::from_nodes(vec![
            node("a", NodeState::Running),
            node("b", NodeState::Starting),
        ])
        .unwrap();
        assert_eq!(starting.phase, ClusterPhase::Starting);
        let with_a_stopped = ClusterStatus::from_nodes(vec![
            node("a", NodeState::Starting),
            node("b", NodeState::Stopped),
        ])
        .unwrap();
        assert_eq!(with_a_stopped.phase, ClusterPhase::Stopped);
        // A provider whose nodes are ready once created (a cloud's machines, say).
        let created = ClusterStatus::build(
            vec![node("a", NodeState::Created), node("b", NodeState::Created)],
            NodeState::Created,
        )
        .unwrap();
        assert_eq!(
            (created.phase, created.nodes_ready),
            (ClusterPhase::Ready, 2)
        );
        let mut cp = node("cp", NodeState::Stopped);
        cp.role = NodeRole::ControlPlane;
        cp.api_endpoint = Some("https://127.0.0.1:1".into());
        let mut cp2 = node("cp2", NodeState::Running);
        cp2.role = NodeRole::ControlPlane;
        cp2.api_endpoint = Some("https://127.0.0.1:2".into());
        let s = ClusterStatus::from_nodes(vec![cp, cp2, node("w", NodeState::Running)]).unwrap();
        assert_eq!(
            s.endpoint.as_deref(),
            Some("https://127.0.0.1:2"),
            "a ready control plane's API first"
        );
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
