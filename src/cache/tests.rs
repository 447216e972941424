//! The kind's cache: stores by namespace, re-lists, Ready flags, the passive encoding.

use super::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::watcher::Event;

fn cm(ns: &str, name: &str) -> ConfigMap {
    let mut c = ConfigMap::default();
    c.metadata.name = Some(name.into());
    c.metadata.namespace = Some(ns.into());
    c
}

/// Each namespace's store answers for its own keys only, and one namespace's re-list
/// leaves the others' objects in place.
#[test]
fn each_namespace_relists_its_own_store_only() {
    let (store, mut writers) = KindStore::<ConfigMap>::new(&[Some("a".into()), Some("b".into())]);
    writers[0].apply_watcher_event(Event::Apply(cm("a", "x")));
    writers[1].apply_watcher_event(Event::Apply(cm("b", "x")));
    writers[1].apply_watcher_event(Event::Apply(cm("b", "y")));
    assert_eq!(store.len(), 3);
    assert!(store.get(&ObjectRef::new("x").within("a")).is_some());
    assert!(
        store.get(&ObjectRef::new("y").within("a")).is_none(),
        "y is in b"
    );
    assert!(
        store.get(&ObjectRef::new("y").within("c")).is_none(),
        "c is not watched"
    );
    // b re-lists with y only.
    writers[1].apply_watcher_event(Event::Init);
    writers[1].apply_watcher_event(Event::InitApply(cm("b", "y")));
    writers[1].apply_watcher_event(Event::InitDone);
    let mut names: Vec<String> = store
        .state()
        .iter()
        .map(|c| {
            format!(
                "{}/{}",
                c.metadata.namespace.as_deref().unwrap_or(""),
                c.metadata.name.as_deref().unwrap_or("")
            )
        })
        .collect();
    names.sort();
    assert_eq!(names, ["a/x", "b/y"]);
}

/// A change replaces the object at its name, a deletion removes it, and a re-list shows
/// nothing of itself until it is complete; then it is the whole store.
#[test]
fn changes_apply_at_once_and_a_relist_when_complete() {
    let (store, mut writers) = KindStore::<ConfigMap>::new(&[None]);
    let w = &mut writers[0];
    let version = |name: &str, ns: &str| {
        store
            .get(&ObjectRef::new(name).within(ns))
            .and_then(|c| c.metadata.resource_version.clone())
    };
    let at = |ns: &str, name: &str, rv: &str| {
        let mut c = cm(ns, name);
        c.metadata.resource_version = Some(rv.into());
        c
    };
    for i in 0..100 {
        w.apply_watcher_event(Event::Apply(at("a", &format!("o{i}"), "1")));
    }
    w.apply_watcher_event(Event::Apply(at("a", "o7", "2")));
    w.apply_watcher_event(Event::Apply(at("b", "o7", "3")));
    assert_eq!(store.len(), 101);
    assert_eq!(version("o7", "a").as_deref(), Some("2"));
    assert_eq!(version("o7", "b").as_deref(), Some("3"));
    w.apply_watcher_event(Event::Delete(at("a", "o7", "4")));
    assert_eq!(version("o7", "a"), None);
    assert_eq!(store.len(), 100);

    let key = |ns: &str, name: &str| ObjectRef::new(name).within(ns);
    store.set_ready(&key("a", "o1"), true);
    w.apply_watcher_event(Event::Init);
    w.apply_watcher_event(Event::InitApply(at("a", "o1", "5")));
    w.apply_watcher_event(Event::InitApply(at("a", "o2", "5")));
    w.apply_watcher_event(Event::InitApply(at("c", "new", "6")));
    assert_eq!(store.len(), 100, "half a list is not shown");
    assert_eq!(version("o1", "a").as_deref(), Some("1"));
    // Said while the list arrives: kept too.
    store.set_ready(&key("a", "o2"), true);
    w.apply_watcher_event(Event::InitDone);
    assert!(
        store.is_ready(&key("a", "o1")),
        "a flag carries over by name"
    );
    assert!(store.is_ready(&key("a", "o2")));
    assert!(!store.is_ready(&key("c", "new")));
    store.set_ready(&key("c", "gone"), true);
    assert!(
        !store.is_ready(&key("c", "gone")),
        "no flag without its object"
    );
    assert_eq!(store.len(), 3);
    assert_eq!(version("o1", "a").as_deref(), Some("5"));
    assert_eq!(version("new", "c").as_deref(), Some("6"));
    assert_eq!(
        version("o7", "b"),
        None,
        "gone from the list, gone from the store"
    );
}

