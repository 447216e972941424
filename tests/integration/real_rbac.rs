//! The roles the runtime renders ([`RuntimeBuilder::roles`]), on a real API server: for each
//! way an operator runs — a namespaced controller with a config and Secret triggers, CRD
//! installation, sharding, leader election, a remote from a kubeconfig Secret registered with
//! Argo CD — the runtime, started as a non-admin user that holds exactly those roles (with the
//! preflight on), runs objects through their whole life (the roles suffice), and sends requests
//! that need every permission they grant (the roles are minimal).
//!
//! Each case runs in namespaces of its own, so what one case's roles grant never helps another.

use crate::common;
use crate::common::argo;
use crate::common::real;

use std::collections::BTreeSet;
use std::sync::Arc;

use actorcile::envtest::Envtest;
use actorcile::prelude::*;
use actorcile::provisioners::argocd::{ArgoCd, application_crd};
use actorcile::provisioners::{AppRef, application, remote};
use actorcile::rbac::{RuleScope, missing_scoped_permissions};
use actorcile::runtime::RuntimeBuilder;
use argo::{FakeArgo, Script};
use common::{Widget, eventually};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, CustomResourceExt, ResourceExt};
use real::*;

/// A kind whose CRD only the runtime installs (the CRD case).
#[derive(
    kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[kube(
    group = "rbac.actorcile.dev",
    version = "v1",
    kind = "Sprocket",
    namespaced,
    status = "ResourceStatus"
)]
pub struct SprocketSpec {
    size: i32,
}

/// Grants that a case's run does not need to use, each with the reason. `get` on the managed
/// kind serves references (the namespaced-controller test in `real_runtime` takes them), `list`
/// is the fallback of streaming lists, `patch` on Events a repeated Event's series (that
/// test repeats one), and `get` on a `resource` child's kind a deletion the server does not
/// finish at once (finalizers).
const NOT_EXERCISED: &[(&str, &str, &str)] = &[
    ("test.actorcile.dev", "widgets", "get"),
    ("test.actorcile.dev", "widgets", "list"),
    ("rbac.actorcile.dev", "sprockets", "get"),
    ("rbac.actorcile.dev", "sprockets", "list"),
    ("events.k8s.io", "events", "patch"),
    ("", "configmaps", "get"),
];

/// Starts the runtime `build` makes (as the user, preflight on) with `run`, which drives a
/// lifecycle and stops the runtime; then checks the roles were sufficient (it ran) and minimal.
async fn prove<R>(env: &Envtest, case: &str, build: impl Fn(Client) -> RuntimeBuilder, run: R)
where
    R: AsyncFnOnce(RuntimeBuilder),
{
    let admin = env.client();
    let used = Used::default();
    let user = recorded_user_client(env, &used);
    let name = format!("rbac-{case}");
    let roles = build(user.clone()).roles(&name);
    let rules = roles.rules();
    roles
        .apply(&admin, user_subject(env), "realapi-rbac")
        .await
        .expect("apply the roles");
    // RBAC reaches the authorizer through an informer: wait until the roles are in force (with
    // a client that does not record, so the reviews are not counted as the runtime's).
    let checker = Client::try_from(env.user_config()).unwrap();
    eventually(&format!("{case}: the roles in force"), CONVERGE, || async {
        let missing = missing_scoped_permissions(&checker, &rules).await.ok()?;
        missing.is_empty().then_some(())
    })
    .await;
    used.take();
    run(build(user).preflight_rbac(true)).await;

    let used = used.take();
    let not_exercised: BTreeSet<(String, String, String)> = NOT_EXERCISED
        .iter()
        .map(|(g, r, v)| (g.to_string(), r.to_string(), v.to_string()))
        .collect();
    let unused: Vec<_> = granted(&rules)
        .difference(&used)
        .filter(|g| !not_exercised.contains(*g))
        .cloned()
        .collect();
    assert!(
        unused.is_empty(),
        "{case}: the roles grant what the runtime never used: {unused:?}\nused: {used:?}\nroles:\n{}",
        roles.to_yaml().unwrap()
    );
    // Nothing cluster-wide stays behind for the other cases.
    if roles.cluster_role.is_some() {
        let _ = Api::<ClusterRoleBinding>::all(admin.clone())
            .delete(&name, &DeleteParams::default())
            .await;
        let _ = Api::<ClusterRole>::all(admin)
            .delete(&name, &DeleteParams::default())
            .await;
    }
}

