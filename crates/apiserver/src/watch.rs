//! Watches and the event history: every write becomes an event with the next revision; open watches of
//! its kind get it at once (translated through their namespace, selectors and apiVersion), and the last
//! events are kept so that a watch can resume from a `resourceVersion`. One older than the history answers
//! 410 `Expired`, as the real server's watch cache. A watch from "now" starts with a synthetic `ADDED` per
//! current object (and the `k8s.io/initial-events-end` bookmark when asked); the periodic and closing
//! bookmarks are sent by the HTTP layer (`service.rs`).

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::error::ApiError;
use super::kinds::{Gr, Kind};
use super::object::{Obj, render};
use super::selector::{FieldSelector, LabelSelector};
use super::store::Store;

/// Watch event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EvType {
    Added,
    Modified,
    Deleted,
    Bookmark,
    Error,
}

impl EvType {
    pub(crate) fn prefix(self) -> &'static [u8] {
        match self {
            EvType::Added => b"{\"type\":\"ADDED\",\"object\":",
            EvType::Modified => b"{\"type\":\"MODIFIED\",\"object\":",
            EvType::Deleted => b"{\"type\":\"DELETED\",\"object\":",
            EvType::Bookmark => b"{\"type\":\"BOOKMARK\",\"object\":",
            EvType::Error => b"{\"type\":\"ERROR\",\"object\":",
        }
    }
}

/// One item sent to a watch stream: the event type and the object's bytes (shared, not copied).
pub(crate) type WatchItem = (EvType, Bytes);

/// A write, as sent to open watches and kept in the history.
#[derive(Debug)]
pub(super) struct Event {
    pub(super) rev: u64,
    pub(super) gr: Gr,
    pub(super) ty: EvType,
    pub(super) value: Arc<Value>,
    pub(super) bytes: Bytes,
    /// The previous state, for watchers with selectors (an object leaving a selector is DELETED for them).
    pub(super) old: Option<Arc<Value>>,
}

/// An open watch: what it selects, the apiVersion it reads through, and where its events go.
#[derive(Debug)]
pub(super) struct Watcher {
    ns: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
    kind: Kind,
    tx: mpsc::UnboundedSender<WatchItem>,
}

impl Watcher {
    fn filtered(&self) -> bool {
        !self.labels.is_empty() || !self.fields.is_empty()
    }

    fn matches(&self, v: &Value) -> bool {
        self.labels.matches(v) && self.fields.matches(v)
    }

    /// What this watcher sees of an event, if anything.
    fn translate(&self, ev: &Event) -> Option<WatchItem> {
        if let Some(ns) = &self.ns
            && ev
                .value
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                != Some(ns.as_str())
        {
            return None;
        }
        let ty = if self.filtered() {
            let now = self.matches(&ev.value);
            let before = ev.old.as_deref().is_some_and(|o| self.matches(o));
            match (ev.ty, before, now) {
                (EvType::Deleted, _, true) | (EvType::Deleted, true, _) => EvType::Deleted,
                (EvType::Added, _, true) => EvType::Added,
                (EvType::Modified, true, true) => EvType::Modified,
                (EvType::Modified, false, true) => EvType::Added,
                (EvType::Modified, true, false) => EvType::Deleted,
                _ => return None,
            }
        } else {
            ev.ty
        };
        Some(match render(&ev.value, &ev.bytes, &self.kind) {
            Ok(bytes) => (ty, bytes),
            // An object this version cannot be read in ends the watch with the error, as the
            // real server's watch does.
            Err(e) => (EvType::Error, error_event(&e)),
        })
    }
}

/// A watch `ERROR` event's object: the error's `Status`.
fn error_event(e: &ApiError) -> Bytes {
    Bytes::from(serde_json::to_vec(&e.to_status()).unwrap_or_default())
}

