//! Nodes as containers, through a Docker Engine API socket (Docker's, or Podman's
//! `podman system service`), on the `bollard` crate.
//!
//! A node is a container named after the node, labelled with its cluster and role in one of
//! four label schemes ([`LabelScheme`]), so the provider also sees clusters that kind, k3d or
//! Talos made. The networks and volumes a node names are created with the cluster's labels
//! when missing, and removed when the cluster's last node is deleted (those of the cluster's
//! labels only: a network another tool made is never removed). A node's endpoints are its
//! published ports (`host address:port`), and its API endpoint the published port of the
//! API server (container port 6443 unless [`DockerProvider::api_port`] says otherwise), which
//! is the cluster's [`endpoint`](super::ClusterStatus::endpoint). Starting a running node or
//! stopping a stopped one is [`ProviderError::Skip`] to the bulk operations (the engine
//! answers `304`). Every engine call is bounded by the provider's timeout (default 30 s): an engine that
//! does not answer, or a socket with nothing behind it, is
//! [`ProviderError::ProviderUnavailable`] within it. Starting or stopping a cluster handles its
//! nodes in name order under one shared deadline; deletion removes containers with force
//! (Podman answers 500, not 409, to removing a running one without it).
//!
//! ```no_run
//! use actorcile::providers::docker::DockerProvider;
//! use actorcile::providers::{NodeRole, NodeSpec, Provider};
//! # async fn f() -> Result<(), actorcile::providers::ProviderError> {
//! let podman = DockerProvider::connect("/run/podman/podman.sock", "kind")?;
//! let mut node = NodeSpec::new("dev-control-plane", NodeRole::ControlPlane, "kindest/node:v1.33.0");
//! node.network_mode = Some("none".into());
//! podman.create_node("dev", &node).await?;
//! podman.start_nodes("dev").await?;
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use bollard::Docker;
use bollard::errors::Error as EngineError;
use bollard::models::{
    ContainerCreateBody, ContainerSummaryStateEnum, EndpointSettings, HostConfig, Mount, MountType,
    NetworkingConfig, PortBinding,
};
use bollard::query_parameters::{
    CreateContainerOptions, ListContainersOptions, RemoveContainerOptions, StopContainerOptions,
};
use tokio::time::Instant;

mod labels;
mod resources;

pub use labels::LabelScheme;

use super::{
    NodeInfo, NodeRole, NodeSpec, NodeState, Provider, ProviderError, for_each_node, nodes_not_in,
};

/// How long to wait before listing again when a container's state did not decode.
const TRANSIENT_STATE_RETRY: Duration = Duration::from_millis(100);

/// Containers as nodes; see the module docs.
pub struct DockerProvider {
    docker: Docker,
    scheme: LabelScheme,
    socket: String,
    timeout: Duration,
    api_port: u16,
}

/// The container port of a node's Kubernetes API server, unless [`DockerProvider::api_port`]
/// says otherwise (kind's, k3d's and Talos's).
pub const DEFAULT_API_PORT: u16 = 6443;

impl DockerProvider {
    /// A provider on the Docker Engine API socket at `socket` (a path, or `unix://` and a
    /// path), labelling nodes by the scheme named `scheme`. A socket path that does not exist
    /// is [`ProviderError::ProviderUnavailable`] at once; one that does not answer, at its
    /// first call.
    pub fn connect(socket: &str, scheme: &str) -> Result<Self, ProviderError> {
        let scheme = LabelScheme::named(scheme)?;
        let timeout = Duration::from_secs(30);
        let docker =
            Docker::connect_with_unix(socket, timeout.as_secs(), bollard::API_DEFAULT_VERSION)
                .map_err(|e| ProviderError::ProviderUnavailable {
                    provider: socket.to_string(),
                    reason: e.to_string(),
                })?;
        Ok(Self {
            docker,
            scheme,
            socket: socket.to_string(),
            timeout,
            api_port: DEFAULT_API_PORT,
        })
    }

    /// The container port of the nodes' API server (default [`DEFAULT_API_PORT`]): its
    /// published port is a control-plane node's [`api_endpoint`](NodeInfo::api_endpoint).
    pub fn api_port(mut self, port: u16) -> Self {
        self.api_port = port;
        self
    }