/// The catalog of the Argo CD case: `web` in two versions.
fn catalog() -> Arc<actorcile::provisioners::Catalog> {
    Arc::new(
        actorcile::provisioners::Catalog::new()
            .chart("web", "1.0.0", "https://charts.example", "web")
            .chart("web", "2.0.0", "https://charts.example", "web"),
    )
}

/// Counts each widget's reconciles.
fn counting(reconciles: Reconciles) -> impl Provisioner<Widget> {
    step("count", move |cx: Context<Widget>| {
        let reconciles = reconciles.clone();
        async move {
            reconciles.bump(&cx.object().name_any());
            Outcome::Done
        }
    })
}

/// Two widgets made Ready, then deleted and gone.
async fn widget_lifecycle(api: &Ns) {
    let all = ["a".to_string(), "b".to_string()];
    for n in &all {
        api.create_widget(n, 1).await;
    }
    api.wait_all_ready(&all).await;
    for n in &all {
        api.delete(n).await;
    }
    for n in &all {
        api.wait_gone(n).await;
    }
}

/// A ConfigMap named after the widget: its child.
fn child(w: &Widget) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: w.metadata.name.clone(),
            ..Default::default()
        },
        data: Some([("size".to_string(), w.spec.size.to_string())].into()),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_namespaced_controller_with_triggers_and_owned_children_runs_on_its_roles() {
    bounded("rbac: config and secrets", async {
        let env = shared_env().await;
        let api = Ns::create(env.client(), "rbac-triggers").await;
        let ns = api.ns.clone();
        let admin = env.client();
        let configs: Api<ConfigMap> = Api::namespaced(admin.clone(), &ns);
        let secrets: Api<Secret> = Api::namespaced(admin.clone(), &ns);
        let config = |v: &str| ConfigMap {
            metadata: ObjectMeta {
                name: Some("settings".into()),
                ..Default::default()
            },
            data: Some([("v".to_string(), v.to_string())].into()),
            ..Default::default()
        };
        let secret = |v: &str| Secret {
            metadata: ObjectMeta {
                name: Some("creds".into()),
                ..Default::default()
            },
            data: Some([("v".to_string(), ByteString(v.as_bytes().to_vec()))].into()),
            ..Default::default()
        };
        configs
            .create(&PostParams::default(), &config("1"))
            .await
            .unwrap();
        secrets
            .create(&PostParams::default(), &secret("1"))
            .await
            .unwrap();
        let reconciles = Reconciles::default();
        let build = |client: Client| {
            let ns = ns.clone();
            Runtime::builder(client, crate::common::names())
                .policy(real_policy())
                .namespace(&ns)
                .controller(
                    Controller::<Widget>::new(serial![
                        counting(reconciles.clone()),
                        resource("child", child)
                    ])
                    .owns::<ConfigMap>()
                    .config(actorcile::triggers::ConfigRef::<ConfigMap>::namespaced(
                        &ns, "settings",
                    ))
                    .secrets(move |_w: &Widget| {
                        vec![ObjectRef::<Secret>::new("creds").within(&ns)]
                    }),
                )
                .events("realapi-rbac")
        };
        prove(env, "triggers", build, async |builder| {
            let rt = builder
                .start()
                .await
                .expect("start with the rendered roles");
            api.create_widget("a", 1).await;
            api.wait_ready("a").await;
            // The Secret it references changes: it runs again.
            let before = reconciles.of("a");
            secrets
                .replace("creds", &PostParams::default(), &{
                    let mut s = secrets.get("creds").await.unwrap();
                    s.data = secret("2").data;
                    s
                })
                .await
                .unwrap();
            eventually("a runs for the Secret", CONVERGE, || async {
                (reconciles.of("a") > before).then_some(())
            })
            .await;
            // The config changes: it runs again.
            let before = reconciles.of("a");
            configs
                .patch(
                    "settings",
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({"data": {"v": "2"}})),
                )
                .await
                .unwrap();
            eventually("a runs for the config", CONVERGE, || async {
                (reconciles.of("a") > before).then_some(())
            })
            .await;
            // Its child deleted by hand: back at once (no poll in this policy).
            configs.delete("a", &DeleteParams::default()).await.unwrap();
            eventually("a's child back", CONVERGE, || async {
                configs.get_opt("a").await.ok()?.map(|_| ())
            })
            .await;
            api.delete("a").await;
            api.wait_gone("a").await;
            rt.shutdown().await;
        })
        .await;
    })
    .await;
}