/// A passive object held encoded is found by its name, reads back equal, shows its
/// version without decoding, and is replaced whole by its next version; only the version
/// given is encoded.
#[test]
fn an_encoded_object_reads_back_equal_and_its_next_version_is_whole() {
    let (store, mut writers) = KindStore::<ConfigMap>::new(&[None]);
    let w = &mut writers[0];
    let mut c = cm("ns", "x");
    c.metadata.resource_version = Some("7".into());
    c.metadata.uid = Some("a-uid".into());
    c.data = Some([("k".to_string(), "v\u{e9}".to_string())].into());
    w.apply_watcher_event(Event::Apply(c.clone()));
    w.apply_watcher_event(Event::Apply(cm("ns", "y")));
    w.apply_watcher_event(Event::Apply(cm("other", "x")));
    let key = ObjectRef::new("x").within("ns");
    let cached = store.get(&key).expect("cached");

    let stale = Arc::new(c.clone());
    assert!(!store.encode(&key, &stale), "not the cached version");
    store.set_ready(&key, true);
    assert!(store.encode(&key, &cached));
    assert_eq!(store.encoded_len(), 1);
    let stripped = store.stores[0]
        .1
        .read()
        .get(&key)
        .is_some_and(|s| matches!(&s.obj, Held::Encoded(e) if e.type_stripped()));
    assert!(
        stripped,
        "a ConfigMap's JSON begins with its apiVersion and kind"
    );
    assert!(!store.encode(&key, &cached), "already encoded");
    drop(cached);

    assert_eq!(store.get(&key).as_deref(), Some(&c));
    assert!(store.contains(&key));
    assert!(store.is_ready(&key), "the flag stays with the slot");
    assert_eq!(store.resource_version(&key), Some(Some("7".into())));
    assert_eq!(
        store.resource_version(&ObjectRef::new("gone").within("ns")),
        None
    );
    assert!(store.get(&ObjectRef::new("x").within("other")).is_some());
    assert!(store.get(&ObjectRef::new("y").within("ns")).is_some());
    assert_eq!(store.state().len(), 3, "state decodes what is encoded");

    // The table grows (rehashing every slot, the encoded one by its header's names).
    for i in 0..200 {
        w.apply_watcher_event(Event::Apply(cm("ns", &format!("z{i}"))));
    }
    assert_eq!(store.get(&key).as_deref(), Some(&c));

    let mut next = c.clone();
    next.metadata.resource_version = Some("8".into());
    w.apply_watcher_event(Event::Apply(next.clone()));
    assert_eq!(store.encoded_len(), 0, "a new version is held whole");
    assert_eq!(store.get(&key).as_deref(), Some(&next));

    assert!(store.encode(&key, &store.get(&key).expect("cached")));
    w.apply_watcher_event(Event::Delete(next));
    assert!(
        !store.contains(&key),
        "an encoded object is deleted by name"
    );
    assert_eq!(store.encoded_len(), 0);
}

/// A cluster-scoped object (no namespace) and a re-list: encoded slots are matched by the
/// names in their header.
#[test]
fn encoded_objects_without_a_namespace_keep_their_flags_across_a_relist() {
    let (store, mut writers) = KindStore::<ConfigMap>::new(&[None]);
    let w = &mut writers[0];
    let mut c = ConfigMap::default();
    c.metadata.name = Some("cluster-wide".into());
    w.apply_watcher_event(Event::Apply(c.clone()));
    let key = ObjectRef::<ConfigMap>::new("cluster-wide");
    assert!(store.encode(&key, &store.get(&key).expect("cached")));
    assert_eq!(store.get(&key).as_deref(), Some(&c));
    assert!(!store.contains(&ObjectRef::new("cluster-wide").within("")));
    store.set_ready(&key, true);
    w.apply_watcher_event(Event::Init);
    w.apply_watcher_event(Event::InitApply(c.clone()));
    w.apply_watcher_event(Event::InitDone);
    assert!(store.is_ready(&key));
}

