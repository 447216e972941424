//! What a tenant who writes a custom resource cannot make the operator do with its own
//! privileges, on a real etcd + kube-apiserver: adopt, overwrite or delete an object under a
//! child's name that the resource does not control, or put a child outside the resource's
//! namespace without the step allowing it.
//!
//! Run with `cargo nextest run --release --all-features --test integration -E
//! 'test(/^real_tenancy::/)'` (needs `scripts/install-test-deps.sh`).
#![cfg(feature = "envtest")]

use crate::common::real;

use actorcile::prelude::*;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use real::*;

use crate::common::Widget;

/// A ConfigMap child named by the widget's `note` (the tenant's choice), in the namespace before
/// the `/` when the note has one.
fn named_child(w: &Widget) -> ConfigMap {
    let (namespace, name) = match w.spec.note.split_once('/') {
        Some((ns, name)) => (Some(ns.to_string()), name.to_string()),
        None => (None, w.spec.note.clone()),
    };
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name),
            namespace,
            ..Default::default()
        },
        data: Some([("size".to_string(), w.spec.size.to_string())].into()),
        ..Default::default()
    }
}

async fn start(ns: &Ns, tree: impl Provisioner<Widget> + 'static) -> RuntimeHandle {
    Runtime::builder(ns.client.clone(), crate::common::names())
        .policy(real_policy())
        .controller(Controller::<Widget>::new(tree).namespace(&ns.ns))
        .start()
        .await
        .expect("start the runtime")
}

async fn create_noted(ns: &Ns, name: &str, note: &str) {
    let mut w = widget_in(&ns.ns, name, 1);
    w.spec.note = note.to_string();
    ns.api()
        .create(&PostParams::default(), &w)
        .await
        .unwrap_or_else(|e| panic!("create widget {name}: {e}"));
}

/// A ConfigMap nobody owns, made by the admin, with `key: theirs`.
async fn theirs_at(cms: &Api<ConfigMap>, name: &str, key: &str) -> ConfigMap {
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        data: Some([(key.to_string(), "theirs".to_string())].into()),
        ..Default::default()
    };
    cms.create(&PostParams::default(), &cm).await.unwrap()
}

/// A ConfigMap nobody owns, holding `size: theirs`.
async fn theirs(cms: &Api<ConfigMap>, name: &str) -> ConfigMap {
    theirs_at(cms, name, "size").await
}

