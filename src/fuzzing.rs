//! The parsers the crate keeps private, opened to its fuzz targets (`fuzz/`) under the
//! `fuzzing` feature. Not part of the API: nothing here is stable.

use crate::provisioners::KubeconfigSecret;
use crate::provisioners::cd::AppHealth;

/// What the Argo CD driver reads of an Application (`argoproj.io/v1alpha1`).
pub fn argocd_health(app: &kube::api::DynamicObject) -> AppHealth {
    crate::provisioners::argocd::health_of(app)
}

/// The configuration a kubeconfig read from a Secret gives (`secret`'s key `key`), as
/// [`KubeconfigSecret`] reads it: `Err` with the message a user would see when it is refused.
pub async fn kubeconfig_from_secret(
    secret: KubeconfigSecret,
    bytes: &[u8],
) -> Result<kube::Config, String> {
    let access = secret.config_from(bytes).await.map_err(|e| e.to_string())?;
    access
        .kube_config()
        .cloned()
        .ok_or_else(|| "a kubeconfig gave no configuration".to_string())
}
