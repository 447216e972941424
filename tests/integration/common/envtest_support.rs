//! Runs one API-behaviour case against the in-process cluster or a real kube-apiserver.

use std::future::Future;
use std::time::Duration;

use actorcile::cluster::ApiServer;
use actorcile::envtest::Envtest;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, PostParams};

/// Which server a case runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `actorcile::cluster::ApiServer`.
    InProcess,
    /// etcd + kube-apiserver (`Envtest::shared`, one per test process).
    Real,
}

/// What a case gets: an admin client and its own namespace (already created).
pub struct Ctx {
    pub client: Client,
    pub ns: String,
    #[allow(dead_code)]
    pub backend: Backend,
    /// Keeps the in-process cluster alive for the case.
    pub _cluster: Option<ApiServer>,
}

/// Bound on one case (including the first real control plane's start-up).
pub const CASE_LIMIT: Duration = Duration::from_secs(90);

/// How many events the in-process cluster keeps for watch resumption (small, so that 410 is reachable).
pub const IN_PROCESS_HISTORY: usize = 64;

/// Prepares `backend` (CRDs installed, namespace created) and runs `case`, bounded by [`CASE_LIMIT`].
pub async fn run<F, Fut>(backend: Backend, test: &str, crds: Vec<CustomResourceDefinition>, case: F)
where
    F: FnOnce(Ctx) -> Fut,
    Fut: Future<Output = ()>,
{
    tokio::time::timeout(CASE_LIMIT, async move {
        let ns = test.replace('_', "-");
        let (client, cluster) = match backend {
            Backend::InProcess => {
                let cluster = ApiServer::builder().history(IN_PROCESS_HISTORY).build();
                for crd in &crds {
                    cluster.install_crd(crd).expect("install CRD in-process");
                }
                (cluster.client(), Some(cluster))
            }
            Backend::Real => {
                let env = Envtest::shared()
                    .await
                    .expect("start etcd + kube-apiserver (run scripts/install-test-deps.sh)");
                env.install_crds(&crds).await.expect("install CRDs");
                (env.client(), None)
            }
        };
        let mut namespace = Namespace::default();
        namespace.metadata.name = Some(ns.clone());
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .expect("create the case's namespace");
        case(Ctx {
            client,
            ns,
            backend,
            _cluster: cluster,
        })
        .await;
    })
    .await
    .expect("conformance case timed out");
}
