//! Helpers shared by the unit tests of the store's files: a store, its kinds, and objects to write.

use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::apply::Ownership;
use super::error::ApiError;
use super::kinds::Kind;
use super::store::{Store, WriteKind};
use super::watch::WatchItem;

/// A store with the built-in namespaces and kinds, keeping `history` events for watch resumption.
pub(super) fn store_with_history(history: usize) -> Store {
    Store::new(history, 0)
}

/// A store with the built-in namespaces and kinds.
pub(super) fn store() -> Store {
    store_with_history(1000)
}

/// The kind served at GROUP/VERSION/PLURAL; panics when none is.
pub(super) fn kind(s: &Store, group: &str, version: &str, plural: &str) -> Arc<Kind> {
    s.resolve(group, version, plural)
        .unwrap_or_else(|| panic!("{group}/{version}/{plural} is not served"))
}

/// Core v1 ConfigMaps.
pub(super) fn configmaps(s: &Store) -> Arc<Kind> {
    kind(s, "", "v1", "configmaps")
}

/// apiextensions.k8s.io v1 CustomResourceDefinitions.
pub(super) fn crds(s: &Store) -> Arc<Kind> {
    kind(s, "apiextensions.k8s.io", "v1", "customresourcedefinitions")
}

/// A ConfigMap body with extra `metadata` fields merged in (e.g. labels, finalizers, ownerReferences).
pub(super) fn configmap(name: &str, metadata: Value) -> Value {
    let mut body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}});
    if let Value::Object(extra) = metadata {
        for (k, v) in extra {
            body["metadata"][k] = v;
        }
    }
    body
}

/// Creates ConfigMaps labelled `app`: (namespace, name, app).
pub(super) fn labelled_configmaps(s: &mut Store, rows: &[(&str, &str, &str)]) {
    let kind = configmaps(s);
    for (ns, name, app) in rows {
        create(
            s,
            &kind,
            Some(ns),
            configmap(name, json!({"labels": {"app": app}})),
        );
    }
}

/// The names of a list's items, in order.
pub(super) fn item_names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .expect("a list has items")
        .iter()
        .map(|i| {
            i["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

/// Creates a namespace.
pub(super) fn namespace(s: &mut Store, name: &str) {
    let kind = kind(s, "", "v1", "namespaces");
    create(s, &kind, None, json!({"metadata": {"name": name}}));
}

/// Watches every object of a kind for what happens from now on (the synthetic `ADDED` events of the
/// current objects are dropped).
pub(super) fn watch_all(s: &mut Store, kind: &Kind) -> mpsc::UnboundedReceiver<WatchItem> {
    let (_current, rx) = s
        .watch(
            kind,
            None,
            Default::default(),
            Default::default(),
            None,
            false,
        )
        .expect("a watch from now starts");
    rx
}

/// Parses what the store answers.
pub(super) fn parse(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).expect("the store answers JSON")
}

/// Creates an object (no server-side apply) and answers it as stored.
pub(super) fn create(s: &mut Store, kind: &Kind, ns: Option<&str>, body: Value) -> Value {
    let written = s.create(kind, ns, body, None).expect("create");
    parse(&written.bytes)
}

/// PUTs `body` over the object it names (the main resource, or `/status` when `status_only`).
pub(super) fn put(
    s: &mut Store,
    kind: &Kind,
    ns: Option<&str>,
    body: Value,
    status_only: bool,
) -> Result<Value, ApiError> {
    let name = body["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let written = s.update(
        kind,
        ns,
        &name,
        body,
        status_only,
        WriteKind::Put,
        false,
        Ownership::Kept,
    )?;
    Ok(parse(&written.bytes))
}

/// The object as stored, if it is.
pub(super) fn get(s: &Store, kind: &Kind, ns: Option<&str>, name: &str) -> Option<Value> {
    s.get(kind, ns, name).ok().map(|b| parse(&b))
}

/// A namespaced CustomResourceDefinition of `widgets.example.com` (kind `Widget`), whose `spec` declares
/// only `size` and whose `status` keeps any field. `versions`: (name, served, storage, status subresource).
pub(super) fn widget_crd(versions: &[(&str, bool, bool, bool)]) -> Value {
    let schema = json!({"type": "object", "properties": {
        "spec": {"type": "object", "properties": {"size": {"type": "integer"}}},
        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}});
    let versions: Vec<Value> = versions
        .iter()
        .map(|(name, served, storage, status)| {
            let mut v = json!({"name": name, "served": served, "storage": storage,
                "schema": {"openAPIV3Schema": schema}});
            if *status {
                v["subresources"] = json!({"status": {}});
            }
            v
        })
        .collect();
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"plural": "widgets", "kind": "Widget"}, "versions": versions}})
}

/// A store serving `widgets.example.com/v1` (with a status subresource) and its kind.
pub(super) fn store_with_widgets() -> (Store, Arc<Kind>) {
    let mut s = store();
    s.install_crd(widget_crd(&[("v1", true, true, true)]))
        .expect("the widget CRD is valid");
    let widgets = kind(&s, "example.com", "v1", "widgets");
    (s, widgets)
}

/// A store serving `widgets.example.com` in versions v1 (the storage version) and v2, and both kinds.
pub(super) fn store_with_two_widget_versions() -> (Store, Arc<Kind>, Arc<Kind>) {
    let mut s = store();
    s.install_crd(widget_crd(&[
        ("v1", true, true, false),
        ("v2", true, false, false),
    ]))
    .expect("the widget CRD is valid");
    let v1 = kind(&s, "example.com", "v1", "widgets");
    let v2 = kind(&s, "example.com", "v2", "widgets");
    (s, v1, v2)
}

/// A Widget body of version v1.
pub(super) fn widget(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name}, "spec": spec})
}
