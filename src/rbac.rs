//! The RBAC an operator built on actorcile needs, derived from its registered controllers, and
//! an optional start-up check that the running identity has it.
//!
//! Every rule has a [`RuleScope`]: what a controller confined to a namespace touches is granted
//! by a Role in that namespace, what is cluster-scoped (or spans every namespace) by the
//! ClusterRole. [`RuntimeBuilder::roles`](crate::runtime::RuntimeBuilder::roles) renders an
//! operator's [`Roles`] from its controllers; they can be built by hand too:
//!
//! ```
//! use actorcile::rbac::{Roles, RuleScope, ScopedRule, rules_for};
//! use k8s_openapi::api::core::v1::ConfigMap;
//! let rules = rules_for::<ConfigMap>()
//!     .into_iter()
//!     .map(|rule| ScopedRule::new(RuleScope::namespace("team-a"), rule));
//! let roles = Roles::new("my-operator", rules);
//! assert!(roles.cluster_role.is_none());
//! let yaml = roles.to_yaml().unwrap();
//! assert!(yaml.contains("kind: Role") && yaml.contains("namespace: team-a"));
//! assert!(yaml.contains("configmaps/status"));
//! ```

use std::collections::BTreeMap;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, Resource};

/// Where a rule is granted.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RuleScope {
    /// Cluster-wide, by the ClusterRole: a cluster-scoped resource, or a namespaced one in every
    /// namespace.
    Cluster,
    /// In one namespace, by a Role there.
    Namespace(String),
    /// In the namespace of the object a step runs for: a Role in the namespace its controller
    /// watches, or the ClusterRole when the controller watches every namespace or its kind is
    /// cluster-scoped. What a step declares is in this scope unless it says otherwise.
    Object,
}

impl RuleScope {
    /// In namespace `ns`.
    pub fn namespace(ns: impl Into<String>) -> Self {
        RuleScope::Namespace(ns.into())
    }

    /// The scope of a rule on kind `K` in the objects' namespace: [`RuleScope::Cluster`] for a
    /// cluster-scoped kind (a Role cannot grant it), [`RuleScope::Object`] otherwise.
    pub fn of_kind<K: Resource>() -> Self {
        if crate::object_api::is_cluster_scoped::<K>() {
            RuleScope::Cluster
        } else {
            RuleScope::Object
        }
    }

    /// This scope with [`RuleScope::Object`] made concrete for a controller watching `objects`
    /// (`None`: every namespace, or a cluster-scoped kind).
    pub fn resolve(self, objects: Option<&str>) -> Self {
        match (self, objects) {
            (RuleScope::Object, Some(ns)) => RuleScope::namespace(ns),
            (RuleScope::Object, None) => RuleScope::Cluster,
            (other, _) => other,
        }
    }
}

/// A rule and where it is granted.
#[derive(Clone, Debug, PartialEq)]
pub struct ScopedRule {
    /// Where.
    pub scope: RuleScope,
    /// What.
    pub rule: PolicyRule,
}

impl ScopedRule {
    /// `rule` granted in `scope`.
    pub fn new(scope: RuleScope, rule: PolicyRule) -> Self {
        ScopedRule { scope, rule }
    }
}

fn rule(group: &str, resources: &[&str], verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![group.to_string()]),
        resources: Some(resources.iter().map(|s| s.to_string()).collect()),
        verbs: verbs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// `verbs` on the objects of `K` named `names` (`resourceNames`). Kubernetes matches a
