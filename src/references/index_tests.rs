//! The reference index's decisions, each on its own: who is woken when, what blocks a
//! deletion, what a referrer holds. The kinds are fakes (their objects in a map, their wake-ups
//! recorded); the reference writes go to the in-process API server.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ApiResource, ObjectMeta};

use super::*;
use crate::status::ReadyReason;

/// An object of a fake kind: what the kind's store would say of it.
#[derive(Clone, Default)]
struct Obj {
    ready: bool,
    deleting: bool,
    referrers: Vec<Target>,
}

/// A kind as the runtime registers it, minus the actors: objects in a map, wake-ups recorded.
#[derive(Default)]
struct FakeKind {
    synced: AtomicBool,
    objects: Mutex<HashMap<Target, Obj>>,
    woken: Mutex<Vec<Target>>,
    /// What the targets' actors last said (only of objects in `objects`, as the store keeps it).
    said: Mutex<HashMap<Target, Readiness>>,
    client: Option<kube::Client>,
}

impl FakeKind {
    fn synced() -> Arc<Self> {
        let k = Self::default();
        k.synced.store(true, Ordering::Release);
        Arc::new(k)
    }
    fn put(&self, t: &Target, obj: Obj) {
        self.objects.lock().unwrap().insert(t.clone(), obj);
    }
    fn remove(&self, t: &Target) {
        self.objects.lock().unwrap().remove(t);
        self.said.lock().unwrap().remove(t);
    }
    /// The wake-ups since the last call.
    fn woken(&self) -> Vec<Target> {
        std::mem::take(&mut *self.woken.lock().unwrap())
    }
}

impl IndexedKind for FakeKind {
    fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }
    fn in_view(&self, _: &Target) -> bool {
        true
    }
    fn readiness(&self, t: &Target) -> Readiness {
        match self.objects.lock().unwrap().get(t) {
            None if !self.synced() => Readiness::NotReady,
            None => Readiness::Missing,
            Some(o) if o.deleting => Readiness::Deleting,
            Some(o) if o.ready => Readiness::Ready,
            Some(_) => Readiness::NotReady,
        }
    }
    fn said(&self, t: &Target) -> Option<Readiness> {
        self.said.lock().unwrap().get(t).copied()
    }
    fn set_said(&self, t: &Target, r: Option<Readiness>) {
        let mut said = self.said.lock().unwrap();
        match r {
            Some(r) if self.exists(t) => {
                said.insert(t.clone(), r);
            }
            _ => {
                said.remove(t);
            }
        }
    }
    fn exists(&self, t: &Target) -> bool {
        self.objects.lock().unwrap().contains_key(t)
    }
    fn deleting(&self, t: &Target) -> bool {
        self.objects
            .lock()
            .unwrap()
            .get(t)
            .is_some_and(|o| o.deleting)
    }
    fn referrers(&self, t: &Target) -> Vec<Target> {
        let objects = self.objects.lock().unwrap();
        objects
            .get(t)
            .map(|o| o.referrers.clone())
            .unwrap_or_default()
    }
    fn notify(&self, t: &Target, _cause: crate::messages::Cause) {
        self.woken.lock().unwrap().push(t.clone());
    }
    fn dynamic_api(&self, t: &Target) -> Api<DynamicObject> {
        let client = self.client.clone().expect("this test writes no reference");
        let ar = ApiResource::erase::<ConfigMap>(&());
        Api::namespaced_with(client, t.namespace.as_deref().unwrap_or("default"), &ar)
    }
}

fn db(name: &str) -> Target {
    Target::new("example.com/v1", "Database", Some("default"), name)
}

fn app(name: &str) -> Target {
    Target::new("example.com/v1", "App", Some("default"), name)
}

/// An index with the kinds `Database` and `App`.
fn index() -> (ReferenceIndex, Arc<FakeKind>, Arc<FakeKind>) {
    let index = ReferenceIndex::default();
    let (dbs, apps) = (FakeKind::synced(), FakeKind::synced());
    index.register_kind("example.com/v1", "Database", dbs.clone());
    index.register_kind("example.com/v1", "App", apps.clone());
    (index, dbs, apps)
}

/// An object whose annotations say that `referrers` reference it.
fn referenced_by(referrers: &[Target], finalizers: &[&str]) -> ConfigMap {
    let annotations: BTreeMap<String, String> = referrers
        .iter()
        .map(|r| {
            let (key, _) = crate::names::Keys::standalone().reference_annotations(r);
            (key, serde_json::to_string(r).unwrap())
        })
        .collect();
    ConfigMap {
        metadata: ObjectMeta {
            name: Some("orders".into()),
            namespace: Some("default".into()),
            annotations: Some(annotations),
            finalizers: Some(finalizers.iter().map(|f| f.to_string()).collect()),
            ..Default::default()
        },
        ..Default::default()
    }
}

