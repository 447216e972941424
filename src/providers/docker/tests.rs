//! The provider's pure parts: label schemes and endpoints.

use super::*;

#[test]
fn label_schemes_are_chosen_by_name() {
    assert_eq!(LabelScheme::named("k3d").unwrap().cluster, "k3d.cluster");
    assert_eq!(
        LabelScheme::named("kind").unwrap().role,
        "io.x-k8s.kind.role"
    );
    assert!(matches!(
        LabelScheme::named("minikube"),
        Err(ProviderError::UnknownLabelScheme { name }) if name == "minikube"
    ));
    let k3d = LabelScheme::K3D;
    assert_eq!(k3d.role_of("server"), NodeRole::ControlPlane);
    assert_eq!(k3d.role_value(NodeRole::Worker), "agent");
    // Talos's docker provisioner: `talos.cluster.name`, `talos.type`, `talos.owned`.
    let talos = LabelScheme::named("talos").unwrap();
    assert_eq!(talos.cluster, "talos.cluster.name");
    assert_eq!(talos.role_of("controlplane"), NodeRole::ControlPlane);
    assert_eq!(talos.role_value(NodeRole::Worker), "worker");
    assert_eq!(talos.extra, &[("talos.owned", "true")]);
}

#[test]
fn published_ports_are_endpoints_on_the_host() {
    let port = |ip: Option<&str>, public: Option<u16>| bollard::models::PortSummary {
        ip: ip.map(str::to_string),
        private_port: 6443,
        public_port: public,
        typ: None,
    };
    let ports = [
        port(Some("0.0.0.0"), Some(41234)),
        port(Some("::"), Some(41234)),
        port(Some("192.0.2.7"), Some(6443)),
        port(None, None), // exposed, not published
        port(Some("0.0.0.0"), Some(41234)),
    ];
    assert_eq!(
        published(&ports),
        ["127.0.0.1:41234", "192.0.2.7:6443", "[::1]:41234"]
    );
}
