//! References on objects of a kind the runtime does not manage (in-process cluster, paused
//! clock): widgets reference gadgets, whose controller the test plays. The reference is a
//! finalizer of the referrer's own on the gadget, listed on the referrer, and released when the
//! referrer is deleted, by a runtime that started after the reference was taken. The real API
//! server's part is in `real_foreign_references`.

use crate::common;

use std::time::Duration;

use actorcile::prelude::*;
use common::*;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};

const LIMIT: Duration = Duration::from_secs(600);

fn gadget_target(name: &str) -> Target {
    Target::for_kind::<Gadget>(Some("default"), name)
}

/// Widgets hold references on the gadgets their `refs` name; a failure is the status message.
fn tree() -> impl Provisioner<Widget> {
    step("gadgets", |cx: Context<Widget>| async move {
        let refs: Vec<Target> = cx
            .object()
            .spec
            .refs
            .iter()
            .map(|n| gadget_target(n))
            .collect();
        match cx.hold_references(&refs).await {
            Ok(()) => Outcome::Done,
            Err(e) => Outcome::yield_after(
                Duration::from_secs(3600),
                Reason::new("GadgetReferences", e.to_string()),
            ),
        }
    })
}

async fn start(client: &kube::Client, controller: Controller<Widget>) -> RuntimeHandle {
    Runtime::builder(client.clone(), common::names())
        .policy(test_policy())
        .controller(controller)
        .start()
        .await
        .expect("start the runtime")
}

async fn create_widget(client: &kube::Client, name: &str, refs: &[&str]) {
    let mut w = widget(name, 1);
    w.spec.refs = refs.iter().map(|s| s.to_string()).collect();
    widgets(client)
        .create(&PostParams::default(), &w)
        .await
        .expect("create the widget");
}

/// The finalizers of gadget `name` (`None`: gone).
async fn gadget_finalizers(gadgets: &Api<Gadget>, name: &str) -> Option<Vec<String>> {
    gadgets
        .get_opt(name)
        .await
        .expect("read the gadget")
        .map(|g| g.finalizers().to_vec())
}

#[tokio::test(start_paused = true)]
async fn a_reference_on_another_kind_is_a_finalizer_released_at_deletion_after_a_restart() {
    let (_c, client) = cluster();
    let gadgets: Api<Gadget> = Api::namespaced(client.clone(), "default");
    let mut g = Gadget::new("net", GadgetSpec::default());
    g.metadata.finalizers = Some(vec!["gadgets.example.com/network".into()]);
    gadgets
        .create(&PostParams::default(), &g)
        .await
        .expect("create the gadget");

    let rt = start(&client, Controller::<Widget>::new(tree())).await;
    create_widget(&client, "app", &["net"]).await;
    wait_all_ready(&client, 1, LIMIT).await;
    // One finalizer of the referrer's own, named as its reference annotation.
    let net = gadgets.get("net").await.expect("net exists");
    let with_app = net.finalizers().to_vec();
    assert_eq!(with_app.len(), 2, "{with_app:?}");
    assert_eq!(with_app[0], "gadgets.example.com/network");
    assert!(with_app[1].starts_with(&common::names().reference_prefix()));
    let referrer: Target = serde_json::from_str(&net.annotations()[&with_app[1]])
        .expect("the annotation of the finalizer's name names the referrer");
    assert_eq!(referrer, Target::for_kind::<Widget>(Some("default"), "app"));
    let app = widgets(&client).get("app").await.expect("app exists");
    let listed: Vec<Target> =
        serde_json::from_str(&app.annotations()[&common::names().held_references_annotation()])
            .expect("the referrer lists what it holds");
    assert_eq!(listed, [gadget_target("net")]);

    // Deleted, the gadget waits for its referrer; the runtime restarts meanwhile.
    gadgets
        .delete("net", &DeleteParams::default())
        .await
        .expect("delete the gadget");
    rt.shutdown().await;
    let rt = start(&client, Controller::<Widget>::new(tree())).await;
    delete(&client, "app").await;
    wait_gone(&client, "app", LIMIT).await;
    assert_eq!(
        gadget_finalizers(&gadgets, "net")
            .await
            .expect("held by its own controller"),
        ["gadgets.example.com/network"],
        "the referrer's finalizer went before the referrer did; the other controller's stays"
    );
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_referrer_without_the_finalizer_cannot_reference_another_kind() {
    let (_c, client) = cluster();
    let gadgets: Api<Gadget> = Api::namespaced(client.clone(), "default");
    gadgets
        .create(
            &PostParams::default(),
            &Gadget::new("net", GadgetSpec::default()),
        )
        .await
        .expect("create the gadget");
    let rt = start(
        &client,
        Controller::<Widget>::new(tree()).without_finalizer(),
    )
    .await;
    create_widget(&client, "app", &["net"]).await;
    let s = wait_reason(&client, "app", "GadgetReferences", LIMIT).await;
    assert!(
        s.ready().unwrap().message.contains("without a finalizer"),
        "{s:?}"
    );
    assert_eq!(
        gadget_finalizers(&gadgets, "net")
            .await
            .expect("net exists"),
        Vec::<String>::new(),
        "nothing was placed on the gadget"
    );
    rt.shutdown().await;
}
