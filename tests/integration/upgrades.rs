//! Operators upgraded to names of their own ([`OperatorNames`]).
//!
//! From the finalizer its objects carry ([`LEGACY_FINALIZER`]), with
//! `RuntimeBuilder::migrate_finalizer`: the old finalizer is replaced in place on a live object,
//! an object deleted before the upgrade is deprovisioned and released, no object keeps a
//! finalizer nothing removes, and nothing is provisioned or deprovisioned twice.
//!
//! From the former domain ([`LEGACY_DOMAIN`], with `OperatorNames::former_domain`): the
//! references the old operator persisted still hold their targets, the children it marked as
//! an object's are still that object's, and its finalizer is migrated; without the former
//! domain the same children are refused as someone else's.
//!
//! Each case runs on the in-process cluster and on a real kube-apiserver.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actorcile::names::{LEGACY_DOMAIN, LEGACY_FINALIZER};
use actorcile::prelude::*;
use actorcile::references::referrers_of;
use actorcile::runtime::{Error, Setting};
use actorcile::testing::eventually;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};

use crate::common::{FINALIZER, Widget, names, test_policy, widget};

/// A finalizer of someone else's, which the runtime keeps where it is.
const OTHERS: &str = "others.example.com/keep";
const LIMIT: Duration = Duration::from_secs(60);

/// How many times each step half ran, by `provision:<name>` / `deprovision:<name>`.
#[derive(Clone, Default)]
struct Runs(Arc<Mutex<HashMap<String, u32>>>);

impl Runs {
    fn bump(&self, key: String) {
        *self.0.lock().unwrap().entry(key).or_default() += 1;
    }
    fn of(&self, key: &str) -> u32 {
        self.0.lock().unwrap().get(key).copied().unwrap_or(0)
    }
}

fn tree(runs: &Runs) -> impl Provisioner<Widget> + 'static {
    let (p, d) = (runs.clone(), runs.clone());
    step("work", move |cx: Context<Widget>| {
        let runs = p.clone();
        async move {
            runs.bump(format!("provision:{}", cx.object().name_any()));
            Outcome::Done
        }
    })
    .on_delete(move |cx: Context<Widget>| {
        let runs = d.clone();
        async move {
            runs.bump(format!("deprovision:{}", cx.object().name_any()));
            Outcome::Done
        }
    })
}

async fn finalizers(api: &Api<Widget>, name: &str) -> Option<Vec<String>> {
    api.get_opt(name)
        .await
        .ok()
        .flatten()
        .map(|w| w.finalizers().to_vec())
}

