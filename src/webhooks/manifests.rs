//! What the API server needs to call the webhooks: the webhook configurations, the CRDs'
//! `conversion` stanza and the Service, and the permissions the runtime needs to write the CA
//! bundle into them.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ValidatingWebhook,
    ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::rbac::v1::PolicyRule;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiext;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{AdmissionWebhook, ConversionError, Webhooks};

/// How the API server reaches the webhook server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// Through a Service (in a cluster): the API server calls
    /// `https://<name>.<namespace>.svc:<port><path>`.
    Service {
        /// The Service's namespace.
        namespace: String,
        /// The Service's name.
        name: String,
        /// The Service's port (443 by default in Kubernetes).
        port: i32,
    },
    /// At a URL (an API server outside the cluster, or a test's, on loopback): the base, such
    /// as `https://127.0.0.1:9443`, to which the paths are appended.
    Url(String),
}

impl Endpoint {
    /// The DNS names a serving certificate for this endpoint must hold.
    pub fn names(&self) -> Vec<String> {
        match self {
            Endpoint::Service {
                namespace, name, ..
            } => vec![
                format!("{name}.{namespace}.svc"),
                format!("{name}.{namespace}.svc.cluster.local"),
            ],
            Endpoint::Url(url) => url::Url::parse(url)
                .ok()
                .and_then(|u| u.host_str().map(|h| h.trim_matches(['[', ']']).to_owned()))
                .into_iter()
                .collect(),
        }
    }

    fn admission_client(&self, path: &str, ca: Option<&str>) -> WebhookClientConfig {
        let ca_bundle = ca.map(|ca| ByteString(ca.as_bytes().to_vec()));
        match self {
            Endpoint::Service {
                namespace,
                name,
                port,
            } => WebhookClientConfig {
                ca_bundle,
                service: Some(
                    k8s_openapi::api::admissionregistration::v1::ServiceReference {
                        namespace: namespace.clone(),
                        name: name.clone(),
                        path: Some(path.into()),
                        port: Some(*port),
                    },
                ),
                url: None,
            },
            Endpoint::Url(base) => WebhookClientConfig {
                ca_bundle,
                service: None,
                url: Some(format!("{}{path}", base.trim_end_matches('/'))),
            },
        }
    }

    fn conversion_client(&self, path: &str, ca: Option<&str>) -> apiext::WebhookClientConfig {
        let ca_bundle = ca.map(|ca| ByteString(ca.as_bytes().to_vec()));
        match self {
            Endpoint::Service {
                namespace,
                name,
                port,
            } => apiext::WebhookClientConfig {
                ca_bundle,
                service: Some(apiext::ServiceReference {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    path: Some(path.into()),
                    port: Some(*port),
                }),
                url: None,
            },
            Endpoint::Url(base) => apiext::WebhookClientConfig {
                ca_bundle,
                service: None,
                url: Some(format!("{}{path}", base.trim_end_matches('/'))),
            },
        }
    }
}

fn rule(webhook: &AdmissionWebhook) -> RuleWithOperations {
    RuleWithOperations {
        api_groups: Some(vec![webhook.kind.group.clone()]),
        api_versions: Some(vec![webhook.kind.version.clone()]),
        resources: Some(vec![webhook.kind.plural.clone()]),
        operations: Some(webhook.operations.iter().map(|o| o.to_string()).collect()),
        scope: None,
    }
}

impl Webhooks {
    /// The name of the `ValidatingWebhookConfiguration`: `<operator>-validating`.
    pub fn validating_name(&self) -> String {
        format!("{}-validating", self.operator)
    }

    /// The name of the `MutatingWebhookConfiguration`: `<operator>-mutating`.
    pub fn mutating_name(&self) -> String {
        format!("{}-mutating", self.operator)
    }

    fn timeout_seconds(&self) -> i32 {
        self.timeout.as_secs() as i32
    }

    /// The `ValidatingWebhookConfiguration` of the validators (`None` without one), reaching
    /// them at `endpoint`, with the CA bundle `ca` if it is known (else the runtime writes it
    /// once it serves).
    pub fn validating_configuration(
        &self,
        endpoint: &Endpoint,
        ca: Option<&str>,
    ) -> Option<ValidatingWebhookConfiguration> {
        let webhooks: Vec<ValidatingWebhook> = self
            .admission
            .iter()
            .filter(|w| !w.mutating)
            .map(|w| ValidatingWebhook {
                name: w.name(),
                admission_review_versions: vec!["v1".into()],
                client_config: endpoint.admission_client(&w.path(), ca),
                failure_policy: Some(self.failure_policy.as_str().into()),
                match_policy: Some("Equivalent".into()),
                rules: Some(vec![rule(w)]),
                side_effects: "None".into(),
                timeout_seconds: Some(self.timeout_seconds()),
                ..Default::default()
            })
            .collect();
        (!webhooks.is_empty()).then(|| ValidatingWebhookConfiguration {
            metadata: ObjectMeta {
                name: Some(self.validating_name()),
                ..Default::default()
            },
            webhooks: Some(webhooks),
        })
    }

