//! Where a child's objects live: the in-process cluster, an envtest control plane, or a cluster
//! from a kubeconfig. A [`BenchCluster`] gives the child two clients to the same cluster: `setup`
//! (object creation, the churn driver, clean-up; not counted) and `runtime` (the runtime under
//! test; every request counted by a [`CountingLayer`]).

use std::time::Duration;

use actorcile::{cluster::ApiServer, envtest::Envtest};
use anyhow::{Context as _, Result};
use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams},
    client::ClientBuilder,
    config::{KubeConfigOptions, Kubeconfig},
};

use tower::Layer;

use super::{
    args::{Backend, RuntimeKind},
    counting::{CountingLayer, RequestCounter},
    workload::{BenchObject, bench_crd},
};

/// Namespace of the objects in a cluster the child owns (in-process or envtest).
pub const IN_CLUSTER_NAMESPACE: &str = "default";

/// Field manager used for the bench's own writes.
pub const FIELD_MANAGER: &str = "actorcile-bench";

/// A connection to the cluster one child benchmarks against.
pub struct BenchCluster {
    /// Client for set-up, the churn driver and clean-up (not counted).
    pub setup: Client,
    /// Client handed to the runtime under test (counted).
    pub runtime: Client,
    /// Requests sent through `runtime`.
    pub counter: RequestCounter,
    /// Namespace of the bench objects.
    pub namespace: String,
    /// A kubeconfig of the cluster with the runtime's rights, for a runtime in a process of its
    /// own (controller-runtime); `None` in process.
    pub kubeconfig: Option<std::path::PathBuf>,
    owned: Owned,
}

enum Owned {
    /// This child's own in-process cluster (dropped on close).
    InProcess(ApiServer),
    /// This child's own etcd + kube-apiserver (stopped on close).
    Envtest(Box<Envtest>),
    /// A namespace this child created in someone's cluster; removed on close.
    Namespace,
}

impl BenchCluster {
    /// Connects to `backend`, installs the bench CRD and prepares a namespace for `runtime`.
    pub async fn open(backend: &Backend, runtime: RuntimeKind) -> Result<BenchCluster> {
        match backend {
            Backend::Kubeconfig(path) => {
                let kubeconfig = Kubeconfig::read_from(path)
                    .with_context(|| format!("reading kubeconfig {}", path.display()))?;
                let config =
                    kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                        .await
                        .with_context(|| format!("loading kubeconfig {}", path.display()))?;
                let setup =
                    Client::try_from(config.clone()).context("building the set-up client")?;
                let counter = RequestCounter::new();
                let runtime_client = ClientBuilder::try_from(config)
                    .context("building the runtime client")?
                    .with_layer(&CountingLayer::new(counter.clone()))
                    .build();
                apply_crd(&setup).await?;
                // Someone's cluster may not let this user read its OpenAPI: measure anyway.
                if let Err(e) = wait_for_openapi(&setup).await {
                    eprintln!("warning: {e:#}; measuring without waiting for it");
                }
                let namespace = format!(
                    "actorcile-bench-{}-{}",
                    runtime.as_str(),
                    std::process::id()
                );
                create_namespace(&setup, &namespace).await?;
                Ok(BenchCluster {
                    setup,
                    runtime: runtime_client,
                    counter,
                    namespace,
                    kubeconfig: Some(path.clone()),
                    owned: Owned::Namespace,
                })
            }
            Backend::InProcess => {
                let cluster = ApiServer::new();
                cluster
                    .install_crd(&bench_crd())
                    .context("installing the bench CRD in the in-process cluster")?;
                let counter = RequestCounter::new();
                let runtime_client = Client::new(
                    CountingLayer::new(counter.clone()).layer(cluster.service()),
                    IN_CLUSTER_NAMESPACE,
                );
                Ok(BenchCluster {
                    setup: cluster.client(),
                    runtime: runtime_client,
                    counter,
                    namespace: IN_CLUSTER_NAMESPACE.to_string(),
                    kubeconfig: None,
                    owned: Owned::InProcess(cluster),
                })
            }
            Backend::Envtest => {
                let envtest = Envtest::start()
                    .await
                    .context("starting etcd + kube-apiserver (envtest)")?;
                envtest
                    .install_crds(&[bench_crd()])
                    .await
                    .context("installing the bench CRD")?;
                wait_for_openapi(&envtest.client()).await?;
                let counter = RequestCounter::new();
                let runtime_client = ClientBuilder::try_from(envtest.config())
                    .context("building the runtime client")?
                    .with_layer(&CountingLayer::new(counter.clone()))
                    .build();
                Ok(BenchCluster {
                    setup: envtest.client(),
                    runtime: runtime_client,
                    counter,
                    namespace: IN_CLUSTER_NAMESPACE.to_string(),
                    kubeconfig: Some(envtest.kubeconfig_path().to_path_buf()),
                    owned: Owned::Envtest(Box::new(envtest)),
                })
            }
        }
    }

