//! An operator's CustomResourceDefinitions: render them as YAML (for `kubectl apply -f -` or a
//! manifest), and install them, waiting until the API server serves them.
//!
//! ```
//! use actorcile::prelude::*;
//! use kube::CustomResourceExt;
//! # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
//! # #[kube(group = "example.com", version = "v1", kind = "App", namespaced, status = "ResourceStatus")]
//! # struct AppSpec {}
//! let yaml = actorcile::crds::to_yaml(&[App::crd()]).unwrap();
//! assert!(yaml.starts_with("apiVersion: apiextensions.k8s.io/v1"));
//! ```
//!
//! [`RuntimeBuilder::install_crds`](crate::runtime::RuntimeBuilder::install_crds) installs them
//! as the runtime starts.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};

use crate::rbac::YamlError;

/// Installing a CustomResourceDefinition failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CrdError {
    /// The CRD has no `metadata.name`.
    #[error("a CustomResourceDefinition has no metadata.name")]
    WithoutName,
    /// The API server refused it.
    #[error("cannot apply CustomResourceDefinition {name}: {source}")]
    Apply {
        /// The CRD's name.
        name: String,
        /// kube's error.
        #[source]
        source: kube::Error,
    },
    /// Waiting for it to become Established failed (before the timeout).
    #[error("waiting for CustomResourceDefinition {name}: {source}")]
    Wait {
        /// The CRD's name.
        name: String,
        /// kube's error.
        #[source]
        source: kube::runtime::wait::Error,
    },
    /// The installed CRD is newer than the operator's: replacing it would downgrade the schema
    /// (an older replica starting during a rollout). Nothing is written.
    #[error(
        "CustomResourceDefinition {name} is newer in the cluster than this operator's: {why}; \
         not replacing it (run the operator version that installed it, or delete the CRD first)"
    )]
    Older {
        /// The CRD's name.
        name: String,
        /// What makes the installed one newer.
        why: String,
    },
    /// It did not become Established in time.
    #[error("CustomResourceDefinition {name} did not become Established within {timeout:?}")]
    NotEstablished {
        /// The CRD's name.
        name: String,
        /// How long was waited.
        timeout: Duration,
    },
}

/// The annotation with which an operator numbers the revisions of a CRD it ships (a decimal
/// integer, raised with every schema change): an installed CRD of a higher revision is not
/// replaced ([`CrdError::Older`]).
pub const SCHEMA_REVISION_ANNOTATION: &str = "crds.actorcile.dev/schema-revision";

/// Why `installed` is newer than `shipped`, if it is: it serves a version `shipped` does not
/// have, or both carry a [`SCHEMA_REVISION_ANNOTATION`] and `installed`'s is higher.
pub fn newer_installed(
    installed: &CustomResourceDefinition,
    shipped: &CustomResourceDefinition,
) -> Option<String> {
    let known: Vec<&str> = shipped
        .spec
        .versions
        .iter()
        .map(|v| v.name.as_str())
        .collect();
    if let Some(v) = installed
        .spec
        .versions
        .iter()
        .find(|v| v.served && !known.contains(&v.name.as_str()))
    {
        return Some(format!(
            "it serves version {}, which this operator does not have",
            v.name
        ));
    }
    let revision = |c: &CustomResourceDefinition| {
        c.metadata
            .annotations
            .as_ref()?
            .get(SCHEMA_REVISION_ANNOTATION)?
            .trim()
            .parse::<u64>()
            .ok()
    };
    match (revision(installed), revision(shipped)) {
        (Some(i), Some(s)) if i > s => Some(format!(
            "its schema revision is {i}, this operator's is {s}"
        )),
        _ => None,
    }
}

