//! The manifests that deploy the operator: ServiceAccount, its roles (derived from the
//! runtime's controllers and trees: a ClusterRole for what is cluster-wide, a Role for the
//! leader Lease in the operator's namespace) and their bindings, Deployment.

use serde_json::json;

use crate::operator;

/// The label of the namespaces whose Pods may scrape the operator's metrics (the NetworkPolicy
/// admits them on the metrics port).
pub const SCRAPER_LABEL: &str = "example.actorcile.dev/metrics-scraper";

/// Every manifest, as YAML documents.
pub fn render(image: &str, namespace: &str) -> Result<String, String> {
    let roles = roles(Leases::LeaderElection, None, namespace);
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

/// The Leases an operator process takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leases {
    /// None: one replica, no election (`run` without `--leader-elect` or `--shards`).
    None,
    /// The leader Lease (`--leader-elect`).
    LeaderElection,
    /// Shard and member Leases (`--shards N`).
    Sharding,
}

/// The roles the runtime renders for the operator watching `watch` (every namespace when
/// `None`), taking `leases` in `namespace` (its Pod's): what `run` needs, derived from the
/// controllers and their trees (no client, no cluster).
pub fn roles(leases: Leases, watch: Option<&str>, namespace: &str) -> actorcile::rbac::Roles {
    let provider = std::sync::Arc::new(actorcile::providers::simulated::SimulatedProvider::new(
        0,
        Default::default(),
    ));
    let mut builder = actorcile::runtime::Runtime::offline_builder(operator::names());
    if let Some(ns) = watch {
        builder = builder.namespace(ns);
    }
    builder = match leases {
        Leases::None => builder,
        Leases::LeaderElection => builder.leader_election(actorcile::leader::LeaderElection::new(
            operator::names().leader_lease(),
            namespace,
        )),
        Leases::Sharding => builder.sharding(
            actorcile::sharding::Sharding::new(2, namespace)
                .lease_prefix(operator::names().shard_lease_prefix()),
        ),
    };
    operator::register(builder, provider, &[operator::DEFAULT_IMAGE_PREFIX.into()])
        .roles(operator::NAME)
}

/// The chart's `templates/rbac.yaml`: the roles and bindings of [`roles`] for each way the chart
/// runs the operator (its Leases: `sharding.shards`, else `leaderElection.enabled`; the namespace
/// it watches: `watchNamespace`, which may be the release's own), the namespaces templated.
/// Generated (`example-operator chart-rbac > examples/operator/chart/templates/rbac.yaml`), never
/// edited: the chart test fails when the file and this function differ.
pub fn chart_rbac() -> Result<String, String> {
    // Stand-ins for the namespaces, replaced by the template's expressions.
    const RELEASE: &str = "release-namespace-of-the-chart";
    const WATCHED: &str = "watched-namespace-of-the-chart";
    let mut out = String::from(
        "{{- /* Generated by `example-operator chart-rbac` from the roles the runtime renders;\n\
         do not edit (the chart test compares this file with the runtime's). */ -}}\n\
         {{- $watch := .Values.watchNamespace | default \"\" }}\n\
         {{- $leases := \"none\" }}\n\
         {{- if .Values.sharding.shards }}{{ $leases = \"sharding\" }}\
         {{- else if .Values.leaderElection.enabled }}{{ $leases = \"election\" }}{{ end }}\n\
         {{- $scope := \"cluster\" }}\n\
         {{- if eq $watch .Release.Namespace }}{{ $scope = \"release\" }}\
         {{- else if $watch }}{{ $scope = \"other\" }}{{ end }}\n",
    );
    let mut first = true;
    for (leases, leases_name) in [
        (Leases::LeaderElection, "election"),
        (Leases::Sharding, "sharding"),
        (Leases::None, "none"),
    ] {
        for (watch, scope) in [
            (None, "cluster"),
            (Some(RELEASE), "release"),
            (Some(WATCHED), "other"),
        ] {
            let roles = roles(leases, watch, RELEASE);
            let bindings =
                roles.bindings(actorcile::rbac::service_account(RELEASE, operator::NAME));
            let yaml = format!(
                "{}---\n{}",
                roles.to_yaml().map_err(|e| e.to_string())?,
                bindings.to_yaml().map_err(|e| e.to_string())?
            )
            .replace(RELEASE, "{{ .Release.Namespace }}")
            .replace(WATCHED, "{{ $watch }}");
            let keyword = if first { "if" } else { "else if" };
            first = false;
            out.push_str(&format!(
                "{{{{- {keyword} and (eq $leases \"{leases_name}\") (eq $scope \"{scope}\") }}}}\n---\n{yaml}"
            ));
        }
    }
    out.push_str("{{- end }}\n");
    Ok(out)
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
