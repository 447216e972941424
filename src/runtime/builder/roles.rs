//! The roles a runtime needs ([`RuntimeBuilder::roles`]): its controllers' rules and its own.

use super::*;

impl RuntimeBuilder {
    /// The roles this runtime needs, named `name` (print them with
    /// [`Roles::to_yaml`](crate::rbac::Roles::to_yaml), bind them with
    /// [`Roles::bindings`](crate::rbac::Roles::bindings)). For each controller: its kind
    /// (list, watch, get, patch, and patch of its status), its config object (by name), the
    /// Secrets it watches, Events, and what its tree's steps declare ([`Provisioner::rules`](crate::provisioners::Provisioner::rules): the
    /// children kinds of [`resource`](crate::provisioners::resource()), a CD driver's, a step's
    /// [`needs`](crate::provisioners::Step::needs)) — in a Role in the namespace it watches, or
    /// in the ClusterRole when it watches all or its kind is cluster-scoped. Besides: the CRDs it
    /// installs (by name), and the Leases of its leader election (by name) or sharding, in a Role
    /// in their namespace.
    pub fn roles(&self, name: &str) -> crate::rbac::Roles {
        let mut rules = self.own_rules();
        rules.extend(
            self.step_rules()
                .into_iter()
                .map(|s| crate::rbac::ScopedRule::new(s.scope, s.rule)),
        );
        crate::rbac::Roles::new(name, rules)
    }

    /// What the trees' steps declare they need, in the scopes they need it.
    pub(super) fn step_rules(&self) -> Vec<crate::rbac::StepRule> {
        let default = self.namespace.as_deref();
        self.controllers
            .iter()
            .flat_map(|c| c.step_rules(default))
            .collect()
    }

    /// What the runtime itself needs: its kinds (their configs, Secrets and Events), installing
    /// its CRDs, and the Leases of its leader election or sharding.
    pub(super) fn own_rules(&self) -> Vec<crate::rbac::ScopedRule> {
        use crate::rbac::{RuleScope, ScopedRule, named_rule_for, rule_for};
        use k8s_openapi::api::coordination::v1::Lease;
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        let default = self.namespace.as_deref();
        let mut rules: Vec<_> = self
            .controllers
            .iter()
            .flat_map(|c| c.rules(default))
            .collect();
        if !self.crds.is_empty() {
            // Read by name (an installed CRD newer than the operator's is not replaced), applied
            // by name (server-side apply: a patch, which Kubernetes authorizes as a `create` of
            // that name when the CRD does not exist yet), then watched by name until Established.
            let names: Vec<&str> = self
                .crds
                .iter()
                .filter_map(|c| c.metadata.name.as_deref())
                .collect();
            rules.push(ScopedRule::new(
                RuleScope::Cluster,
                named_rule_for::<CustomResourceDefinition>(
                    &["get", "create", "patch", "list", "watch"],
                    &names,
                ),
            ));
        }
        if let Some(election) = &self.leader {
            let here = RuleScope::namespace(&election.namespace);
            rules.push(ScopedRule::new(
                here.clone(),
                rule_for::<Lease>(&["create"]),
            ));
            rules.push(ScopedRule::new(
                here,
                named_rule_for::<Lease>(&["get", "update"], &[&election.lease]),
            ));
        }
        if let Some(sharding) = &self.sharding {
            // Shard and member Leases: members are named after replicas, and found by a label.
            rules.push(ScopedRule::new(
                RuleScope::namespace(&sharding.namespace),
                rule_for::<Lease>(&["get", "list", "create", "update", "delete"]),
            ));
        }
        rules
    }
}
