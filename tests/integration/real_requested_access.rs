//! Requested cluster access on real control planes: the operator holds no kubeconfig of the
//! workload cluster; each widget asks the platform for one with a request object, and a
//! stand-in platform controller (this test) grants it by writing a kubeconfig Secret and
//! naming it in the request's status, or denies it. Two etcd + kube-apiserver pairs: the
//! platform cluster (the runtime, its widgets, the requests) and the workload cluster.
//!
//! Run with `cargo test --release --features envtest --test integration real_requested_access::`.
#![cfg(feature = "envtest")]

use crate::common;
use crate::common::real::*;
use crate::real_remote::put_kubeconfig;

use actorcile::envtest::Envtest;
use actorcile::prelude::*;
use actorcile::provisioners::{AccessRequest, boxed, remote, resource};
use common::{Widget, eventually};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, ObjectMeta, Patch, PatchParams};
use kube::{Client, CustomResource, CustomResourceExt, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The platform's request kind (the shape of openmcp's `AccessRequest`).
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "clusters.platform.test",
    version = "v1alpha1",
    kind = "ClusterAccess",
    namespaced,
    status = "ClusterAccessStatus"
)]
pub struct ClusterAccessSpec {
    /// What kind of cluster is asked for.
    pub purpose: String,
    /// The object it is asked for.
    pub owner: String,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterAccessStatus {
    pub phase: Option<String>,
    pub message: Option<String>,
    pub secret_ref: Option<SecretRef>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
pub struct SecretRef {
    pub name: String,
}

const PLATFORM: &str = "platform";

/// The platform's controller: every request without a status is granted (a kubeconfig
/// Secret of the workload cluster, named in its status), or denied when its owner's name
/// starts with `denied`. Runs until aborted.
async fn platform_controller(platform: Client, workload_kubeconfig: std::path::PathBuf) {
    let requests: Api<ClusterAccess> = Api::namespaced(platform.clone(), PLATFORM);
    loop {
        for r in requests
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
        {
            if r.status.as_ref().and_then(|s| s.phase.as_ref()).is_some()
                || r.metadata.deletion_timestamp.is_some()
            {
                continue;
            }
            let status = if r.spec.owner.starts_with("denied") {
                serde_json::json!({ "phase": "Denied", "message": "quota exceeded" })
            } else {
                let secret = format!("{}-kubeconfig", r.name_any());
                put_kubeconfig(&platform, PLATFORM, &secret, &workload_kubeconfig).await;
                serde_json::json!({ "phase": "Granted", "secretRef": { "name": secret } })
            };
            let _ = requests
                .patch_status(
                    &r.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({ "status": status })),
                )
                .await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Each widget asks for a workload cluster of its own and puts a ConfigMap named after it
/// into its `default` namespace.
fn tree() -> impl Provisioner<Widget> {
    let kind = ApiResource::erase::<ClusterAccess>(&());
    let names = common::names();
    remote(
        "workload",
        move |w: &Widget| {
            AccessRequest::new(
                &names,
                &kind,
                PLATFORM,
                format!("{}-workload", w.name_any()),
            )
            .spec(serde_json::json!({ "purpose": "workload", "owner": w.name_any() }))
            .kubeconfig(|s| s.key("value"))
        },
        vec![boxed(resource("cm", |w: &Widget| ConfigMap {
            metadata: ObjectMeta {
                name: Some(w.name_any()),
                namespace: Some("default".into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }))],
    )
    .credentials_scope(actorcile::rbac::RuleScope::namespace(PLATFORM))
}

async fn configmap(client: &Client, name: &str) -> Option<ConfigMap> {
    Api::<ConfigMap>::namespaced(client.clone(), "default")
        .get_opt(name)
        .await
        .expect("read a configmap")
}

async fn request(platform: &Client, name: &str) -> Option<DynamicObject> {
    let kind = ApiResource::erase::<ClusterAccess>(&());
    Api::<DynamicObject>::namespaced_with(platform.clone(), PLATFORM, &kind)
        .get_opt(name)
        .await
        .expect("read a request")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_asks_the_platform_for_access_per_object_and_gives_it_back_on_deletion() {
    bounded("requested cluster access", async {
        let env = shared_env().await;
        let workload = Envtest::builder()
            .start()
            .await
            .expect("start the workload cluster's etcd + kube-apiserver");
        env.install_crds(&[ClusterAccess::crd()])
            .await
            .expect("install the request kind");
        create_namespace(&env.client(), PLATFORM).await;
        let api = Ns::create(env.client(), "requested-access").await;
        let platform = tokio::spawn(platform_controller(
            env.client(),
            workload.kubeconfig_path().to_path_buf(),
        ));
        let rt = Runtime::builder(api.client.clone(), common::names())
            .policy(real_policy())
            .controller(Controller::<Widget>::new(tree()).namespace(&api.ns))
            .start()
            .await
            .expect("start the runtime");

        // One request per widget, each granted; the children run in the granted cluster.
        api.create_widget("a", 1).await;
        api.create_widget("b", 1).await;
        api.wait_ready("a").await;
        api.wait_ready("b").await;
        let a = request(&env.client(), "a-workload").await.expect("a asked");
        assert_eq!(a.data["spec"]["owner"], "a");
        assert!(
            a.metadata
                .managed_fields
                .iter()
                .flatten()
                .any(|m| m.manager.as_deref() == Some(common::FIELD_MANAGER)
                    && m.operation.as_deref() == Some("Apply")),
            "applied with the operator's field manager: {:?}",
            a.metadata.managed_fields
        );
        assert!(configmap(&workload.client(), "a").await.is_some());
        assert!(configmap(&workload.client(), "b").await.is_some());
        assert!(
            configmap(&env.client(), "a").await.is_none(),
            "nothing in the platform cluster"
        );

        // A denied request needs someone to act.
        api.create_widget("denied", 1).await;
        let s = api.wait_reason("denied", "RemoteAccessDenied").await;
        assert!(
            s.ready().unwrap().message.contains("quota exceeded"),
            "{s:?}"
        );

        // Deleted: its children go from the granted cluster, then its request.
        api.delete("a").await;
        api.wait_gone("a").await;
        assert!(configmap(&workload.client(), "a").await.is_none());
        eventually("a's request is gone", CONVERGE, || async {
            request(&env.client(), "a-workload")
                .await
                .is_none()
                .then_some(())
        })
        .await;
        assert!(request(&env.client(), "b-workload").await.is_some());
        assert!(configmap(&workload.client(), "b").await.is_some());

        // A request never granted gave no access: deletion deletes it and goes.
        api.delete("denied").await;
        api.wait_gone("denied").await;
        assert!(request(&env.client(), "denied-workload").await.is_none());

        rt.shutdown().await;
        platform.abort();
        workload.stop().await;
    })
    .await;
}