#[tokio::test]
async fn a_child_name_holding_someone_elses_object_is_neither_adopted_nor_deleted() {
    bounded("child ownership", async {
        let env = shared_env().await;
        let ns = Ns::create(env.client(), "tenancy-children").await;
        let cms: Api<ConfigMap> = Api::namespaced(ns.client.clone(), &ns.ns);
        let rt = start(&ns, resource("child", named_child)).await;

        // The tenant names an object they do not own: refused, untouched.
        let before = theirs(&cms, "precious").await;
        create_noted(&ns, "grab", "precious").await;
        let s = ns.wait_reason("grab", "ChildNotOwned").await;
        let c = s.ready().unwrap();
        assert_eq!(c.status, "False");
        assert_eq!(s.phase, Some(Phase::Failed), "{s:?}");
        assert!(
            c.message.contains("ConfigMap tenancy-children/precious"),
            "{c:?}"
        );
        let after = cms.get("precious").await.unwrap();
        assert_eq!(after.resource_version(), before.resource_version());
        assert!(after.owner_references().is_empty());
        // Deleting the widget does not delete it either, and leaks no finalizer.
        ns.delete("grab").await;
        ns.wait_gone("grab").await;
        let after = cms.get("precious").await.unwrap();
        assert_eq!(after.uid(), before.uid(), "someone else's object survives");

        // A child of its own is made, and deleted with the widget.
        create_noted(&ns, "mine", "mine-child").await;
        ns.wait_ready("mine").await;
        let child = cms.get("mine-child").await.unwrap();
        let owner = ns.get("mine").await.unwrap();
        assert_eq!(child.owner_references()[0].uid, owner.uid().unwrap());
        ns.delete("mine").await;
        ns.wait_gone("mine").await;
        assert!(cms.get_opt("mine-child").await.unwrap().is_none());

        // Ours deleted behind the runtime's back and the name taken by someone else: the
        // widget's deletion leaves the newcomer alone.
        create_noted(&ns, "swap", "swap-child").await;
        ns.wait_ready("swap").await;
        cms.delete("swap-child", &DeleteParams::default())
            .await
            .unwrap();
        let newcomer = theirs(&cms, "swap-child").await;
        ns.delete("swap").await;
        ns.wait_gone("swap").await;
        assert_eq!(
            cms.get("swap-child").await.unwrap().uid(),
            newcomer.uid(),
            "the newcomer was deleted"
        );
        rt.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn adoption_and_children_outside_the_namespace_are_opt_in() {
    bounded("child rules", async {
        let env = shared_env().await;
        let ns = Ns::create(env.client(), "tenancy-rules").await;
        create_namespace(&ns.client, "tenancy-rules-other").await;
        let cms: Api<ConfigMap> = Api::namespaced(ns.client.clone(), &ns.ns);
        let other: Api<ConfigMap> = Api::namespaced(ns.client.clone(), "tenancy-rules-other");
        let namespaces: Api<Namespace> = Api::all(ns.client.clone());
        let tree = resource("child", named_child).rules(ChildRules::default().adopt());
        let rt = start(&ns, tree).await;

        // With adopt(): an object nobody controls is taken over, and then the widget's (its
        // fields that another manager set keep their manager: see the field-conflict test).
        theirs_at(&cms, "orphan", "other").await;
        create_noted(&ns, "adopter", "orphan").await;
        let w = ns.wait_ready("adopter").await;
        let child = cms.get("orphan").await.unwrap();
        assert_eq!(child.owner_references()[0].uid, w.uid().unwrap());
        assert_eq!(child.data.unwrap()["size"], "1");
        // ... but never one another owner controls.
        create_noted(&ns, "poacher", "orphan").await;
        let s = ns.wait_reason("poacher", "ChildNotOwned").await;
        assert!(
            s.ready().unwrap().message.contains("Widget adopter"),
            "{s:?}"
        );

        // Another namespace without other_namespaces(): Terminal, nothing written there.
        create_noted(&ns, "roamer", "tenancy-rules-other/far").await;
        let s = ns.wait_reason("roamer", "ChildOutOfScope").await;
        assert!(
            s.ready().unwrap().message.contains("tenancy-rules-other"),
            "{s:?}"
        );
        assert!(other.get_opt("far").await.unwrap().is_none());

        rt.shutdown().await;

        // A cluster-scoped child without cluster_scoped(): Terminal, no Namespace made.
        let ns = Ns::create(ns.client.clone(), "tenancy-rules-cluster").await;
        let tree = resource("namespace", |w: &Widget| Namespace {
            metadata: ObjectMeta {
                name: Some(w.spec.note.clone()),
                ..Default::default()
            },
            ..Default::default()
        });
        let rt = start(&ns, tree).await;
        create_noted(&ns, "squatter", "tenancy-rules-squat").await;
        let s = ns.wait_reason("squatter", "ChildOutOfScope").await;
        assert!(
            s.ready().unwrap().message.contains("cluster-scoped"),
            "{s:?}"
        );
        assert!(
            namespaces
                .get_opt("tenancy-rules-squat")
                .await
                .unwrap()
                .is_none()
        );
        rt.shutdown().await;
    })
    .await;
}

/// A CRD of group `tenancy.actorcile.dev` serving `versions` (the first the storage version),
/// with a schema revision when given.
fn doohickey_crd(
    versions: &[&str],
    revision: Option<u32>,
) -> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    let versions: Vec<_> = versions
        .iter()
        .enumerate()
        .map(|(i, v)| {
            serde_json::json!({
                "name": v, "served": true, "storage": i == 0,
                "schema": {"openAPIV3Schema": {"type": "object",
                    "x-kubernetes-preserve-unknown-fields": true}},
            })
        })
        .collect();
    let mut crd = serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "doohickeys.tenancy.actorcile.dev"},
        "spec": {
            "group": "tenancy.actorcile.dev",
            "scope": "Namespaced",
            "names": {"plural": "doohickeys", "singular": "doohickey", "kind": "Doohickey"},
            "versions": versions,
        },
    });
    if let Some(r) = revision {
        crd["metadata"]["annotations"] = serde_json::json!({
            actorcile::crds::SCHEMA_REVISION_ANNOTATION: r.to_string()
        });
    }
    serde_json::from_value(crd).unwrap()
}

#[tokio::test]
async fn an_older_operator_does_not_downgrade_an_installed_crd() {
    use actorcile::crds::{CrdError, install};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    bounded("CRD downgrade", async {
        let env = shared_env().await;
        let client = env.client();
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        let limit = std::time::Duration::from_secs(60);
        let served = || async {
            let c = crds.get("doohickeys.tenancy.actorcile.dev").await.unwrap();
            let names: Vec<String> = c.spec.versions.iter().map(|v| v.name.clone()).collect();
            let revision = c
                .metadata
                .annotations
                .unwrap_or_default()
                .get(actorcile::crds::SCHEMA_REVISION_ANNOTATION)
                .cloned();
            (names, revision)
        };
        // The newer operator installed v1 and v2, revision 3.
        install(
            client.clone(),
            &[doohickey_crd(&["v1", "v2"], Some(3))],
            "newer",
            limit,
        )
        .await
        .unwrap();
        // An older replica, knowing v1 only: refused, the CRD as it was.
        let e = install(
            client.clone(),
            &[doohickey_crd(&["v1"], Some(2))],
            "older",
            limit,
        )
        .await
        .unwrap_err();
        assert!(
            matches!(&e, CrdError::Older { why, .. } if why.contains("v2")),
            "{e}"
        );
        assert_eq!(
            served().await,
            (vec!["v1".into(), "v2".into()], Some("3".into()))
        );
        // The same versions at a lower revision: refused too.
        let e = install(
            client.clone(),
            &[doohickey_crd(&["v1", "v2"], Some(2))],
            "older",
            limit,
        )
        .await
        .unwrap_err();
        assert!(
            matches!(&e, CrdError::Older { why, .. } if why.contains("revision is 3")),
            "{e}"
        );
        // A newer revision goes in.
        install(
            client.clone(),
            &[doohickey_crd(&["v1", "v2"], Some(4))],
            "newer",
            limit,
        )
        .await
        .unwrap();
        assert_eq!(served().await.1, Some("4".into()));
    })
    .await;
}