#[tokio::test]
async fn a_waiter_is_woken_once_when_its_target_becomes_ready() {
    let (index, dbs, apps) = index();
    dbs.put(&db("orders"), Obj::default());
    assert_eq!(
        index.readiness(&app("shop"), &db("orders")).await,
        Readiness::NotReady
    );
    let target = Arc::new(db("orders"));
    index.mark_ready(&target, true);
    assert_eq!(apps.woken(), vec![app("shop")]);
    // The waiter was served: the same news again wakes nobody.
    index.mark_ready(&target, true);
    assert_eq!(apps.woken(), vec![]);
    // Ready as its own actor said, whatever the store says yet.
    assert_eq!(
        index.readiness(&app("shop"), &db("orders")).await,
        Readiness::Ready
    );
    // Not Ready any more: the kind's store is asked again.
    index.mark_ready(&target, false);
    assert_eq!(
        index.readiness(&app("shop"), &db("orders")).await,
        Readiness::NotReady
    );
}

#[tokio::test]
async fn a_waiter_woken_by_a_failure_reads_it_before_the_store_has_it() {
    let (index, dbs, apps) = index();
    dbs.put(&db("orders"), Obj::default());
    assert_eq!(
        index.readiness(&app("shop"), &db("orders")).await,
        Readiness::NotReady
    );
    // The target's actor wrote Failed; the store still holds the status before it.
    index.changed(&db("orders"), Readiness::Failed);
    assert_eq!(apps.woken(), vec![app("shop")]);
    assert_eq!(
        index.readiness(&app("shop"), &db("orders")).await,
        Readiness::Failed
    );
    // A not-Ready announcement keeps it (only Ready, or another change, replaces it).
    index.mark_ready(&db("orders"), false);
    assert_eq!(
        index.readiness(&app("shop"), &db("orders")).await,
        Readiness::Failed
    );
    // The store's news of a deletion comes first.
    dbs.put(
        &db("orders"),
        Obj {
            deleting: true,
            ..Obj::default()
        },
    );
    assert_eq!(
        index.readiness(&app("shop"), &db("orders")).await,
        Readiness::Deleting
    );
}

#[tokio::test]
async fn a_target_found_missing_is_rechecked_when_it_appears() {
    let (index, _dbs, apps) = index();
    assert_eq!(
        index.readiness(&app("shop"), &db("orders")).await,
        Readiness::Missing
    );
    index.appeared(&db("other"));
    assert_eq!(apps.woken(), vec![]);
    index.appeared(&db("orders"));
    assert_eq!(apps.woken(), vec![app("shop")]);
}

#[tokio::test]
async fn before_its_kinds_first_list_a_target_is_not_ready_and_missing_once_listed() {
    let index = ReferenceIndex::default();
    let dbs = Arc::new(FakeKind::default());
    let apps = FakeKind::synced();
    index.register_kind("example.com/v1", "Database", dbs.clone());
    index.register_kind("example.com/v1", "App", apps.clone());
    // Not listed yet: it may exist.
    assert_eq!(
        index.readiness(&app("shop"), &db("orders")).await,
        Readiness::NotReady
    );
    dbs.synced.store(true, Ordering::Release);
    index.kind_synced("example.com/v1", "Database");
    // The list is in and it is not there: the waiter is woken to see it missing.
    assert_eq!(apps.woken(), vec![app("shop")]);
    assert_eq!(
        index.readiness(&app("shop"), &db("orders")).await,
        Readiness::Missing
    );
}

#[tokio::test]
async fn a_referrer_that_was_not_listed_releases_what_it_held_once_its_kind_is_listed() {
    let index = ReferenceIndex::default();
    let dbs = FakeKind::synced();
    let apps = Arc::new(FakeKind::default());
    index.register_kind("example.com/v1", "Database", dbs.clone());
    index.register_kind("example.com/v1", "App", apps.clone());
    index.learn(&db("orders"), &[app("gone"), app("here")]);
    apps.put(&app("here"), Obj::default());
    apps.synced.store(true, Ordering::Release);
    index.kind_synced("example.com/v1", "App");
    // Only what the absent referrer held is woken, to find its reference dangling.
    assert_eq!(dbs.woken(), vec![db("orders")]);
}