impl Store {
    /// Sends an event to the open watches of its kind (dropping closed ones) and appends it to the history,
    /// forgetting the oldest events beyond the history limit.
    pub(super) fn emit(&mut self, ev: Event) {
        let ev = Arc::new(ev);
        if let Some(t) = self.tables.get_mut(&ev.gr) {
            t.watchers.retain(|w| match w.translate(&ev) {
                Some(item) => w.tx.send(item).is_ok(),
                None => !w.tx.is_closed(),
            });
        }
        self.history.push_back(ev);
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.compacted = old.rev;
            }
        }
    }

    /// Starts a watch. Answers the events to send first and the receiver of later ones.
    /// `rv`: `None` for "" or "0" (synthetic ADDED events for every current object), or a revision.
    #[allow(clippy::type_complexity)]
    pub(crate) fn watch(
        &mut self,
        kind: &Kind,
        ns: Option<&str>,
        labels: LabelSelector,
        fields: FieldSelector,
        rv: Option<u64>,
        initial_events_bookmark: bool,
    ) -> Result<(Vec<WatchItem>, mpsc::UnboundedReceiver<WatchItem>), ApiError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let w = Watcher {
            ns: if kind.namespaced {
                ns.map(str::to_string)
            } else {
                None
            },
            labels,
            fields,
            kind: kind.clone(),
            tx,
        };
        let mut first = Vec::new();
        match rv {
            None => {
                if let Some(t) = self.tables.get(&kind.gr) {
                    let iter: Box<dyn Iterator<Item = (&(String, String), &Obj)>> = match &w.ns {
                        Some(ns) => {
                            let ns = ns.clone();
                            Box::new(
                                t.objects
                                    .range((ns.clone(), String::new())..)
                                    .take_while(move |(k, _)| k.0 == ns),
                            )
                        }
                        None => Box::new(t.objects.iter()),
                    };
                    for (_, o) in iter {
                        if w.matches(&o.value) {
                            first.push(match render(&o.value, &o.bytes, kind) {
                                Ok(bytes) => (EvType::Added, bytes),
                                Err(e) => (EvType::Error, error_event(&e)),
                            });
                        }
                    }
                }
                if initial_events_bookmark {
                    let bm = json!({"kind": kind.kind, "apiVersion": kind.api_version, "metadata": {
                        "resourceVersion": self.rev.to_string(),
                        "annotations": {"k8s.io/initial-events-end": "true"}}});
                    first.push((
                        EvType::Bookmark,
                        Bytes::from(serde_json::to_vec(&bm).unwrap_or_default()),
                    ));
                }
            }
            Some(rv) => {
                if rv < self.compacted {
                    return Err(ApiError::expired(format!(
                        "too old resource version: {rv} ({})",
                        self.compacted + 1
                    )));
                }
                let start = self.history.partition_point(|e| e.rev <= rv);
                for ev in self.history.range(start..) {
                    if ev.gr == kind.gr
                        && let Some(item) = w.translate(ev)
                    {
                        first.push(item);
                    }
                }
            }
        }
        self.tables
            .entry(kind.gr.clone())
            .or_default()
            .watchers
            .push(w);
        Ok((first, rx))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::deletion::DeleteOpts;
    use super::super::error::ApiError;
    use super::super::kinds::Kind;
    use super::super::testing::*;
    use super::*;

    type Started = (Vec<WatchItem>, mpsc::UnboundedReceiver<WatchItem>);

    fn watch(
        s: &mut Store,
        kind: &Kind,
        ns: Option<&str>,
        labels: &str,
        rv: Option<u64>,
    ) -> Result<Started, ApiError> {
        let labels = LabelSelector::parse(labels).unwrap();
        s.watch(kind, ns, labels, FieldSelector::default(), rv, false)
    }

    /// The type and object name of each item.
    fn summary(items: &[WatchItem]) -> Vec<(EvType, String)> {
        items
            .iter()
            .map(|(ty, obj)| {
                (
                    *ty,
                    parse(obj)["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                )
            })
            .collect()
    }

    fn received(rx: &mut mpsc::UnboundedReceiver<WatchItem>) -> Vec<(EvType, String)> {
        let mut items = Vec::new();
        while let Ok(item) = rx.try_recv() {
            items.push(item);
        }
        summary(&items)
    }

    fn ev(ty: EvType, name: &str) -> (EvType, String) {
        (ty, name.to_string())
    }

    #[test]
    fn a_watch_resumed_from_a_revision_gets_exactly_the_later_events() {
        let mut s = store();
        let cm = configmaps(&s);
        let a = create(&mut s, &cm, Some("default"), configmap("a", json!({})));
        let rv: u64 = a["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        create(&mut s, &cm, Some("default"), configmap("b", json!({})));
        put(
            &mut s,
            &cm,
            Some("default"),
            configmap("a", json!({"labels": {"x": "1"}})),
            false,
        )
        .unwrap();
        s.delete(&cm, Some("default"), "b", &DeleteOpts::default())
            .unwrap();
        // Events of other kinds are not sent.
        let secrets = kind(&s, "", "v1", "secrets");
        create(
            &mut s,
            &secrets,
            Some("default"),
            json!({"metadata": {"name": "s"}}),
        );

        let (first, mut rx) = watch(&mut s, &cm, None, "", Some(rv)).unwrap();
        use EvType::*;
        assert_eq!(
            summary(&first),
            [ev(Added, "b"), ev(Modified, "a"), ev(Deleted, "b")]
        );
        let revisions: Vec<u64> = first
            .iter()
            .map(|(_, o)| {
                parse(o)["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap()
                    .parse()
                    .unwrap()
            })
            .collect();
        assert_eq!(revisions, [rv + 1, rv + 2, rv + 3]);
        assert!(received(&mut rx).is_empty());
        create(&mut s, &cm, Some("default"), configmap("c", json!({})));
        assert_eq!(received(&mut rx), [ev(Added, "c")]);

        // From the latest revision there is nothing to catch up on.
        let now = s.revision();
        assert!(
            watch(&mut s, &cm, None, "", Some(now))
                .unwrap()
                .0
                .is_empty()
        );
    }

    #[test]
    fn a_revision_older_than_the_history_answers_410_expired() {
        // The four built-in namespaces take revisions 1 to 4; the history keeps the last three events.
        let mut s = store_with_history(3);
        let cm = configmaps(&s);
        for name in ["a", "b", "c", "d", "e"] {
            create(&mut s, &cm, Some("default"), configmap(name, json!({})));
        }
        // Revisions 5 to 9 were written; 7, 8 and 9 are kept.
        assert_eq!(s.revision(), 9);
        let err = watch(&mut s, &cm, None, "", Some(5)).unwrap_err();
        assert_eq!((err.code, err.reason), (410, "Expired"));
        assert_eq!(err.message, "too old resource version: 5 (7)");
        let (first, _) = watch(&mut s, &cm, None, "", Some(6)).unwrap();
        use EvType::Added;
        assert_eq!(
            summary(&first),
            [ev(Added, "c"), ev(Added, "d"), ev(Added, "e")]
        );
    }

    #[test]
    fn a_watch_from_now_starts_with_the_current_objects() {
        let mut s = store();
        let cm = configmaps(&s);
        create(&mut s, &cm, Some("kube-system"), configmap("b", json!({})));
        create(&mut s, &cm, Some("default"), configmap("a", json!({})));
        let (first, _) = s
            .watch(
                &cm,
                Some("default"),
                LabelSelector::default(),
                FieldSelector::default(),
                None,
                true,
            )
            .unwrap();
        assert_eq!(summary(&first[..1]), [ev(EvType::Added, "a")]);
        assert_eq!(first.len(), 2);
        let (ty, bookmark) = &first[1];
        let bookmark = parse(bookmark);
        assert_eq!(*ty, EvType::Bookmark);
        assert_eq!(bookmark["kind"], "ConfigMap");
        assert_eq!(
            bookmark["metadata"]["resourceVersion"],
            s.revision().to_string()
        );
        assert_eq!(
            bookmark["metadata"]["annotations"]["k8s.io/initial-events-end"],
            "true"
        );

        // Without sendInitialEvents there is no bookmark; all namespaces, in order.
        let (first, _) = watch(&mut s, &cm, None, "", None).unwrap();
        assert_eq!(
            summary(&first),
            [ev(EvType::Added, "a"), ev(EvType::Added, "b")]
        );
    }

    #[test]
    fn a_label_selector_sees_objects_enter_and_leave_it() {
        let mut s = store();
        let cm = configmaps(&s);
        let (first, mut rx) = watch(&mut s, &cm, None, "app=web", None).unwrap();
        assert!(first.is_empty());
        let write = |s: &mut Store, name: &str, labels: serde_json::Value| {
            put(
                s,
                &cm,
                Some("default"),
                configmap(name, json!({"labels": labels})),
                false,
            )
            .unwrap();
        };
        create(&mut s, &cm, Some("default"), configmap("a", json!({})));
        write(&mut s, "a", json!({"app": "web"}));
        write(&mut s, "a", json!({"app": "web", "tier": "1"}));
        write(&mut s, "a", json!({"app": "db"}));
        create(
            &mut s,
            &cm,
            Some("default"),
            configmap("b", json!({"labels": {"app": "web"}})),
        );
        s.delete(&cm, Some("default"), "b", &DeleteOpts::default())
            .unwrap();
        s.delete(&cm, Some("default"), "a", &DeleteOpts::default())
            .unwrap();
        use EvType::*;
        assert_eq!(
            received(&mut rx),
            [
                ev(Added, "a"),
                ev(Modified, "a"),
                ev(Deleted, "a"),
                ev(Added, "b"),
                ev(Deleted, "b")
            ]
        );
    }

    #[test]
    fn a_namespaced_watch_sees_only_its_namespace() {
        let mut s = store();
        let cm = configmaps(&s);
        let (_, mut rx) = watch(&mut s, &cm, Some("kube-system"), "", None).unwrap();
        create(&mut s, &cm, Some("default"), configmap("a", json!({})));
        create(&mut s, &cm, Some("kube-system"), configmap("b", json!({})));
        assert_eq!(received(&mut rx), [ev(EvType::Added, "b")]);
    }

    #[test]
    fn a_watch_through_another_version_sees_that_apiversion() {
        let (mut s, v1, v2) = store_with_two_widget_versions();
        let (_, mut rx) = watch(&mut s, &v2, None, "", None).unwrap();
        create(&mut s, &v1, Some("default"), widget("w", json!({})));
        let (ty, obj) = rx.try_recv().unwrap();
        assert_eq!(
            (ty, parse(&obj)["apiVersion"].clone()),
            (EvType::Added, json!("example.com/v2"))
        );
    }

    #[test]
    fn a_closed_watch_is_dropped_at_the_next_event_of_its_kind() {
        let mut s = store();
        let cm = configmaps(&s);
        let (_, rx) = watch(&mut s, &cm, None, "app=web", None).unwrap();
        drop(rx);
        assert_eq!(s.tables[&cm.gr].watchers.len(), 1);
        // Not even an event the watch would not see keeps it.
        create(&mut s, &cm, Some("default"), configmap("a", json!({})));
        assert!(s.tables[&cm.gr].watchers.is_empty());
    }
}
