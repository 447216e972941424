//! Tests that start real etcd + kube-apiserver processes (installed by scripts/install-test-deps.sh).

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, PostParams};

use super::*;

const LIMIT: Duration = Duration::from_secs(120);

fn config_map(name: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm.data = Some([("k".to_string(), "v".to_string())].into());
    cm
}

fn alive(pid: u32) -> bool {
    crate::procs::pid_alive(pid)
}

#[tokio::test]
async fn start_serves_admin_and_rbac_limited_user_then_stop_cleans_up() {
    tokio::time::timeout(LIMIT, async {
        let env = Envtest::start().await.unwrap();
        let dir = env.dir().to_path_buf();
        assert!(env.kubeconfig_path().is_file());
        assert!(env.server_url().starts_with("https://127.0.0.1:"));

        // Admin: full access, TLS verified against the apiserver's own certificate.
        assert!(!env.config().accept_invalid_certs);
        let cms: Api<ConfigMap> = Api::namespaced(env.client(), "default");
        cms.create(&PostParams::default(), &config_map("a"))
            .await
            .unwrap();
        let nss: Api<Namespace> = Api::all(env.client());
        assert!(nss.get_opt("default").await.unwrap().is_some());

        // The kubeconfig file works on its own.
        let from_file = files::client_config(env.kubeconfig_path()).await.unwrap();
        let cms_file: Api<ConfigMap> =
            Api::namespaced(kube::Client::try_from(from_file).unwrap(), "default");
        assert_eq!(cms_file.get("a").await.unwrap().data, config_map("a").data);

        // User: authenticated, but RBAC forbids until granted.
        assert_eq!(env.user_name(), "actorcile-user");
        let user_cms: Api<ConfigMap> = Api::namespaced(env.user_client(), "default");
        match user_cms.list(&ListParams::default()).await {
            Err(kube::Error::Api(s)) => assert_eq!(s.code, 403, "{s:?}"),
            other => panic!("expected 403, got {other:?}"),
        }
        grant_configmap_read(&env).await;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match user_cms.list(&ListParams::default()).await {
                Ok(list) => {
                    assert!(
                        list.items
                            .iter()
                            .any(|c| c.metadata.name.as_deref() == Some("a"))
                    );
                    break;
                }
                Err(e) if std::time::Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("user still cannot list after the grant: {e}"),
            }
        }

        let (etcd, api) = env.pids();
        let (etcd, api) = (etcd.unwrap(), api.unwrap());
        assert!(alive(etcd) && alive(api));
        env.stop().await;
        assert!(!alive(etcd) && !alive(api));
        assert!(!dir.exists(), "{} should be removed", dir.display());
    })
    .await
    .unwrap();
}

async fn grant_configmap_read(env: &Envtest) {
    let mut role = ClusterRole::default();
    role.metadata.name = Some("cm-reader".into());
    role.rules = Some(vec![PolicyRule {
        api_groups: Some(vec!["".into()]),
        resources: Some(vec!["configmaps".into()]),
        verbs: vec!["get".into(), "list".into()],
        ..Default::default()
    }]);
    Api::<ClusterRole>::all(env.client())
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let mut binding = ClusterRoleBinding::default();
    binding.metadata.name = Some("cm-reader".into());
    binding.role_ref = RoleRef {
        api_group: "rbac.authorization.k8s.io".into(),
        kind: "ClusterRole".into(),
        name: "cm-reader".into(),
    };
    binding.subjects = Some(vec![Subject {
        kind: "User".into(),
        name: env.user_name().into(),
        api_group: Some("rbac.authorization.k8s.io".into()),
        ..Default::default()
    }]);
    Api::<ClusterRoleBinding>::all(env.client())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
}