#[test]
fn deletion_waits_for_live_referrers_and_names_them() {
    let (index, _dbs, apps) = index();
    let target = db("orders");
    assert!(
        index
            .deletion_blocked(&target, &referenced_by(&[], &[]))
            .is_none()
    );

    apps.put(&app("shop"), Obj::default());
    let obj = referenced_by(&[app("shop")], &[]);
    let blocked = index
        .deletion_blocked(&target, &obj)
        .expect("a live referrer blocks");
    assert_eq!(blocked.reason, ReadyReason::InUse);
    assert_eq!(blocked.message, format!("in use by {}", app("shop")));

    // The referrer is gone from its kind's store: its reference is dangling.
    apps.remove(&app("shop"));
    assert!(index.deletion_blocked(&target, &obj).is_none());

    // Until its kind's first list is in, a referrer counts as live.
    apps.synced.store(false, Ordering::Release);
    assert!(index.deletion_blocked(&target, &obj).is_some());
}

#[test]
fn a_referrer_of_a_kind_not_managed_here_blocks_and_foreground_deletion_waits_for_children() {
    let (index, _dbs, _apps) = index();
    let stranger = Target::new("other.io/v1", "Thing", Some("default"), "t");
    let blocked = index
        .deletion_blocked(
            &db("orders"),
            &referenced_by(std::slice::from_ref(&stranger), &[]),
        )
        .expect("an unmanaged referrer cannot release, so it blocks");
    assert_eq!(blocked.message, format!("in use by {stranger}"));

    let blocked = index
        .deletion_blocked(
            &db("orders"),
            &referenced_by(&[], &[deletion::FOREGROUND_DELETION]),
        )
        .expect("foreground deletion waits for the children");
    assert_eq!(blocked.reason, ReadyReason::Deprovisioning);
}

#[test]
fn a_cycle_of_deleting_resources_is_named_as_a_cycle() {
    let (index, dbs, apps) = index();
    // orders is referenced by shop, which is referenced by orders; both are being deleted.
    dbs.put(
        &db("orders"),
        Obj {
            deleting: true,
            referrers: vec![app("shop")],
            ..Obj::default()
        },
    );
    apps.put(
        &app("shop"),
        Obj {
            deleting: true,
            referrers: vec![db("orders")],
            ..Obj::default()
        },
    );
    let blocked = index
        .deletion_blocked(&db("orders"), &referenced_by(&[app("shop")], &[]))
        .expect("blocked");
    assert_eq!(
        blocked.message,
        format!(
            "reference cycle, deletion cannot proceed: {} -> {} -> {}",
            db("orders"),
            app("shop"),
            db("orders")
        )
    );
    // Not deleting: the referrer may still release, so it is only in use.
    apps.put(
        &app("shop"),
        Obj {
            referrers: vec![db("orders")],
            ..Obj::default()
        },
    );
    let blocked = index
        .deletion_blocked(&db("orders"), &referenced_by(&[app("shop")], &[]))
        .expect("blocked");
    assert_eq!(blocked.message, format!("in use by {}", app("shop")));
}

/// A deletion blocked by a referrer this runtime never ran (another replica's, or one that
/// took its reference after this runtime started) is woken when that referrer leaves the
/// store, not at the fallback poll: the annotations that block it also say what to wait for.
#[test]
fn a_deletion_blocked_by_a_referrer_is_woken_when_that_referrer_goes() {
    let (index, dbs, apps) = index();
    apps.put(&app("shop"), Obj::default());
    assert!(!index.holds_any());
    let obj = referenced_by(&[app("shop")], &[]);
    assert!(index.deletion_blocked(&db("orders"), &obj).is_some());
    apps.remove(&app("shop"));
    index.gone(&app("shop"));
    assert_eq!(dbs.woken(), vec![db("orders")]);
    assert!(index.deletion_blocked(&db("orders"), &obj).is_none());
}

#[test]
fn a_referrer_gone_from_its_store_wakes_what_it_held_and_is_forgotten() {
    let (index, dbs, _apps) = index();
    index.learn(&db("orders"), &[app("shop")]);
    index.learn(&db("users"), &[app("shop")]);
    assert!(index.holds_any());
    index.gone(&app("unknown"));
    assert_eq!(dbs.woken(), vec![]);
    index.gone(&app("shop"));
    let mut woken = dbs.woken();
    woken.sort();
    assert_eq!(woken, vec![db("orders"), db("users")]);
    assert!(!index.holds_any());
    // Gone twice: nothing is held any more, nobody is woken again.
    index.gone(&app("shop"));
    assert_eq!(dbs.woken(), vec![]);
}

#[test]
fn what_a_referrer_holds_is_taken_out_before_its_finalizer_goes_and_put_back_if_that_fails() {
    let (index, dbs, _apps) = index();
    index.learn(&db("orders"), &[app("shop")]);
    let taken = index.take_held(&app("shop"));
    assert_eq!(taken, BTreeSet::from([db("orders")]));
    // Taken out: the referrer leaving the store now wakes nothing early.
    index.gone(&app("shop"));
    assert_eq!(dbs.woken(), vec![]);
    index.restore_held(&app("shop"), taken);
    index.gone(&app("shop"));
    assert_eq!(dbs.woken(), vec![db("orders")]);
}

