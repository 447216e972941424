//! The operator: two kinds, their provisioner trees, and the runtime that drives them.

use std::sync::Arc;
use std::time::Duration;

use actorcile::prelude::*;
use actorcile::providers::simulated::{ProviderFaults, SimulatedProvider};
use actorcile::providers::{NodeRole, NodeSpec, Provider};
use actorcile::provisioners::{NodeSet, nodes};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;
use kube::{CustomResource, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of the operator's kinds.
pub const GROUP: &str = "example.actorcile.dev";

/// A network that clusters attach to.
#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "example.actorcile.dev",
    version = "v1",
    kind = "Network",
    namespaced,
    status = "ResourceStatus",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#
)]
pub struct NetworkSpec {
    /// The network's IPv4 range, e.g. `10.0.0.0/16`.
    pub cidr: String,
}

/// A cluster of nodes on a network.
#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "example.actorcile.dev",
    version = "v1",
    kind = "Cluster",
    namespaced,
    status = "ClusterStatus",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#
)]
pub struct ClusterSpec {
    /// The Network (same namespace) the cluster's nodes attach to.
    pub network: String,
    /// Worker nodes, at most [`MAX_WORKERS`].
    #[schemars(range(max = 16))]
    pub workers: usize,
    /// The node image: one the operator allows (`--allowed-image-prefix`).
    #[serde(default = "default_image")]
    pub image: String,
}

/// The most workers a Cluster may ask for: the spec is a tenant's, the nodes the operator's.
pub const MAX_WORKERS: usize = 16;

/// The image prefix the operator allows by default: its own node images.
pub const DEFAULT_IMAGE_PREFIX: &str = "example/node:";

/// A Cluster's status: the runtime's part (Ready, phase, conditions) and where the cluster is
/// reached, which its tree writes.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct ClusterStatus {
    /// The runtime's part.
    #[serde(flatten)]
    pub base: ResourceStatus,
    /// Where the cluster is reached: its first node's first endpoint (a published port), else
    /// that node's name where the provider publishes none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
}

fn default_image() -> String {
    "example/node:1.33".into()
}

/// Whether `cidr` is an IPv4 range `a.b.c.d/n`.
fn valid_cidr(cidr: &str) -> bool {
    let Some((ip, bits)) = cidr.split_once('/') else {
        return false;
    };
    ip.parse::<std::net::Ipv4Addr>().is_ok() && bits.parse::<u8>().is_ok_and(|b| b <= 32)
}

/// Network: validate the range, then publish it as a ConfigMap `<name>-network` the clusters
/// read.
pub fn network_tree() -> impl Provisioner<Network> {
    serial![
        step("validate", |cx: Context<Network>| async move {
            let cidr = &cx.object().spec.cidr;
            if !valid_cidr(cidr) {
                return Outcome::Terminal(Reason::new(
                    "InvalidCIDR",
                    format!("spec.cidr {cidr:?} is not an IPv4 range like 10.0.0.0/16"),
                ));
            }
            Outcome::Done
        }),
        resource("publish", |n: &Network| ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("{}-network", n.name_any())),
                ..Default::default()
            },
            data: Some([("cidr".to_string(), n.spec.cidr.clone())].into()),
            ..Default::default()
        }),
    ]
}

/// The Network a Cluster names, as a reference target.
fn network_of(c: &Cluster) -> Target {
    Target::new(
        format!("{GROUP}/v1"),
        "Network",
        c.namespace().as_deref(),
        c.spec.network.clone(),
    )
}

/// The name of a Cluster's node set on the provider: `<namespace>.<name>`. A namespace holds no
/// `.`, so two Clusters never share a node set (with `-`, `a-b/c` and `a/b-c` did).
fn node_set_of(c: &Cluster) -> String {
    format!("{}.{}", c.namespace().unwrap_or_default(), c.name_any())
}