/// A re-list keeps an unchanged object as it is held (encoded), and a changed one whole.
#[test]
fn a_relist_keeps_unchanged_objects_encoded() {
    let (store, mut writers) = KindStore::<ConfigMap>::new(&[None]);
    let w = &mut writers[0];
    let at = |name: &str, rv: &str| {
        let mut c = cm("ns", name);
        c.metadata.resource_version = Some(rv.into());
        c
    };
    for name in ["same", "changed"] {
        w.apply_watcher_event(Event::Apply(at(name, "1")));
        let key = ObjectRef::new(name).within("ns");
        assert!(store.encode(&key, &store.get(&key).expect("cached")));
    }
    w.apply_watcher_event(Event::Init);
    w.apply_watcher_event(Event::InitApply(at("same", "1")));
    w.apply_watcher_event(Event::InitApply(at("changed", "2")));
    w.apply_watcher_event(Event::InitDone);
    assert_eq!(store.encoded_len(), 1);
    let version = |name: &str| store.resource_version(&ObjectRef::new(name).within("ns"));
    assert_eq!(version("same"), Some(Some("1".into())));
    assert_eq!(version("changed"), Some(Some("2".into())));
    assert_eq!(
        store.get(&ObjectRef::new("same").within("ns")).as_deref(),
        Some(&at("same", "1"))
    );
}

/// The Ready flag an object's actor set holds for that object at that generation only:
/// another generation (a changed spec) or another uid (deleted and created again under the
/// name) clears it, whole or encoded; a new version of the same (its status) keeps it.
#[test]
fn the_ready_flag_is_of_one_generation_of_one_object() {
    use crate::actors::test_kind::{Widget, WidgetSpec};
    let (store, mut writers) = KindStore::<Widget>::new(&[None]);
    let key = ObjectRef::new("w").within("ns");
    let version = |uid: &str, generation: i64, rv: &str| {
        let mut w = Widget::new("w", WidgetSpec::default());
        w.metadata.namespace = Some("ns".into());
        w.metadata.uid = Some(uid.into());
        w.metadata.generation = Some(generation);
        w.metadata.resource_version = Some(rv.into());
        w
    };
    writers[0].apply_watcher_event(Event::Apply(version("u1", 1, "1")));
    store.set_ready(&key, true);
    writers[0].apply_watcher_event(Event::Apply(version("u1", 1, "2")));
    assert!(store.is_ready(&key), "a status write keeps it");
    for encoded in [false, true] {
        if encoded {
            store.set_ready(&key, true);
            assert!(store.encode(&key, &store.get(&key).unwrap()));
        }
        let next = if encoded { ("u1", 3) } else { ("u1", 2) };
        writers[0].apply_watcher_event(Event::Apply(version(next.0, next.1, "3")));
        assert!(
            !store.is_ready(&key),
            "a new generation clears it (encoded: {encoded})"
        );
    }
    store.set_ready(&key, true);
    writers[0].apply_watcher_event(Event::Apply(version("u2", 3, "9")));
    assert!(!store.is_ready(&key), "another object under the name");
}

/// What the reference index reads of an encoded object (deletion, status) is what it reads
/// of the whole object.
#[test]
fn an_encoded_object_s_readiness_is_read_as_the_whole_object_s() {
    use crate::actors::test_kind::{Widget, WidgetSpec};
    use crate::status::{Phase, ReadyReason};
    let (store, mut writers) = KindStore::<Widget>::new(&[None]);
    let ready = ResourceStatus::default().with_ready(
        Phase::Ready,
        true,
        ReadyReason::Provisioned,
        "all done",
        Some(3),
    );
    let mut objects = Vec::new();
    for (name, status, deleting) in [
        ("ready", Some(ready), false),
        ("bare", None, false),
        ("leaving", None, true),
    ] {
        let mut w = Widget::new(name, WidgetSpec::default());
        w.metadata.namespace = Some("ns".into());
        w.status = status;
        if deleting {
            w.metadata.deletion_timestamp = Some(
                k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
            );
        }
        writers[0].apply_watcher_event(Event::Apply(w));
        objects.push(ObjectRef::new(name).within("ns"));
    }
    for key in &objects {
        let whole = store.readiness(key).expect("cached");
        let deleting = store.deleting(key).expect("cached");
        assert!(store.encode(key, &store.get(key).expect("cached")));
        assert_eq!(store.readiness(key), Some(whole), "{key}");
        assert_eq!(store.deleting(key), Some(deleting), "{key}");
    }
    let read = |name: &str| store.readiness(&ObjectRef::new(name).within("ns"));
    assert!(read("ready").is_some_and(|(d, s, _)| !d && s.is_ready()));
    assert!(read("bare").is_some_and(|(d, s, _)| !d && !s.is_ready()));
    assert!(read("leaving").is_some_and(|(d, _, _)| d));
    assert_eq!(
        store.deleting(&ObjectRef::new("leaving").within("ns")),
        Some(true)
    );
    assert_eq!(
        store.deleting(&ObjectRef::new("ready").within("ns")),
        Some(false)
    );
}

