//! The manifests that deploy the operator: ServiceAccount, its roles (derived from the
//! runtime's controllers and trees: a ClusterRole for what is cluster-wide, a Role for the
//! leader Lease in the operator's namespace) and their bindings, Deployment.

use serde_json::json;

use crate::operator;

/// Every manifest, as YAML documents.
/// The label of the namespaces whose Pods may scrape the operator's metrics (the NetworkPolicy
/// admits them on the metrics port).
pub const SCRAPER_LABEL: &str = "example.actorcile.dev/metrics-scraper";

pub fn render(image: &str, namespace: &str) -> Result<String, String> {
    // The roles are derived from the controllers and their trees: no client, no cluster.
    let provider = std::sync::Arc::new(actorcile::providers::simulated::SimulatedProvider::new(
        0,
        Default::default(),
    ));
    let builder = operator::register(
        actorcile::runtime::Runtime::offline_builder(operator::names()),
        provider,
        &[operator::DEFAULT_IMAGE_PREFIX.into()],
    )
    .leader_election(actorcile::leader::LeaderElection::new(
        operator::names().leader_lease(),
        namespace,
    ));
    let roles = builder.roles(operator::NAME);
    let bindings = roles.bindings(actorcile::rbac::service_account(namespace, operator::NAME));
    let mut docs = vec![json!({
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": operator::NAME, "namespace": namespace},
    })];
    let probe =
        |path: &str| json!({"httpGet": {"path": path, "port": "probes"}, "periodSeconds": 10});
    docs.push(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": operator::NAME, "namespace": namespace, "labels": {"app": operator::NAME}},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": operator::NAME}},
            "template": {
                "metadata": {
                    "labels": {"app": operator::NAME},
                    "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "8080"},
                },
                "spec": {
                    "serviceAccountName": operator::NAME,
                    "terminationGracePeriodSeconds": 40,
                    // What Pod Security `restricted` asks (a namespace that enforces it admits
                    // these Pods): a non-root user, the runtime's default seccomp profile.
                    "securityContext": {
                        "runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [{
                        "name": "operator",
                        "image": image,
                        "args": ["run", "--leader-elect"],
                        "env": [
                            // The kubelet's probes and Prometheus reach the Pod's IP; each on a
                            // port of its own, so a NetworkPolicy can admit them apart.
                            {"name": "ACTORCILE_ADMIN_ADDR", "value": "0.0.0.0:8081"},
                            {"name": "ACTORCILE_METRICS_ADDR", "value": "0.0.0.0:8080"},
                            {"name": "ACTORCILE_LOG_FORMAT", "value": "json"},
                            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                        ],
                        "ports": [
                            {"name": "metrics", "containerPort": 8080},
                            {"name": "probes", "containerPort": 8081},
                        ],
                        "livenessProbe": probe("/healthz"),
                        "readinessProbe": probe("/readyz"),
                        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                        "securityContext": {
                            "runAsNonRoot": true, "readOnlyRootFilesystem": true,
                            "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]},
                            "seccompProfile": {"type": "RuntimeDefault"},
                        },
                    }],
                },
            },
        },
    }));
    // Only the two admin ports take connections: the probes' from anywhere (the kubelet comes
    // from the node's address, which a policy cannot name portably), the metrics' from
    // namespaces labelled as scrapers. The operator makes no connection that comes in otherwise.
    docs.push(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": operator::NAME, "namespace": namespace},
        "spec": {
            "podSelector": {"matchLabels": {"app": operator::NAME}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"ports": [{"protocol": "TCP", "port": "probes"}]},
                {
                    "ports": [{"protocol": "TCP", "port": "metrics"}],
                    "from": [{"namespaceSelector": {"matchLabels": {SCRAPER_LABEL: "true"}}}],
                },
            ],
        },
    }));
    let mut yaml = Vec::with_capacity(docs.len() + 1);
    for d in &docs {
        yaml.push(serde_saphyr::to_string(d).map_err(|e| e.to_string())?);
    }
    // After the ServiceAccount, the roles and bindings from the runtime's own renderer.
    yaml.insert(1, bindings.to_yaml().map_err(|e| e.to_string())?);
    yaml.insert(1, roles.to_yaml().map_err(|e| e.to_string())?);
    Ok(yaml.join("---\n"))
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn the_role_covers_the_kinds_the_trees_write() {
        let yaml = super::render("img", "ns").unwrap();
        for needed in [
            "networks/status",
            "clusters/status",
            "configmaps",
            "events",
            "kind: Deployment",
            "kind: Role\n",
            "kind: RoleBinding",
            "kind: ClusterRoleBinding",
            "kind: NetworkPolicy",
            super::SCRAPER_LABEL,
        ] {
            assert!(yaml.contains(needed), "{needed} missing:\n{yaml}");
        }
    }
}