/// Create or update each CRD (server-side apply as `field_manager`, forced: the operator owns
/// its CRDs; without the integer formats the API server does not know), then wait up to `timeout` for each to be Established. An installed CRD that is newer
/// than the operator's ([`newer_installed`]) is not replaced: the error is
/// [`CrdError::Older`], and no CRD is written.
pub async fn install(
    client: kube::Client,
    crds: &[CustomResourceDefinition],
    field_manager: &str,
    timeout: Duration,
) -> Result<(), CrdError> {
    let api: Api<CustomResourceDefinition> = Api::all(client);
    let pp = PatchParams::apply(field_manager).force();
    let mut names = Vec::with_capacity(crds.len());
    // Every CRD is checked before any is written: a refused install leaves the cluster as it was.
    for crd in crds {
        let name = crd.metadata.name.clone().ok_or(CrdError::WithoutName)?;
        let installed = api.get_opt(&name).await.map_err(|source| CrdError::Apply {
            name: name.clone(),
            source,
        })?;
        if let Some(why) = installed.and_then(|i| newer_installed(&i, crd)) {
            return Err(CrdError::Older { name, why });
        }
    }
    for crd in crds {
        let name = crd.metadata.name.clone().ok_or(CrdError::WithoutName)?;
        let mut body = without_unknown_formats(crd);
        body.metadata.resource_version = None;
        body.metadata.managed_fields = None;
        body.status = None;
        api.patch(&name, &pp, &Patch::Apply(&body))
            .await
            .map_err(|source| CrdError::Apply {
                name: name.clone(),
                source,
            })?;
        names.push(name);
    }
    for name in names {
        let wait = await_condition(api.clone(), &name, conditions::is_crd_established());
        match tokio::time::timeout(timeout, wait).await {
            Ok(Ok(_)) => {}
            Ok(Err(source)) => return Err(CrdError::Wait { name, source }),
            Err(_) => return Err(CrdError::NotEstablished { name, timeout }),
        }
    }
    Ok(())
}

/// The integer formats schemars writes for Rust's integer types that the API server does not
/// know (`uint8` of a `u8`, …): `kubectl apply` and the server warn about each. The type stays
/// `integer` and the bounds schemars writes (`minimum: 0`) stay.
const UNKNOWN_INTEGER_FORMATS: &[&str] = &[
    "int8", "int16", "uint", "uint8", "uint16", "uint32", "uint64",
];

/// `crd` without the integer formats the API server does not know
/// (`int8`, `int16`, `uint`, `uint8`, `uint16`, `uint32`, `uint64`), which [`install`] and
/// [`to_yaml`] leave out.
///
/// ```
/// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
/// # #[kube(group = "example.com", version = "v1", kind = "Disk", namespaced)]
/// # struct DiskSpec { size_gib: u32 }
/// use kube::CustomResourceExt;
/// let yaml = actorcile::crds::to_yaml(&[Disk::crd()]).unwrap();
/// assert!(!yaml.contains("uint32"));
/// assert!(yaml.contains("minimum: 0"));
/// ```
pub fn without_unknown_formats(crd: &CustomResourceDefinition) -> CustomResourceDefinition {
    fn walk(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                if m.get("format")
                    .and_then(|f| f.as_str())
                    .is_some_and(|f| UNKNOWN_INTEGER_FORMATS.contains(&f))
                {
                    m.remove("format");
                }
                m.values_mut().for_each(walk);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(walk),
            _ => {}
        }
    }
    let mut crd = crd.clone();
    for version in &mut crd.spec.versions {
        if let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.take())
        {
            let mut value = serde_json::to_value(&schema).unwrap_or_default();
            walk(&mut value);
            version
                .schema
                .as_mut()
                .expect("taken from it")
                .open_api_v3_schema = Some(serde_json::from_value(value).unwrap_or(schema));
        }
    }
    crd
}

/// The CRDs as YAML documents separated by `---`, each with its `apiVersion` and `kind`
/// (without the integer formats the API server does not know: [`without_unknown_formats`]).
pub fn to_yaml(crds: &[CustomResourceDefinition]) -> Result<String, YamlError> {
    let mut out = String::new();
    for (i, crd) in crds.iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        let mut value = serde_json::to_value(without_unknown_formats(crd)).unwrap_or_default();
        if let Some(map) = value.as_object_mut() {
            map.remove("status");
        }
        out.push_str(&serde_saphyr::to_string(&value).map_err(YamlError::new)?);
    }
    Ok(out)
}
