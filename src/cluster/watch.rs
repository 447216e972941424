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
use super::selector::{FieldSelector, LabelSelector};
use super::store::{Obj, Store, render};

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
    api_version: String,
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
        Some((ty, render(&ev.value, &ev.bytes, &self.api_version)))
    }
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
            api_version: kind.api_version.clone(),
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
                            first.push((
                                EvType::Added,
                                render(&o.value, &o.bytes, &kind.api_version),
                            ));
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