#[tokio::test]
async fn installing_crds_runs_on_its_roles() {
    bounded("rbac: CRDs", async {
        let env = shared_env().await;
        let admin = env.client();
        let ns = "rbac-crds";
        create_namespace(&admin, ns).await;
        let sprockets: Api<Sprocket> = Api::namespaced(admin.clone(), ns);
        let build = |client: Client| {
            Runtime::builder(client, crate::common::names())
                .policy(real_policy())
                .install_crds([Sprocket::crd()])
                .controller(
                    Controller::<Sprocket>::new(step("noop", |_cx: Context<Sprocket>| async {
                        Outcome::Done
                    }))
                    .namespace(ns),
                )
                .events("realapi-rbac")
        };
        prove(env, "crds", build, async |builder| {
            let rt = builder
                .start()
                .await
                .expect("start with the rendered roles");
            sprockets
                .create(
                    &PostParams::default(),
                    &Sprocket::new("s", SprocketSpec { size: 1 }),
                )
                .await
                .expect("create a Sprocket");
            eventually("the Sprocket Ready", CONVERGE, || async {
                let s = sprockets.get_opt("s").await.ok()??;
                ResourceStatus::of(&s).is_ready().then_some(())
            })
            .await;
            sprockets
                .delete("s", &DeleteParams::default())
                .await
                .unwrap();
            eventually("the Sprocket gone", CONVERGE, || async {
                matches!(sprockets.get_opt("s").await, Ok(None)).then_some(())
            })
            .await;
            rt.shutdown().await;
        })
        .await;
    })
    .await;
}

#[tokio::test]
async fn sharding_runs_on_its_roles() {
    bounded("rbac: sharding", async {
        let env = shared_env().await;
        let api = Ns::create(env.client(), "rbac-sharding").await;
        let ns = api.ns.clone();
        let build = |client: Client| {
            Runtime::builder(client, crate::common::names())
                .policy(real_policy())
                .controller(
                    Controller::<Widget>::new(counting(Reconciles::default())).namespace(&ns),
                )
                .sharding(actorcile::sharding::Sharding::new(2, &ns))
                .events("realapi-rbac")
        };
        prove(env, "sharding", build, async |builder| {
            let rt = builder
                .start()
                .await
                .expect("start with the rendered roles");
            widget_lifecycle(&api).await;
            rt.shutdown().await;
        })
        .await;
    })
    .await;
}

/// A controller of two namespaces: one watch each, on a Role in each and nothing cluster-wide.
#[tokio::test]
async fn a_controller_of_two_namespaces_runs_on_a_role_in_each() {
    bounded("rbac: two namespaces", async {
        let env = shared_env().await;
        let a = Ns::create(env.client(), "rbac-two-a").await;
        let b = Ns::create(env.client(), "rbac-two-b").await;
        let namespaces = [a.ns.clone(), b.ns.clone()];
        let build = |client: Client| {
            Runtime::builder(client, crate::common::names())
                .policy(real_policy())
                .controller(
                    Controller::<Widget>::new(counting(Reconciles::default()))
                        .namespaces(namespaces.clone()),
                )
                .events("realapi-rbac")
        };
        let roles = build(env.client()).roles("rbac-two");
        assert!(
            roles.cluster_role.is_none(),
            "nothing cluster-wide: {}",
            roles.to_yaml().unwrap()
        );
        let role_namespaces: Vec<_> = roles
            .roles
            .iter()
            .filter_map(|r| r.metadata.namespace.clone())
            .collect();
        assert_eq!(role_namespaces, namespaces, "a Role in each namespace");
        prove(env, "two-namespaces", build, async |builder| {
            let rt = builder
                .start()
                .await
                .expect("start with the rendered roles");
            futures::join!(widget_lifecycle(&a), widget_lifecycle(&b));
            rt.shutdown().await;
        })
        .await;
    })
    .await;
}

