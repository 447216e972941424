//! References on objects of a kind the runtime does not manage, on a real etcd +
//! kube-apiserver: widgets (managed) reference gadgets (another operator's kind, which the
//! test plays the controller of). Each reference is a finalizer of its referrer's own on the
//! gadget, which the API server honours: a deleted gadget stays until every referrer released
//! it, across a restart of the operator, and the other controller's finalizer is never touched.
//!
//! Run with `cargo test --release --features envtest --test integration real_foreign_references::`.
#![cfg(feature = "envtest")]

use crate::common;
use crate::common::real::*;

use std::time::Duration;

use actorcile::prelude::*;
use actorcile::references::{Selection, referrers_of};
use common::{Gadget, GadgetSpec, Widget, eventually};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};

/// The finalizer of the gadgets' own controller.
const OTHERS: &str = "gadgets.example.com/network";

/// Widgets hold references on exactly the gadgets their `refs` name; a widget whose note is
/// `fleet` instead makes exactly the gadgets labelled `pool=fleet` that its `needs` name carry
/// its reference (one or the other: each states every reference the widget holds).
fn tree() -> impl Provisioner<Widget> {
    step("gadget-references", |cx: Context<Widget>| async move {
        let ns = cx.object().namespace();
        let w = cx.object();
        let refs: Vec<Target> = w
            .spec
            .refs
            .iter()
            .map(|n| Target::for_kind::<Gadget>(ns.as_deref(), n))
            .collect();
        if w.spec.note != "fleet" {
            if let Err(e) = cx.hold_references(&refs).await {
                return Outcome::failed(Reason::new("GadgetReferences", "hold"), e);
            }
        } else {
            let fleet = Selection::new(
                Gadget::api_version(&()),
                "Gadget",
                ns.as_deref(),
                "pool=fleet",
            );
            if let Err(e) = cx.set_references(&fleet, w.spec.needs.clone()).await {
                return Outcome::failed(Reason::new("GadgetReferences", "set"), e);
            }
        }
        Outcome::Done
    })
}

async fn start(api: &Ns) -> RuntimeHandle {
    Runtime::builder(api.client.clone(), common::names())
        .policy(real_policy())
        .controller(Controller::<Widget>::new(tree()).namespace(&api.ns))
        .start()
        .await
        .expect("start the runtime")
}

/// The reference finalizers (`ref.<domain>/…`) on gadget `name`, and the referrers its
/// annotations name, both sorted; `None` once it is gone.
async fn references_on(gadgets: &Api<Gadget>, name: &str) -> Option<(usize, Vec<String>)> {
    let g = gadgets.get_opt(name).await.expect("read the gadget")?;
    let prefix = common::names().reference_prefix();
    let finalizers: Vec<&String> = g
        .finalizers()
        .iter()
        .filter(|f| f.starts_with(&prefix))
        .collect();
    // Each finalizer is named as its referrer's annotation.
    for f in &finalizers {
        assert!(
            g.annotations().contains_key(f.as_str()),
            "finalizer {f} has its reference annotation"
        );
    }
    assert!(
        g.finalizers().iter().any(|f| f == OTHERS),
        "the other controller's finalizer is never removed by the runtime"
    );
    let mut referrers: Vec<String> = referrers_of(&g, &common::names())
        .into_iter()
        .map(|t| t.name)
        .collect();
    referrers.sort();
    Some((finalizers.len(), referrers))
}

async fn wait_references(gadgets: &Api<Gadget>, name: &str, referrers: &[&str]) {
    eventually(
        &format!("gadget {name} referenced by {referrers:?}"),
        CONVERGE,
        || async {
            references_on(gadgets, name)
                .await
                .filter(|(finalizers, r)| *finalizers == referrers.len() && r == referrers)
                .map(|_| ())
        },
    )
    .await;
}

