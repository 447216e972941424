//! The contract between the `application` and `remote` provisioners and a continuous-delivery
//! system (Argo CD in practice).
//!
//! A driver deploys Helm applications and knows the clusters it deploys to. It is found by
//! nothing but what it is given: an application is named by its [`AppIdentity`] (labels derived
//! from the owning object's scope, never a fixed object name), a cluster by its
//! [`ClusterRegistration`].
//!
//! [`argocd::ArgoCd`](super::argocd::ArgoCd) is the Argo CD driver. Another CD system plugs in
//! by implementing [`CdDriver`]:
//!
//! ```
//! use actorcile::provisioners::cd::{
//!     AppHealth, AppIdentity, AppSpec, CdDriver, CdError, ClusterRegistration, Deletion,
//! };
//!
//! /// A CD system that deploys nothing and reports everything healthy.
//! struct Noop;
//!
//! #[async_trait::async_trait]
//! impl CdDriver for Noop {
//!     fn kind(&self) -> &str {
//!         "noop"
//!     }
//!     async fn health(&self, _id: &AppIdentity) -> Result<AppHealth, CdError> {
//!         Ok(AppHealth::Healthy)
//!     }
//!     async fn apply(&self, _app: &AppSpec) -> Result<(), CdError> {
//!         Ok(())
//!     }
//!     async fn delete(&self, _id: &AppIdentity, _background: bool) -> Result<Deletion, CdError> {
//!         Ok(Deletion::Gone)
//!     }
//!     async fn register_cluster(&self, _r: &ClusterRegistration, _user: &str) -> Result<(), CdError> {
//!         Ok(())
//!     }
//!     async fn unregister_cluster(&self, _id: &str, _user: &str) -> Result<(), CdError> {
//!         Ok(())
//!     }
//! }
//!
//! // Applications are found by labels derived from their owner, never by a fixed name.
//! let names = actorcile::names::OperatorNames::new("tenant-operator", "tenants.example.com");
//! let id = AppIdentity::new(&names, "Tenant", Some("team-a"), "acme", "web", Some("edge"));
//! assert!(id.selector().contains("app.tenants.example.com/owner-name=acme"));
//! ```

use std::collections::BTreeMap;

use async_trait::async_trait;

use crate::names::OperatorNames;

/// The label keys of an [`AppIdentity`], each under the operator's domain:
/// `app.<domain>/<key>` ([`OperatorNames::app_label_prefix`]).
pub mod labels {
    /// The owning object's kind.
    pub const OWNER_KIND: &str = "owner-kind";
    /// The owning object's namespace (absent for a cluster-scoped owner).
    pub const OWNER_NAMESPACE: &str = "owner-namespace";
    /// The owning object's name.
    pub const OWNER_NAME: &str = "owner-name";
    /// The application's name within its owner's tree.
    pub const APPLICATION: &str = "application";
    /// The remote cluster the application deploys to (absent: the driver's own cluster).
    pub const CLUSTER: &str = "cluster";
}

/// Which CD application belongs to which object: a set of labels derived from the owning
/// object's scope (kind, namespace, name), the application's name, and the remote cluster it
/// deploys to, if any, under the operator's domain (`app.<domain>/owner-name`, …). Drivers
/// find applications by these labels; two applications with one identity are an error
/// ([`CdError::Ambiguous`]), never a random pick. For an operator that names a
/// [former domain](OperatorNames::former_domain), the identity also has the labels an
/// earlier version wrote ([`former_selector`](Self::former_selector)): a driver that finds
/// no application by the current labels looks under those, and moves what it finds to the
/// current labels.
///
/// Label values are at most 63 characters: a longer value is cut and ends in a hash of the
/// whole, so two long names stay apart.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AppIdentity {
    labels: BTreeMap<String, String>,
    former: Option<BTreeMap<String, String>>,
}