    /// The `MutatingWebhookConfiguration` of the defaulters (`None` without one); see
    /// [`validating_configuration`](Self::validating_configuration).
    pub fn mutating_configuration(
        &self,
        endpoint: &Endpoint,
        ca: Option<&str>,
    ) -> Option<MutatingWebhookConfiguration> {
        let webhooks: Vec<MutatingWebhook> = self
            .admission
            .iter()
            .filter(|w| w.mutating)
            .map(|w| MutatingWebhook {
                name: w.name(),
                admission_review_versions: vec!["v1".into()],
                client_config: endpoint.admission_client(&w.path(), ca),
                failure_policy: Some(self.failure_policy.as_str().into()),
                match_policy: Some("Equivalent".into()),
                reinvocation_policy: Some("Never".into()),
                rules: Some(vec![rule(w)]),
                side_effects: "None".into(),
                timeout_seconds: Some(self.timeout_seconds()),
                ..Default::default()
            })
            .collect();
        (!webhooks.is_empty()).then(|| MutatingWebhookConfiguration {
            metadata: ObjectMeta {
                name: Some(self.mutating_name()),
                ..Default::default()
            },
            webhooks: Some(webhooks),
        })
    }

    /// `crds` with the conversion stanza on each CRD of a kind with a [`Conversion`]
    /// (checked: every version has a path to the hub); the others as they are.
    ///
    /// [`Conversion`]: super::Conversion
    pub fn crds(
        &self,
        crds: Vec<apiext::CustomResourceDefinition>,
        endpoint: &Endpoint,
        ca: Option<&str>,
    ) -> Result<Vec<apiext::CustomResourceDefinition>, ConversionError> {
        crds.into_iter()
            .map(
                |crd| match self.conversion_for(&crd.spec.group, &crd.spec.names.kind) {
                    Some(conversion) => conversion
                        .apply_to(crd, endpoint.conversion_client(super::CONVERT_PATH, ca)),
                    None => Ok(crd),
                },
            )
            .collect()
    }

    /// The Service in front of the webhook server for [`Endpoint::Service`], selecting the
    /// operator's Pods by `selector` and forwarding to `target_port` (the server's).
    pub fn service(
        &self,
        endpoint: &Endpoint,
        selector: BTreeMap<String, String>,
        target_port: u16,
    ) -> Option<Service> {
        let Endpoint::Service {
            namespace,
            name,
            port,
        } = endpoint
        else {
            return None;
        };
        Some(Service {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                selector: Some(selector),
                ports: Some(vec![ServicePort {
                    name: Some("webhook".into()),
                    port: *port,
                    target_port: Some(IntOrString::Int(target_port.into())),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            status: None,
        })
    }

    /// The names of the CRDs with a conversion (`<plural>.<group>`, from `crds`).
    fn conversion_crd_names(&self, crds: &[apiext::CustomResourceDefinition]) -> Vec<String> {
        crds.iter()
            .filter(|crd| {
                self.conversion_for(&crd.spec.group, &crd.spec.names.kind)
                    .is_some()
            })
            .filter_map(|crd| crd.metadata.name.clone())
            .collect()
    }

    /// What the runtime needs to write the CA bundle: `get` and `update` of its own webhook
    /// configurations and of the CRDs among `crds` it converts, each by name
    /// (`resourceNames`), and nothing else. Cluster-scoped: these kinds are.
    pub fn rules(&self, crds: &[apiext::CustomResourceDefinition]) -> Vec<PolicyRule> {
        let named = |group: &str, resource: &str, names: Vec<String>| PolicyRule {
            api_groups: Some(vec![group.into()]),
            resources: Some(vec![resource.into()]),
            resource_names: Some(names),
            verbs: vec!["get".into(), "update".into()],
            ..Default::default()
        };
        let mut rules = Vec::new();
        if self.admission.iter().any(|w| !w.mutating) {
            rules.push(named(
                "admissionregistration.k8s.io",
                "validatingwebhookconfigurations",
                vec![self.validating_name()],
            ));
        }
        if self.admission.iter().any(|w| w.mutating) {
            rules.push(named(
                "admissionregistration.k8s.io",
                "mutatingwebhookconfigurations",
                vec![self.mutating_name()],
            ));
        }
        let crd_names = self.conversion_crd_names(crds);
        if !crd_names.is_empty() {
            rules.push(named(
                "apiextensions.k8s.io",
                "customresourcedefinitions",
                crd_names,
            ));
        }
        rules
    }
}
