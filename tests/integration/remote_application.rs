//! `remote(...)` and `application(...)` on in-process clusters (a management cluster and a
//! remote one), with a CD driver that keeps its applications and registrations in memory:
//! the lifecycle rules, deterministically (paused clock).

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actorcile::cluster::ApiServer;
use actorcile::prelude::*;
use actorcile::provisioners::cd::{
    AppHealth, AppIdentity, AppSpec, CdDriver, CdError, ClusterRegistration, Deletion,
};
use actorcile::provisioners::{
    AppRef, Catalog, FixedCluster, KubeconfigSecret, RemoteAccess, RemoteCluster,
    RemoteClusterError, application, remote, resource,
};
use actorcile::status::Phase;
use async_trait::async_trait;
use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};

const LIMIT: Duration = Duration::from_secs(600);

/// A CD driver in memory: what it was asked, in order, and what it holds.
#[derive(Default)]
struct MemoryCd {
    log: Mutex<Vec<String>>,
    /// Registration id → its users.
    registered: Mutex<BTreeMap<String, BTreeSet<String>>>,
    /// Applications by identity: their spec and health.
    apps: Mutex<BTreeMap<String, (AppSpec, AppHealth)>>,
    /// Identities two applications carry.
    duplicated: Mutex<BTreeSet<String>>,
    /// While set, deleted applications stay `Deleting`.
    hold_deletion: AtomicBool,
}

impl MemoryCd {
    fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
    fn users(&self, id: &str) -> BTreeSet<String> {
        self.registered
            .lock()
            .unwrap()
            .get(id)
            .cloned()
            .unwrap_or_default()
    }
    fn set_health(&self, identity: &str, health: AppHealth) {
        if let Some(a) = self.apps.lock().unwrap().get_mut(identity) {
            a.1 = health;
        }
    }
    fn app_identities(&self) -> Vec<String> {
        self.apps.lock().unwrap().keys().cloned().collect()
    }
}

#[async_trait]
impl CdDriver for MemoryCd {
    fn kind(&self) -> &str {
        "memory"
    }
    async fn health(&self, identity: &AppIdentity) -> Result<AppHealth, CdError> {
        Ok(self
            .apps
            .lock()
            .unwrap()
            .get(&identity.selector())
            .map(|a| a.1.clone())
            .unwrap_or(AppHealth::Missing))
    }
    async fn apply(&self, app: &AppSpec) -> Result<(), CdError> {
        let key = app.identity.selector();
        if self.duplicated.lock().unwrap().contains(&key) {
            return Err(CdError::Ambiguous {
                identity: app.identity.clone(),
                count: 2,
            });
        }
        if let actorcile::provisioners::cd::Destination::Registered(id) = &app.destination
            && self.users(id).is_empty()
        {
            self.log.lock().unwrap().push(format!(
                "VIOLATION: applied to the unregistered remote {id}"
            ));
        }
        self.log
            .lock()
            .unwrap()
            .push(format!("apply {}", app.release));
        let mut apps = self.apps.lock().unwrap();
        let entry = apps
            .entry(key)
            .or_insert_with(|| (app.clone(), AppHealth::Progressing("OutOfSync".into())));
        entry.0 = app.clone();
        Ok(())
    }
    async fn delete(&self, identity: &AppIdentity, background: bool) -> Result<Deletion, CdError> {
        let key = identity.selector();
        let mut apps = self.apps.lock().unwrap();
        if !apps.contains_key(&key) {
            return Ok(Deletion::Gone);
        }
        self.log
            .lock()
            .unwrap()
            .push(format!("delete {}", apps[&key].0.release));
        if background || !self.hold_deletion.load(Ordering::SeqCst) {
            apps.remove(&key);
            return Ok(Deletion::Gone);
        }
        apps.get_mut(&key).unwrap().1 = AppHealth::Deleting;
        Ok(Deletion::InProgress)
    }
    async fn register_cluster(&self, r: &ClusterRegistration, user: &str) -> Result<(), CdError> {
        self.log
            .lock()
            .unwrap()
            .push(format!("register {} {user}", r.id));
        self.registered
            .lock()
            .unwrap()
            .entry(r.id.clone())
            .or_default()
            .insert(user.to_string());
        Ok(())
    }
    async fn unregister_cluster(&self, id: &str, user: &str) -> Result<(), CdError> {
        self.log
            .lock()
            .unwrap()
            .push(format!("unregister {id} {user}"));
        let mut r = self.registered.lock().unwrap();
        if let Some(users) = r.get_mut(id) {
            users.remove(user);
            if users.is_empty() {
                r.remove(id);
            }
        }
        Ok(())
    }
}

