//! The watch of a controller's children across a change of the held shards: what the first
//! list of a new watch runs, driven event by event under a paused clock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PartialObjectMeta};
use kube::core::PartialObjectMetaExt;
use kube::runtime::watcher::Event;
use tokio::sync::mpsc;

use super::testing::{PassLog, Widget, logging, start_spec, test_policy};
use super::triggers::{TestInput, drive_related, owners_of};
use super::{KindSpec, RelatedSpec};
use crate::provisioners::resource;
use crate::serial;

type Input = TestInput<PartialObjectMeta<ConfigMap>>;

/// Until every task waits: the paused clock moves on only then.
async fn settle() {
    tokio::time::sleep(Duration::from_secs(3600)).await;
}

/// A child's metadata as a watch would deliver it, at `version`.
fn child(cm: &ConfigMap, version: &str) -> PartialObjectMeta<ConfigMap> {
    let mut meta = cm.metadata.clone();
    meta.resource_version = Some(version.into());
    meta.into_response_partial()
}

/// Objects that write a ConfigMap child each, whose children's watch is the test's.
async fn started(log: PassLog) -> (super::testing::Kind, mpsc::UnboundedSender<Input>) {
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
        start: Box::new(move |_client, _namespace, shared, echoes, manager| {
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
async fn the_first_list_of_a_new_watch_runs_owners_only_for_children_changed_since_the_runtime_wrote_them()
 {
    let log = PassLog::default();
    let (kind, tx) = started(log.clone()).await;
    list(&tx, vec![]);
    kind.create("a").await;
    kind.wait_ready("a").await;
    settle().await;
    assert_eq!(log.count("a"), 1);
    let cms: Api<ConfigMap> = Api::namespaced(kind.client.clone(), "default");
    let written = cms.get("a").await.unwrap();
    let version = written.metadata.resource_version.clone().unwrap();

    // A new watch (a shard acquired) lists the child as the runtime wrote it: its echo.
    tx.send(TestInput::Restart(vec![0])).unwrap();
    list(&tx, vec![child(&written, &version)]);
    settle().await;
    assert_eq!(
        log.count("a"),
        1,
        "the echo of the runtime's write runs nothing"
    );

    // A new watch that no longer selects the child's shard: the child leaves the view, and the
    // next list without it is no deletion.
    tx.send(TestInput::Restart(vec![])).unwrap();
    list(&tx, vec![]);
    settle().await;
    assert_eq!(log.count("a"), 1, "a child of a shard let go is not gone");

    // The runtime writes the child again (a's spec changed), and someone deletes it before the
    // next watch's list: the list does not hold it, and its owner runs.
    kind.set_note("a", "second").await;
    settle().await;
    assert_eq!(log.count("a"), 2);
    tx.send(TestInput::Restart(vec![0])).unwrap();
    list(&tx, vec![]);
    settle().await;
    assert_eq!(
        log.count("a"),
        3,
        "a child deleted after the runtime's write runs its owner"
    );

    // Written again (by that run), and changed by someone before the next list: it runs too.
    let rewritten = cms.get("a").await.unwrap();
    tx.send(TestInput::Restart(vec![0])).unwrap();
    list(&tx, vec![child(&rewritten, "999999")]);
    settle().await;
    assert_eq!(
        log.count("a"),
        4,
        "a child changed after the runtime's write runs its owner"
    );

    // The next watch lists it as that run wrote it: its echo, nothing runs.
    let now = cms.get("a").await.unwrap();
    let version = now.metadata.resource_version.clone().unwrap();
    tx.send(TestInput::Restart(vec![0])).unwrap();
    list(&tx, vec![child(&now, &version)]);
    settle().await;
    assert_eq!(log.count("a"), 4);
    kind.stop().await;
}