#[tokio::test]
async fn leader_election_runs_on_its_roles() {
    bounded("rbac: leader election", async {
        let env = shared_env().await;
        let api = Ns::create(env.client(), "rbac-leader").await;
        let ns = api.ns.clone();
        let build = |client: Client| {
            Runtime::builder(client, crate::common::names())
                .policy(real_policy())
                .controller(
                    Controller::<Widget>::new(counting(Reconciles::default())).namespace(&ns),
                )
                .leader_election(actorcile::leader::LeaderElection::new("rbac-leader", &ns))
                .events("realapi-rbac")
        };
        prove(env, "leader", build, async |builder| {
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let run = tokio::spawn(builder.run_until(async {
                let _ = stopped.await;
            }));
            widget_lifecycle(&api).await;
            let _ = stop.send(());
            run.await
                .expect("the runtime's task")
                .expect("run with the rendered roles");
        })
        .await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_registered_with_argo_cd_runs_on_its_roles() {
    bounded("rbac: remote and Argo CD", async {
        let env = shared_env().await;
        let admin = env.client();
        env.install_crds(&[application_crd()])
            .await
            .expect("install the Application CRD");
        let argo_ns = "argocd-rbac";
        create_namespace(&admin, argo_ns).await;
        let fake = Arc::new(FakeArgo::default());
        let _argo = fake.spawn(admin.clone(), argo_ns);
        let api = Ns::create(admin.clone(), "rbac-remote").await;
        let ns = api.ns.clone();
        // The remote is this cluster, reached as the admin through a kubeconfig Secret in the
        // objects' namespace.
        crate::real_remote::put_kubeconfig(&admin, &ns, "edge", env.kubeconfig_path()).await;
        let build = |client: Client| {
            let driver = Arc::new(ArgoCd::new(
                client.clone(),
                argo_ns,
                &crate::common::names(),
            ));
            let ns_of = ns.clone();
            let tree = remote(
                "edge",
                move |_w: &Widget| actorcile::provisioners::KubeconfigSecret::new(&ns_of, "edge"),
                vec![boxed(
                    application("web", driver.clone(), catalog(), |w: &Widget| {
                        // A widget noted `v2` moves its application to 2.0.0 (a replaced spec).
                        let version = if w.spec.note == "v2" {
                            "2.0.0"
                        } else {
                            "1.0.0"
                        };
                        AppRef::new("web", version)
                    })
                    .release_name(|w: &Widget| format!("web-{}", w.name_any())),
                )],
            )
            .registered_with(driver);
            Runtime::builder(client, crate::common::names())
                .policy(real_policy())
                .controller(Controller::<Widget>::new(tree).namespace(&ns))
                .events("realapi-rbac")
        };
        let roles = build(admin.clone()).roles("probe");
        let argo_scope = RuleScope::namespace(argo_ns);
        assert!(
            roles.rules().iter().any(|r| r.scope == argo_scope),
            "the driver's rules are in Argo CD's namespace"
        );
        assert!(roles.cluster_role.is_none(), "nothing cluster-wide");
        prove(env, "remote", build, async |builder| {
            let rt = builder
                .start()
                .await
                .expect("start with the rendered roles");
            for n in ["a", "b", "v"] {
                fake.script(n, Script::Health("Healthy"));
            }
            api.create_widget("v", 1).await;
            api.wait_ready("v").await;
            api.patch_spec("v", serde_json::json!({ "note": "v2" }))
                .await;
            api.wait_ready_at("v", 2).await;
            api.delete("v").await;
            api.wait_gone("v").await;
            widget_lifecycle(&api).await;
            rt.shutdown().await;
        })
        .await;
    })
    .await;
}

#[tokio::test]
async fn a_watch_the_server_refuses_fails_readiness_naming_the_permission() {
    bounded("rbac: a refused watch", async {
        let env = shared_env().await;
        let admin = env.client();
        let api = Ns::create(admin.clone(), "rbac-refused").await;
        let user = Client::try_from(env.user_config()).unwrap();
        // The roles of a controller confined to the namespace...
        let confined = |client: Client| {
            Runtime::builder(client, crate::common::names())
                .policy(real_policy())
                .controller(
                    Controller::<Widget>::new(counting(Reconciles::default())).namespace(&api.ns),
                )
        };
        let roles = confined(user.clone()).roles("rbac-refused");
        roles
            .apply(&admin, user_subject(env), "realapi-rbac")
            .await
            .expect("apply the roles");
        let rules = roles.rules();
        eventually("the roles in force", CONVERGE, || async {
            let missing = missing_scoped_permissions(&user, &rules).await.ok()?;
            missing.is_empty().then_some(())
        })
        .await;
        // ...are not enough to watch every namespace: the runtime starts (no preflight), and
        // /readyz says why it is not ready.
        let everywhere = Runtime::builder(user.clone(), crate::common::names())
            .policy(real_policy())
            .controller(Controller::<Widget>::new(counting(Reconciles::default())))
            .start()
            .await
            .expect("start without preflight");
        let health = everywhere.health();
        let detail = eventually("readiness names the refusal", CONVERGE, || async {
            let probe = health.ready();
            (!probe.ok && probe.detail.contains("refused")).then_some(probe.detail)
        })
        .await;
        assert!(
            detail.contains("widgets") && detail.contains("cluster scope"),
            "{detail}"
        );
        everywhere.shutdown().await;
        // Confined to the namespace, the same user is ready.
        let rt = confined(user.clone())
            .start()
            .await
            .expect("start confined");
        let health = rt.health();
        eventually("ready when confined", CONVERGE, || async {
            health.ready().ok.then_some(())
        })
        .await;
        rt.shutdown().await;
        // With a second namespace it holds no Role in: /readyz names that namespace's watch,
        // and the objects of the first still run.
        let other = Ns::create(admin.clone(), "rbac-unlisted").await;
        let rt = Runtime::builder(user, crate::common::names())
            .policy(real_policy())
            .controller(
                Controller::<Widget>::new(counting(Reconciles::default()))
                    .namespaces([api.ns.clone(), other.ns.clone()]),
            )
            .start()
            .await
            .expect("start without preflight");
        let health = rt.health();
        api.create_widget("runs", 1).await;
        api.wait_all_ready(&["runs".to_string()]).await;
        let detail = eventually("readiness names the other namespace", CONVERGE, || async {
            let probe = health.ready();
            (!probe.ok && probe.detail.contains("refused")).then_some(probe.detail)
        })
        .await;
        assert!(
            detail.contains(&format!("Widget in {}", other.ns))
                && !detail.contains(&format!("Widget in {}", api.ns)),
            "{detail}"
        );
        rt.shutdown().await;
    })
    .await;
}

/// `needs` → `require_ready` on the sibling widgets.
fn needs_tree() -> impl Provisioner<Widget> {
    step("needs", |cx: Context<Widget>| async move {
        let ns = cx.object().namespace();
        for n in &cx.object().spec.needs {
            let target = Target::for_kind::<Widget>(ns.as_deref(), n);
            if let Some(wait) = cx.require_ready(&target).await {
                return wait;
            }
        }
        Outcome::Done
    })
}

/// Two replicas of a namespaced controller that watch only their shards' objects: an object
/// waiting on one in the other replica's shard reads it through a watch of its own, which the
/// namespaced roles must grant (a watch of the target's namespace, not a cluster-wide one).
#[tokio::test]
async fn a_namespaced_controller_waiting_on_another_replicas_shard_runs_on_its_roles() {
    use actorcile::sharding::{ShardWatch, Sharding, object_key, shard_of};
    bounded("rbac: readiness across shards", async {
        let env = shared_env().await;
        let api = Ns::create(env.client(), "rbac-cross-shard").await;
        let ns = api.ns.clone();
        let build = |client: Client, id: &str| {
            Runtime::builder(client, crate::common::names())
                .policy(real_policy())
                .controller(Controller::<Widget>::new(needs_tree()).namespace(&ns))
                .sharding(
                    Sharding::new(2, &ns)
                        .watch(ShardWatch::HeldShards)
                        .identity(id),
                )
                .events("realapi-rbac")
        };
        prove(
            env,
            "cross-shard",
            |c| build(c, "one"),
            async |builder| {
                let one = builder
                    .start()
                    .await
                    .expect("start with the rendered roles");
                let user = Client::try_from(env.user_config()).unwrap();
                let two = build(user, "two")
                    .preflight_rbac(true)
                    .start()
                    .await
                    .expect("start the second replica with the rendered roles");
                eventually("each replica holds a shard", CONVERGE, || async {
                    (one.health().shards_held().len() == 1 && two.health().shards_held().len() == 1)
                        .then_some(())
                })
                .await;
                // A chain, each widget needing the next: some links cross the shards.
                let names: Vec<String> = (0..8).map(|i| format!("w{i}")).collect();
                let shard = |n: &str| shard_of(&object_key(Some(&ns), n), 2);
                assert!(
                    names.windows(2).any(|p| shard(&p[0]) != shard(&p[1])),
                    "the chain crosses the shards"
                );
                for (i, n) in names.iter().enumerate() {
                    let needs: Vec<&str> =
                        names.get(i + 1).map(|s| s.as_str()).into_iter().collect();
                    api.create_with(n, &needs, &[]).await;
                }
                api.wait_all_ready(&names).await;
                for n in &names {
                    api.delete(n).await;
                }
                for n in &names {
                    api.wait_gone(n).await;
                }
                two.shutdown().await;
                one.shutdown().await;
            },
        )
        .await;
    })
    .await;
}
