//! Remote clusters and Argo CD applications on real control planes: two etcd + kube-apiserver
//! pairs from `actorcile::envtest` at once, a management cluster (where the runtime, its objects
//! and Argo CD's Applications live) and a remote one.
//!
//! Argo CD itself cannot run here; `common/argo.rs` plays its application controller against
//! the real `Application` objects the driver writes.
//!
//! Run with `cargo test --release --features envtest --test integration real_remote::`.
#![cfg(feature = "envtest")]

use crate::common;
use crate::common::argo;
use crate::common::real;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use actorcile::envtest::Envtest;
use actorcile::prelude::*;
use actorcile::provisioners::argocd::{ArgoCd, SECRET_TYPE_LABEL, application_crd};
use actorcile::provisioners::{
    AppRef, Catalog, FixedCluster, KubeconfigSecret, application, boxed, remote, resource,
};
use argo::{FakeArgo, Script};
use common::{Gadget, GadgetSpec, Widget, eventually};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use real::*;

/// The remote cluster: a control plane of its own, no CRDs.
async fn remote_env() -> Envtest {
    Envtest::builder()
        .start()
        .await
        .expect("start the remote etcd + kube-apiserver (run scripts/install-test-deps.sh)")
}

async fn configmap(client: &Client, ns: &str, name: &str) -> Option<ConfigMap> {
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .expect("read a configmap")
}

/// `kubeconfig` (a file) with its certificate-authority file inlined as
/// certificate-authority-data: a kubeconfig read from a Secret may name no local file.
fn inline_kubeconfig(kubeconfig: &std::path::Path) -> Vec<u8> {
    use base64::Engine as _;
    let text = std::fs::read_to_string(kubeconfig).expect("read the kubeconfig");
    let mut doc: serde_json::Value = serde_saphyr::from_str(&text).expect("kubeconfig YAML");
    for cluster in doc["clusters"].as_array_mut().expect("clusters") {
        let c = &mut cluster["cluster"];
        if let Some(path) = c["certificate-authority"].as_str() {
            let pem = std::fs::read(path).expect("read the CA file");
            c["certificate-authority-data"] =
                base64::engine::general_purpose::STANDARD.encode(pem).into();
            c.as_object_mut().unwrap().remove("certificate-authority");
        }
    }
    serde_saphyr::to_string(&doc).unwrap().into_bytes()
}