#[tokio::test]
async fn restarts_keep_data_and_clients_work_again() {
    tokio::time::timeout(LIMIT, async {
        let mut env = Envtest::start().await.unwrap();
        let client = env.client();
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
        cms.create(&PostParams::default(), &config_map("before"))
            .await
            .unwrap();
        let (etcd_before, api_before) = env.pids();

        env.restart_apiserver().await.unwrap();
        let (etcd_mid, api_mid) = env.pids();
        assert_eq!(etcd_mid, etcd_before);
        assert_ne!(api_mid, api_before);
        assert!(!alive(api_before.unwrap()));
        // The client built before the restart still works (same port and certificate).
        assert!(cms.get_opt("before").await.unwrap().is_some());

        env.restart_etcd().await.unwrap();
        let (etcd_after, _) = env.pids();
        assert_ne!(etcd_after, etcd_before);
        assert!(!alive(etcd_before.unwrap()));
        // Data survived the etcd restart (same data dir); writes work again.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            match cms
                .create(&PostParams::default(), &config_map("after"))
                .await
            {
                Ok(_) => break,
                Err(e) if std::time::Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("cannot write after etcd restart: {e}"),
            }
        }
        assert!(cms.get_opt("before").await.unwrap().is_some());
        env.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn builder_installs_crds_waits_established_and_for_openapi() {
    tokio::time::timeout(LIMIT, async {
        // From a folder of CRD files, as controller-runtime's CRDDirectoryPaths.
        let folder = tempfile::tempdir().unwrap();
        std::fs::write(folder.path().join("widget.yaml"), super::crds::WIDGET_CRD).unwrap();
        let crds = crds_from_yaml(super::crds::WIDGET_CRD).unwrap();
        let env = Envtest::builder()
            .crd_dir(folder.path())
            .start()
            .await
            .unwrap();
        let got = Api::<CustomResourceDefinition>::all(env.client())
            .get("widgets.example.com")
            .await
            .unwrap();
        let established = got
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        assert!(established);
        // Immediately usable.
        let ar = kube::api::ApiResource {
            group: "example.com".into(),
            version: "v1".into(),
            api_version: "example.com/v1".into(),
            kind: "Widget".into(),
            plural: "widgets".into(),
        };
        let widgets: Api<kube::api::DynamicObject> =
            Api::namespaced_with(env.client(), "default", &ar);
        let obj =
            kube::api::DynamicObject::new("w1", &ar).data(serde_json::json!({"spec": {"size": 3}}));
        widgets.create(&PostParams::default(), &obj).await.unwrap();
        // Installing again (an update) is fine.
        env.install_crds(&crds).await.unwrap();
        // Its OpenAPI is published (in the background, after Established).
        wait_for_openapi(env.client(), &crds, Duration::from_secs(60))
            .await
            .unwrap();
        // A CRD the server does not have is never published.
        let mut absent = crds[0].clone();
        absent.metadata.name = Some("gizmos.example.com".into());
        absent.spec.names.plural = "gizmos".into();
        let err = wait_for_openapi(env.client(), &[absent], Duration::from_millis(500))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, EnvtestError::CrdOpenApiNotPublished { name, .. } if name == "gizmos.example.com"),
            "{err:?}"
        );
        env.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn drop_kills_processes_and_removes_the_dir_keep_dir_keeps_it() {
    tokio::time::timeout(LIMIT, async {
        let env = Envtest::builder().keep_dir(true).start().await.unwrap();
        let dir = env.dir().to_path_buf();
        let (etcd, api) = env.pids();
        drop(env);
        assert!(!alive(etcd.unwrap()) && !alive(api.unwrap()));
        assert!(
            dir.join("kube-apiserver.log").is_file(),
            "keep_dir keeps the logs"
        );
        std::fs::remove_dir_all(&dir).unwrap();

        let env = Envtest::start().await.unwrap();
        let dir = env.dir().to_path_buf();
        let (etcd, api) = env.pids();
        drop(env);
        assert!(!alive(etcd.unwrap()) && !alive(api.unwrap()));
        assert!(!dir.exists());
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_failing_apiserver_reports_its_log_tail() {
    use std::os::unix::fs::PermissionsExt;
    tokio::time::timeout(LIMIT, async {
        let real = binaries().unwrap();
        let bin = tempfile::tempdir().unwrap();
        let fake = bin.path().join("kube-apiserver");
        std::fs::write(
            &fake,
            "#!/bin/sh\n[ \"$1\" = --version ] && echo 'Kubernetes v1.37.2' && exit 0\n\
             echo 'E1121 bogus flag: everything is broken' >&2\nexit 3\n",
        )
        .unwrap();
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let work = tempfile::tempdir().unwrap();
        let dir = work.path().join("cp");
        let err = Envtest::builder()
            .binaries(Binaries {
                etcd: real.etcd,
                kube_apiserver: fake,
                kube_controller_manager: None,
            })
            .dir(&dir)
            .start()
            .await
            .unwrap_err();
        match &err {
            EnvtestError::Startup {
                component,
                reason,
                log_tail,
            } => {
                assert_eq!(*component, "kube-apiserver");
                assert!(reason.contains("exit"), "{reason}");
                assert!(log_tail.contains("everything is broken"), "{log_tail}");
            }
            other => panic!("expected a startup error, got {other}"),
        }
        assert!(!dir.exists(), "a failed start removes its directory");
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn detached_control_plane_outlives_its_handle_and_stops() {
    tokio::time::timeout(LIMIT, async {
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("state");
        assert!(matches!(
            Envtest::builder().start_detached().await,
            Err(EnvtestError::DetachedWithoutDir)
        ));
        let d = Envtest::builder().dir(&dir).start_detached().await.unwrap();
        let loaded = DetachedEnvtest::load(&dir).unwrap().unwrap();
        assert_eq!(loaded, d);
        assert!(loaded.is_running(), "{loaded:?}");
        assert!(loaded.is_ready().await, "{loaded:?} not ready");
        let client =
            kube::Client::try_from(files::client_config(&loaded.kubeconfig).await.unwrap())
                .unwrap();
        let cms: Api<ConfigMap> = Api::namespaced(client, "default");
        cms.create(&PostParams::default(), &config_map("x"))
            .await
            .unwrap();
        let (etcd, api) = (loaded.etcd_pid, loaded.apiserver_pid);
        loaded.stop(Duration::from_secs(5)).await.unwrap();
        assert!(!alive(etcd), "etcd {etcd} still alive");
        assert!(!alive(api), "kube-apiserver {api} still alive");
        assert!(!d.is_running());
        assert!(!dir.exists());
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn service_account_tokens_are_signed_and_verified_with_the_generated_key() {
    use k8s_openapi::api::authentication::v1::{
        TokenRequest, TokenRequestSpec, TokenReview, TokenReviewSpec,
    };
    use k8s_openapi::api::core::v1::ServiceAccount;
    tokio::time::timeout(LIMIT, async {
        let env = Envtest::start().await.unwrap();
        let sas: Api<ServiceAccount> = Api::namespaced(env.client(), "default");
        let mut sa = ServiceAccount::default();
        sa.metadata.name = Some("robot".into());
        sas.create(&PostParams::default(), &sa).await.unwrap();
        // Issuing signs with --service-account-signing-key-file (the private key) ...
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: vec!["https://kubernetes.default.svc.cluster.local".into()],
                ..Default::default()
            },
            ..Default::default()
        };
        let issued = sas
            .create_token_request("robot", &PostParams::default(), &request)
            .await
            .unwrap();
        let token = issued.status.unwrap().token;
        // ... and a review verifies with --service-account-key-file (the public key).
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token),
                ..Default::default()
            },
            ..Default::default()
        };
        let reviewed = Api::<TokenReview>::all(env.client())
            .create(&PostParams::default(), &review)
            .await
            .unwrap();
        let status = reviewed.status.unwrap();
        assert_eq!(status.authenticated, Some(true), "{status:?}");
        assert_eq!(
            status.user.and_then(|u| u.username).as_deref(),
            Some("system:serviceaccount:default:robot")
        );
        env.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn the_controller_manager_collects_owned_objects_and_empties_deleted_namespaces() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::api::DeleteParams;
    tokio::time::timeout(LIMIT, async {
        let env = Envtest::builder()
            .controller_manager(true)
            .start()
            .await
            .unwrap();
        let expected = KubeVersion::of_binary(&binaries().unwrap().kube_apiserver).unwrap();
        assert_eq!(env.version(), expected);
        assert!(env.has_controller_manager());
        let client = env.client();
        let nss: Api<Namespace> = Api::all(client.clone());
        let mut ns = Namespace::default();
        ns.metadata.name = Some("gc".into());
        nss.create(&PostParams::default(), &ns).await.unwrap();
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "gc");
        let owner = cms
            .create(&PostParams::default(), &config_map("owner"))
            .await
            .unwrap();
        let mut child = config_map("child");
        child.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: "owner".into(),
            uid: owner.metadata.uid.clone().unwrap(),
            ..Default::default()
        }]);
        cms.create(&PostParams::default(), &child).await.unwrap();
        // Foreground: the owner stays (with the foregroundDeletion finalizer) until its child is
        // gone, then goes.
        cms.delete("owner", &DeleteParams::foreground())
            .await
            .unwrap();
        wait_gone(&cms, "child").await;
        wait_gone(&cms, "owner").await;
        // A deleted namespace is emptied and goes away.
        cms.create(&PostParams::default(), &config_map("left"))
            .await
            .unwrap();
        nss.delete("gc", &DeleteParams::default()).await.unwrap();
        wait_gone(&nss, "gc").await;
        env.stop().await;
    })
    .await
    .unwrap();
}

async fn wait_gone<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    // Bounded by the test's LIMIT; the controllers act within seconds once their caches synced.
    while api.get_opt(name).await.unwrap().is_some() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// controller-runtime's `USE_EXISTING_CLUSTER`: a second handle on the first control plane,
/// through its kubeconfig, starts nothing, installs its CRDs there, impersonates the non-admin
/// user, refuses what only its own processes allow, and stops nothing.
#[tokio::test]
async fn an_existing_cluster_is_used_as_it_is() {
    tokio::time::timeout(LIMIT, async {
        let cluster = Envtest::start().await.unwrap();
        let env = Envtest::builder()
            .use_existing_cluster(true)
            .kubeconfig(cluster.kubeconfig_path())
            .crds(crds_from_yaml(super::crds::WIDGET_CRD).unwrap())
            .start()
            .await
            .unwrap();
        assert!(env.is_existing_cluster() && !cluster.is_existing_cluster());
        assert_eq!(env.server_url(), cluster.server_url());
        assert_eq!(env.version(), cluster.version());
        assert_eq!(env.pids(), (None, None));

        // Its CRDs are installed into the cluster; what its client writes is there.
        assert!(
            Api::<CustomResourceDefinition>::all(cluster.client())
                .get_opt("widgets.example.com")
                .await
                .unwrap()
                .is_some()
        );
        Api::<ConfigMap>::namespaced(env.client(), "default")
            .create(&PostParams::default(), &config_map("existing"))
            .await
            .unwrap();
        assert!(
            Api::<ConfigMap>::namespaced(cluster.client(), "default")
                .get_opt("existing")
                .await
                .unwrap()
                .is_some()
        );
        // Its kubeconfig file works on its own.
        let from_file = files::client_config(env.kubeconfig_path()).await.unwrap();
        let cms: Api<ConfigMap> =
            Api::namespaced(kube::Client::try_from(from_file).unwrap(), "default");
        assert!(cms.get_opt("existing").await.unwrap().is_some());

        // The user is the kubeconfig's identity impersonating `actorcile-user`: RBAC applies.
        let user_cms: Api<ConfigMap> = Api::namespaced(env.user_client(), "default");
        match user_cms.list(&ListParams::default()).await {
            Err(kube::Error::Api(s)) => {
                assert_eq!(s.code, 403, "{s:?}");
                assert!(s.message.contains(USER_NAME), "{s:?}");
            }
            other => panic!("expected 403, got {other:?}"),
        }
        grant_configmap_read(&env).await;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while let Err(e) = user_cms.list(&ListParams::default()).await {
            assert!(
                std::time::Instant::now() < deadline,
                "the user still cannot list after the grant: {e}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }

        // Only the test's own processes restart or detach.
        let mut env = env;
        assert!(matches!(
            env.restart_apiserver().await,
            Err(EnvtestError::ExistingCluster { .. })
        ));
        assert!(matches!(
            env.restart_etcd().await,
            Err(EnvtestError::ExistingCluster { .. })
        ));
        let dir = env.dir().to_path_buf();
        env.stop().await;
        assert!(!dir.exists(), "{} should be removed", dir.display());
        let detached = Envtest::builder()
            .use_existing_cluster(true)
            .kubeconfig(cluster.kubeconfig_path())
            .dir(tempfile::tempdir().unwrap().path().join("d"))
            .start_detached()
            .await;
        assert!(matches!(
            detached,
            Err(EnvtestError::ExistingCluster { .. })
        ));

        // Stopping it stopped nothing.
        let (etcd, api) = cluster.pids();
        assert!(alive(etcd.unwrap()) && alive(api.unwrap()));
        assert!(
            Api::<ConfigMap>::namespaced(cluster.client(), "default")
                .get_opt("existing")
                .await
                .unwrap()
                .is_some()
        );
        cluster.stop().await;
    })
    .await
    .unwrap();
}
