//! Admission and conversion webhooks for the managed kinds (feature `webhooks`), served by the
//! runtime over TLS.
//!
//! - [`Validator`] and [`Defaulter`]: typed admission handlers for a kind; the runtime decodes
//!   the `AdmissionReview`, makes the JSON patch from the defaulter's typed change, passes
//!   warnings on, and turns a handler's panic or overrun into a denial.
//! - [`Conversion`]: a multi-version kind's versions, each converted to and from one hub type;
//!   the runtime answers `ConversionReview` and refuses a CRD whose versions have no path to
//!   the hub.
//! - [`Webhooks`]: the handlers of an operator, and what the API server needs to call them: the
//!   `ValidatingWebhookConfiguration` and `MutatingWebhookConfiguration`, the CRDs'
//!   `conversion` stanza, the Service, and the RBAC the runtime needs to write the CA bundle.
//! - [`WebhookServer`]: one HTTPS listener (rustls), apart from the admin server, with the
//!   certificate from a mounted Secret (read again when it changes) or made by the runtime
//!   ([`Certificates`]); it writes the CA bundle into the configurations and the CRDs, and
//!   again when the CA changes.
//!
//! - [`Webhooks::local`]: the webhooks served on loopback to a real API server for a test
//!   (envtest's `WebhookInstallOptions`), installed, and waited for until the API server calls
//!   them.
//! - [`migrate_storage_version`]: every stored object of a CRD written again in its storage
//!   version, and the CRD's `storedVersions` set to it, after the storage version changed.
//!
//! Paths are controller-runtime's: `/validate-<group with . as ->-<version>-<kind, lower case>`,
//! `/mutate-…` likewise, and `/convert`. Failure policy `Fail` and `sideEffects: None` by
//! default, as kubebuilder scaffolds them.
//!
//! With the feature `cluster`, [`Webhooks::install_in`] makes the in-process API server call the
//! same handlers (in process, without TLS), so unit tests see admission and conversion.
//!
//! ```
//! use actorcile::webhooks::{Denial, Request, Validator, Warnings, Webhooks};
//! # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
//! # #[kube(group = "example.com", version = "v1", kind = "App", namespaced)]
//! # struct AppSpec { replicas: u32 }
//! struct NoHugeApps;
//! impl Validator<App> for NoHugeApps {
//!     async fn validate(&self, new: &App, _: Option<&App>, _: &Request) -> Result<Warnings, Denial> {
//!         if new.spec.replicas > 100 {
//!             return Err(Denial::invalid("spec.replicas: at most 100"));
//!         }
//!         Ok(Warnings::new())
//!     }
//! }
//!
//! let webhooks = Webhooks::new("app-operator").validate::<App>(NoHugeApps);
//! assert_eq!(webhooks.paths(), ["/validate-example-com-v1-app"]);
//! ```

mod admission;
mod ca_bundle;
#[cfg(feature = "cluster")]
mod in_process;
mod manifests;
mod server;
mod storage;
mod tls;

pub mod conversion;
pub mod local;

use std::sync::Arc;
use std::time::Duration;

use kube::Resource;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

pub use admission::{Defaulter, Denial, Request, Validator, Warnings};
pub use conversion::{Conversion, ConversionError, Convertible};
pub use local::{LocalInstall, LocalWebhooks};
pub use manifests::Endpoint;
pub use server::{WebhookError, WebhookLimits, WebhookServer};
pub use storage::{Migrated, migrate_storage_version};
pub use tls::{CertFiles, CertPem, Certificates, GeneratedCa, ServingCert, TlsError};

use admission::ErasedReview;
use conversion::ErasedConversion;

/// What the API server does when a webhook cannot be reached or does not answer in time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FailurePolicy {
    /// The write is refused (the default, as controller-runtime's).
    #[default]
    Fail,
    /// The write goes ahead unchecked.
    Ignore,
}

impl FailurePolicy {
    fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::Fail => "Fail",
            FailurePolicy::Ignore => "Ignore",
        }
    }
}

/// The kind an admission webhook is for.
#[derive(Clone, Debug)]
struct KindRef {
    group: String,
    version: String,
    kind: String,
    plural: String,
}

impl KindRef {
    fn of<K: Resource<DynamicType = ()>>() -> Self {
        KindRef {
            group: K::group(&()).into_owned(),
            version: K::version(&()).into_owned(),
            kind: K::kind(&()).into_owned(),
            plural: K::plural(&()).into_owned(),
        }
    }

    /// controller-runtime's path segment: `<group, . as ->-<version>-<kind lower case>`.
    fn segment(&self) -> String {
        format!(
            "{}-{}-{}",
            self.group.replace('.', "-"),
            self.version,
            self.kind.to_lowercase()
        )
    }
}

/// One admission webhook: a kind, a handler, and how the API server calls it.
#[derive(Clone)]
struct AdmissionWebhook {
    kind: KindRef,
    mutating: bool,
    handler: ErasedReview,
    operations: Vec<&'static str>,
}

impl AdmissionWebhook {
    fn path(&self) -> String {
        let verb = if self.mutating { "mutate" } else { "validate" };
        format!("/{verb}-{}", self.kind.segment())
    }

    /// The webhook's name in its configuration (a DNS subdomain, unique there):
    /// `<m|v><kind lower case>.<group>`, kubebuilder's.
    fn name(&self) -> String {
        let letter = if self.mutating { 'm' } else { 'v' };
        format!(
            "{letter}{}.{}",
            self.kind.kind.to_lowercase(),
            self.kind.group
        )
    }
}