async fn create_gadget(gadgets: &Api<Gadget>, ns: &str, name: &str, fleet: bool) {
    let mut g = Gadget::new(name, GadgetSpec::default());
    g.metadata.namespace = Some(ns.to_string());
    g.metadata.finalizers = Some(vec![OTHERS.to_string()]);
    if fleet {
        g.metadata.labels = Some([("pool".to_string(), "fleet".to_string())].into());
    }
    gadgets
        .create(&PostParams::default(), &g)
        .await
        .unwrap_or_else(|e| panic!("create gadget {name}: {e}"));
}

#[tokio::test]
async fn references_on_another_operators_objects_are_finalizers_released_across_a_restart() {
    bounded("references on another operator's kind", async {
        let env = shared_env().await;
        let api = Ns::create(env.client(), "refs-foreign").await;
        let gadgets: Api<Gadget> = Api::namespaced(env.client(), &api.ns);
        eventually("gadgets are served", Duration::from_secs(30), || async {
            gadgets.list(&Default::default()).await.ok().map(|_| ())
        })
        .await;
        create_gadget(&gadgets, &api.ns, "net", false).await;
        create_gadget(&gadgets, &api.ns, "db1", true).await;
        create_gadget(&gadgets, &api.ns, "db2", true).await;

        let rt = start(&api).await;
        api.create_with("app1", &[], &["net"]).await;
        api.create_with("app2", &[], &["net"]).await;
        let mut fleet = widget_in(&api.ns, "fleet", 1);
        fleet.spec.note = "fleet".into();
        fleet.spec.needs = vec!["db1".into(), "db2".into()];
        api.api()
            .create(&PostParams::default(), &fleet)
            .await
            .expect("create the fleet widget");
        for n in ["app1", "app2", "fleet"] {
            api.wait_ready(n).await;
        }
        // One finalizer per referrer, beside the other controller's.
        wait_references(&gadgets, "net", &["app1", "app2"]).await;
        wait_references(&gadgets, "db1", &["fleet"]).await;
        wait_references(&gadgets, "db2", &["fleet"]).await;
        let app1 = api.get("app1").await.expect("app1");
        let listed = app1
            .annotations()
            .get(&common::names().held_references_annotation())
            .expect("app1 lists what it holds on gadgets");
        assert!(listed.contains("\"net\""), "{listed}");

        // Deleted, the gadget stays while referrers hold it.
        gadgets
            .delete("net", &DeleteParams::default())
            .await
            .expect("delete the gadget");
        let net = gadgets.get("net").await.expect("net stays");
        assert!(net.meta().deletion_timestamp.is_some());

        // A referrer that stops naming it releases its finalizer, and only its own.
        api.patch_spec("app1", serde_json::json!({ "refs": [] }))
            .await;
        wait_references(&gadgets, "net", &["app2"]).await;
        api.patch_spec("fleet", serde_json::json!({ "needs": ["db1"] }))
            .await;
        wait_references(&gadgets, "db2", &[]).await;
        wait_references(&gadgets, "db1", &["fleet"]).await;
        eventually("app1 lists nothing", CONVERGE, || async {
            let w = api.get("app1").await?;
            (!w.annotations()
                .contains_key(&common::names().held_references_annotation()))
            .then_some(())
        })
        .await;

        // A new runtime (the operator restarted) knows what app2 and fleet hold from their
        // own annotations: deleting them releases their finalizers on the gadgets.
        rt.shutdown().await;
        let rt = start(&api).await;
        api.delete("app2").await;
        api.delete("fleet").await;
        api.wait_gone("app2").await;
        api.wait_gone("fleet").await;
        wait_references(&gadgets, "net", &[]).await;
        wait_references(&gadgets, "db1", &[]).await;
        let net = gadgets
            .get("net")
            .await
            .expect("held by its own controller");
        assert_eq!(net.finalizers(), [OTHERS]);
        // The other controller finishes its deletion: nothing of this runtime's holds it.
        gadgets
            .patch(
                "net",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({ "metadata": { "finalizers": null } })),
            )
            .await
            .expect("the other controller removes its finalizer");
        eventually("net is gone", CONVERGE, || async {
            matches!(gadgets.get_opt("net").await, Ok(None)).then_some(())
        })
        .await;
        rt.shutdown().await;
    })
    .await;
}
