//! The watch of a controller's children across changes of the held shards: what the list of a
//! new watch runs, driven event by event under a paused clock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PartialObjectMeta};
use kube::core::PartialObjectMetaExt;
use kube::runtime::watcher::Event;
use tokio::sync::mpsc;

use super::test_kind::{ReconcileLog, Widget, logging, start_spec, test_policy};
use super::watches::{TestInput, drive_related, owners_of};
use super::{KindSpec, RelatedSpec};
use crate::provisioners::resource;
use crate::serial;

type Input = TestInput<PartialObjectMeta<ConfigMap>>;

/// Until every task waits: the paused clock moves on only then.
async fn settle() {
    tokio::time::sleep(Duration::from_secs(3600)).await;
}

/// A child's metadata as a watch would deliver it, at `version`, of shard 0.
fn child(cm: &ConfigMap, version: &str) -> PartialObjectMeta<ConfigMap> {
    let mut meta = cm.metadata.clone();
    meta.resource_version = Some(version.into());
    meta.labels = Some([("shard".to_string(), "0".to_string())].into());
    meta.into_response_partial()
}

/// Objects that write a ConfigMap child each, whose children's watch is the test's.
async fn started(log: ReconcileLog) -> (super::test_kind::Kind, mpsc::UnboundedSender<Input>) {
    let tree = serial![
        logging(log),
        resource("settings", |w: &Widget| ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: w.metadata.name.clone(),
                ..Default::default()
            },
            data: Some([("note".to_string(), w.spec.note.clone())].into()),
            ..Default::default()
        }),
    ];
    let (tx, rx) = mpsc::unbounded_channel();
    let rx = Mutex::new(Some(rx));
    let mut spec = KindSpec::new(Arc::new(tree));
    spec.related.push(RelatedSpec {
        owned: true,
        cluster_scoped: false,
        rule: crate::rbac::rule_for::<ConfigMap>(&["list", "watch"]),
        kind: "ConfigMap".into(),
        start: Arc::new(move |_client, _namespace, shared, echoes, manager| {
            let inputs = rx.lock().unwrap().take().expect("one watch");
            tokio::spawn(drive_related(
                shared,
                inputs,
                Arc::new(owners_of::<Widget, PartialObjectMeta<ConfigMap>>),
                echoes,
                manager,
            ))
        }),
    });
    let kind = start_spec(spec, test_policy()).await;
    (kind, tx)
}

/// A list: `Init`, the children, `InitDone`.
fn list(tx: &mpsc::UnboundedSender<Input>, children: Vec<PartialObjectMeta<ConfigMap>>) {
    tx.send(TestInput::Event(Event::Init)).unwrap();
    for c in children {
        tx.send(TestInput::Event(Event::InitApply(c))).unwrap();
    }
    tx.send(TestInput::Event(Event::InitDone)).unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_new_watch_runs_the_owners_of_children_changed_meanwhile_but_not_of_shards_acquired_or_let_go()
 {
    let log = ReconcileLog::default();
    let (kind, tx) = started(log.clone()).await;
    // The first watch selects no shard; its list is empty.
    list(&tx, vec![]);
    kind.create("a").await;
    kind.create("b").await;
    kind.wait_ready("a").await;
    kind.wait_ready("b").await;
    settle().await;
    assert_eq!((log.count("a"), log.count("b")), (1, 1));
    let cms: Api<ConfigMap> = Api::namespaced(kind.client.clone(), "default");
    let (a, b) = (cms.get("a").await.unwrap(), cms.get("b").await.unwrap());
    let version = |cm: &ConfigMap| cm.metadata.resource_version.clone().unwrap();

    // Shard 0 acquired: the new watch lists its children, whose owners run as the shard is
    // acquired, not for the list.
    tx.send(TestInput::Restart(vec![0])).unwrap();
    list(&tx, vec![child(&a, "1000")]);
    settle().await;
    assert_eq!(
        log.count("a"),
        1,
        "a child of a shard just acquired runs nothing"
    );

    // The same shards again: a child changed meanwhile runs its owner, and so does a child
    // someone else made meanwhile (not the echo of the runtime's write).
    tx.send(TestInput::Restart(vec![0])).unwrap();
    list(&tx, vec![child(&a, "1001"), child(&b, "1002")]);
    settle().await;
    assert_eq!((log.count("a"), log.count("b")), (2, 2));

    // The echo of the runtime's own write runs nothing, in a list as in a watch.
    let b = cms.get("b").await.unwrap();
    tx.send(TestInput::Restart(vec![0])).unwrap();
    list(&tx, vec![child(&a, "1001"), child(&b, &version(&b))]);
    settle().await;
    assert_eq!((log.count("a"), log.count("b")), (2, 2));

    // Shard 0 let go: its children leave the view; the next list without them is no deletion.
    tx.send(TestInput::Restart(vec![])).unwrap();
    list(&tx, vec![]);
    settle().await;
    assert_eq!(
        (log.count("a"), log.count("b")),
        (2, 2),
        "children of a shard let go are not gone"
    );

    // Within one watch, a relist that no longer holds a child is its deletion.
    tx.send(TestInput::Restart(vec![0])).unwrap();
    list(&tx, vec![child(&a, "1001")]);
    list(&tx, vec![]);
    settle().await;
    assert_eq!(
        log.count("a"),
        3,
        "a child gone while the watch was down runs its owner"
    );
    kind.stop().await;
}
