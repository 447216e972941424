//! The tests of `provisioners/argocd.rs`.

use super::*;
use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

fn test_names() -> OperatorNames {
    OperatorNames::new("test-operator", "test.example.com")
}

fn app(spec: Value, status: Value) -> DynamicObject {
    DynamicObject::new("a", &ArgoCd::application_resource())
        .data(json!({ "spec": spec, "status": status }))
}

#[test]
fn health_needs_the_current_spec_compared_synced_and_healthy() {
    let spec = json!({ "source": { "chart": "c" }, "destination": { "name": "edge" } });
    let compared = json!({ "source": { "chart": "c" }, "destination": { "name": "edge" } });
    let old = json!({ "source": { "chart": "old" }, "destination": { "name": "edge" } });
    let status = |cmp: &Value, sync: &str, health: &str| {
        json!({ "sync": { "status": sync, "comparedTo": cmp },
                    "health": { "status": health, "message": "m" } })
    };
    assert_eq!(
        health_of(&app(spec.clone(), status(&compared, "Synced", "Healthy"))),
        AppHealth::Healthy
    );
    assert!(matches!(
        health_of(&app(spec.clone(), status(&old, "Synced", "Healthy"))),
        AppHealth::Progressing(_)
    ));
    assert!(matches!(
        health_of(&app(spec.clone(), status(&compared, "OutOfSync", "Healthy"))),
        AppHealth::Progressing(m) if m.contains("OutOfSync")
    ));
    assert!(matches!(
        health_of(&app(spec.clone(), status(&compared, "Synced", "Degraded"))),
        AppHealth::Degraded(m) if m.ends_with(": m")
    ));
    assert!(matches!(
        health_of(&app(spec, json!({}))),
        AppHealth::Progressing(_)
    ));
}

#[tokio::test]
async fn a_registration_keeps_its_data_until_its_last_user_goes() {
    let cluster = crate::cluster::ApiServer::new();
    let argo = ArgoCd::new(cluster.client(), "default", &test_names());
    let reg = ClusterRegistration {
        id: "edge".into(),
        server: "https://edge:6443".into(),
        config: json!({ "bearerToken": "t" }),
    };
    argo.register_cluster(&reg, "a").await.unwrap();
    argo.register_cluster(&reg, "b").await.unwrap();
    argo.register_cluster(&reg, "b").await.unwrap();
    argo.unregister_cluster("edge", "a").await.unwrap();
    let secret = argo
        .secrets()
        .get(&ArgoCd::cluster_secret_name("edge"))
        .await
        .unwrap();
    assert_eq!(argo.users_of(&secret), BTreeSet::from(["b".to_string()]));
    let data = secret.data.unwrap_or_default();
    assert_eq!(data["name"].0, b"edge");
    assert_eq!(data["server"].0, b"https://edge:6443");
    assert_eq!(
        secret.metadata.labels.unwrap_or_default()[SECRET_TYPE_LABEL],
        "cluster"
    );
    argo.unregister_cluster("edge", "b").await.unwrap();
    assert!(
        argo.secrets()
            .get_opt(&ArgoCd::cluster_secret_name("edge"))
            .await
            .unwrap()
            .is_none()
    );
    // Unregistering what is not registered succeeds.
    argo.unregister_cluster("edge", "b").await.unwrap();
}

#[test]
fn the_bundled_crd_is_the_application_kind() {
    let crd = application_crd();
    assert_eq!(crd.spec.group, "argoproj.io");
    assert_eq!(crd.spec.names.kind, "Application");
    assert_eq!(crd.spec.versions[0].name, "v1alpha1");
}

#[test]
fn application_names_are_valid_label_values() {
    assert_eq!(ArgoCd::application_name_prefix("web"), "web-");
    let long = ArgoCd::application_name_prefix(&"Web_Release.".repeat(10));
    assert!(long.len() + 5 <= 63, "{long}");
    assert!(
        long.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
        "{long}"
    );
    assert!(!long.ends_with("--"), "{long}");
}

fn registration(id: &str, server: &str, token: &str) -> ClusterRegistration {
    ClusterRegistration {
        id: id.into(),
        server: server.into(),
        config: json!({ "bearerToken": token }),
    }
}