    /// The processes serving this cluster whose CPU the bench can read: etcd and kube-apiserver
    /// on envtest; none in process (the runtime's own CPU includes that server) or for a
    /// kubeconfig's cluster.
    pub fn server_pids(&self) -> Vec<u32> {
        match &self.owned {
            Owned::Envtest(envtest) => {
                let (etcd, apiserver) = envtest.pids();
                etcd.into_iter().chain(apiserver).collect()
            }
            Owned::InProcess(_) | Owned::Namespace => Vec::new(),
        }
    }

    /// In process, the API server shares this process: it serves one full list, so that what
    /// it keeps after serving one (as a real API server would, in its own process) is part of
    /// the memory read before the runtime starts, not of the runtime's. Elsewhere nothing.
    pub async fn prime(&self, api: &kube::Api<super::workload::BenchObject>) -> Result<()> {
        if let Owned::InProcess(_) = self.owned {
            let listed = api
                .list(&Default::default())
                .await
                .context("listing the objects")?;
            drop(listed);
        }
        Ok(())
    }

    /// Removes what this child created (objects and namespace of a kubeconfig cluster).
    pub async fn close(self) -> Result<()> {
        match self.owned {
            Owned::InProcess(cluster) => {
                drop(cluster);
                Ok(())
            }
            Owned::Envtest(envtest) => {
                envtest.stop().await;
                Ok(())
            }
            Owned::Namespace => {
                remove_objects(&self.setup, &self.namespace).await?;
                let namespaces: Api<Namespace> = Api::all(self.setup.clone());
                crate::retry::idempotent(
                    &format!("deleting namespace {}", self.namespace),
                    Some(404),
                    || async {
                        namespaces
                            .delete(&self.namespace, &DeleteParams::default())
                            .await
                            .map(drop)
                    },
                )
                .await
            }
        }
    }
}

/// Creates or updates the bench CRD (server-side apply) and waits until it is established.
pub async fn apply_crd(client: &Client) -> Result<()> {
    actorcile::crds::install(
        client.clone(),
        &[bench_crd()],
        FIELD_MANAGER,
        Duration::from_secs(60),
    )
    .await
    .context("installing the bench CRD")
}

/// Waits until the API server publishes the bench CRD's OpenAPI: kube-apiserver merges it into
/// its OpenAPI document in the background after the CRD is Established, about half a CPU-second
/// on a 2-core machine that would otherwise overlap the measurement (more or less of it by
/// chance).
async fn wait_for_openapi(client: &Client) -> Result<()> {
    actorcile::envtest::wait_for_openapi(client.clone(), &[bench_crd()], Duration::from_secs(60))
        .await
        .context("waiting for the bench CRD's OpenAPI")
}

async fn create_namespace(client: &Client, name: &str) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(
                [(
                    "app.kubernetes.io/managed-by".to_string(),
                    FIELD_MANAGER.to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        ..Default::default()
    };
    crate::retry::idempotent(&format!("creating namespace {name}"), None, || async {
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .map(drop)
    })
    .await
}

/// Deletes every bench object in `namespace`, first dropping finalizers a stopped runtime left.
async fn remove_objects(client: &Client, namespace: &str) -> Result<()> {
    let api: Api<BenchObject> = Api::namespaced(client.clone(), namespace);
    let list: Vec<BenchObject> =
        crate::retry::idempotent("listing bench objects", None, || async {
            api.list(&ListParams::default()).await.map(|l| l.items)
        })
        .await?;
    for obj in list.iter().filter(|o| !o.finalizers().is_empty()) {
        let patch = serde_json::json!({ "metadata": { "finalizers": null } });
        let name = obj.name_any();
        crate::retry::idempotent(
            &format!("removing finalizers of {name}"),
            Some(404),
            || async {
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map(drop)
            },
        )
        .await?;
    }
    crate::retry::idempotent("deleting bench objects", None, || async {
        api.delete_collection(&DeleteParams::default(), &ListParams::default())
            .await
            .map(drop)
    })
    .await
}
