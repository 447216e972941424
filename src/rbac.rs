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

/// What the runtime does with a managed kind `K`, and no more: list and watch it, read a
/// target before taking a reference on it (get), add and remove its finalizer and reference
/// annotations (patch), and patch its status subresource. (Every write is a patch: no
/// `update`.)
pub fn rules_for<K: Resource<DynamicType = ()>>() -> Vec<PolicyRule> {
    let group = K::group(&());
    let plural = K::plural(&());
    vec![
        rule(&group, &[&plural], &["get", "list", "watch", "patch"]),
        rule(&group, &[&format!("{plural}/status")], &["patch"]),
    ]
}

/// `verbs` on kind `K` (e.g. what a step does with a kind the runtime does not know of).
pub fn rule_for<K: Resource<DynamicType = ()>>(verbs: &[&str]) -> PolicyRule {
    rule(&K::group(&()), &[&K::plural(&())], verbs)
}

/// What [`resource`](crate::provisioners::resource()) does with its child's kind `C`: get,
/// create and patch (server-side apply), delete.
pub fn child_rules_for<C: Resource<DynamicType = ()>>() -> Vec<PolicyRule> {
    vec![rule_for::<C>(&["get", "create", "patch", "delete"])]
}

/// A permission a step of a provisioner tree needs, and the step
/// ([`Provisioner::rules`](crate::provisioners::Provisioner::rules)).
#[derive(Clone, Debug, PartialEq)]
pub struct StepRule {
    /// The step's name.
    pub step: String,
    /// What it needs.
    pub rule: PolicyRule,
}

impl StepRule {
    /// `rules` needed by step `step`.
    pub fn all(step: &str, rules: Vec<PolicyRule>) -> Vec<StepRule> {
        rules
            .into_iter()
            .map(|rule| StepRule {
                step: step.to_string(),
                rule,
            })
            .collect()
    }
}

/// Reading and watching kind `K` (a provider config, the Secrets a controller watches).
pub fn read_rules_for<K: Resource<DynamicType = ()>>() -> Vec<PolicyRule> {
    vec![rule(
        &K::group(&()),
        &[&K::plural(&())],
        &["get", "list", "watch"],
    )]
}

/// What every runtime needs besides its kinds: publishing Events (`events.k8s.io/v1`; a
/// repeated Event is a patch of its series).
pub fn common_rules() -> Vec<PolicyRule> {
    vec![rule("events.k8s.io", &["events"], &["create", "patch"])]
}

/// `rules` with one rule per (API group, resource), each with the union of its verbs, in the
/// order they first appear (rules with other fields, such as `resourceNames`, kept as they are).
pub fn merge(rules: Vec<PolicyRule>) -> Vec<PolicyRule> {
    let mut out: Vec<PolicyRule> = Vec::new();
    for r in rules {
        let plain = r.resource_names.is_none() && r.non_resource_urls.is_none();
        let single = |v: &Option<Vec<String>>| v.as_ref().is_some_and(|v| v.len() == 1);
        if plain
            && single(&r.api_groups)
            && single(&r.resources)
            && let Some(same) = out.iter_mut().find(|o| {
                o.resource_names.is_none()
                    && o.non_resource_urls.is_none()
                    && o.api_groups == r.api_groups
                    && o.resources == r.resources
            })
        {
            for v in r.verbs {
                if !same.verbs.contains(&v) {
                    same.verbs.push(v);
                }
            }
            continue;
        }
        out.push(r);
    }
    out
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
    "permission missing: cannot {verb} {resource} in API group {group:?}{} (add it to the operator's ClusterRole)",
    .step.as_ref().map(|s| format!(", needed by step {s:?}")).unwrap_or_default()
)]
pub struct MissingPermission {
    /// The provisioner step that needs it (`None`: the runtime itself).
    pub step: Option<String>,
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
    missing_permissions_of(client, rules.iter().map(|r| (None, r))).await
}

/// [`missing_permissions`] of the runtime's own `rules` and of its steps' `steps`: what is
/// missing names the step that needs it.
pub async fn missing_step_permissions(
    client: &Client,
    rules: &[PolicyRule],
    steps: &[StepRule],
) -> Result<Vec<MissingPermission>, kube::Error> {
    let own = rules.iter().map(|r| (None, r));
    let of_steps = steps.iter().map(|s| (Some(s.step.as_str()), &s.rule));
    missing_permissions_of(client, own.chain(of_steps)).await
}

async fn missing_permissions_of<'a>(
    client: &Client,
    rules: impl Iterator<Item = (Option<&'a str>, &'a PolicyRule)>,
) -> Result<Vec<MissingPermission>, kube::Error> {
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let mut missing = Vec::new();
    let mut asked = std::collections::HashSet::new();
    for (step, r) in rules {
        for group in r.api_groups.iter().flatten() {
            for res in r.resources.iter().flatten() {
                let (resource, subresource) = match res.split_once('/') {
                    Some((a, b)) => (a.to_string(), Some(b.to_string())),
                    None => (res.clone(), None),
                };
                for verb in &r.verbs {
                    if !asked.insert((step, group.clone(), res.clone(), verb.clone())) {
                        continue;
                    }
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
                            step: step.map(str::to_string),
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