/// `list` or `watch` against names only when it selects one object by a `metadata.name` field
/// selector, and a `create` only when it is a server-side apply (a POST names no object).
pub fn named_rule_for<K: Resource<DynamicType = ()>>(verbs: &[&str], names: &[&str]) -> PolicyRule {
    PolicyRule {
        resource_names: Some(names.iter().map(|n| n.to_string()).collect()),
        ..rule(&K::group(&()), &[&K::plural(&())], verbs)
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
    /// Where it needs it.
    pub scope: RuleScope,
    /// What it needs.
    pub rule: PolicyRule,
}

impl StepRule {
    /// `rules` needed by step `step` in the namespace of the object it runs for
    /// ([`RuleScope::Object`]).
    pub fn all(step: &str, rules: Vec<PolicyRule>) -> Vec<StepRule> {
        Self::scoped(
            step,
            rules
                .into_iter()
                .map(|r| ScopedRule::new(RuleScope::Object, r)),
        )
    }

    /// `rules` needed by step `step`, each where it is needed.
    pub fn scoped(step: &str, rules: impl IntoIterator<Item = ScopedRule>) -> Vec<StepRule> {
        rules
            .into_iter()
            .map(|ScopedRule { scope, rule }| StepRule {
                step: step.to_string(),
                scope,
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

/// The roles an operator needs: a ClusterRole for what is granted cluster-wide and a Role in
/// each namespace for the rest, all of one name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Roles {
    /// What is granted cluster-wide (`None` when nothing is).
    pub cluster_role: Option<ClusterRole>,
    /// One Role per namespace, in namespace order.
    pub roles: Vec<Role>,
}

impl Roles {
    /// Roles named `name` granting `rules` ([`merge`]d per role). A rule in
    /// [`RuleScope::Object`] that nobody [resolved](RuleScope::resolve) is granted cluster-wide.
    pub fn new(name: &str, rules: impl IntoIterator<Item = ScopedRule>) -> Self {
        let mut cluster = Vec::new();
        let mut namespaced: BTreeMap<String, Vec<PolicyRule>> = BTreeMap::new();
        for r in rules {
            match r.scope {
                RuleScope::Namespace(ns) => namespaced.entry(ns).or_default().push(r.rule),
                RuleScope::Cluster | RuleScope::Object => cluster.push(r.rule),
            }
        }
        let meta = |namespace: Option<&str>| ObjectMeta {
            name: Some(name.to_string()),
            namespace: namespace.map(str::to_string),
            ..Default::default()
        };
        Roles {
            cluster_role: (!cluster.is_empty()).then(|| ClusterRole {
                metadata: meta(None),
                rules: Some(merge(cluster)),
                ..Default::default()
            }),
            roles: namespaced
                .into_iter()
                .map(|(ns, rules)| Role {
                    metadata: meta(Some(&ns)),
                    rules: Some(merge(rules)),
                })
                .collect(),
        }
    }

    /// Every rule, with where it is granted.
    pub fn rules(&self) -> Vec<ScopedRule> {
        let cluster = self.cluster_role.iter().flat_map(|c| {
            c.rules
                .iter()
                .flatten()
                .map(|r| ScopedRule::new(RuleScope::Cluster, r.clone()))
        });
        let namespaced = self.roles.iter().flat_map(|role| {
            let ns = role.metadata.namespace.clone().unwrap_or_default();
            role.rules
                .iter()
                .flatten()
                .map(move |r| ScopedRule::new(RuleScope::namespace(ns.clone()), r.clone()))
        });
        cluster.chain(namespaced).collect()
    }

    /// The bindings that grant these roles to `subject` (e.g. the operator's ServiceAccount):
    /// a ClusterRoleBinding for the ClusterRole, a RoleBinding beside each Role.
    pub fn bindings(&self, subject: Subject) -> Bindings {
        let role_ref = |kind: &str, name: &Option<String>| RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: kind.into(),
            name: name.clone().unwrap_or_default(),
        };
        Bindings {
            cluster_role_binding: self.cluster_role.as_ref().map(|c| ClusterRoleBinding {
                metadata: ObjectMeta {
                    name: c.metadata.name.clone(),
                    ..Default::default()
                },
                role_ref: role_ref("ClusterRole", &c.metadata.name),
                subjects: Some(vec![subject.clone()]),
            }),
            role_bindings: self
                .roles
                .iter()
                .map(|r| RoleBinding {
                    metadata: r.metadata.clone(),
                    role_ref: role_ref("Role", &r.metadata.name),
                    subjects: Some(vec![subject.clone()]),
                })
                .collect(),
        }
    }

    /// Apply the roles and their [bindings](Roles::bindings) to `subject` with `client`
    /// (server-side apply as `field_manager`, forced), for installers and test set-ups.
    /// Kubernetes puts new RBAC in force within moments, not at once: wait for it with
    /// [`missing_scoped_permissions`] of [`Roles::rules`] as the subject.
    pub async fn apply(
        &self,
        client: &Client,
        subject: Subject,
        field_manager: &str,
    ) -> Result<(), kube::Error> {
        async fn one<K>(api: Api<K>, obj: &K, field_manager: &str) -> Result<(), kube::Error>
        where
            K: Resource<DynamicType = ()>
                + Clone
                + serde::Serialize
                + serde::de::DeserializeOwned
                + std::fmt::Debug,
        {
            let mut v = serde_json::to_value(obj).map_err(kube::Error::SerdeError)?;
            v["apiVersion"] = K::api_version(&()).into_owned().into();
            v["kind"] = K::kind(&()).into_owned().into();
            let name = obj.meta().name.clone().unwrap_or_default();
            let pp = kube::api::PatchParams::apply(field_manager).force();
            api.patch(&name, &pp, &kube::api::Patch::Apply(&v))
                .await
                .map(drop)
        }
        let bindings = self.bindings(subject);
        if let Some(c) = &self.cluster_role {
            one(Api::all(client.clone()), c, field_manager).await?;
        }
        if let Some(b) = &bindings.cluster_role_binding {
            one(Api::all(client.clone()), b, field_manager).await?;
        }
        for r in &self.roles {
            let ns = r.metadata.namespace.as_deref().unwrap_or_default();
            one(Api::namespaced(client.clone(), ns), r, field_manager).await?;
        }
        for b in &bindings.role_bindings {
            let ns = b.metadata.namespace.as_deref().unwrap_or_default();
            one(Api::namespaced(client.clone(), ns), b, field_manager).await?;
        }
        Ok(())
    }

    /// The roles as YAML documents for `kubectl apply -f -`: the ClusterRole, then the Roles.
    pub fn to_yaml(&self) -> Result<String, YamlError> {
        let mut docs = Vec::new();
        if let Some(c) = &self.cluster_role {
            docs.push(document(c)?);
        }
        for r in &self.roles {
            docs.push(document(r)?);
        }
        Ok(docs.join("---\n"))
    }
}

/// The bindings of [`Roles`] to one subject ([`Roles::bindings`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Bindings {
    /// Binds the ClusterRole.
    pub cluster_role_binding: Option<ClusterRoleBinding>,
    /// Bind the Roles, each in its Role's namespace.
    pub role_bindings: Vec<RoleBinding>,
}

impl Bindings {
    /// The bindings as YAML documents for `kubectl apply -f -`.
    pub fn to_yaml(&self) -> Result<String, YamlError> {
        let mut docs = Vec::new();
        if let Some(c) = &self.cluster_role_binding {
            docs.push(document(c)?);
        }
        for r in &self.role_bindings {
            docs.push(document(r)?);
        }
        Ok(docs.join("---\n"))
    }
}

/// A ServiceAccount as a [`Subject`] of [`Roles::bindings`].
pub fn service_account(namespace: &str, name: &str) -> Subject {
    Subject {
        api_group: None,
        kind: "ServiceAccount".into(),
        name: name.into(),
        namespace: Some(namespace.into()),
    }
}

/// `obj` as one YAML document, with its `apiVersion` and `kind`.
fn document<K: Resource<DynamicType = ()> + serde::Serialize>(
    obj: &K,
) -> Result<String, YamlError> {
    let mut v = serde_json::to_value(obj).unwrap_or_default();
    v["apiVersion"] = K::api_version(&()).into_owned().into();
    v["kind"] = K::kind(&()).into_owned().into();
    serde_saphyr::to_string(&v).map_err(YamlError::new)
}

/// YAML could not be written or read.
///
/// This crate's own type rather than the YAML library's: the library (today serde-saphyr, which
/// kube uses too) can then be replaced without changing this crate's public API.
/// The library's error is the [`source`](std::error::Error::source), and its message is this one's.
#[derive(Debug, thiserror::Error)]
#[error("{source}")]
pub struct YamlError {
    #[source]
    source: serde_saphyr::SerializeError,
}

impl YamlError {
    pub(crate) fn new(source: serde_saphyr::SerializeError) -> Self {
        YamlError { source }
    }
}

/// A permission the running identity lacks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "permission missing: cannot {verb} {resource}{} in API group {group:?} {}{} (add it to the operator's {})",
    .name.as_ref().map(|n| format!(" {n:?}")).unwrap_or_default(),
    .namespace.as_ref().map(|n| format!("in namespace {n:?}")).unwrap_or_else(|| "cluster-wide".into()),
    .step.as_ref().map(|s| format!(", needed by step {s:?}")).unwrap_or_default(),
    if .namespace.is_some() { "Role in that namespace" } else { "ClusterRole" },
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
    /// The namespace it is needed in (`None`: cluster-wide).
    pub namespace: Option<String>,
    /// The object it is needed on (a rule's `resourceNames`), if only one.
    pub name: Option<String>,
}

/// Check every rule, cluster-wide, with a SelfSubjectAccessReview; returns the permissions that
/// are missing. A server without the authorization API (e.g. the in-process cluster) skips the
/// check.
pub async fn missing_permissions(
    client: &Client,
    rules: &[PolicyRule],
) -> Result<Vec<MissingPermission>, kube::Error> {
    missing_permissions_of(client, rules.iter().map(|r| (None, &RuleScope::Cluster, r))).await
}

/// [`missing_permissions`] of `rules`, each checked where it is granted (a rule in a namespace
/// with the namespace in the review).
pub async fn missing_scoped_permissions(
    client: &Client,
    rules: &[ScopedRule],
) -> Result<Vec<MissingPermission>, kube::Error> {
    missing_permissions_of(client, rules.iter().map(|r| (None, &r.scope, &r.rule))).await
}

/// [`missing_scoped_permissions`] of the runtime's own `rules` and of its steps' `steps` (their
/// scopes [resolved](RuleScope::resolve)): what is missing names the step that needs it.
pub async fn missing_step_permissions(
    client: &Client,
    rules: &[ScopedRule],
    steps: &[StepRule],
) -> Result<Vec<MissingPermission>, kube::Error> {
    let own = rules.iter().map(|r| (None, &r.scope, &r.rule));
    let of_steps = steps
        .iter()
        .map(|s| (Some(s.step.as_str()), &s.scope, &s.rule));
    missing_permissions_of(client, own.chain(of_steps)).await
}

async fn missing_permissions_of<'a>(
    client: &Client,
    rules: impl Iterator<Item = (Option<&'a str>, &'a RuleScope, &'a PolicyRule)>,
) -> Result<Vec<MissingPermission>, kube::Error> {
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let mut missing = Vec::new();
    let mut asked = std::collections::HashSet::new();
    for (step, scope, r) in rules {
        let namespace = match scope {
            RuleScope::Namespace(ns) => Some(ns.clone()),
            RuleScope::Cluster | RuleScope::Object => None,
        };
        let names: Vec<Option<String>> = match &r.resource_names {
            Some(names) if !names.is_empty() => names.iter().cloned().map(Some).collect(),
            _ => vec![None],
        };
        for group in r.api_groups.iter().flatten() {
            for res in r.resources.iter().flatten() {
                let (resource, subresource) = match res.split_once('/') {
                    Some((a, b)) => (a.to_string(), Some(b.to_string())),
                    None => (res.clone(), None),
                };
                for verb in &r.verbs {
                    for name in &names {
                        let key = (
                            step,
                            namespace.clone(),
                            group.clone(),
                            res.clone(),
                            verb.clone(),
                            name.clone(),
                        );
                        if !asked.insert(key) {
                            continue;
                        }
                        let review = SelfSubjectAccessReview {
                            spec: SelfSubjectAccessReviewSpec {
                                resource_attributes: Some(ResourceAttributes {
                                    group: Some(group.clone()),
                                    resource: Some(resource.clone()),
                                    subresource: subresource.clone(),
                                    verb: Some(verb.clone()),
                                    namespace: namespace.clone(),
                                    name: name.clone(),
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
                                namespace: namespace.clone(),
                                name: name.clone(),
                            });
                        }
                    }
                }
            }
        }
    }
    Ok(missing)
}
