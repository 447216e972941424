//! Writing the CA bundle where the API server reads it: every webhook of the operator's own
//! configurations, and the conversion of the CRDs it converts. Each is read, changed and
//! replaced, and read again on a conflict (another writer, such as a rollout's other replica).

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::Webhooks;

/// How often a write that conflicts is tried again.
const CONFLICT_RETRIES: usize = 8;

/// What writing the CA bundle did to one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Injected {
    /// Written.
    Written,
    /// Already so.
    Unchanged,
    /// The object does not exist (not installed yet): nothing to write.
    Missing,
}

/// Sets `ca` on the object named `name` with `set` (which says whether it changed anything),
/// retrying conflicts.
async fn inject<K>(
    api: &Api<K>,
    name: &str,
    set: impl Fn(&mut K) -> bool,
) -> Result<Injected, kube::Error>
where
    K: Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let mut attempt = 0;
    loop {
        let Some(mut object) = api.get_opt(name).await? else {
            return Ok(Injected::Missing);
        };
        if !set(&mut object) {
            return Ok(Injected::Unchanged);
        }
        match api.replace(name, &PostParams::default(), &object).await {
            Ok(_) => return Ok(Injected::Written),
            Err(kube::Error::Api(status)) if status.code == 409 && attempt < CONFLICT_RETRIES => {
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

fn bundle(ca: &str) -> Option<ByteString> {
    Some(ByteString(ca.as_bytes().to_vec()))
}

impl Webhooks {
    /// Writes `ca` as the CA bundle of the operator's webhook configurations and of its
    /// converted CRDs (those that exist), and says for each object what it did.
    pub(crate) async fn inject_ca(
        &self,
        client: &kube::Client,
        ca: &str,
    ) -> Result<Vec<(String, Injected)>, kube::Error> {
        let mut done = Vec::new();
        let ours: Vec<String> = self.admission.iter().map(|w| w.name()).collect();
        if self.admission.iter().any(|w| !w.mutating) {
            let name = self.validating_name();
            let api = Api::<ValidatingWebhookConfiguration>::all(client.clone());
            let what = inject(&api, &name, |config| {
                let clients = config.webhooks.iter_mut().flatten();
                set_bundles(clients.map(|w| (&w.name, &mut w.client_config)), &ours, ca)
            })
            .await?;
            done.push((name, what));
        }
        if self.admission.iter().any(|w| w.mutating) {
            let name = self.mutating_name();
            let api = Api::<MutatingWebhookConfiguration>::all(client.clone());
            let what = inject(&api, &name, |config| {
                let clients = config.webhooks.iter_mut().flatten();
                set_bundles(clients.map(|w| (&w.name, &mut w.client_config)), &ours, ca)
            })
            .await?;
            done.push((name, what));
        }
        let crds = Api::<CustomResourceDefinition>::all(client.clone());
        for conversion in &self.conversions {
            let name = conversion.crd_name();
            let what = inject(&crds, &name, |crd| {
                let Some(client_config) = crd
                    .spec
                    .conversion
                    .as_mut()
                    .and_then(|c| c.webhook.as_mut())
                    .and_then(|w| w.client_config.as_mut())
                else {
                    return false;
                };
                if client_config.ca_bundle == bundle(ca) {
                    return false;
                }
                client_config.ca_bundle = bundle(ca);
                true
            })
            .await?;
            done.push((name, what));
        }
        Ok(done)
    }
}

/// Sets `ca` on the clients of the webhooks named in `ours`; whether one changed.
fn set_bundles<'a>(
    clients: impl Iterator<Item = (&'a String, &'a mut WebhookClientConfig)>,
    ours: &[String],
    ca: &str,
) -> bool {
    let mut changed = false;
    for (name, client) in clients {
        if ours.contains(name) && client.ca_bundle != bundle(ca) {
            client.ca_bundle = bundle(ca);
            changed = true;
        }
    }
    changed
}
