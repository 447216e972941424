//! The label schemes a cluster's containers carry: actorcile's own, kind's, k3d's and Talos's.

use super::{NodeRole, ProviderError};

/// How a cluster's nodes are labelled: the cluster label, the role label, and the role values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelScheme {
    /// Its name (`kind`, `k3d`, `talos`, `actorcile`).
    pub name: &'static str,
    /// The label holding the cluster's name.
    pub cluster: &'static str,
    /// The label holding the node's role.
    pub role: &'static str,
    /// The role label's value for a control-plane node.
    pub control_plane: &'static str,
    /// The role label's value for a worker node.
    pub worker: &'static str,
    /// Labels every node of the scheme carries besides (Talos marks its own).
    pub extra: &'static [(&'static str, &'static str)],
}

impl LabelScheme {
    /// kind's labels.
    pub const KIND: LabelScheme = LabelScheme {
        name: "kind",
        cluster: "io.x-k8s.kind.cluster",
        role: "io.x-k8s.kind.role",
        control_plane: "control-plane",
        worker: "worker",
        extra: &[],
    };
    /// k3d's labels (servers and agents).
    pub const K3D: LabelScheme = LabelScheme {
        name: "k3d",
        cluster: "k3d.cluster",
        role: "k3d.role",
        control_plane: "server",
        worker: "agent",
        extra: &[],
    };
    /// Talos's (`talosctl cluster create --provisioner docker`): the cluster's name, the
    /// machine type, and the mark of a container Talos owns.
    pub const TALOS: LabelScheme = LabelScheme {
        name: "talos",
        cluster: "talos.cluster.name",
        role: "talos.type",
        control_plane: "controlplane",
        worker: "worker",
        extra: &[("talos.owned", "true")],
    };
    /// actorcile's own.
    pub const ACTORCILE: LabelScheme = LabelScheme {
        name: "actorcile",
        cluster: "actorcile.dev/cluster",
        role: "actorcile.dev/role",
        control_plane: "control-plane",
        worker: "worker",
        extra: &[],
    };

    /// The scheme named `name`; [`ProviderError::UnknownLabelScheme`] for any other name.
    pub fn named(name: &str) -> Result<LabelScheme, ProviderError> {
        [Self::KIND, Self::K3D, Self::TALOS, Self::ACTORCILE]
            .into_iter()
            .find(|s| s.name == name)
            .ok_or_else(|| ProviderError::UnknownLabelScheme { name: name.into() })
    }

    pub(super) fn role_value(&self, role: NodeRole) -> &'static str {
        match role {
            NodeRole::ControlPlane => self.control_plane,
            NodeRole::Worker => self.worker,
        }
    }

    pub(super) fn role_of(&self, value: &str) -> NodeRole {
        if value == self.control_plane {
            NodeRole::ControlPlane
        } else {
            NodeRole::Worker
        }
    }
}