impl AppIdentity {
    /// The identity of application `application` of the object `kind` `namespace`/`name`,
    /// deployed to remote cluster `cluster` (`None`: the driver's own cluster), for the
    /// operator `names`.
    pub fn new(
        names: &OperatorNames,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        application: &str,
        cluster: Option<&str>,
    ) -> Self {
        let mut values = vec![
            (labels::OWNER_KIND, label_value(kind)),
            (labels::OWNER_NAME, label_value(name)),
            (labels::APPLICATION, label_value(application)),
        ];
        if let Some(ns) = namespace {
            values.push((labels::OWNER_NAMESPACE, label_value(ns)));
        }
        if let Some(c) = cluster {
            values.push((labels::CLUSTER, label_value(c)));
        }
        let under = |prefix: &str| {
            values
                .iter()
                .map(|(k, v)| (format!("{prefix}{k}"), v.clone()))
                .collect::<BTreeMap<_, _>>()
        };
        Self {
            labels: under(&names.app_label_prefix()),
            former: names
                .former()
                .map(|d| under(&OperatorNames::new(names.name(), d).app_label_prefix())),
        }
    }

    /// The labels.
    pub fn labels(&self) -> &BTreeMap<String, String> {
        &self.labels
    }

    /// The value of the label `key` (one of [`labels`]), if the identity has it.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k.rsplit_once('/').is_some_and(|(_, short)| short == key))
            .map(|(_, v)| v.as_str())
    }

    /// The labels as a label selector (`k=v,k=v`).
    pub fn selector(&self) -> String {
        selector_of(&self.labels)
    }

    /// The labels under the former domain, if the operator names one: those to remove from an
    /// application found by [`former_selector`](Self::former_selector).
    pub fn former_labels(&self) -> Option<&BTreeMap<String, String>> {
        self.former.as_ref()
    }

    /// The selector of the labels an earlier version of the operator wrote under its
    /// [former domain](OperatorNames::former_domain), if it names one.
    pub fn former_selector(&self) -> Option<String> {
        self.former.as_ref().map(selector_of)
    }
}

fn selector_of(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

impl std::fmt::Display for AppIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.selector())
    }
}

/// `v` as a label value: characters outside `[A-Za-z0-9._-]` become `-`, and a value longer
/// than 63 characters is cut and ends in a hash of the whole.
pub(crate) fn label_value(v: &str) -> String {
    let clean: String = v
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    let clean = clean.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    if clean.len() <= 63 {
        return clean.to_string();
    }
    let h = crate::hash::sip13(&[v]);
    format!("{}-{:012x}", &clean[..50], h & 0xffff_ffff_ffff)
}

/// Where an application deploys to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Destination {
    /// The cluster the CD system runs in.
    InCluster,
    /// A cluster registered with the driver under this id (see [`ClusterRegistration`]).
    Registered(String),
}

/// Where an application's manifests come from.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AppSource {
    /// A chart of a Helm chart repository.
    Helm {
        /// The chart repository's URL.
        repo: String,
        /// The chart's name.
        chart: String,
        /// The chart's version.
        version: String,
    },
    /// A folder of a git repository at a branch, tag or commit: the CD system renders what it
    /// finds there (a Helm chart, Kustomize, plain manifests).
    Git {
        /// The repository's URL.
        repo: String,
        /// The folder within it.
        path: String,
        /// The branch, tag or commit.
        revision: String,
    },
}

impl AppSource {
    /// A chart `chart` of repository `repo` at `version`.
    pub fn helm(
        repo: impl Into<String>,
        chart: impl Into<String>,
        version: impl Into<String>,
    ) -> Self {
        AppSource::Helm {
            repo: repo.into(),
            chart: chart.into(),
            version: version.into(),
        }
    }

    /// Folder `path` of git repository `repo` at `revision` (a branch, tag or commit).
    pub fn git(
        repo: impl Into<String>,
        path: impl Into<String>,
        revision: impl Into<String>,
    ) -> Self {
        AppSource::Git {
            repo: repo.into(),
            path: path.into(),
            revision: revision.into(),
        }
    }
}

