//! The operator's webhooks: the first version of Network (`v1alpha1`, whose range was
//! `subnet`), served by conversion through v1, and a rule CEL cannot express: a Cluster must
//! name a Network that exists in its namespace, which only a lookup can tell.

use actorcile::webhooks::{
    Conversion, Convertible, Denial, Request, Validator, Warnings, Webhooks,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;
use kube::core::crd::merge_crds;
use kube::{CustomResourceExt, ResourceExt};

use crate::operator::{Cluster, MAX_WORKERS, NAME, Network, NetworkSpec};

/// Network's first version.
pub mod v1alpha1 {
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    /// A network that clusters attach to, as v1alpha1 had it.
    #[derive(kube::CustomResource, Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
    #[kube(
        group = "example.actorcile.dev",
        version = "v1alpha1",
        kind = "Network",
        namespaced,
        status = "actorcile::status::ResourceStatus"
    )]
    pub struct NetworkSpec {
        /// The network's IPv4 range (v1's `cidr`).
        pub subnet: String,
    }
}

impl Convertible<Network> for v1alpha1::Network {
    fn to_hub(self) -> Network {
        let mut hub = Network::new(
            "",
            NetworkSpec {
                cidr: self.spec.subnet,
            },
        );
        hub.status = self.status;
        hub
    }

    fn from_hub(hub: Network) -> Self {
        let mut spoke = v1alpha1::Network::new(
            "",
            v1alpha1::NetworkSpec {
                subnet: hub.spec.cidr,
            },
        );
        spoke.status = hub.status;
        spoke
    }
}

/// The operator's CRDs: Network in v1alpha1 and v1 (stored as v1), and Cluster.
pub fn crds() -> Vec<CustomResourceDefinition> {
    let network = merge_crds(vec![v1alpha1::Network::crd(), Network::crd()], "v1")
        .expect("the Network versions share their names and scope");
    vec![network, Cluster::crd()]
}

/// A Cluster must name a Network of its namespace that exists (or be leaving: a deletion is
/// not judged), and ask for at most [`MAX_WORKERS`] workers.
pub struct ClusterRules {
    client: kube::Client,
}

impl Validator<Cluster> for ClusterRules {
    async fn validate(
        &self,
        new: &Cluster,
        old: Option<&Cluster>,
        request: &Request,
    ) -> Result<Warnings, Denial> {
        if new.spec.workers > MAX_WORKERS {
            return Err(Denial::invalid(format!(
                "spec.workers: {} is more than {MAX_WORKERS}",
                new.spec.workers
            )));
        }
        // An update that keeps the network is not judged again: the Network may be leaving
        // while the Cluster still holds it.
        if old.is_some_and(|old| old.spec.network == new.spec.network) {
            return Ok(Warnings::new());
        }
        let namespace = new
            .namespace()
            .or_else(|| request.namespace.clone())
            .unwrap_or_else(|| "default".into());
        let networks: Api<Network> = Api::namespaced(self.client.clone(), &namespace);
        match networks.get_opt(&new.spec.network).await {
            Ok(Some(_)) => Ok(Warnings::new()),
            Ok(None) => Err(Denial::invalid(format!(
                "spec.network: Network {:?} does not exist in namespace {namespace:?}",
                new.spec.network
            ))),
            Err(e) => Err(Denial::new(format!(
                "spec.network: cannot look Network {:?} up: {e}",
                new.spec.network
            ))),
        }
    }
}

/// The operator's webhooks, looking Networks up with `client`.
pub fn webhooks(client: kube::Client) -> Webhooks {
    Webhooks::new(NAME)
        .validate::<Cluster>(ClusterRules { client })
        .convert(Conversion::<Network>::hub().spoke::<v1alpha1::Network>())
}