/// A remote cluster reached through a configuration (so it can be registered) whose requests go
/// to an in-process cluster's client; `down` makes it unavailable.
#[derive(Clone)]
struct Edge {
    client: Client,
    down: Arc<AtomicBool>,
}

#[async_trait]
impl RemoteCluster for Edge {
    fn id(&self) -> String {
        "edge".into()
    }
    async fn access(&self, _scope: &Client) -> Result<RemoteAccess, RemoteClusterError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(RemoteClusterError::Unavailable {
                what: "the edge is down".into(),
                source: None,
            });
        }
        Ok(RemoteAccess::client(self.client.clone()))
    }
}

/// `Edge` as a configuration-reached cluster, for registration: the configuration points
/// nowhere, the children use the in-process client through a nested `FixedCluster`.
fn edge_config() -> kube::Config {
    let mut c = kube::Config::new("https://edge.example:6443".parse().unwrap());
    c.auth_info.token = Some("sekret-token".to_string().into());
    c
}

fn policy() -> SupervisorPolicy {
    let mut p = test_policy();
    p.kind.yield_delay = Duration::from_millis(100);
    p
}

fn configmap(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

async fn configmap_in(client: &Client, name: &str) -> Option<ConfigMap> {
    Api::<ConfigMap>::namespaced(client.clone(), "default")
        .get_opt(name)
        .await
        .unwrap()
}

async fn start(client: &Client, tree: impl Provisioner<Widget> + 'static) -> RuntimeHandle {
    start_widgets(client, policy(), tree).await
}

#[tokio::test(start_paused = true)]
async fn a_remote_provisions_into_the_remote_and_a_transient_outage_during_deletion_is_waited_out()
{
    let (_mgmt, client) = cluster();
    let edge_cluster = ApiServer::new();
    let edge = Edge {
        client: edge_cluster.client(),
        down: Arc::default(),
    };
    let e = edge.clone();
    let tree = remote(
        "edge",
        move |_w: &Widget| e.clone(),
        vec![boxed(resource("hello", |w: &Widget| {
            configmap(&format!("hello-{}", w.name_any()))
        }))],
    );
    let rt = start(&client, tree).await;
    create(&client, "w", 1).await;
    wait_ready(&client, "w", LIMIT).await;
    let child = configmap_in(&edge_cluster.client(), "hello-w")
        .await
        .expect("the child is in the remote");
    assert!(
        child.owner_references().is_empty(),
        "no owner reference across clusters"
    );
    assert!(
        configmap_in(&client, "hello-w").await.is_none(),
        "nothing in the management cluster"
    );

    // The remote goes down, then the widget is deleted: its children are not taken for gone.
    edge.down.store(true, Ordering::SeqCst);
    delete(&client, "w").await;
    let s = wait_reason(&client, "w", "RemoteClusterUnavailable", LIMIT).await;
    assert_eq!(s.phase, Some(Phase::Terminating));
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(
        status_of(&client, "w").await.is_some(),
        "deletion waits for the remote"
    );
    assert!(
        configmap_in(&edge_cluster.client(), "hello-w")
            .await
            .is_some()
    );

    edge.down.store(false, Ordering::SeqCst);
    wait_gone(&client, "w", LIMIT).await;
    assert!(
        configmap_in(&edge_cluster.client(), "hello-w")
            .await
            .is_none(),
        "the child was deleted in the remote"
    );
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn registration_comes_before_every_child_and_goes_after_the_last_user_deprovisioned() {
    let (_mgmt, client) = cluster();
    let edge_cluster = ApiServer::new();
    let cd = Arc::new(MemoryCd::default());
    let release_b = Arc::new(AtomicBool::new(false));
    // Two remote provisioners of one object share the remote "edge"; a sibling of the first
    // yields on its first reconcile and the second fails on its first reconcile: children must still only
    // ever run with "edge" registered.
    let child = |name: &'static str, cd: Arc<MemoryCd>, gate: Option<Arc<AtomicBool>>| {
        let cd2 = cd.clone();
        let log = move |what: String| cd2.log.lock().unwrap().push(what);
        let first = Arc::new(AtomicBool::new(true));
        let log2 = log.clone();
        boxed(
            step(name, move |cx: Context<Widget>| {
                let cd = cd.clone();
                let log = log.clone();
                let first = first.clone();
                async move {
                    if cd.users("edge").is_empty()
                        || cx.remote().map(|r| r.id.as_str()) != Some("edge")
                    {
                        log(format!(
                            "VIOLATION: {name} provisioned outside a registered edge"
                        ));
                    }
                    log(format!("provision {name}"));
                    if first.swap(false, Ordering::SeqCst) {
                        return match name {
                            "a" => Outcome::yield_now(Reason::new("NotYet", "a yields once")),
                            _ => Outcome::failed(
                                Reason::new("Flaky", "b fails once"),
                                std::io::Error::other("boom"),
                            ),
                        };
                    }
                    Outcome::Done
                }
            })
            .on_delete(move |_cx: Context<Widget>| {
                let log = log2.clone();
                let gate = gate.clone();
                async move {
                    if let Some(g) = &gate
                        && !g.load(Ordering::SeqCst)
                    {
                        return Outcome::yield_now(Reason::new("Draining", "b drains"));
                    }
                    log(format!("deprovision {name}"));
                    Outcome::Done
                }
            }),
        )
    };
    let edge_a = FixedCluster::config("edge", edge_config());
    let edge_b = edge_a.clone();
    let _ = edge_cluster;
    let tree = concurrent![
        remote(
            "ra",
            move |_w: &Widget| edge_a.clone(),
            vec![child("a", cd.clone(), None)]
        )
        .registered_with(cd.clone()),
        remote(
            "rb",
            move |_w: &Widget| edge_b.clone(),
            vec![child("b", cd.clone(), Some(release_b.clone()))]
        )
        .registered_with(cd.clone()),
    ];
    let rt = start(&client, tree).await;
    create(&client, "w", 1).await;
    wait_ready(&client, "w", LIMIT).await;
    let users = cd.users("edge");
    assert_eq!(
        users.len(),
        2,
        "each remote provisioner is a user: {users:?}"
    );

    delete(&client, "w").await;
    wait_reason(&client, "w", "Draining", LIMIT).await;
    // b's children are not done: b has not unregistered; a has (its children are), but the
    // registration stays for b.
    let users = cd.users("edge");
    assert_eq!(users.len(), 1, "{users:?}");
    assert!(users.iter().next().unwrap().ends_with(" rb"));
    release_b.store(true, Ordering::SeqCst);
    wait_gone(&client, "w", LIMIT).await;
    assert!(
        cd.users("edge").is_empty(),
        "unregistered after the last user"
    );
    let log = cd.log();
    assert!(!log.iter().any(|l| l.starts_with("VIOLATION")), "{log:?}");
    let pos = |what: &str| {
        log.iter()
            .position(|l| l.starts_with(what))
            .unwrap_or_else(|| panic!("{what} in {log:?}"))
    };
    assert!(
        pos("deprovision b") < pos("unregister edge Widget default/w rb"),
        "{log:?}"
    );
    assert!(
        pos("deprovision a") < pos("unregister edge Widget default/w ra"),
        "{log:?}"
    );
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_kubeconfig_secret_that_is_missing_yields_and_one_that_does_not_parse_is_terminal_without_its_content()
 {
    let (_mgmt, client) = cluster();
    let tree = remote(
        "edge",
        |w: &Widget| KubeconfigSecret::cluster_api("default", &w.spec.note),
        vec![boxed(resource("hello", |_w: &Widget| configmap("hello")))],
    );
    let rt = start(&client, tree).await;
    let mut w = widget("w", 1);
    w.spec.note = "edge".into();
    widgets(&client)
        .create(&PostParams::default(), &w)
        .await
        .unwrap();
    let s = wait_reason(&client, "w", "RemoteClusterUnavailable", LIMIT).await;
    assert!(
        s.ready()
            .unwrap()
            .message
            .contains("default/edge-kubeconfig"),
        "{s:?}"
    );
    assert_eq!(s.phase, Some(Phase::Progressing));

    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let garbage = "not: [a kubeconfig, token: hunter2";
    let mut secret = Secret {
        metadata: ObjectMeta {
            name: Some("edge-kubeconfig".into()),
            ..Default::default()
        },
        string_data: Some([("value".to_string(), garbage.to_string())].into()),
        ..Default::default()
    };
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let s = wait_reason(&client, "w", "KubeconfigInvalid", LIMIT).await;
    let message = &s.ready().unwrap().message;
    assert!(
        message.contains("default/edge-kubeconfig"),
        "names the Secret: {message}"
    );
    assert!(
        !message.contains("hunter2") && !message.contains("not: ["),
        "never its content: {message}"
    );
    assert_eq!(s.phase, Some(Phase::Failed));

    // A valid kubeconfig (of a cluster that is not there): the remote is entered, and the
    // child's apply fails instead.
    let kubeconfig = "apiVersion: v1\nkind: Config\nclusters:\n- name: edge\n  cluster:\n    server: https://127.0.0.1:1\ncontexts:\n- name: edge\n  context:\n    cluster: edge\n    user: edge\ncurrent-context: edge\nusers:\n- name: edge\n  user:\n    token: hunter2\n";
    secret.string_data = Some([("value".to_string(), kubeconfig.to_string())].into());
    secrets
        .replace("edge-kubeconfig", &PostParams::default(), &secret)
        .await
        .unwrap();
    // A spec change re-runs the Terminal object (the Secret itself is not watched).
    widgets(&client)
        .patch(
            "w",
            &Default::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"size": 2}})),
        )
        .await
        .unwrap();
    let s = wait_reason(&client, "w", "ApplyFailed", LIMIT).await;
    assert!(!s.ready().unwrap().message.contains("hunter2"));
    rt.shutdown().await;
}