mod writes {
    use super::*;
    use crate::cluster::ApiServer;
    use kube::api::{DeleteParams, PostParams};

    fn cm(name: &str) -> Target {
        Target::new("v1", "ConfigMap", Some("default"), name)
    }

    /// An index whose `ConfigMap` kind writes to an in-process API server, with `names` in it.
    async fn index_on_server(names: &[&str]) -> (ReferenceIndex, Arc<FakeKind>, Api<ConfigMap>) {
        let server = ApiServer::new();
        let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
        for name in names {
            let obj = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    finalizers: Some(vec!["example.com/keep".into()]),
                    ..Default::default()
                },
                ..Default::default()
            };
            api.create(&PostParams::default(), &obj).await.unwrap();
        }
        let index = ReferenceIndex::default();
        let kind = Arc::new(FakeKind {
            client: Some(server.client()),
            ..FakeKind::default()
        });
        kind.synced.store(true, Ordering::Release);
        index.register_kind("v1", "ConfigMap", kind.clone());
        (index, kind, api)
    }

    fn referrers_of(obj: &ConfigMap) -> Vec<Target> {
        obj.metadata
            .annotations
            .as_ref()
            .map(|a| referrers_in(&crate::names::Keys::standalone(), a))
            .unwrap_or_default()
    }

    #[tokio::test]
    async fn a_reference_is_persisted_on_its_target_and_released_from_it() {
        let (index, kind, api) = index_on_server(&["a", "b"]).await;
        let from = app("shop");
        index
            .hold_references(&from, &[cm("a"), cm("b")])
            .await
            .unwrap();
        assert_eq!(
            referrers_of(&api.get("a").await.unwrap()),
            vec![from.clone()]
        );
        assert_eq!(
            referrers_of(&api.get("b").await.unwrap()),
            vec![from.clone()]
        );
        // Holding only `b` now releases `a`, and wakes it.
        kind.woken();
        index.hold_references(&from, &[cm("b")]).await.unwrap();
        assert_eq!(referrers_of(&api.get("a").await.unwrap()), vec![]);
        assert_eq!(
            referrers_of(&api.get("b").await.unwrap()),
            vec![from.clone()]
        );
        assert_eq!(kind.woken(), vec![cm("a")]);
        // What it holds is known to the index: its deletion later releases `b`.
        assert_eq!(index.take_held(&from), BTreeSet::from([cm("b")]));
    }

    #[tokio::test]
    async fn no_reference_is_added_to_a_target_being_deleted_or_missing() {
        let (index, _kind, api) = index_on_server(&["a"]).await;
        api.delete("a", &DeleteParams::default()).await.unwrap();
        let err = index
            .add_reference(&app("shop"), &cm("a"))
            .await
            .unwrap_err();
        assert!(
            matches!(err, ReferenceError::TargetDeleting(ref t) if *t == cm("a")),
            "{err}"
        );
        assert_eq!(referrers_of(&api.get("a").await.unwrap()), vec![]);
        let err = index
            .add_reference(&app("shop"), &cm("none"))
            .await
            .unwrap_err();
        assert!(
            matches!(err, ReferenceError::TargetMissing(ref t) if *t == cm("none")),
            "{err}"
        );
        assert!(!index.holds_any());
    }
}

#[tokio::test]
async fn what_a_resource_waits_on_is_bounded_and_goes_with_it() {
    let (index, dbs, apps) = index();
    // A spec that names ever new missing targets: only the newest registrations are kept.
    for i in 0..1000 {
        assert_eq!(
            index.readiness(&app("shop"), &db(&format!("n{i}"))).await,
            Readiness::Missing
        );
    }
    let sizes = index.sizes();
    assert_eq!(sizes.waiting, 1);
    assert_eq!(sizes.missing, MAX_WAITS_PER_RESOURCE, "{sizes:?}");
    assert_eq!(sizes.waited_on, MAX_WAITS_PER_RESOURCE, "{sizes:?}");
    // The newest still wake it; the oldest were let go.
    index.appeared(&db("n999"));
    assert_eq!(apps.woken(), vec![app("shop")]);
    index.appeared(&db("n0"));
    assert_eq!(apps.woken(), vec![]);
    // Another waits on a target that exists; the waiter's deletion takes its waits out.
    dbs.put(&db("orders"), Obj::default());
    assert_eq!(
        index.readiness(&app("cart"), &db("orders")).await,
        Readiness::NotReady
    );
    index.gone(&app("shop"));
    index.gone(&app("cart"));
    assert_eq!(
        index.sizes(),
        crate::references::index::IndexSizes::default()
    );
    assert!(!index.holds_or_waits_any());
}
