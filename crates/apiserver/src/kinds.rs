//! The kind registry: which resources are served at which `GROUP/VERSION/PLURAL`, and how each one
//! behaves (scope, `/status` subresource, `metadata.generation`, what DELETE answers, its structural
//! schema). The built-in kinds are registered here when the store is made; custom kinds come and go with
//! their CustomResourceDefinitions (see `crd.rs`).

use std::sync::Arc;

use serde_json::Value;

use super::conversion::Converter;
use super::error::Subject;
use super::store::Store;

/// Group + plural: the identity of a stored resource (all versions of a kind share one table).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Gr {
    pub(crate) group: String,
    pub(crate) plural: String,
}

/// One served version of a resource.
#[derive(Debug, Clone)]
pub(crate) struct Kind {
    pub(crate) gr: Gr,
    pub(crate) version: String,
    pub(crate) api_version: String,
    pub(crate) kind: String,
    pub(crate) list_kind: String,
    pub(crate) namespaced: bool,
    /// Has a `/status` subresource.
    pub(crate) status: bool,
    /// metadata.generation is maintained.
    pub(crate) generation: bool,
    /// A custom resource: no strategic merge patch, no unconditional PUT.
    pub(crate) custom: bool,
    /// DELETE answers the object (otherwise a `Status` when the object is gone at once).
    pub(crate) delete_returns_object: bool,
    /// The structural schema (`openAPIV3Schema`) of a custom resource version: unknown fields are pruned.
    pub(crate) schema: Option<Arc<Value>>,
    /// How a custom resource's versions convert (strategy `Webhook` with a hook registered),
    /// else none: every version reads the stored object with its `apiVersion` rewritten.
    pub(crate) conversion: Option<Converter>,
}

impl Kind {
    /// A namespaced kind with no behaviour of its own, served at `group/version`.
    #[cfg(test)]
    pub(crate) fn plain(group: &str, version: &str, kind: &str) -> Kind {
        Kind {
            gr: Gr {
                group: group.into(),
                plural: format!("{}s", kind.to_lowercase()),
            },
            version: version.into(),
            api_version: format!("{group}/{version}"),
            kind: kind.into(),
            list_kind: format!("{kind}List"),
            namespaced: true,
            status: false,
            generation: false,
            custom: true,
            delete_returns_object: false,
            schema: None,
            conversion: None,
        }
    }

    pub(super) fn subject<'a>(&'a self, name: &'a str) -> Subject<'a> {
        Subject {
            group: &self.gr.group,
            plural: &self.gr.plural,
            name,
        }
    }
}

impl Store {
    /// Serves the built-in kinds.
    pub(super) fn register_builtins(&mut self) {
        let b = |group: &str,
                 version: &str,
                 plural: &str,
                 kind: &str,
                 namespaced: bool,
                 status: bool| Kind {
            gr: Gr {
                group: group.into(),
                plural: plural.into(),
            },
            version: version.into(),
            api_version: if group.is_empty() {
                version.into()
            } else {
                format!("{group}/{version}")
            },
            kind: kind.into(),
            list_kind: format!("{kind}List"),
            namespaced,
            status,
            generation: false,
            custom: false,
            delete_returns_object: false,
            schema: None,
            conversion: None,
        };
        let mut ns = b("", "v1", "namespaces", "Namespace", false, true);
        ns.delete_returns_object = true;
        let mut crd = b(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            false,
            true,
        );
        crd.generation = true;
        // The real server answers DELETE of a CRD with the CRD (it is finalized, not gone at once).
        crd.delete_returns_object = true;
        let mut pods = b("", "v1", "pods", "Pod", true, true);
        pods.delete_returns_object = true;
        // Workload kinds keep metadata.generation, as on the real server.
        let workload = |group: &str, plural: &str, kind: &str| Kind {
            generation: true,
            ..b(group, "v1", plural, kind, true, true)
        };
        // Kinds stored without behaviour of their own (no controllers run here), so that operators creating
        // them work unchanged.
        for k in [
            pods,
            b("", "v1", "services", "Service", true, true),
            b("", "v1", "serviceaccounts", "ServiceAccount", true, false),
            b("", "v1", "endpoints", "Endpoints", true, false),
            b(
                "",
                "v1",
                "persistentvolumeclaims",
                "PersistentVolumeClaim",
                true,
                true,
            ),
            b(
                "",
                "v1",
                "persistentvolumes",
                "PersistentVolume",
                false,
                true,
            ),
            b("", "v1", "nodes", "Node", false, true),
            workload("apps", "deployments", "Deployment"),
            workload("apps", "statefulsets", "StatefulSet"),
            workload("apps", "daemonsets", "DaemonSet"),
            workload("apps", "replicasets", "ReplicaSet"),
            workload("batch", "jobs", "Job"),
            workload("batch", "cronjobs", "CronJob"),
            b(
                "networking.k8s.io",
                "v1",
                "ingresses",
                "Ingress",
                true,
                true,
            ),
            b(
                "rbac.authorization.k8s.io",
                "v1",
                "roles",
                "Role",
                true,
                false,
            ),
            b(
                "rbac.authorization.k8s.io",
                "v1",
                "rolebindings",
                "RoleBinding",
                true,
                false,
            ),
            b(
                "rbac.authorization.k8s.io",
                "v1",
                "clusterroles",
                "ClusterRole",
                false,
                false,
            ),
            b(
                "rbac.authorization.k8s.io",
                "v1",
                "clusterrolebindings",
                "ClusterRoleBinding",
                false,
                false,
            ),
        ] {
            self.add_route(k);
        }
        for k in [
            ns,
            b("", "v1", "configmaps", "ConfigMap", true, false),
            b("", "v1", "secrets", "Secret", true, false),
            b("", "v1", "events", "Event", true, false),
            b("events.k8s.io", "v1", "events", "Event", true, false),
            b("coordination.k8s.io", "v1", "leases", "Lease", true, false),
            crd,
        ] {
            self.add_route(k);
        }
    }