    /// Bound every engine call (and a cluster's whole stop) by `timeout` (default 30 s).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        let timeout = timeout.min(crate::policy::MAX_DURATION);
        self.timeout = timeout;
        self.docker = self.docker.with_timeout(timeout);
        self
    }

    /// The label scheme.
    pub fn scheme(&self) -> &LabelScheme {
        &self.scheme
    }

    /// Run one engine call under the timeout; `operation` and `node` name it in errors.
    async fn engine<T>(
        &self,
        operation: &'static str,
        node: &str,
        call: impl Future<Output = Result<T, EngineError>>,
    ) -> Result<T, ProviderError> {
        self.engine_until(operation, node, Instant::now() + self.timeout, call)
            .await
    }

    async fn engine_until<T>(
        &self,
        operation: &'static str,
        node: &str,
        deadline: Instant,
        call: impl Future<Output = Result<T, EngineError>>,
    ) -> Result<T, ProviderError> {
        match tokio::time::timeout_at(deadline, call).await {
            Err(_) => Err(self.unavailable(format!("no answer to {operation} within the timeout"))),
            Ok(Ok(v)) => Ok(v),
            Ok(Err(EngineError::DockerResponseServerError {
                status_code,
                message,
            })) => Err(ProviderError::Refused {
                operation,
                node: node.to_string(),
                message: format!("{status_code}: {message}"),
            }),
            Ok(Err(e)) => Err(self.unavailable(e.to_string())),
        }
    }

    fn unavailable(&self, reason: String) -> ProviderError {
        ProviderError::ProviderUnavailable {
            provider: self.socket.clone(),
            reason,
        }
    }

    /// The containers labelled with `cluster` (every cluster's when `None`), as nodes.
    async fn containers(&self, cluster: Option<&str>) -> Result<Vec<NodeInfo>, ProviderError> {
        let filter = match cluster {
            Some(c) => format!("{}={c}", self.scheme.cluster),
            None => self.scheme.cluster.to_string(),
        };
        let options = ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([("label".to_string(), vec![filter])])),
            ..Default::default()
        };
        // Podman's compat list can name a transient state outside the Engine API's set
        // (`stopped`, `stopping`: containers/podman#28359), and bollard then fails the whole
        // list. The state passes once Podman cleans up after the container, so the list is
        // asked again, under the same deadline, until every state decodes.
        let deadline = Instant::now() + self.timeout;
        let listing = async {
            loop {
                match self.docker.list_containers(Some(options.clone())).await {
                    Err(EngineError::JsonDataError { .. })
                        if Instant::now() + TRANSIENT_STATE_RETRY < deadline =>
                    {
                        tokio::time::sleep(TRANSIENT_STATE_RETRY).await;
                    }
                    answer => return answer,
                }
            }
        };
        let list = self
            .engine_until("list", cluster.unwrap_or("*"), deadline, listing)
            .await?;
        let mut nodes: Vec<NodeInfo> = list
            .into_iter()
            .filter_map(|c| {
                let labels = c.labels.unwrap_or_default();
                let name = c.names?.first()?.trim_start_matches('/').to_string();
                Some(NodeInfo {
                    name,
                    cluster: labels.get(self.scheme.cluster)?.clone(),
                    role: self
                        .scheme
                        .role_of(labels.get(self.scheme.role).map_or("", String::as_str)),
                    state: state_of(c.state),
                    endpoints: published(c.ports.as_deref().unwrap_or_default()),
                    api_endpoint: published(
                        &c.ports
                            .unwrap_or_default()
                            .into_iter()
                            .filter(|p| p.private_port == self.api_port)
                            .collect::<Vec<_>>(),
                    )
                    .first()
                    .map(|e| format!("https://{e}")),
                })
            })
            .collect();
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(nodes)
    }

    fn is_not_found(e: &ProviderError) -> bool {
        matches!(e, ProviderError::Refused { message, .. } if message.starts_with("404"))
    }

    /// The labels of everything the provider makes for `cluster`: the scheme's cluster label
    /// and its own marks.
    fn cluster_labels(&self, cluster: &str) -> HashMap<String, String> {
        let mut labels = HashMap::from([(self.scheme.cluster.to_string(), cluster.to_string())]);
        for (k, v) in self.scheme.extra {
            labels.insert((*k).into(), (*v).into());
        }
        labels
    }

    fn label_filter(&self, cluster: &str) -> HashMap<String, Vec<String>> {
        HashMap::from([(
            "label".to_string(),
            vec![format!("{}={cluster}", self.scheme.cluster)],
        )])
    }
}

/// `Refused` with status `304` (the engine had nothing to do: the container runs already, or
/// is stopped already) as [`ProviderError::Skip`].
fn skip_unchanged(r: Result<(), ProviderError>, node: &str) -> Result<(), ProviderError> {
    match r {
        Err(ProviderError::Refused { message, .. }) if message.starts_with("304") => {
            Err(ProviderError::Skip {
                node: node.to_string(),
            })
        }
        other => other,
    }
}