fn catalog() -> Arc<Catalog> {
    Arc::new(
        Catalog::new()
            .chart("web", "1.0.0", "https://charts.example", "web")
            .chart("web", "2.0.0", "https://charts.example", "web"),
    )
}

/// Widgets deploy application `web` at the version in their note (`allow-degraded` in the
/// note's suffix accepts Degraded).
fn app_tree(cd: Arc<MemoryCd>) -> impl Provisioner<Widget> {
    application("web", cd, catalog(), |w: &Widget| {
        AppRef::new("web", w.spec.note.split(' ').next().unwrap_or_default())
    })
    .release_name(|w: &Widget| format!("web-{}", w.name_any()))
    .customize(|w: &Widget, spec| {
        spec.allow_degraded = w.spec.note.ends_with("allow-degraded");
        if w.spec.size > 100 {
            return Err("size above 100".into());
        }
        Ok(())
    })
}

fn identity(name: &str) -> String {
    AppIdentity::new(
        &crate::common::names(),
        "Widget",
        Some("default"),
        name,
        "web",
        None,
    )
    .selector()
}

async fn create_app(client: &Client, name: &str, note: &str, size: i32) {
    let mut w = widget(name, size);
    w.spec.note = note.into();
    widgets(client)
        .create(&PostParams::default(), &w)
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_application_progresses_until_healthy_and_degraded_only_counts_when_allowed() {
    let (_mgmt, client) = cluster();
    let cd = Arc::new(MemoryCd::default());
    let rt = start(&client, app_tree(cd.clone())).await;
    create_app(&client, "a", "1.0.0", 1).await;
    create_app(&client, "b", "1.0.0 allow-degraded", 1).await;
    wait_reason(&client, "a", "ApplicationProgressing", LIMIT).await;
    assert_eq!(cd.app_identities().len(), 2);
    cd.set_health(&identity("a"), AppHealth::Healthy);
    wait_ready(&client, "a", LIMIT).await;
    cd.set_health(
        &identity("b"),
        AppHealth::Degraded("a pod crash-loops".into()),
    );
    wait_ready(&client, "b", LIMIT).await;
    // a's application turns Degraded: a's next reconcile (its spec changed) yields on it.
    cd.set_health(
        &identity("a"),
        AppHealth::Degraded("a pod crash-loops".into()),
    );
    set_note(&client, "a", "2.0.0").await;
    let s = wait_reason(&client, "a", "ApplicationDegraded", LIMIT).await;
    assert!(s.ready().unwrap().message.contains("crash-loops"));
    let spec = cd.apps.lock().unwrap()[&identity("a")].0.clone();
    assert_eq!(
        (&spec.source, spec.release.as_str()),
        (
            &actorcile::provisioners::cd::AppSource::helm("https://charts.example", "web", "2.0.0"),
            "web-a"
        )
    );
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn unknown_applications_and_versions_are_terminal_and_hooks_and_ambiguity_fail_typed() {
    let (_mgmt, client) = cluster();
    let cd = Arc::new(MemoryCd::default());
    cd.duplicated.lock().unwrap().insert(identity("twice"));
    let rt = start(&client, app_tree(cd.clone())).await;
    create_app(&client, "old", "0.1.0", 1).await;
    create_app(&client, "huge", "1.0.0", 1000).await;
    create_app(&client, "twice", "1.0.0", 1).await;
    let s = wait_reason(&client, "old", "ApplicationVersionNotFound", LIMIT).await;
    assert_eq!(s.phase, Some(Phase::Failed));
    let s = wait_reason(&client, "huge", "ApplicationHookFailed", LIMIT).await;
    assert!(
        !s.ready().unwrap().message.contains("size above 100"),
        "the hook's error is not status"
    );
    let s = wait_reason(&client, "twice", "ApplicationAmbiguous", LIMIT).await;
    assert!(
        s.ready().unwrap().message.contains("2 memory applications"),
        "{s:?}"
    );
    assert!(cd.app_identities().is_empty(), "nothing applied");
    rt.shutdown().await;
    let (_mgmt, client) = cluster();
    let tree = application("web", cd.clone(), catalog(), |_w: &Widget| {
        AppRef::new("nginx", "1")
    });
    let rt = start(&client, tree).await;
    create_app(&client, "x", "", 1).await;
    let s = wait_reason(&client, "x", "ApplicationNotFound", LIMIT).await;
    assert_eq!(s.phase, Some(Phase::Failed));
    rt.shutdown().await;
}

/// Every hook and switch of `application` reaches the spec it applies; `post_provision` runs
/// only once the application is healthy; on deletion `pre_deprovision` runs first, and while it
/// does not end `Done` nothing is deleted.
#[tokio::test(start_paused = true)]
async fn every_hook_reaches_the_spec_and_the_provision_hooks_run_in_their_place() {
    use actorcile::provisioners::cd::{AppSource, IgnoreDifference};
    let (_mgmt, client) = cluster();
    let cd = Arc::new(MemoryCd::default());
    let after_healthy = Arc::new(AtomicUsize::new(0));
    let drained = Arc::new(AtomicBool::new(false));
    let catalog = Arc::new(Catalog::new().git(
        "web",
        "1.0.0",
        "https://git.example/apps.git",
        "web",
        "v1.0.0",
    ));
    let (after, drain, log) = (after_healthy.clone(), drained.clone(), cd.clone());
    let tree = application("web", cd.clone(), catalog, |_w: &Widget| {
        AppRef::new("web", "1.0.0")
    })
    .namespace(|w: &Widget| format!("ns-{}", w.name_any()))
    .namespace_labels(|w: &Widget| [("owner".to_string(), w.name_any())].into())
    .namespace_annotations(|_w: &Widget| [("team".to_string(), "web".to_string())].into())
    .parameters(|w: &Widget| Ok([("size".to_string(), w.spec.size.to_string())].into()))
    .values(|w: &Widget| Ok(serde_json::json!({ "note": w.spec.note })))
    .create_namespace(false)
    .server_side_apply(true)
    .ignore_difference(IgnoreDifference {
        group: "apps".into(),
        kind: "Deployment".into(),
        json_pointers: vec!["/spec/replicas".into()],
        ..Default::default()
    })
    .post_provision(step("after", move |_cx: Context<Widget>| {
        let after = after.clone();
        async move {
            after.fetch_add(1, Ordering::SeqCst);
            Outcome::Done
        }
    }))
    .pre_deprovision(step("drain", move |_cx: Context<Widget>| {
        let (drain, log) = (drain.clone(), log.clone());
        async move {
            log.log.lock().unwrap().push("drain".into());
            if drain.load(Ordering::SeqCst) {
                Outcome::Done
            } else {
                Outcome::failed(
                    Reason::new("DrainFailed", "still serving"),
                    std::io::Error::other("still serving"),
                )
            }
        }
    }));
    let rt = start(&client, tree).await;
    create_app(&client, "a", "hello", 3).await;
    // Progressing: applied, and post_provision has not run (this reconcile saw it unhealthy).
    wait_reason(&client, "a", "ApplicationProgressing", LIMIT).await;
    assert_eq!(after_healthy.load(Ordering::SeqCst), 0);
    let spec = cd.apps.lock().unwrap()[&identity("a")].0.clone();
    assert_eq!(
        spec.source,
        AppSource::git("https://git.example/apps.git", "web", "v1.0.0")
    );
    assert_eq!(spec.namespace, "ns-a");
    assert_eq!(spec.namespace_labels["owner"], "a");
    assert_eq!(spec.namespace_annotations["team"], "web");
    assert_eq!(spec.parameters["size"], "3");
    assert_eq!(spec.values, Some(serde_json::json!({ "note": "hello" })));
    assert!(!spec.create_namespace && spec.server_side_apply);
    assert_eq!(spec.ignore_differences.len(), 1);
    cd.set_health(&identity("a"), AppHealth::Healthy);
    wait_ready(&client, "a", LIMIT).await;
    assert!(after_healthy.load(Ordering::SeqCst) >= 1);

    // Deletion: the drain fails, so the application stays; once it succeeds, it goes.
    delete(&client, "a").await;
    wait_reason(&client, "a", "DrainFailed", LIMIT).await;
    assert!(cd.log().contains(&"drain".to_string()));
    assert!(
        !cd.log().iter().any(|l| l.starts_with("delete")),
        "{:?}",
        cd.log()
    );
    assert_eq!(cd.app_identities().len(), 1);
    drained.store(true, Ordering::SeqCst);
    wait_gone(&client, "a", LIMIT).await;
    let log = cd.log();
    let drain = log.iter().rposition(|l| l == "drain").unwrap();
    let deleted = log.iter().position(|l| l.starts_with("delete")).unwrap();
    assert!(drain < deleted, "{log:?}");
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn deleting_an_application_waits_for_the_cd_system_unless_in_the_background() {
    let (_mgmt, client) = cluster();
    let cd = Arc::new(MemoryCd::default());
    cd.hold_deletion.store(true, Ordering::SeqCst);
    let background = Arc::new(MemoryCd::default());
    background.hold_deletion.store(true, Ordering::SeqCst);
    let tree = concurrent![
        app_tree(cd.clone()),
        application("bg", background.clone(), catalog(), |_w: &Widget| {
            AppRef::new("web", "1.0.0")
        })
        .background_delete(true),
    ];
    let rt = start(&client, tree).await;
    create_app(&client, "a", "1.0.0", 1).await;
    eventually("both applied", LIMIT, || async {
        (cd.app_identities().len() == 1 && background.app_identities().len() == 1).then_some(())
    })
    .await;
    cd.set_health(&identity("a"), AppHealth::Healthy);
    let bg = AppIdentity::new(
        &crate::common::names(),
        "Widget",
        Some("default"),
        "a",
        "bg",
        None,
    )
    .selector();
    background.set_health(&bg, AppHealth::Healthy);
    wait_ready(&client, "a", LIMIT).await;
    delete(&client, "a").await;
    wait_reason(&client, "a", "ApplicationDeleting", LIMIT).await;
    assert!(
        background.app_identities().is_empty(),
        "background delete does not wait"
    );
    assert_eq!(cd.app_identities().len(), 1, "foreground delete waits");
    cd.hold_deletion.store(false, Ordering::SeqCst);
    cd.apps.lock().unwrap().clear();
    wait_gone(&client, "a", LIMIT).await;
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_application_in_a_registered_remote_deploys_there_and_in_an_unregistered_one_is_terminal()
 {
    let (_mgmt, client) = cluster();
    let cd = Arc::new(MemoryCd::default());
    let c2 = cd.clone();
    let tree = concurrent![
        remote(
            "registered",
            |_w: &Widget| FixedCluster::config("edge", edge_config()),
            vec![boxed(app_tree(cd.clone()))]
        )
        .registered_with(cd.clone()),
        conditional(
            "unregistered",
            |w: &Widget| w.spec.size > 1,
            remote(
                "plain",
                |_w: &Widget| FixedCluster::config("far", edge_config()),
                vec![boxed(application(
                    "far-web",
                    c2,
                    catalog(),
                    |_w: &Widget| AppRef::new("web", "1.0.0")
                ))]
            ),
        ),
    ];
    let rt = start(&client, tree).await;
    create_app(&client, "a", "1.0.0", 1).await;
    let key = AppIdentity::new(
        &crate::common::names(),
        "Widget",
        Some("default"),
        "a",
        "web",
        Some("edge"),
    )
    .selector();
    eventually("applied into edge", LIMIT, || async {
        cd.app_identities().contains(&key).then_some(())
    })
    .await;
    let spec = cd.apps.lock().unwrap()[&key].0.clone();
    assert_eq!(
        spec.destination,
        actorcile::provisioners::cd::Destination::Registered("edge".into())
    );
    cd.set_health(&key, AppHealth::Healthy);
    wait_ready(&client, "a", LIMIT).await;
    // The registration carries the server and the token for the CD system, and nothing of it
    // reaches the status.
    widgets(&client)
        .patch(
            "a",
            &Default::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"size": 2}})),
        )
        .await
        .unwrap();
    let s = wait_reason(&client, "a", "RemoteNotRegistered", LIMIT).await;
    assert!(s.ready().unwrap().message.contains("far"));
    assert!(!s.ready().unwrap().message.contains("sekret"));
    assert!(
        !cd.log().iter().any(|l| l.starts_with("VIOLATION")),
        "{:?}",
        cd.log()
    );
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_kubeconfig_secret_of_another_namespace_is_refused_unless_the_controller_allows_it() {
    let (_mgmt, client) = cluster();
    let tree = remote(
        "edge",
        |w: &Widget| {
            let secret = KubeconfigSecret::cluster_api("other", &w.spec.note);
            if w.metadata.name.as_deref() == Some("allowed") {
                secret.from_any_namespace()
            } else {
                secret
            }
        },
        vec![boxed(resource("hello", |_w: &Widget| configmap("hello")))],
    );
    let rt = start(&client, tree).await;
    for name in ["refused", "allowed"] {
        let mut w = widget(name, 1);
        w.spec.note = "edge".into();
        widgets(&client)
            .create(&PostParams::default(), &w)
            .await
            .unwrap();
    }
    // The object lives in `default`; its remote names a Secret in `other`.
    let s = wait_reason(&client, "refused", "KubeconfigInvalid", LIMIT).await;
    let message = &s.ready().unwrap().message;
    assert!(
        message.contains("other") && message.contains("own namespace default"),
        "{message}"
    );
    // Allowed by the controller: the Secret is looked up there (and is missing).
    wait_reason(&client, "allowed", "RemoteClusterUnavailable", LIMIT).await;
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_remote_gone_for_good_blocks_deletion_unless_the_author_abandons_it_with_a_warning() {
    let (_cluster, client) = cluster();
    // Both kinds' remotes read a kubeconfig Secret that does not exist: Widgets abandon it at
    // once on deletion, Gadgets (the default) wait.
    let widget_tree = actorcile::provisioners::remote(
        "edge",
        |w: &Widget| KubeconfigSecret::new(w.namespace().unwrap_or_default(), "gone-kubeconfig"),
        vec![boxed(step("w-child", |_cx: Context<Widget>| async {
            Outcome::Done
        }))],
    )
    .abandon_after(Duration::ZERO);
    let gadget_tree = actorcile::provisioners::remote(
        "edge",
        |g: &Gadget| KubeconfigSecret::new(g.namespace().unwrap_or_default(), "gone-kubeconfig"),
        vec![boxed(step("g-child", |_cx: Context<Gadget>| async {
            Outcome::Done
        }))],
    );
    let rt = Runtime::builder(client.clone(), crate::common::names())
        .policy(test_policy())
        .controller(Controller::<Widget>::new(widget_tree))
        .controller(Controller::<Gadget>::new(gadget_tree))
        .events("remote-test")
        .start()
        .await
        .unwrap();
    create(&client, "w", 1).await;
    let gadgets: Api<Gadget> = Api::namespaced(client.clone(), "default");
    gadgets
        .create(
            &PostParams::default(),
            &Gadget::new("g", Default::default()),
        )
        .await
        .unwrap();
    wait_reason(&client, "w", "RemoteClusterUnavailable", LIMIT).await;
    delete(&client, "w").await;
    gadgets.delete("g", &Default::default()).await.unwrap();
    // The widget goes, with a Warning naming the remote.
    wait_gone(&client, "w", LIMIT).await;
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), "default");
    let abandoned = eventually("a RemoteAbandoned Warning", LIMIT, || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("RemoteAbandoned"))
    })
    .await;
    assert_eq!(abandoned.type_.as_deref(), Some("Warning"));
    let note = abandoned.note.unwrap_or_default();
    assert!(
        note.contains("gone-kubeconfig") && note.contains("may remain"),
        "{note}"
    );
    // The gadget waits for its remote, saying why.
    let status = eventually("the gadget waits for its remote", LIMIT, || async {
        let g = gadgets.get_opt("g").await.ok()??;
        let s = ResourceStatus::of(&g);
        (s.phase == Some(Phase::Terminating) && s.ready()?.message.contains("gone-kubeconfig"))
            .then_some(s)
    })
    .await;
    assert!(!status.is_ready());
    rt.shutdown().await;
}