fn token_of(secret: &Secret) -> String {
    let config = &secret.data.as_ref().unwrap()["config"].0;
    serde_json::from_slice::<Value>(config).unwrap()["bearerToken"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn ids_that_read_alike_keep_registrations_of_their_own() {
    let cluster = crate::cluster::ApiServer::new();
    let argo = ArgoCd::new(cluster.client(), "default", &test_names());
    let (a, b) = ("team/a-x", "team-a/x");
    assert_ne!(
        ArgoCd::cluster_secret_name(a),
        ArgoCd::cluster_secret_name(b)
    );
    argo.register_cluster(&registration(a, "https://a:6443", "ta"), "u")
        .await
        .unwrap();
    argo.register_cluster(&registration(b, "https://b:6443", "tb"), "u")
        .await
        .unwrap();
    for (id, token) in [(a, "ta"), (b, "tb")] {
        let s = argo
            .secrets()
            .get(&ArgoCd::cluster_secret_name(id))
            .await
            .unwrap();
        assert_eq!(token_of(&s), token, "{id}");
        assert_eq!(s.annotations()[argo.cluster_id_annotation()], id);
    }
}

#[tokio::test]
async fn secrets_the_driver_did_not_write_are_neither_overwritten_nor_deleted() {
    let cluster = crate::cluster::ApiServer::new();
    let argo = ArgoCd::new(cluster.client(), "default", &test_names());
    let name = ArgoCd::cluster_secret_name("edge");
    // Someone's own cluster Secret under the name: refused, untouched.
    let hand_made = Secret {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(BTreeMap::from([(
                SECRET_TYPE_LABEL.to_string(),
                "cluster".to_string(),
            )])),
            ..Default::default()
        },
        string_data: Some(BTreeMap::from([(
            "server".to_string(),
            "https://theirs:6443".to_string(),
        )])),
        ..Default::default()
    };
    argo.secrets()
        .create(&PostParams::default(), &hand_made)
        .await
        .unwrap();
    let reg = registration("edge", "https://edge:6443", "t");
    let e = argo.register_cluster(&reg, "u").await.unwrap_err();
    assert!(
        matches!(&e, CdError::NotOurs { object, .. } if object.contains(&name)),
        "{e}"
    );
    // Unregistering leaves it alone: nothing of ours is there.
    argo.unregister_cluster("edge", "u").await.unwrap();
    let s = argo.secrets().get(&name).await.unwrap();
    assert_eq!(s.data.unwrap()["server"].0, b"https://theirs:6443");
    // Another registration of a server registered already by someone else: refused.
    let e = argo
        .register_cluster(&registration("other", "https://theirs:6443/", "t"), "u")
        .await
        .unwrap_err();
    assert!(
        matches!(&e, CdError::NotRegistrable { why, .. } if why.contains("registered already")),
        "{e}"
    );
    // Argo CD's own cluster, under any of its names: refused.
    for server in [
        IN_CLUSTER_SERVER,
        "https://kubernetes.default.svc/",
        "https://kubernetes.default.svc.cluster.local:443",
        "https://KUBERNETES.default",
    ] {
        let e = argo
            .register_cluster(&registration("inside", server, "t"), "u")
            .await
            .unwrap_err();
        assert!(matches!(e, CdError::NotRegistrable { .. }), "{server}: {e}");
    }
    assert!(
        argo.secrets()
            .get_opt(&ArgoCd::cluster_secret_name("inside"))
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn a_registration_under_the_old_name_moves_with_its_users() {
    let cluster = crate::cluster::ApiServer::new();
    let argo = ArgoCd::new(cluster.client(), "default", &test_names());
    let reg = registration("edge", "https://edge:6443", "t");
    let mut old = argo
        .registration_secret(
            "cluster-edge",
            "edge",
            &reg,
            &BTreeSet::from(["a".to_string()]),
        )
        .unwrap();
    old.annotations_mut().remove(argo.cluster_id_annotation());
    argo.secrets()
        .create(&PostParams::default(), &old)
        .await
        .unwrap();
    argo.register_cluster(&reg, "b").await.unwrap();
    assert!(
        argo.secrets()
            .get_opt("cluster-edge")
            .await
            .unwrap()
            .is_none()
    );
    let moved = argo
        .secrets()
        .get(&ArgoCd::cluster_secret_name("edge"))
        .await
        .unwrap();
    assert_eq!(
        argo.users_of(&moved),
        BTreeSet::from(["a".to_string(), "b".to_string()])
    );
}

#[test]
fn cluster_secret_names_are_valid_names() {
    let edge = ArgoCd::cluster_secret_name("edge");
    assert!(
        edge.starts_with("cluster-edge-") && edge.len() == "cluster-edge-".len() + 16,
        "{edge}"
    );
    let n = ArgoCd::cluster_secret_name("Team_A.Edge/west");
    assert!(
        n.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
        "{n}"
    );
}

#[tokio::test]
async fn what_was_written_under_the_former_domain_is_found_and_moved_to_the_current_one() {
    let cluster = crate::cluster::ApiServer::new();
    cluster.install_crd(&application_crd()).unwrap();
    let old_names = OperatorNames::new("test-operator", crate::names::LEGACY_DOMAIN);
    let new_names = test_names().former_domain(crate::names::LEGACY_DOMAIN);
    let (old, new) = (
        ArgoCd::new(cluster.client(), "default", &old_names),
        ArgoCd::new(cluster.client(), "default", &new_names),
    );
    // The earlier version registered a cluster and created an Application.
    let reg = registration("edge", "https://edge:6443", "t");
    old.register_cluster(&reg, "a").await.unwrap();
    let spec = |names: &OperatorNames, version: &str| AppSpec {
        identity: AppIdentity::new(names, "Tenant", Some("t"), "acme", "web", None),
        source: crate::provisioners::cd::AppSource::helm(
            "https://charts.example.com",
            "web",
            version,
        ),
        release: "web".into(),
        namespace: "web".into(),
        create_namespace: true,
        namespace_labels: BTreeMap::new(),
        namespace_annotations: BTreeMap::new(),
        server_side_apply: false,
        ignore_differences: Vec::new(),
        parameters: BTreeMap::new(),
        values: None,
        destination: crate::provisioners::cd::Destination::InCluster,
        allow_degraded: false,
    };
    old.apply(&spec(&old_names, "1.0.0")).await.unwrap();

    // The upgraded one finds both: the Application is updated, not created again, and both
    // carry the current domain's marks only.
    let current = spec(&new_names, "1.1.0");
    assert!(!matches!(
        new.health(&current.identity).await.unwrap(),
        AppHealth::Missing
    ));
    new.apply(&current).await.unwrap();
    let apps = new
        .applications()
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(apps.items.len(), 1, "one Application: {apps:?}");
    let labels = apps.items[0].labels();
    assert!(
        labels.keys().all(|k| !k.contains("actorcile.dev")),
        "{labels:?}"
    );
    assert_eq!(
        labels
            .get("app.test.example.com/owner-name")
            .map(String::as_str),
        Some("acme")
    );
    new.register_cluster(&reg, "b").await.unwrap();
    let secret = new
        .secrets()
        .get(&ArgoCd::cluster_secret_name("edge"))
        .await
        .unwrap();
    assert_eq!(
        new.users_of(&secret),
        BTreeSet::from(["a".to_string(), "b".to_string()])
    );
    let marks: Vec<&String> = secret
        .labels()
        .keys()
        .chain(secret.annotations().keys())
        .collect();
    assert!(
        marks.iter().all(|k| !k.contains("actorcile.dev")),
        "{marks:?}"
    );
    assert_eq!(secret.annotations()[new.cluster_id_annotation()], "edge");

    // Without the former domain, an upgraded driver does not take the earlier one's Secret.
    let unaware = ArgoCd::new(cluster.client(), "default", &test_names());
    old.register_cluster(&registration("west", "https://west:6443", "t"), "a")
        .await
        .unwrap();
    assert!(matches!(
        unaware
            .register_cluster(&registration("west", "https://west:6443", "t"), "b")
            .await,
        Err(CdError::NotOurs { .. })
    ));
}