/// Why the Cluster's spec is refused, if it is: too many workers, or an image outside the
/// allowed prefixes.
fn refused_spec(c: &ClusterSpec, allowed_images: &[String]) -> Option<Reason> {
    if c.workers > MAX_WORKERS {
        return Some(Reason::new(
            "TooManyWorkers",
            format!("spec.workers is {}; at most {MAX_WORKERS}", c.workers),
        ));
    }
    if !allowed_images
        .iter()
        .any(|p| c.image.starts_with(p.as_str()))
    {
        return Some(Reason::new(
            "ImageNotAllowed",
            format!(
                "spec.image is not one this operator runs (allowed: {})",
                allowed_images.join(", ")
            ),
        ));
    }
    None
}

/// Cluster: wait for its Network to be Ready and hold a reference on it (so the Network cannot
/// be deleted while the cluster uses it), start its nodes on the provider, write where it is
/// reached into its status (`status.endpoint`), then write its connection details as a
/// ConfigMap `<name>-cluster`.
pub fn cluster_tree(
    provider: Arc<dyn Provider>,
    allowed_images: Arc<[String]>,
) -> impl Provisioner<Cluster> {
    let nodes_provider = provider.clone();
    serial![
        step("validate", move |cx: Context<Cluster>| {
            let allowed = allowed_images.clone();
            async move {
                match refused_spec(&cx.object().spec, &allowed) {
                    Some(reason) => Outcome::Terminal(reason),
                    None => Outcome::Done,
                }
            }
        }),
        step("network", |cx: Context<Cluster>| async move {
            let network = network_of(cx.object());
            if let Some(wait) = cx.require_ready(&network).await {
                return wait;
            }
            // The one reference it holds: a changed spec.network releases the old network.
            if let Err(e) = cx.hold_references(std::slice::from_ref(&network)).await {
                return Outcome::failed(
                    Reason::new("NetworkReference", "cannot reference the network"),
                    e,
                );
            }
            Outcome::Done
        }),
        nodes(nodes_provider, |c: &Cluster| {
            let template = NodeSpec::new("", NodeRole::Worker, &c.spec.image);
            NodeSet::new(node_set_of(c), 1, c.spec.workers, template)
        }),
        step("endpoint", move |cx: Context<Cluster>| {
            let provider = provider.clone();
            async move {
                let nodes = match provider.list_nodes(&node_set_of(cx.object())).await {
                    Ok(nodes) => nodes,
                    Err(e) => {
                        return Outcome::failed(
                            Reason::new("ProviderError", "cannot list the cluster's nodes"),
                            e,
                        );
                    }
                };
                let Some(first) = nodes.iter().min_by(|a, b| a.name.cmp(&b.name)) else {
                    return Outcome::yield_after(
                        Duration::from_secs(1),
                        Reason::new("NoNodes", "the provider lists no node yet"),
                    );
                };
                let endpoint = first.endpoints.first().unwrap_or(&first.name).clone();
                // Written with the reconcile's one status write, and only when it changed.
                if let Err(e) = cx.set_status_field("endpoint", endpoint) {
                    return Outcome::Terminal(Reason::new("StatusFieldInvalid", e.to_string()));
                }
                Outcome::Done
            }
        }),
        resource("connection", |c: &Cluster| ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("{}-cluster", c.name_any())),
                ..Default::default()
            },
            data: Some(
                [
                    ("network".to_string(), c.spec.network.clone()),
                    ("workers".to_string(), c.spec.workers.to_string()),
                ]
                .into(),
            ),
            ..Default::default()
        }),
    ]
}

/// Where the clusters' nodes run.
#[derive(clap::Args, Clone, Debug)]
#[command(next_help_heading = "Infrastructure")]
pub struct ProviderArgs {
    /// The infrastructure provider: `simulated` (in memory; a node starts in 50–200 ms) or
    /// `docker` (containers on a Docker Engine API: Docker, or Podman's socket)
    #[arg(long, env = "EXAMPLE_OPERATOR_PROVIDER", default_value = "simulated")]
    pub provider: ProviderKind,
    /// The Docker Engine API socket (with `--provider docker`)
    #[arg(
        long,
        env = "EXAMPLE_OPERATOR_DOCKER_SOCKET",
        default_value = "/var/run/docker.sock"
    )]
    pub docker_socket: String,
    /// An image prefix Clusters' nodes may use (repeat for several); a Cluster naming another
    /// image is refused (`ImageNotAllowed`)
    #[arg(
        long = "allowed-image-prefix",
        env = "EXAMPLE_OPERATOR_ALLOWED_IMAGE_PREFIXES",
        value_delimiter = ',',
        default_value = DEFAULT_IMAGE_PREFIX
    )]
    pub allowed_images: Vec<String>,
}