/// The upgrade on `client`, in namespace `ns` (which exists).
async fn upgrade_keeps_the_old_operators_objects(client: Client, ns: &str) {
    let api: Api<Widget> = Api::namespaced(client.clone(), ns);
    // What the operator left before the upgrade: a live object with the old finalizer (and
    // another's after it), and one deleted while the operator was down.
    for (name, list) in [
        ("live", vec![LEGACY_FINALIZER, OTHERS]),
        ("leaving", vec![LEGACY_FINALIZER]),
    ] {
        let mut w = widget(name, 1);
        w.metadata.namespace = Some(ns.into());
        w.metadata.finalizers = Some(list.iter().map(|f| f.to_string()).collect());
        api.create(&PostParams::default(), &w).await.unwrap();
    }
    api.delete("leaving", &DeleteParams::default())
        .await
        .unwrap();

    let runs = Runs::default();
    let rt = Runtime::builder(client.clone(), names())
        .policy(test_policy())
        .migrate_finalizer(LEGACY_FINALIZER)
        .controller(Controller::<Widget>::new(tree(&runs)).namespace(ns))
        .start()
        .await
        .expect("start the runtime");

    // The live object: the old finalizer replaced where it stood, the other's kept.
    eventually("the live object's finalizer migrated", LIMIT, || async {
        (finalizers(&api, "live").await? == [FINALIZER, OTHERS]).then_some(())
    })
    .await;
    actorcile::testing::wait_ready(&api, "live", LIMIT).await;
    // The deleted one: deprovisioned under the old finalizer, which goes with it.
    eventually("the deleted object released", LIMIT, || async {
        matches!(api.get_opt("leaving").await, Ok(None)).then_some(())
    })
    .await;
    assert_eq!(runs.of("deprovision:leaving"), 1);
    assert_eq!(
        runs.of("provision:leaving"),
        0,
        "a deleted object is not provisioned"
    );

    // Deleted after the upgrade: deprovisioned once, the current finalizer removed, the
    // other's left for its owner.
    api.delete("live", &DeleteParams::default()).await.unwrap();
    eventually("the runtime's finalizer removed", LIMIT, || async {
        (finalizers(&api, "live").await? == [OTHERS]).then_some(())
    })
    .await;
    assert_eq!(runs.of("deprovision:live"), 1);
    assert_eq!(
        runs.of("provision:live"),
        1,
        "the migration is no second provision"
    );
    rt.shutdown().await;
    api.patch(
        "live",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn an_upgraded_operator_keeps_the_objects_of_its_old_finalizer() {
    let (_cluster, client) = crate::common::cluster();
    upgrade_keeps_the_old_operators_objects(client, "default").await;
}

#[cfg(feature = "envtest")]
#[tokio::test]
async fn an_upgraded_operator_keeps_the_objects_of_its_old_finalizer_on_kube_apiserver() {
    use crate::common::real::{bounded, create_namespace, shared_env};
    bounded("finalizer migration", async {
        let env = shared_env().await;
        create_namespace(&env.client(), "finalizer-migration").await;
        upgrade_keeps_the_old_operators_objects(env.client(), "finalizer-migration").await;
    })
    .await;
}

/// `refs` → a reference on each; a ConfigMap child named as the widget in namespace
/// `children` (another namespace: the child carries the owner annotation, not an owner
/// reference).
fn upgrade_tree(children: &str) -> impl Provisioner<Widget> + 'static {
    let children = children.to_string();
    let refs = step("refs", |cx: Context<Widget>| async move {
        let ns = cx.object().namespace();
        for n in &cx.object().spec.refs {
            let target = Target::for_kind::<Widget>(ns.as_deref(), n);
            if let Err(e) = cx.add_reference(&target).await {
                return Outcome::yield_after(
                    Duration::from_millis(100),
                    Reason::new("ReferencePending", e.to_string()),
                );
            }
        }
        Outcome::Done
    });
    let child = resource("child", move |w: &Widget| ConfigMap {
        metadata: ObjectMeta {
            name: Some(w.name_any()),
            namespace: Some(children.clone()),
            ..Default::default()
        },
        data: Some([("size".to_string(), w.spec.size.to_string())].into()),
        ..Default::default()
    })
    .rules(ChildRules::default().other_namespaces());
    serial("upgrade", vec![boxed(refs), boxed(child)])
}

async fn start_with(client: &Client, ns: &str, names: OperatorNames) -> RuntimeHandle {
    Runtime::builder(client.clone(), names)
        .policy(test_policy())
        .controller(
            Controller::<Widget>::new(upgrade_tree(&format!("{ns}-children"))).namespace(ns),
        )
        .start()
        .await
        .expect("start the runtime")
}

/// Sets (or with `None` removes) annotation `key` on widget `name`.
async fn annotate(api: &Api<Widget>, name: &str, key: &str, value: Option<&str>) {
    let patch = serde_json::json!({"metadata": {"annotations": {key: value}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
}

/// The domain upgrade on `client`, in namespace `ns` (which exists, as does `<ns>-children`).
/// `app` references `db`; `app` and `solo` each have a child in `<ns>-children`, marked theirs
/// by the owner annotation.
async fn domain_upgrade_keeps_references_and_children(client: Client, ns: &str) {
    let api: Api<Widget> = Api::namespaced(client.clone(), ns);
    let children: Api<ConfigMap> = Api::namespaced(client.clone(), &format!("{ns}-children"));
    let create = async |name: &str, refs: &[&str]| {
        let mut w = widget(name, 1);
        w.metadata.namespace = Some(ns.into());
        w.spec.refs = refs.iter().map(|r| r.to_string()).collect();
        api.create(&PostParams::default(), &w).await.unwrap();
    };
    // The operator before the upgrade: every name under actorcile.dev.
    let old = OperatorNames::new(crate::common::FIELD_MANAGER, LEGACY_DOMAIN);
    let rt = start_with(&client, ns, old.clone()).await;
    create("db", &[]).await;
    create("app", &["db"]).await;
    create("solo", &[]).await;
    for name in ["db", "app", "solo"] {
        actorcile::testing::wait_ready(&api, name, LIMIT).await;
    }
    rt.shutdown().await;
    let db = api.get("db").await.unwrap();
    assert_eq!(
        referrers_of(&db, &old).len(),
        1,
        "the old operator's reference"
    );
    assert!(
        referrers_of(&db, &names()).is_empty(),
        "none under the new domain"
    );
    let child = children.get("solo").await.unwrap();
    assert!(
        child.annotations().contains_key(&old.owner_annotation()),
        "{child:?}"
    );

    // Without the former domain the old marks mean nothing: solo's child is someone else's.
    // (app is held by the new domain's brake meanwhile: it takes no reference of its own.)
    let ignore = names().ignore_annotation();
    annotate(&api, "app", &ignore, Some("true")).await;
    let rt = start_with(&client, ns, names()).await;
    let s = actorcile::testing::wait_reason(&api, "solo", "ChildNotOwned", LIMIT).await;
    assert!(
        s.ready().unwrap().message.contains("not controlled"),
        "{s:?}"
    );
    rt.shutdown().await;

    // With it, the upgraded operator carries on.
    let upgraded = names().former_domain(LEGACY_DOMAIN);
    let rt = start_with(&client, ns, upgraded.clone()).await;
    actorcile::testing::wait_ready(&api, "solo", LIMIT).await;
    // Only the old operator's reference holds db: its deletion waits for app.
    api.delete("db", &DeleteParams::default()).await.unwrap();
    let s = actorcile::testing::wait_reason(&api, "db", "InUse", LIMIT).await;
    assert!(s.ready().unwrap().message.contains("app"), "{s:?}");
    let db = api.get("db").await.unwrap();
    assert!(
        referrers_of(&db, &names()).is_empty(),
        "held by the old operator's reference alone: {:?}",
        db.annotations()
    );
    assert_eq!(referrers_of(&db, &upgraded).len(), 1);

    // The brake released: app's child (marked by the old operator) is updated, the
    // finalizers migrated.
    api.patch(
        "app",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"size": 3}})),
    )
    .await
    .unwrap();
    annotate(&api, "app", &ignore, None).await;
    eventually(
        "app's child updated by the upgraded operator",
        LIMIT,
        || async {
            let child = children.get("app").await.ok()?;
            (child.data?.get("size")? == "3").then_some(())
        },
    )
    .await;
    actorcile::testing::wait_ready(&api, "app", LIMIT).await;
    eventually("the finalizers migrated", LIMIT, || async {
        for name in ["app", "solo"] {
            if finalizers(&api, name).await? != [FINALIZER] {
                return None;
            }
        }
        Some(())
    })
    .await;

    // The referrer goes: its references (under either domain) are released, and the target
    // follows it.
    api.delete("app", &DeleteParams::default()).await.unwrap();
    for name in ["app", "db"] {
        eventually(&format!("{name} deleted"), LIMIT, || async {
            matches!(api.get_opt(name).await, Ok(None)).then_some(())
        })
        .await;
    }
    rt.shutdown().await;
    let _ = api.delete("solo", &DeleteParams::default()).await;
}