/// A container's published ports as `address:port` (an unspecified host address, as `0.0.0.0`
/// or `::`, is reached on loopback), sorted and without repeats.
fn published(ports: &[bollard::models::PortSummary]) -> Vec<String> {
    let mut out: Vec<String> = ports
        .iter()
        .filter_map(|p| {
            let port = p.public_port?;
            let ip = match p.ip.as_deref() {
                None | Some("") | Some("0.0.0.0") => "127.0.0.1",
                Some("::") => "[::1]",
                Some(ip) if ip.contains(':') => return Some(format!("[{ip}]:{port}")),
                Some(ip) => ip,
            };
            Some(format!("{ip}:{port}"))
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

fn state_of(s: Option<ContainerSummaryStateEnum>) -> NodeState {
    match s {
        Some(ContainerSummaryStateEnum::RUNNING) => NodeState::Running,
        Some(ContainerSummaryStateEnum::CREATED)
        | None
        | Some(ContainerSummaryStateEnum::EMPTY) => NodeState::Created,
        Some(ContainerSummaryStateEnum::RESTARTING) => NodeState::Starting,
        Some(_) => NodeState::Stopped,
    }
}

#[async_trait]
impl Provider for DockerProvider {
    fn name(&self) -> &str {
        &self.socket
    }

    /// Creates the networks and volumes `spec` names first (with the cluster's labels, where
    /// missing), then the container on them, its ports published.
    async fn create_node(&self, cluster: &str, spec: &NodeSpec) -> Result<NodeInfo, ProviderError> {
        for n in &spec.networks {
            self.ensure_network(cluster, n).await?;
        }
        for v in &spec.volumes {
            self.ensure_volume(cluster, &v.volume).await?;
        }
        let mut labels: HashMap<String, String> = spec.labels.clone().into_iter().collect();
        labels.extend(self.cluster_labels(cluster));
        labels.insert(
            self.scheme.role.into(),
            self.scheme.role_value(spec.role).into(),
        );
        let port_key =
            |p: &super::PortMapping| format!("{}/{}", p.container_port, p.protocol.as_str());
        let mut bindings: HashMap<String, Option<Vec<PortBinding>>> = HashMap::new();
        for p in &spec.ports {
            bindings
                .entry(port_key(p))
                .or_insert_with(|| Some(Vec::new()))
                .get_or_insert_with(Vec::new)
                .push(PortBinding {
                    host_ip: Some(p.host_ip.clone()),
                    host_port: Some(p.host_port.map(|h| h.to_string()).unwrap_or_default()),
                });
        }
        let mounts: Vec<Mount> = spec
            .volumes
            .iter()
            .map(|v| Mount {
                typ: Some(MountType::VOLUME),
                source: Some(v.volume.clone()),
                target: Some(v.target.clone()),
                read_only: Some(v.read_only),
                ..Default::default()
            })
            .collect();
        let network_mode = spec
            .network_mode
            .clone()
            .or_else(|| spec.networks.first().cloned());
        let endpoints: HashMap<String, EndpointSettings> = spec
            .networks
            .iter()
            .map(|n| (n.clone(), EndpointSettings::default()))
            .collect();
        let body = ContainerCreateBody {
            image: Some(spec.image.clone()),
            cmd: (!spec.command.is_empty()).then(|| spec.command.clone()),
            labels: Some(labels),
            hostname: Some(spec.name.clone()),
            exposed_ports: (!spec.ports.is_empty())
                .then(|| spec.ports.iter().map(port_key).collect()),
            host_config: Some(HostConfig {
                network_mode,
                port_bindings: (!bindings.is_empty()).then_some(bindings),
                mounts: (!mounts.is_empty()).then_some(mounts),
                ..Default::default()
            }),
            networking_config: (!endpoints.is_empty()).then_some(NetworkingConfig {
                endpoints_config: Some(endpoints),
            }),
            ..Default::default()
        };
        let options = CreateContainerOptions {
            name: Some(spec.name.clone()),
            ..Default::default()
        };
        match self
            .engine(
                "create",
                &spec.name,
                self.docker.create_container(Some(options), body),
            )
            .await
        {
            Ok(_) => Ok(NodeInfo {
                name: spec.name.clone(),
                cluster: cluster.into(),
                role: spec.role,
                state: NodeState::Created,
                endpoints: Vec::new(),
                api_endpoint: None,
            }),
            // The name may be taken by the node itself, created by an earlier reconcile (Docker
            // answers 409, Podman 500): then it is the node.
            Err(ProviderError::Refused { message, .. }) => self
                .containers(Some(cluster))
                .await?
                .into_iter()
                .find(|n| n.name == spec.name)
                .ok_or(ProviderError::Refused {
                    operation: "create",
                    node: spec.name.clone(),
                    message,
                }),
            Err(e) => Err(e),
        }
    }

    async fn list_nodes(&self, cluster: &str) -> Result<Vec<NodeInfo>, ProviderError> {
        self.containers(Some(cluster)).await
    }

    /// The engine answers a ping within the provider's timeout.
    async fn is_available(&self) -> bool {
        self.engine("ping", "*", self.docker.ping()).await.is_ok()
    }

    async fn list_clusters(&self) -> Result<Vec<String>, ProviderError> {
        let mut clusters: Vec<String> = self
            .containers(None)
            .await?
            .into_iter()
            .map(|n| n.cluster)
            .collect();
        clusters.sort();
        clusters.dedup();
        Ok(clusters)
    }

    /// A running node is left as it is.
    async fn start_node(&self, node: &NodeInfo) -> Result<(), ProviderError> {
        let deadline = Instant::now() + self.timeout;
        match start_until(self, node, deadline).await {
            Err(ProviderError::Skip { .. }) => Ok(()),
            other => other,
        }
    }

    async fn start_nodes(&self, cluster: &str) -> Result<(), ProviderError> {
        let nodes = nodes_not_in(self, cluster, NodeState::Running).await?;
        // One deadline for the whole cluster, in name order; a node that runs by now is skipped.
        let deadline = Instant::now() + self.timeout;
        for_each_node(&nodes, |n| start_until(self, n, deadline)).await?;
        Ok(())
    }

    /// A stopped node is left as it is.
    async fn stop_node(&self, node: &NodeInfo) -> Result<(), ProviderError> {
        let deadline = Instant::now() + self.timeout;
        match stop_until(self, node, deadline).await {
            Err(ProviderError::Skip { .. }) => Ok(()),
            other => other,
        }
    }

    async fn stop_nodes(&self, cluster: &str) -> Result<(), ProviderError> {
        let nodes = nodes_not_in(self, cluster, NodeState::Stopped).await?;
        // One deadline for the whole cluster, in name order; a node stopped by now is skipped.
        let deadline = Instant::now() + self.timeout;
        for_each_node(&nodes, |n| stop_until(self, n, deadline)).await?;
        Ok(())
    }

    /// Removes the container; with the cluster's last node, also the networks and volumes
    /// labelled with the cluster.
    async fn delete_node(&self, node: &NodeInfo) -> Result<(), ProviderError> {
        let options = RemoveContainerOptions {
            force: true,
            ..Default::default()
        };
        match self
            .engine(
                "delete",
                &node.name,
                self.docker.remove_container(&node.name, Some(options)),
            )
            .await
        {
            Err(e) if Self::is_not_found(&e) => {}
            other => other?,
        }
        if self.containers(Some(&node.cluster)).await?.is_empty() {
            self.remove_cluster_resources(&node.cluster).await?;
        }
        Ok(())
    }
}

/// Start `node` by `deadline`; [`ProviderError::Skip`] if it runs already.
async fn start_until(
    p: &DockerProvider,
    node: &NodeInfo,
    deadline: Instant,
) -> Result<(), ProviderError> {
    let started = p
        .engine_until(
            "start",
            &node.name,
            deadline,
            p.docker.start_container(&node.name, None),
        )
        .await;
    skip_unchanged(started, &node.name)
}

/// Stop `node`, giving its processes until `deadline` to exit before the engine kills them;
/// [`ProviderError::Skip`] if it is stopped already.
async fn stop_until(
    p: &DockerProvider,
    node: &NodeInfo,
    deadline: Instant,
) -> Result<(), ProviderError> {
    let left = deadline.saturating_duration_since(Instant::now());
    // The engine's grace period, leaving it a second to answer within the deadline.
    let grace = left
        .saturating_sub(Duration::from_secs(1))
        .as_secs()
        .min(10) as i32;
    let options = StopContainerOptions {
        t: Some(grace),
        ..Default::default()
    };
    let stopped = p
        .engine_until(
            "stop",
            &node.name,
            deadline,
            p.docker.stop_container(&node.name, Some(options)),
        )
        .await;
    skip_unchanged(stopped, &node.name)
}

#[cfg(test)]
mod tests;