/// Put `kubeconfig` (a file's content, its CA inlined) into Secret `name`, key `value`.
pub(crate) async fn put_kubeconfig(
    client: &Client,
    ns: &str,
    name: &str,
    kubeconfig: &std::path::Path,
) {
    let bytes = inline_kubeconfig(kubeconfig);
    let api = Api::<Secret>::namespaced(client.clone(), ns);
    let mut secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        data: Some([("value".to_string(), ByteString(bytes))].into()),
        ..Secret::default()
    };
    match api.get_opt(name).await.expect("read the secret") {
        Some(current) => {
            secret.metadata.resource_version = current.resource_version();
            api.replace(name, &PostParams::default(), &secret)
                .await
                .expect("rotate the secret");
        }
        None => {
            api.create(&PostParams::default(), &secret)
                .await
                .expect("create the secret");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_from_a_kubeconfig_secret_waits_for_it_follows_rotation_and_cleans_up() {
    bounded("remote from a kubeconfig secret", async {
        let env = shared_env().await;
        let edge = remote_env().await;
        let mgmt = Ns::create(env.client(), "remote-kubeconfig").await;
        let ns = mgmt.ns.clone();
        // Each widget puts one ConfigMap named after it into the remote's `default` namespace.
        let tree = remote(
            "edge",
            move |_w: &Widget| KubeconfigSecret::cluster_api(ns.clone(), "edge"),
            vec![boxed(resource("cm", |w: &Widget| ConfigMap {
                metadata: ObjectMeta {
                    name: Some(w.name_any()),
                    namespace: Some("default".into()),
                    ..ObjectMeta::default()
                },
                data: Some([("from".to_string(), "management".to_string())].into()),
                ..ConfigMap::default()
            }))],
        );
        let rt = Runtime::builder(mgmt.client.clone(), crate::common::names())
            .policy(real_policy())
            .controller(Controller::<Widget>::new(tree).namespace(&mgmt.ns))
            .start()
            .await
            .expect("start the runtime");

        // No Secret yet: a typed yield, not a failure.
        mgmt.create_widget("w", 1).await;
        mgmt.wait_reason("w", "RemoteClusterUnavailable").await;

        // A kubeconfig of a user without any permission on the remote: the child's apply is
        // refused there, and nothing of the credentials shows in the status.
        put_kubeconfig(
            &mgmt.client,
            &mgmt.ns,
            "edge-kubeconfig",
            edge.user_kubeconfig_path(),
        )
        .await;
        let status = mgmt.wait_reason("w", "ApplyFailed").await;
        assert_eq!(status.ready().unwrap().status, "False");
        let text = serde_json::to_string(&status).unwrap();
        let token = std::fs::read_to_string(edge.user_kubeconfig_path()).unwrap();
        let token = token
            .lines()
            .find_map(|l| l.trim().strip_prefix("token: "))
            .expect("the user kubeconfig has a token");
        assert!(
            !text.contains(token),
            "the status carries the token: {text}"
        );
        assert!(configmap(&edge.client(), "default", "w").await.is_none());

        // Rotated to the admin kubeconfig: takes effect without a restart.
        put_kubeconfig(
            &mgmt.client,
            &mgmt.ns,
            "edge-kubeconfig",
            edge.kubeconfig_path(),
        )
        .await;
        mgmt.wait_ready("w").await;
        let cm = configmap(&edge.client(), "default", "w")
            .await
            .expect("the child is in the remote");
        assert!(
            cm.owner_references().is_empty(),
            "no owner reference across clusters"
        );
        assert!(configmap(&mgmt.client, &mgmt.ns, "w").await.is_none());

        // Deletion removes the child from the remote before the finalizer goes.
        mgmt.delete("w").await;
        mgmt.wait_gone("w").await;
        assert!(configmap(&edge.client(), "default", "w").await.is_none());
        rt.shutdown().await;
        edge.stop().await;
    })
    .await;
}

fn catalog() -> Arc<Catalog> {
    Arc::new(Catalog::new().chart("web", "1.0.0", "https://charts.example", "web"))
}

/// `web` from a folder of a git repository at a tag.
fn git_catalog() -> Arc<Catalog> {
    Arc::new(Catalog::new().git(
        "web",
        "1.0.0",
        "https://git.example/apps.git",
        "charts/web",
        "v1.0.0",
    ))
}

/// The field manager the test's Argo CD driver writes with.
const MANAGER: &str = "remote-apps-operator";

/// The managers named in `meta`'s managed fields.
fn managers(meta: &kube::api::ObjectMeta) -> Vec<String> {
    let mut m: Vec<String> = meta
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|f| f.manager.clone())
        .collect();
    m.dedup();
    m
}

/// The Applications carrying owner `name`'s identity.
async fn applications_of(argo_ns: &Api<DynamicObject>, owner: &str) -> Vec<DynamicObject> {
    argo_ns
        .list(&ListParams::default().labels(&format!(
            "{}{}={owner}",
            crate::common::names().app_label_prefix(),
            actorcile::provisioners::cd::labels::OWNER_NAME
        )))
        .await
        .expect("list applications")
        .items
}

async fn cluster_secrets(client: &Client) -> Vec<Secret> {
    Api::<Secret>::namespaced(client.clone(), "argocd")
        .list(&ListParams::default().labels(&format!("{SECRET_TYPE_LABEL}=cluster")))
        .await
        .expect("list cluster secrets")
        .items
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applications_through_argo_cd_into_a_registered_remote() {
    bounded("applications through Argo CD", async {
        let env = shared_env().await;
        env.install_crds(&[application_crd()])
            .await
            .expect("install the Application CRD");
        let edge = remote_env().await;
        create_namespace(&env.client(), "argocd").await;
        let mgmt = Ns::create(env.client(), "remote-apps").await;
        let fake = Arc::new(FakeArgo::default());
        let controller = fake.spawn(env.client(), "argocd");
        let driver = Arc::new(ArgoCd::new(
            env.client(),
            "argocd",
            &OperatorNames::new(MANAGER, crate::common::names().domain()),
        ));

        // Widgets deploy `web` into the edge; a note `allow-degraded` accepts Degraded. Gadgets
        // do the same, deleting their application in the background.
        let edge_config = edge.config();
        let widget_tree = {
            let (driver, edge_config) = (driver.clone(), edge_config.clone());
            remote(
                "edge",
                move |_w: &Widget| FixedCluster::config("edge", edge_config.clone()),
                vec![boxed(
                    application("web", driver.clone(), catalog(), |_w: &Widget| {
                        AppRef::new("web", "1.0.0")
                    })
                    .release_name(|w: &Widget| format!("web-{}", w.name_any()))
                    .customize(|w: &Widget, spec| {
                        spec.allow_degraded = w.spec.note == "allow-degraded";
                        Ok(())
                    }),
                )],
            )
            .registered_with(driver)
        };
        let gadget_tree = {
            let driver = driver.clone();
            remote(
                "edge",
                move |_g: &Gadget| FixedCluster::config("edge", edge_config.clone()),
                // From a folder of a git repository, with Argo CD's switches.
                vec![boxed(
                    application("web", driver.clone(), git_catalog(), |_g: &Gadget| {
                        AppRef::new("web", "1.0.0")
                    })
                    .release_name(|g: &Gadget| format!("web-{}", g.name_any()))
                    .namespace_labels(|_g: &Gadget| {
                        [("team".to_string(), "web".to_string())].into()
                    })
                    .namespace_annotations(|_g: &Gadget| {
                        [("owner".to_string(), "web@example.com".to_string())].into()
                    })
                    .server_side_apply(true)
                    .ignore_difference(actorcile::provisioners::cd::IgnoreDifference {
                        group: "apps".into(),
                        kind: "Deployment".into(),
                        json_pointers: vec!["/spec/replicas".into()],
                        ..Default::default()
                    })
                    .background_delete(true),
                )],
            )
            .registered_with(driver)
        };
        let rt = Runtime::builder(mgmt.client.clone(), crate::common::names())
            .policy(real_policy())
            .controller(Controller::<Widget>::new(widget_tree).namespace(&mgmt.ns))
            .controller(Controller::<Gadget>::new(gadget_tree).namespace(&mgmt.ns))
            .start()
            .await
            .expect("start the runtime");
        let apps: Api<DynamicObject> =
            Api::namespaced_with(env.client(), "argocd", &ArgoCd::application_resource());

        // Created → Progressing while Argo CD has not synced → Ready once Synced + Healthy.
        fake.script("healthy", Script::Hold);
        mgmt.create_widget("healthy", 1).await;
        mgmt.wait_reason("healthy", "ApplicationProgressing").await;
        let secrets = cluster_secrets(&env.client()).await;
        assert_eq!(secrets.len(), 1, "one registration for the edge");
        fake.script("healthy", Script::Health("Healthy"));
        mgmt.wait_ready("healthy").await;
        assert!(
            configmap(&edge.client(), &mgmt.ns, "web-healthy")
                .await
                .is_some(),
            "Argo CD deployed into the edge, into the object's namespace"
        );
        let app = applications_of(&apps, "healthy").await;
        assert_eq!(app.len(), 1);
        assert!(
            app[0].name_any().starts_with("web-healthy-"),
            "generateName"
        );
        // Every write of the driver names its field manager: the Application's and the
        // cluster Secret's.
        assert!(
            managers(&app[0].metadata).contains(&MANAGER.to_string()),
            "{:?}",
            app[0].metadata.managed_fields
        );
        assert!(
            managers(&secrets[0].metadata).contains(&MANAGER.to_string()),
            "{:?}",
            secrets[0].metadata.managed_fields
        );

        // Degraded: waits unless the application allows it.
        fake.script("degraded", Script::Health("Degraded"));
        fake.script("tolerated", Script::Health("Degraded"));
        mgmt.create_widget("degraded", 1).await;
        let mut tolerated = real::widget_in(&mgmt.ns, "tolerated", 1);
        tolerated.spec.note = "allow-degraded".into();
        mgmt.api()
            .create(&PostParams::default(), &tolerated)
            .await
            .expect("create tolerated");
        mgmt.wait_reason("degraded", "ApplicationDegraded").await;
        mgmt.wait_ready("tolerated").await;

        // A second Application with one identity: a typed failure, never a pick.
        let mut twin = applications_of(&apps, "degraded").await.remove(0);
        twin.metadata = ObjectMeta {
            generate_name: Some("twin-".into()),
            labels: twin.metadata.labels.clone(),
            ..ObjectMeta::default()
        };
        twin.data.as_object_mut().unwrap().remove("status");
        let twin = apps
            .create(&PostParams::default(), &twin)
            .await
            .expect("create the twin");
        mgmt.patch_spec("degraded", serde_json::json!({ "size": 2 }))
            .await;
        mgmt.wait_reason("degraded", "ApplicationAmbiguous").await;
        apps.delete(&twin.name_any(), &DeleteParams::default())
            .await
            .expect("delete the twin");
        fake.script("degraded", Script::Health("Healthy"));
        mgmt.wait_ready("degraded").await;

        // Foreground delete waits for Argo CD to remove what it deployed.
        fake.hold_deletion.store(true, Ordering::SeqCst);
        mgmt.delete("healthy").await;
        mgmt.wait_reason("healthy", "ApplicationDeleting").await;
        let app = applications_of(&apps, "healthy").await;
        assert_eq!(app.len(), 1, "still there while Argo CD holds it");
        assert!(
            app[0]
                .finalizers()
                .iter()
                .any(|f| f == actorcile::provisioners::argocd::RESOURCES_FINALIZER),
            "the resources finalizer is set before the delete"
        );
        assert!(
            app[0].metadata.managed_fields.iter().flatten().any(|f| {
                f.manager.as_deref() == Some(MANAGER)
                    && f.fields_v1
                        .as_ref()
                        .is_some_and(|v| v.0.to_string().contains("f:finalizers"))
            }),
            "the finalizer patch names the driver's field manager: {:?}",
            app[0].metadata.managed_fields
        );
        // Background delete: the gadget goes while its Application is still being deleted.
        let gadgets: Api<Gadget> = Api::namespaced(mgmt.client.clone(), &mgmt.ns);
        let mut g = Gadget::new("bg", GadgetSpec::default());
        g.metadata.namespace = Some(mgmt.ns.clone());
        gadgets
            .create(&PostParams::default(), &g)
            .await
            .expect("create the gadget");
        eventually("the gadget is Ready", CONVERGE, || async {
            let g = gadgets.get_opt("bg").await.ok()??;
            (g.status?.ready()?.status == "True").then_some(())
        })
        .await;
        // Its Application, as the real server stores it: the git folder and every switch.
        let app = applications_of(&apps, "bg").await;
        let spec = &app[0].data["spec"];
        assert_eq!(
            spec["source"],
            serde_json::json!({ "repoURL": "https://git.example/apps.git", "path": "charts/web",
                                "targetRevision": "v1.0.0" })
        );
        assert_eq!(
            spec["syncPolicy"]["syncOptions"],
            serde_json::json!(["CreateNamespace=true", "ServerSideApply=true"])
        );
        assert_eq!(
            spec["syncPolicy"]["managedNamespaceMetadata"],
            serde_json::json!({ "labels": { "team": "web" },
                                "annotations": { "owner": "web@example.com" } })
        );
        assert_eq!(
            spec["ignoreDifferences"],
            serde_json::json!([{ "group": "apps", "kind": "Deployment",
                                 "jsonPointers": ["/spec/replicas"] }])
        );
        gadgets
            .delete("bg", &DeleteParams::default())
            .await
            .expect("delete the gadget");
        eventually("the gadget is gone", CONVERGE, || async {
            gadgets.get_opt("bg").await.ok()?.is_none().then_some(())
        })
        .await;
        assert_eq!(
            applications_of(&apps, "bg").await.len(),
            1,
            "its Application is still being deleted by Argo CD"
        );
        assert!(
            mgmt.get("healthy").await.is_some(),
            "foreground still waits"
        );

        // Released: everything goes; the registration goes with its last user.
        fake.hold_deletion.store(false, Ordering::SeqCst);
        mgmt.wait_gone("healthy").await;
        assert!(
            configmap(&edge.client(), &mgmt.ns, "web-healthy")
                .await
                .is_none(),
            "Argo CD removed what it deployed: {:?}",
            fake.log()
        );
        let users = cluster_secrets(&env.client()).await[0]
            .annotations()
            .get(driver.users_annotation())
            .cloned()
            .unwrap_or_default();
        assert!(
            users.contains("degraded") && users.contains("tolerated") && !users.contains("healthy"),
            "{users}"
        );
        for w in ["degraded", "tolerated"] {
            mgmt.delete(w).await;
        }
        eventually("every application is gone", CONVERGE, || async {
            let left = apps.list(&ListParams::default()).await.ok()?.items.len();
            let widgets = mgmt
                .api()
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .len();
            (left == 0 && widgets == 0).then_some(())
        })
        .await;
        assert!(
            cluster_secrets(&env.client()).await.is_empty(),
            "the registration goes after the last application of the edge"
        );
        let log = fake.log();
        assert!(
            !log.iter()
                .any(|l| l.starts_with("VIOLATION") || l.starts_with("error")),
            "{log:?}"
        );
        controller.abort();
        rt.shutdown().await;
        edge.stop().await;
    })
    .await;
}