#[tokio::test]
async fn an_operator_upgraded_from_the_former_domain_keeps_its_references_and_children() {
    let (_cluster, client) = crate::common::cluster();
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let mut children = k8s_openapi::api::core::v1::Namespace::default();
    children.metadata.name = Some("default-children".into());
    namespaces
        .create(&PostParams::default(), &children)
        .await
        .unwrap();
    domain_upgrade_keeps_references_and_children(client, "default").await;
}

#[cfg(feature = "envtest")]
#[tokio::test]
async fn an_operator_upgraded_from_the_former_domain_keeps_its_references_and_children_on_kube_apiserver()
 {
    use crate::common::real::{bounded, create_namespace, shared_env};
    bounded("domain upgrade", async {
        let env = shared_env().await;
        create_namespace(&env.client(), "domain-upgrade").await;
        create_namespace(&env.client(), "domain-upgrade-children").await;
        domain_upgrade_keeps_references_and_children(env.client(), "domain-upgrade").await;
    })
    .await;
}

#[tokio::test]
async fn names_and_former_finalizers_are_checked_before_anything_starts() {
    let (_cluster, client) = crate::common::cluster();
    let check = |b: actorcile::runtime::RuntimeBuilder| {
        b.controller(Controller::<Widget>::new(tree(&Runs::default())))
            .validate()
            .unwrap_err()
    };
    let bad_name = check(Runtime::builder(
        client.clone(),
        OperatorNames::new("Widget Operator", "example.com"),
    ));
    assert!(
        matches!(&bad_name, Error::Invalid { field: Setting::OperatorNames, problem } if problem.contains("Widget Operator")),
        "{bad_name}"
    );
    let current = check(Runtime::builder(client.clone(), names()).migrate_finalizer(FINALIZER));
    assert!(
        matches!(
            &current,
            Error::Invalid {
                field: Setting::FormerFinalizer,
                ..
            }
        ),
        "{current}"
    );
    let unqualified = check(Runtime::builder(client, names()).migrate_finalizer("no-prefix"));
    assert!(
        matches!(
            &unqualified,
            Error::Invalid {
                field: Setting::FormerFinalizer,
                ..
            }
        ),
        "{unqualified}"
    );
}