/// A kind whose `Deserialize` refuses what its `Serialize` writes.
#[derive(
    kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[kube(
    group = "test.actorcile.dev",
    version = "v1",
    kind = "OneWay",
    namespaced
)]
struct OneWaySpec {
    #[serde(skip_serializing)]
    required: String,
}

#[derive(
    kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[kube(
    group = "test.actorcile.dev",
    version = "v1",
    kind = "Lossy",
    namespaced
)]
struct LossySpec {
    /// Decodes as something else than was written: a trimmed copy.
    #[serde(deserialize_with = "trimmed")]
    name: String,
}

fn trimmed<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(<String as serde::Deserialize>::deserialize(d)?
        .trim()
        .to_string())
}

/// An object that decodes from its encoding, but as another object, stays whole: a
/// reconcile must see the object as it was cached.
#[test]
fn a_kind_that_decodes_to_another_object_stays_whole() {
    let (store, mut writers) = KindStore::<Lossy>::new(&[None]);
    let mut o = Lossy::new(
        "a",
        LossySpec {
            name: "  spaced ".into(),
        },
    );
    o.metadata.namespace = Some("ns".into());
    writers[0].apply_watcher_event(Event::Apply(o));
    let key = ObjectRef::new("a").within("ns");
    let obj = store.get(&key).expect("cached");
    assert!(!store.encode(&key, &obj));
    assert_eq!(store.get(&key).expect("cached").spec.name, "  spaced ");
    // One that round-trips, with a map whose order is not fixed, is encoded.
    let (store, mut writers) = KindStore::<ConfigMap>::new(&[None]);
    let mut c = cm("ns", "x");
    c.data = Some(
        (0..20)
            .map(|i| (format!("k{i}"), "v".to_string()))
            .collect(),
    );
    writers[0].apply_watcher_event(Event::Apply(c.clone()));
    let key = ObjectRef::new("x").within("ns");
    let obj = store.get(&key).expect("cached");
    assert!(store.encode(&key, &obj));
    assert_eq!(store.get(&key).unwrap().as_ref(), &c);
}

/// Ready is recorded for the generation a reconcile ran on only: a newer generation cached
/// since then is not Ready until its own reconcile says so.
#[test]
fn ready_is_recorded_for_the_generation_reconciled_only() {
    let (store, mut writers) = KindStore::<ConfigMap>::new(&[None]);
    let at = |generation: i64| {
        let mut c = cm("ns", "t");
        c.metadata.generation = Some(generation);
        c
    };
    let key = ObjectRef::new("t").within("ns");
    writers[0].apply_watcher_event(Event::Apply(at(1)));
    // Generation 2 arrives while generation 1's reconcile ends Ready.
    writers[0].apply_watcher_event(Event::Apply(at(2)));
    assert!(!store.set_ready_at(&key, Some(1)));
    assert!(!store.is_ready(&key));
    assert!(store.set_ready_at(&key, Some(2)));
    assert!(store.is_ready(&key));
    assert!(!store.set_ready_at(&ObjectRef::new("gone").within("ns"), Some(1)));
}

/// An object that does not decode from its own encoding stays whole, and so does every
/// object of its kind after it.
#[test]
fn a_kind_that_does_not_round_trip_stays_whole() {
    let (store, mut writers) = KindStore::<OneWay>::new(&[None]);
    for name in ["a", "b"] {
        let mut o = OneWay::new(
            name,
            OneWaySpec {
                required: "kept".into(),
            },
        );
        o.metadata.namespace = Some("ns".into());
        writers[0].apply_watcher_event(Event::Apply(o));
    }
    for name in ["a", "b"] {
        let key = ObjectRef::new(name).within("ns");
        let obj = store.get(&key).expect("cached");
        assert!(!store.encode(&key, &obj));
        assert_eq!(store.get(&key).expect("cached").spec.required, "kept");
    }
    assert!(!store.encodes.load(Ordering::Relaxed));
    assert_eq!(store.encoded_len(), 0);
}
