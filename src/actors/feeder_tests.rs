//! The watch feeder, on one kind started through its seam under a paused clock: what reaches
//! an actor and what does not.

use std::time::Duration;

use super::test_kind::{ReconcileLog, logging, start_kind, test_policy};

#[tokio::test(start_paused = true)]
async fn the_echoes_of_the_runtimes_own_writes_run_no_reconcile() {
    let log = ReconcileLog::default();
    let kind = start_kind(logging(log.clone()), test_policy()).await;
    kind.create("a").await;
    kind.wait_ready("a").await;
    // The finalizer and the status were written, and their watch events delivered; under the
    // paused clock this sleep ends only once every task is idle.
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(log.count("a"), 1, "one reconcile for one generation");
    // A change of the user's is news.
    kind.set_note("a", "changed").await;
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(log.count("a"), 2);
    kind.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_object_deleted_and_created_again_under_its_name_is_run_afresh() {
    let log = ReconcileLog::default();
    let kind = start_kind(logging(log.clone()), test_policy()).await;
    kind.create("a").await;
    kind.wait_ready("a").await;
    kind.delete("a").await;
    kind.wait_gone("a").await;
    kind.create("a").await;
    kind.wait_ready("a").await;
    assert_eq!(log.count("a"), 2, "the new object's first reconcile");
    log.assert_no_overlap("a");
    kind.stop().await;
}

/// What a step sees of `name` (created by server-side apply, with a last-applied annotation,
/// so that it carries both) when the kind's cache is pruned or not.
async fn seen_by_a_step(prune: bool) -> (usize, bool) {
    use std::sync::{Arc, Mutex};

    use kube::ResourceExt;
    use kube::api::{Api, Patch, PatchParams};

    use super::KindSpec;
    use super::test_kind::{Widget, start_spec};
    use crate::provisioners::{Context, Outcome, step};

    let seen = Arc::new(Mutex::new(None));
    let tree = {
        let seen = seen.clone();
        step("look", move |cx: Context<Widget>| {
            let seen = seen.clone();
            async move {
                let o = cx.object();
                let last_applied = o
                    .annotations()
                    .contains_key("kubectl.kubernetes.io/last-applied-configuration");
                *seen.lock().unwrap() = Some((o.managed_fields().len(), last_applied));
                Outcome::Done
            }
        })
    };
    let mut spec = KindSpec::new(Arc::new(tree));
    spec.prune_cache = prune;
    let kind = start_spec(spec, test_policy()).await;
    let applied = serde_json::json!({
        "apiVersion": "test.actorcile.dev/v1", "kind": "Widget",
        "metadata": { "name": "w", "annotations": {
            "kubectl.kubernetes.io/last-applied-configuration": "{\"spec\":{}}",
            "team": "storage" } },
        "spec": { "note": "n" }
    });
    Api::<Widget>::namespaced(kind.client.clone(), "default")
        .patch("w", &PatchParams::apply("kubectl"), &Patch::Apply(&applied))
        .await
        .expect("apply");
    kind.wait_ready("w").await;
    kind.stop().await;
    let last = seen.lock().unwrap().take();
    last.expect("a reconcile ran")
}

#[tokio::test(start_paused = true)]
async fn the_cache_drops_what_the_server_keeps_for_itself_unless_told_not_to() {
    assert_eq!(seen_by_a_step(true).await, (0, false), "pruned");
    let (managed, last_applied) = seen_by_a_step(false).await;
    assert!(
        managed > 0 && last_applied,
        "kept whole: {managed} managedFields entries"
    );
}
