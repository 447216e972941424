//! Runs one API-behaviour case against the in-process cluster or a real kube-apiserver.

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
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
    /// etcd + kube-apiserver (`Envtest::shared`: one per test process, shared by its cases).
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

/// How many cases [`run_real_cases`] runs at once on its one control plane.
pub const REAL_CASES_AT_ONCE: usize = 4;

/// One case, boxed so that a list of different `async fn`s has one type (see [`case`]).
pub type Case = Box<dyn FnOnce(Ctx) -> Pin<Box<dyn Future<Output = ()>>>>;

/// Boxes `async fn NAME(cx: Ctx)` as a [`Case`].
pub fn case<F, Fut>(f: F) -> Case
where
    F: FnOnce(Ctx) -> Fut + 'static,
    Fut: Future<Output = ()> + 'static,
{
    Box::new(move |cx| Box::pin(f(cx)))
}

/// Runs every case against one real control plane ([`Backend::Real`]), each in its own namespace
/// as [`run`] prepares it, [`REAL_CASES_AT_ONCE`] at a time, and fails naming every case that
/// failed (each one's panic is printed as it happens). Under nextest every test is a process of
/// its own, and a control plane per case (~3 s to start) would cost more than the cases.
pub async fn run_real_cases(crds: Vec<CustomResourceDefinition>, cases: Vec<(&'static str, Case)>) {
    let local = tokio::task::LocalSet::new();
    let failed = local
        .run_until(async move {
            let limit = Rc::new(tokio::sync::Semaphore::new(REAL_CASES_AT_ONCE));
            let tasks: Vec<_> = cases
                .into_iter()
                .map(|(name, case)| {
                    let limit = limit.clone();
                    let crds = crds.clone();
                    let task = tokio::task::spawn_local(async move {
                        let _turn = limit
                            .acquire()
                            .await
                            .expect("the semaphore is never closed");
                        run(Backend::Real, name, crds, case).await;
                    });
                    (name, task)
                })
                .collect();
            let mut failed = Vec::new();
            for (name, task) in tasks {
                match task.await {
                    Ok(()) => eprintln!("conformance case {name}: passed"),
                    Err(e) => {
                        eprintln!("conformance case {name}: FAILED ({e})");
                        failed.push(name);
                    }
                }
            }
            failed
        })
        .await;
    assert!(
        failed.is_empty(),
        "conformance cases failed on the real API server: {failed:?} (each one's panic is above)"
    );
}

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