/// The infrastructure providers the example knows.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProviderKind {
    /// actorcile's seeded simulated provider.
    Simulated,
    /// actorcile's Docker-API provider (containers labelled with the `actorcile` scheme).
    Docker,
}

impl ProviderArgs {
    /// The provider the flags name.
    pub fn provider(&self) -> Result<Arc<dyn Provider>, String> {
        Ok(match self.provider {
            ProviderKind::Simulated => {
                Arc::new(SimulatedProvider::new(7, ProviderFaults::default()))
            }
            ProviderKind::Docker => Arc::new(
                actorcile::providers::docker::DockerProvider::connect(
                    &self.docker_socket,
                    "actorcile",
                )
                .map_err(|e| e.to_string())?,
            ),
        })
    }
}

/// The runtime's name: Events' reporting controller, field manager.
pub const NAME: &str = "example-operator";

/// The operator's names: the finalizer `example.actorcile.dev/finalizer`, the field manager
/// and the Leases from [`NAME`].
pub fn names() -> actorcile::names::OperatorNames {
    actorcile::names::OperatorNames::new(NAME, GROUP)
}

/// Register both kinds on `builder`, the clusters' nodes on `provider`, with images under
/// `allowed_images` only.
pub fn register(
    builder: actorcile::runtime::RuntimeBuilder,
    provider: Arc<dyn Provider>,
    allowed_images: &[String],
) -> actorcile::runtime::RuntimeBuilder {
    let check = provider.clone();
    builder
        .events(NAME)
        // Each kind watches the ConfigMaps it owns: one deleted or edited by hand is put back
        // at once.
        .controller(Controller::<Network>::new(network_tree()).owns::<ConfigMap>())
        .controller(
            Controller::<Cluster>::new(cluster_tree(provider, allowed_images.into()))
                .owns::<ConfigMap>()
                .on_initialize(
                    // Start-up fails at once if the provider does not answer, not object by object.
                    move |_client| async move {
                        let clusters = check.list_clusters().await?;
                        tracing::info!(
                            clusters = clusters.len(),
                            "the infrastructure provider answers"
                        );
                        Ok(())
                    },
                ),
        )
}

/// How long a demo or test waits at most for everything to converge.
pub const CONVERGE: Duration = Duration::from_secs(120);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs() {
        assert!(valid_cidr("10.0.0.0/16"));
        assert!(!valid_cidr("10.0.0.0"));
        assert!(!valid_cidr("10.0.0.0/33"));
        assert!(!valid_cidr("banana/8"));
    }

    #[test]
    fn tenants_choose_neither_the_node_count_nor_the_image_beyond_the_bounds() {
        let allowed = [DEFAULT_IMAGE_PREFIX.to_string()];
        let spec = |workers, image: &str| ClusterSpec {
            network: "n".into(),
            workers,
            image: image.into(),
        };
        assert!(refused_spec(&spec(MAX_WORKERS, &default_image()), &allowed).is_none());
        let r = refused_spec(&spec(MAX_WORKERS + 1, &default_image()), &allowed).unwrap();
        assert_eq!(r.code(), "TooManyWorkers");
        let r = refused_spec(&spec(1, "evil/miner:latest"), &allowed).unwrap();
        assert_eq!(r.code(), "ImageNotAllowed");
        let schema = serde_json::to_value(schemars::schema_for!(ClusterSpec)).unwrap();
        assert_eq!(schema["properties"]["workers"]["maximum"], MAX_WORKERS);
    }

    #[test]
    fn node_sets_of_clusters_in_different_namespaces_never_collide() {
        let cluster = |ns: &str, name: &str| {
            let mut c = Cluster::new(
                name,
                ClusterSpec {
                    network: "n".into(),
                    workers: 1,
                    image: default_image(),
                },
            );
            c.metadata.namespace = Some(ns.into());
            c
        };
        assert_ne!(
            node_set_of(&cluster("a-b", "c")),
            node_set_of(&cluster("a", "b-c"))
        );
    }
}