/// A difference the CD system ignores when it compares what it deployed with what is running
/// (Argo CD's `ignoreDifferences`): in the objects of `group`/`kind` (and of `name` and
/// `namespace`, when given), the fields that `json_pointers` or `jq_path_expressions` select, and
/// those that the field managers `managed_fields_managers` own (a controller that scales a
/// Deployment, a webhook that injects a CA bundle).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IgnoreDifference {
    /// The objects' API group (`""` for the core group).
    pub group: String,
    /// The objects' kind.
    pub kind: String,
    /// Only the object of this name.
    pub name: Option<String>,
    /// Only objects in this namespace.
    pub namespace: Option<String>,
    /// Fields by JSON pointer (`/spec/replicas`).
    pub json_pointers: Vec<String>,
    /// Fields by jq path expression (`.spec.template.spec.containers[]?.image`).
    pub jq_path_expressions: Vec<String>,
    /// Fields these field managers own.
    pub managed_fields_managers: Vec<String>,
}

/// Everything a driver needs to create or update one application.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct AppSpec {
    /// Which application this is.
    pub identity: AppIdentity,
    /// Where its manifests come from.
    pub source: AppSource,
    /// The Helm release name (for a git source, used when it holds a Helm chart and Helm
    /// parameters or values are given).
    pub release: String,
    /// The namespace the application is installed into.
    pub namespace: String,
    /// Whether the CD system creates the namespace when it is missing (default `true`).
    pub create_namespace: bool,
    /// Labels for the namespace, when the CD system creates it.
    pub namespace_labels: BTreeMap<String, String>,
    /// Annotations for the namespace, when the CD system creates it.
    pub namespace_annotations: BTreeMap<String, String>,
    /// Whether the CD system applies the manifests server-side (default `false`).
    pub server_side_apply: bool,
    /// Differences the CD system ignores.
    pub ignore_differences: Vec<IgnoreDifference>,
    /// Helm parameters (`--set name=value`).
    pub parameters: BTreeMap<String, String>,
    /// Helm values (a YAML/JSON object), if any.
    pub values: Option<serde_json::Value>,
    /// Where it deploys to.
    pub destination: Destination,
    /// Whether a Degraded application counts as provisioned.
    pub allow_degraded: bool,
}

/// An application's state as the CD system reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AppHealth {
    /// No application has this identity.
    Missing,
    /// Not yet synced and healthy; the message says what the CD system reports.
    Progressing(String),
    /// Synced, but the CD system reports it Degraded.
    Degraded(String),
    /// Synced and healthy.
    Healthy,
    /// Being deleted.
    Deleting,
}

/// What a delete request achieved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Deletion {
    /// No application has this identity any more.
    Gone,
    /// The application is being deleted (the CD system is removing what it deployed).
    InProgress,
}

/// A remote cluster as the CD system needs to know it, and the user that needs it registered.
///
/// Registrations are shared: several applications, of one object or of many, may deploy to one
/// cluster. Each registers with its own `user` key, and a registration is removed only when its
/// last user unregisters.
#[derive(Clone, PartialEq)]
pub struct ClusterRegistration {
    /// The remote cluster's stable id.
    pub id: String,
    /// The API server URL.
    pub server: String,
    /// The CD system's connection config (for Argo CD: `bearerToken`, `tlsClientConfig`).
    pub config: serde_json::Value,
}

