//! Moving a kind's stored objects to its storage version, after the CRD's storage version
//! changed: what the kube-storage-version-migrator does, for one CRD.
//!
//! Each object is read in the storage version and written back unchanged (an update: the API
//! server stores it encoded in the storage version now, converting it with the webhook); then
//! the CRD's `status.storedVersions` is set to the storage version alone, so that a later
//! release may stop serving the old one.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;

/// What [`migrate_storage_version`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Migrated {
    /// The storage version the objects are stored in now.
    pub version: String,
    /// How many objects were written.
    pub objects: usize,
}

/// Stores every object of the CRD `crd_name` in its storage version, and sets its
/// `status.storedVersions` to that version alone. An object changed or deleted meanwhile is
/// skipped (a write by anyone since stores it in the storage version already).
///
/// Needs `list` and `update` on the kind, and `get` and `patch` on the CRD's status.
pub async fn migrate_storage_version(
    client: &kube::Client,
    crd_name: &str,
) -> Result<Migrated, kube::Error> {
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    let crd = crds.get(crd_name).await?;
    let version = crd
        .spec
        .versions
        .iter()
        .find(|v| v.storage)
        .map(|v| v.name.clone())
        .unwrap_or_default();
    let gvk = GroupVersionKind::gvk(&crd.spec.group, &version, &crd.spec.names.kind);
    let resource = ApiResource::from_gvk_with_plural(&gvk, &crd.spec.names.plural);
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let mut objects = 0;
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api.list(&params).await?;
        for object in &page.items {
            let namespace = object.metadata.namespace.clone();
            let name = object.metadata.name.clone().unwrap_or_default();
            let scoped: Api<DynamicObject> = match &namespace {
                Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
                None => Api::all_with(client.clone(), &resource),
            };
            match scoped.replace(&name, &PostParams::default(), object).await {
                Ok(_) => objects += 1,
                // Changed since listed (stored anew by that write), or gone.
                Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(next) => params = params.continue_token(&next),
            None => break,
        }
    }
    crds.patch_status(
        crd_name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": {"storedVersions": [version]}})),
    )
    .await?;
    Ok(Migrated { version, objects })
}
