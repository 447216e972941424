//! The RBAC an operator built on actorcile needs, derived from its registered controllers, and
//! an optional start-up check that the running identity has it.
//!
//! ```
//! use actorcile::rbac::{cluster_role, rules_for};
//! use k8s_openapi::api::core::v1::ConfigMap;
//! let role = cluster_role("my-operator", rules_for::<ConfigMap>());
//! let yaml = actorcile::rbac::to_yaml(&role).unwrap();
//! assert!(yaml.contains("configmaps/status"));
//! ```

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, Resource};

fn rule(group: &str, resources: &[&str], verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![group.to_string()]),
        resources: Some(resources.iter().map(|s| s.to_string()).collect()),
        verbs: verbs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// What the runtime does with a managed kind `K`: watch it, add and remove its finalizer and
/// reference annotations (patch), and write its status subresource.
pub fn rules_for<K: Resource<DynamicType = ()>>() -> Vec<PolicyRule> {
    let group = K::group(&());
    let plural = K::plural(&());
    vec![
        rule(
            &group,
            &[&plural],
            &["get", "list", "watch", "patch", "update"],
        ),
        rule(
            &group,
            &[&format!("{plural}/status")],
            &["get", "patch", "update"],
        ),
    ]
}

/// Reading and watching kind `K` (a provider config, the Secrets a controller watches).
pub fn read_rules_for<K: Resource<DynamicType = ()>>() -> Vec<PolicyRule> {
    vec![rule(
        &K::group(&()),
        &[&K::plural(&())],
        &["get", "list", "watch"],
    )]
}

/// What every runtime needs besides its kinds: publishing Events (both APIs).
pub fn common_rules() -> Vec<PolicyRule> {
    vec![
        rule("", &["events"], &["create", "patch"]),
        rule("events.k8s.io", &["events"], &["create", "patch"]),
    ]
}

/// A ClusterRole named `name` with `rules` plus [`common_rules`].
pub fn cluster_role(name: &str, rules: Vec<PolicyRule>) -> ClusterRole {
    let mut all = rules;
    all.extend(common_rules());
    ClusterRole {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        rules: Some(all),
        ..Default::default()
    }
}

/// Render a ClusterRole as YAML for `kubectl apply -f -`.
pub fn to_yaml(role: &ClusterRole) -> Result<String, YamlError> {
    let mut v = serde_json::to_value(role).unwrap_or_default();
    v["apiVersion"] = "rbac.authorization.k8s.io/v1".into();
    v["kind"] = "ClusterRole".into();
    serde_norway::to_string(&v).map_err(YamlError::new)
}

/// YAML could not be written or read.
///
/// This crate's own type rather than the YAML library's: the library (today `serde_norway`, a fork
/// of the deprecated `serde_yaml`) can then be replaced without changing this crate's public API.
/// The library's error is the [`source`](std::error::Error::source), and its message is this one's.
#[derive(Debug, thiserror::Error)]
#[error("{source}")]
pub struct YamlError {
    #[source]
    source: serde_norway::Error,
}

impl YamlError {
    pub(crate) fn new(source: serde_norway::Error) -> Self {
        YamlError { source }
    }
}

/// A permission the running identity lacks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "permission missing: cannot {verb} {resource} in API group {group:?} (add it to the operator's ClusterRole)"
)]
pub struct MissingPermission {
    /// The verb.
    pub verb: String,
    /// The resource (with subresource, e.g. `widgets/status`).
    pub resource: String,
    /// The API group (`""` for core).
    pub group: String,
}

/// Check every rule with a SelfSubjectAccessReview; returns the permissions that are missing.
/// A server without the authorization API (e.g. the in-process cluster) skips the check.
pub async fn missing_permissions(
    client: &Client,
    rules: &[PolicyRule],
) -> Result<Vec<MissingPermission>, kube::Error> {
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let mut missing = Vec::new();
    for r in rules {
        for group in r.api_groups.iter().flatten() {
            for res in r.resources.iter().flatten() {
                let (resource, subresource) = match res.split_once('/') {
                    Some((a, b)) => (a.to_string(), Some(b.to_string())),
                    None => (res.clone(), None),
                };
                for verb in &r.verbs {
                    let review = SelfSubjectAccessReview {
                        spec: SelfSubjectAccessReviewSpec {
                            resource_attributes: Some(ResourceAttributes {
                                group: Some(group.clone()),
                                resource: Some(resource.clone()),
                                subresource: subresource.clone(),
                                verb: Some(verb.clone()),
                                ..Default::default()
                            }),
                            ..Default::default()
                        },
                        ..Default::default()
                    };
                    let answer = match api.create(&PostParams::default(), &review).await {
                        Ok(a) => a,
                        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Vec::new()),
                        Err(e) => return Err(e),
                    };
                    if !answer.status.is_some_and(|s| s.allowed) {
                        missing.push(MissingPermission {
                            verb: verb.clone(),
                            resource: res.clone(),
                            group: group.clone(),
                        });
                    }
                }
            }
        }
    }
    Ok(missing)
}