impl ClusterRegistration {
    /// The registration of remote cluster `id` reached with `config`, in the connection format
    /// Argo CD's cluster Secrets use: `bearerToken`, and `tlsClientConfig` with `caData`,
    /// `certData`, `keyData` (base64 PEM) and `insecure`.
    pub fn from_config(id: &str, config: &kube::Config) -> Result<Self, CdError> {
        use base64::Engine;
        use secrecy::ExposeSecret;
        let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
        let mut tls = serde_json::Map::new();
        tls.insert("insecure".into(), config.accept_invalid_certs.into());
        if let Some(certs) = &config.root_cert {
            // DER certificates, as PEM.
            let pem: String = certs
                .iter()
                .map(|der| {
                    let body = b64(der);
                    let lines: Vec<&str> = body
                        .as_bytes()
                        .chunks(64)
                        .map(|c| std::str::from_utf8(c).unwrap_or_default())
                        .collect();
                    format!(
                        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
                        lines.join("\n")
                    )
                })
                .collect();
            tls.insert("caData".into(), b64(pem.as_bytes()).into());
        }
        let auth = &config.auth_info;
        let not_registrable = |why: &str| CdError::NotRegistrable {
            id: id.to_string(),
            why: why.to_string(),
        };
        // Inline data only: a command cannot run in the CD system, and a file a kubeconfig
        // names is never read here (its content would be copied into a Secret of the CD
        // system, readable by whoever reads those, and a kubeconfig from a Secret could name
        // any file of the operator's pod, its service-account token among them).
        if let Some(field) = super::remote::local_auth_field(auth) {
            return Err(not_registrable(&format!(
                "its credentials use {field}, a command or a local file; only inline credentials \
                 (client-certificate-data, client-key-data, token) are registered"
            )));
        }
        if let Some(cert) = auth.client_certificate_data.clone() {
            tls.insert("certData".into(), cert.into());
        }
        if let Some(key) = auth.client_key_data.as_ref() {
            tls.insert("keyData".into(), key.expose_secret().to_string().into());
        }
        let mut cfg = serde_json::Map::new();
        cfg.insert("tlsClientConfig".into(), tls.into());
        if let Some(token) = &auth.token {
            cfg.insert(
                "bearerToken".into(),
                token.expose_secret().to_string().into(),
            );
        }
        Ok(Self {
            id: id.to_string(),
            server: config
                .cluster_url
                .to_string()
                .trim_end_matches('/')
                .to_string(),
            config: cfg.into(),
        })
    }
}

impl std::fmt::Debug for ClusterRegistration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the credentials in `config`.
        f.debug_struct("ClusterRegistration")
            .field("id", &self.id)
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

/// Why a driver call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CdError {
    /// More than one application carries one identity.
    #[error("{count} applications carry the identity {identity}; expected at most one")]
    Ambiguous {
        /// The identity.
        identity: AppIdentity,
        /// How many carry it.
        count: usize,
    },
    /// The remote cannot be registered (e.g. it is reached through an in-process client, with no
    /// server URL the CD system could use).
    #[error("cluster {id} cannot be registered with the CD system: {why}")]
    NotRegistrable {
        /// The remote's id.
        id: String,
        /// Why.
        why: String,
    },
    /// An object of the CD system's under a name the driver writes is not one it wrote: it is
    /// neither updated nor deleted.
    #[error("{object} is not the driver's: {why}")]
    NotOurs {
        /// The object, `Kind namespace/name`.
        object: String,
        /// What it lacks.
        why: String,
    },
    /// The CD system's API failed.
    #[error("CD API request failed: {0}")]
    Api(#[from] kube::Error),
    /// The CD system's object could not be built or read.
    #[error("invalid CD object: {0}")]
    Invalid(String),
}