/// An operator's webhooks; see the [module](self).
#[derive(Clone)]
pub struct Webhooks {
    operator: String,
    admission: Vec<AdmissionWebhook>,
    conversions: Vec<Arc<dyn ErasedConversion>>,
    timeout: Duration,
    failure_policy: FailurePolicy,
}

impl std::fmt::Debug for Webhooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhooks")
            .field("operator", &self.operator)
            .field("paths", &self.paths())
            .field("timeout", &self.timeout)
            .field("failure_policy", &self.failure_policy)
            .finish()
    }
}

/// The path the conversion webhook is served on.
pub const CONVERT_PATH: &str = "/convert";

impl Webhooks {
    /// No webhooks yet, for the operator `operator` (the configurations are named
    /// `<operator>-validating` and `<operator>-mutating`).
    pub fn new(operator: impl Into<String>) -> Self {
        Webhooks {
            operator: operator.into(),
            admission: Vec::new(),
            conversions: Vec::new(),
            timeout: Duration::from_secs(10),
            failure_policy: FailurePolicy::Fail,
        }
    }

    /// Validates creates and updates of `K`.
    pub fn validate<K>(self, validator: impl Validator<K>) -> Self
    where
        K: Resource<DynamicType = ()> + DeserializeOwned + Send + Sync + 'static,
    {
        self.validating::<K>(validator, &["CREATE", "UPDATE"])
    }

    /// Validates creates, updates and deletions of `K` (on a deletion, the validator's `new`
    /// is the stored object).
    pub fn validate_with_deletes<K>(self, validator: impl Validator<K>) -> Self
    where
        K: Resource<DynamicType = ()> + DeserializeOwned + Send + Sync + 'static,
    {
        self.validating::<K>(validator, &["CREATE", "UPDATE", "DELETE"])
    }

    fn validating<K>(mut self, validator: impl Validator<K>, operations: &[&'static str]) -> Self
    where
        K: Resource<DynamicType = ()> + DeserializeOwned + Send + Sync + 'static,
    {
        self.admission.push(AdmissionWebhook {
            kind: KindRef::of::<K>(),
            mutating: false,
            handler: admission::erase_validator::<K, _>(validator),
            operations: operations.to_vec(),
        });
        self
    }

    /// Defaults creates and updates of `K`.
    pub fn defaults<K>(mut self, defaulter: impl Defaulter<K>) -> Self
    where
        K: Resource<DynamicType = ()> + DeserializeOwned + Serialize + Send + Sync + 'static,
    {
        self.admission.push(AdmissionWebhook {
            kind: KindRef::of::<K>(),
            mutating: true,
            handler: admission::erase_defaulter::<K, _>(defaulter),
            operations: vec!["CREATE", "UPDATE"],
        });
        self
    }

    /// Converts between the versions of a kind.
    pub fn convert<H: 'static>(mut self, conversion: Conversion<H>) -> Self {
        self.conversions.push(Arc::new(conversion));
        self
    }

    /// How long the API server waits for an admission webhook (`timeoutSeconds`, default 10 s,
    /// at most 30 s as Kubernetes allows). A handler gets a second less, so that its overrun
    /// is answered as a denial before the API server gives up and applies the failure policy.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.clamp(Duration::from_secs(1), Duration::from_secs(30));
        self
    }

    /// What the API server does when a webhook cannot be reached (default
    /// [`FailurePolicy::Fail`]).
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.failure_policy = policy;
        self
    }

    /// The paths served, in order of registration (`/convert` last, if any conversion).
    pub fn paths(&self) -> Vec<String> {
        let mut paths: Vec<String> = self.admission.iter().map(AdmissionWebhook::path).collect();
        if !self.conversions.is_empty() {
            paths.push(CONVERT_PATH.into());
        }
        paths
    }

    /// How long a handler has before its write is denied.
    fn handler_deadline(&self) -> Duration {
        self.timeout
            .saturating_sub(Duration::from_secs(1))
            .max(Duration::from_millis(500))
    }

    /// The answer to a review posted to `path` (a review's JSON), or `None` for a path that
    /// is not served.
    pub async fn answer(&self, path: &str, body: &[u8]) -> Option<Value> {
        if path == CONVERT_PATH && !self.conversions.is_empty() {
            return Some(self.convert_review(body));
        }
        let webhook = self.admission.iter().find(|w| w.path() == path)?;
        Some((webhook.handler)(body.to_vec(), self.handler_deadline()).await)
    }

    /// A `ConversionReview`'s answer, by the conversion of the objects' kind.
    fn convert_review(&self, body: &[u8]) -> Value {
        // The API server sends one kind per review; the first object's group and kind pick
        // the conversion.
        let picked = serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|review| {
                let object = review.pointer("/request/objects/0")?.clone();
                let group = object
                    .get("apiVersion")?
                    .as_str()?
                    .split_once('/')?
                    .0
                    .to_owned();
                let kind = object.get("kind")?.as_str()?.to_owned();
                self.conversions
                    .iter()
                    .find(|c| c.group() == group && c.kind() == kind)
                    .cloned()
            });
        match picked {
            Some(conversion) => conversion.review(body),
            // No objects, or an unknown kind: the first conversion answers (an empty review
            // converts to nothing, and an unknown kind fails there with its name).
            None => self.conversions[0].review(body),
        }
    }

    /// Whether `path` is served.
    fn serves(&self, path: &str) -> bool {
        (path == CONVERT_PATH && !self.conversions.is_empty())
            || self.admission.iter().any(|w| w.path() == path)
    }

    fn conversion_for(&self, group: &str, kind: &str) -> Option<&Arc<dyn ErasedConversion>> {
        self.conversions
            .iter()
            .find(|c| c.group() == group && c.kind() == kind)
    }
}