    /// Serves one version of a resource (replacing what was served at its GROUP/VERSION/PLURAL).
    pub(super) fn add_route(&mut self, k: Kind) {
        self.tables.entry(k.gr.clone()).or_default().namespaced = k.namespaced;
        self.routes.insert(
            (k.gr.group.clone(), k.version.clone(), k.gr.plural.clone()),
            Arc::new(k),
        );
    }

    /// The resource served at GROUP/VERSION/PLURAL.
    pub(crate) fn resolve(&self, group: &str, version: &str, plural: &str) -> Option<Arc<Kind>> {
        self.routes
            .get(&(group.to_string(), version.to_string(), plural.to_string()))
            .cloned()
    }

    /// Every served resource (for discovery).
    pub(crate) fn kinds(&self) -> Vec<Arc<Kind>> {
        let mut v: Vec<_> = self.routes.values().cloned().collect();
        v.sort_by(|a, b| (&a.gr, &a.version).cmp(&(&b.gr, &b.version)));
        v
    }

    /// Whether a built-in kind is served in this group (the core group included).
    pub(crate) fn serves_builtin_group(&self, group: &str) -> bool {
        self.routes
            .values()
            .any(|k| !k.custom && k.gr.group == group)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{kind, store};

    #[test]
    fn builtin_kinds_are_served_with_their_behaviour() {
        let s = store();
        let cm = kind(&s, "", "v1", "configmaps");
        assert_eq!(
            (
                cm.api_version.as_str(),
                cm.kind.as_str(),
                cm.list_kind.as_str()
            ),
            ("v1", "ConfigMap", "ConfigMapList")
        );
        assert!(cm.namespaced && !cm.status && !cm.generation && !cm.custom);
        assert!(!cm.delete_returns_object && cm.schema.is_none());

        let deploy = kind(&s, "apps", "v1", "deployments");
        assert_eq!(deploy.api_version, "apps/v1");
        assert!(deploy.namespaced && deploy.status && deploy.generation);

        let ns = kind(&s, "", "v1", "namespaces");
        assert!(!ns.namespaced && ns.status && ns.delete_returns_object);

        let crd = kind(
            &s,
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
        );
        assert!(!crd.namespaced && crd.generation && crd.delete_returns_object);

        // events.k8s.io Events are stored apart from core Events.
        let core_events = kind(&s, "", "v1", "events");
        let events = kind(&s, "events.k8s.io", "v1", "events");
        assert_ne!(core_events.gr, events.gr);
        assert_eq!(events.api_version, "events.k8s.io/v1");
    }

    #[test]
    fn unknown_resources_and_groups_are_not_served() {
        let s = store();
        assert!(s.resolve("", "v2", "configmaps").is_none());
        assert!(s.resolve("apps", "v1", "configmaps").is_none());
        assert!(s.resolve("example.com", "v1", "widgets").is_none());
        assert!(s.serves_builtin_group(""));
        assert!(s.serves_builtin_group("apps"));
        assert!(!s.serves_builtin_group("example.com"));
    }

    #[test]
    fn discovery_lists_every_kind_once_in_order() {
        let s = store();
        let kinds = s.kinds();
        let keys: Vec<_> = kinds
            .iter()
            .map(|k| (k.gr.clone(), k.version.clone()))
            .collect();
        let mut sorted = keys.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(keys, sorted);
        assert!(
            kinds
                .iter()
                .any(|k| k.kind == "Lease" && k.api_version == "coordination.k8s.io/v1")
        );
        assert!(kinds.iter().all(|k| !k.custom));
    }
}