/// A continuous-delivery system that deploys Helm applications into clusters.
///
/// Implementations must be idempotent: every call may be repeated on every reconcile.
#[async_trait]
pub trait CdDriver: Send + Sync {
    /// The driver's kind, e.g. `argocd`.
    fn kind(&self) -> &str;
    /// The state of the application with this identity.
    async fn health(&self, identity: &AppIdentity) -> Result<AppHealth, CdError>;
    /// Create the application, or update it to `app`.
    async fn apply(&self, app: &AppSpec) -> Result<(), CdError>;
    /// Delete the application; with `background`, do not wait for the CD system to remove what
    /// it deployed.
    async fn delete(&self, identity: &AppIdentity, background: bool) -> Result<Deletion, CdError>;
    /// Create or update `registration` and record `user` as one of its users.
    async fn register_cluster(
        &self,
        registration: &ClusterRegistration,
        user: &str,
    ) -> Result<(), CdError>;
    /// Remove `user` from the registration of cluster `id`, and the registration itself once
    /// it has no user left. Unregistering what is not registered succeeds.
    async fn unregister_cluster(&self, id: &str, user: &str) -> Result<(), CdError>;
    /// The RBAC permissions the driver needs in the cluster its client talks to, each where it
    /// needs it (see [`Provisioner::rules`](super::Provisioner::rules)). Default: none.
    fn rules(&self) -> Vec<crate::rbac::ScopedRule> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registration_holds_inline_credentials_only() {
        let url: http::Uri = "https://edge.example:6443".parse().unwrap();
        let mut config = kube::Config::new(url);
        config.auth_info.token = Some("t0ken".to_string().into());
        let registration = ClusterRegistration::from_config("edge", &config).unwrap();
        assert_eq!(registration.id, "edge");
        for (field, set) in [
            (
                "tokenFile",
                Box::new(|a: &mut kube::config::AuthInfo| {
                    a.token_file =
                        Some("/var/run/secrets/kubernetes.io/serviceaccount/token".into())
                }) as Box<dyn Fn(&mut kube::config::AuthInfo)>,
            ),
            (
                "client-key",
                Box::new(|a: &mut kube::config::AuthInfo| a.client_key = Some("/etc/key".into())),
            ),
        ] {
            let mut c = config.clone();
            set(&mut c.auth_info);
            match ClusterRegistration::from_config("edge", &c) {
                Err(e @ CdError::NotRegistrable { .. }) => {
                    assert!(e.to_string().contains(field), "{e}")
                }
                Err(other) => panic!("{field}: expected NotRegistrable, got {other}"),
                Ok(_) => panic!("{field}: registered"),
            }
        }
    }

    #[test]
    fn identity_labels_are_valid_label_values_and_long_names_stay_apart() {
        let long_a = format!("{}a", "x".repeat(80));
        let long_b = format!("{}b", "x".repeat(80));
        let names = OperatorNames::new("op", "ops.example.com");
        let a = AppIdentity::new(&names, "Cluster", Some("ns"), &long_a, "cilium", None);
        let b = AppIdentity::new(&names, "Cluster", Some("ns"), &long_b, "cilium", None);
        assert_ne!(a, b);
        for v in a.labels().values() {
            assert!(v.len() <= 63, "{v}");
        }
        let odd = AppIdentity::new(&names, "Cluster", None, "a/b c", "app", Some("remote:1"));
        assert_eq!(odd.label(labels::OWNER_NAME), Some("a-b-c"));
        assert_eq!(odd.label(labels::CLUSTER), Some("remote-1"));
        assert_eq!(odd.label(labels::OWNER_NAMESPACE), None);
        assert_eq!(
            odd.selector(),
            "app.ops.example.com/application=app,app.ops.example.com/cluster=remote-1,\
             app.ops.example.com/owner-kind=Cluster,app.ops.example.com/owner-name=a-b-c"
        );
        assert_eq!(odd.former_selector(), None);
    }

    #[test]
    fn an_identity_of_an_operator_with_a_former_domain_has_its_labels_too() {
        let names =
            OperatorNames::new("op", "ops.example.com").former_domain(crate::names::LEGACY_DOMAIN);
        let id = AppIdentity::new(&names, "Cluster", Some("ns"), "c", "cilium", None);
        assert!(id.selector().contains("app.ops.example.com/owner-name=c"));
        let former = id.former_selector().unwrap();
        assert!(
            former.contains("app.actorcile.dev/owner-name=c"),
            "{former}"
        );
        assert_eq!(id.former_labels().unwrap().len(), id.labels().len());
    }
}
