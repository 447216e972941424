//! Garbage collection by `ownerReferences`: the index of dependents by owner uid, and the in-process
//! collector (and namespace controller) that runs inline at the end of each write, so that it is
//! deterministic. Dependents whose owners are all gone are deleted in the background; `Orphan` removes
//! an owner's references from its dependents first; `Foreground` keeps the owner (with the
//! `foregroundDeletion` finalizer) until its blocking dependents are gone. Dangling references on new
//! objects are not collected.

use std::collections::HashSet;

use serde_json::Value;

use super::deletion::{Propagation, finalizers, is_deleting};
use super::kinds::Gr;
use super::object::{ObjRef, meta, meta_mut};
use super::store::Store;
use super::watch::EvType;

/// Pending garbage-collection work.
#[derive(Debug)]
pub(super) enum Gc {
    /// An object was removed: its dependents may be orphaned, its owners may be waiting in foreground.
    Removed { uid: String, owners: Vec<String> },
    /// A namespace may have become empty.
    Namespace(String),
    /// A CRD was removed: stop serving its kind.
    CrdRemoved,
}

/// The finalizer that holds an owner in foreground deletion until its blocking dependents are gone.
pub(super) const FOREGROUND: &str = "foregroundDeletion";

/// The uids an object's `ownerReferences` name, each with its `blockOwnerDeletion`.
pub(super) fn owner_refs(v: &Value) -> Vec<(String, bool)> {
    meta(v)
        .and_then(|m| m.get("ownerReferences"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|o| {
                    let uid = o.get("uid")?.as_str()?.to_string();
                    Some((
                        uid,
                        o.get("blockOwnerDeletion")
                            .and_then(Value::as_bool)
                            .unwrap_or(false),
                    ))
                })
                .collect()
        })
        .unwrap_or_default()
}

impl Store {
    /// Keeps the index of dependents by owner uid up to date with a write (`old` → `new`).
    pub(super) fn index(&mut self, r: &ObjRef, old: Option<&Value>, new: Option<&Value>) {
        let old_owners: HashSet<String> = old
            .map(owner_refs)
            .unwrap_or_default()
            .into_iter()
            .map(|o| o.0)
            .collect();
        let new_owners: HashSet<String> = new
            .map(owner_refs)
            .unwrap_or_default()
            .into_iter()
            .map(|o| o.0)
            .collect();
        for o in old_owners.difference(&new_owners) {
            if let Some(set) = self.dependents.get_mut(o) {
                set.remove(r);
                if set.is_empty() {
                    self.dependents.remove(o);
                }
            }
        }
        for o in new_owners.difference(&old_owners) {
            self.dependents
                .entry(o.clone())
                .or_default()
                .insert(r.clone());
        }
    }

    /// The objects whose `ownerReferences` name `uid`.
    pub(super) fn dependents_of(&self, uid: &str) -> Vec<ObjRef> {
        self.dependents
            .get(uid)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Whether a live dependent of `uid` blocks its deletion (`blockOwnerDeletion: true`).
    pub(super) fn blocking_dependents(&self, uid: &str) -> bool {
        self.dependents.get(uid).is_some_and(|deps| {
            deps.iter().any(|d| {
                self.lookup(d).is_some_and(|o| {
                    owner_refs(&o.value)
                        .iter()
                        .any(|(u, block)| u == uid && *block)
                })
            })
        })
    }

    /// Removes the references to `uid` from its dependents (`propagationPolicy: Orphan`).
    pub(super) fn orphan_dependents(&mut self, uid: &str) {
        let deps = self.dependents_of(uid);
        for d in deps {
            if let Some(o) = self.lookup(&d).cloned() {
                let mut v = (*o.value).clone();
                let m = meta_mut(&mut v);
                if let Some(Value::Array(refs)) = m.get_mut("ownerReferences") {
                    refs.retain(|o| o.get("uid").and_then(Value::as_str) != Some(uid));
                    if refs.is_empty() {
                        m.remove("ownerReferences");
                    }
                }
                self.put(&d, v, EvType::Modified);
            }
        }
    }

    /// The in-process garbage collector and namespace controller: runs until nothing is left to do.
    pub(super) fn run_gc(&mut self) {
        while let Some(work) = self.gc.pop_front() {
            match work {
                Gc::Removed { uid, owners } => {
                    // Dependents whose owners are all gone are deleted (background).
                    if !uid.is_empty() {
                        let deps = self.dependents_of(&uid);
                        for d in deps {
                            let Some(o) = self.lookup(&d) else { continue };
                            let all_gone = owner_refs(&o.value)
                                .iter()
                                .all(|(u, _)| !self.uids.contains_key(u));
                            if all_gone {
                                self.delete_ref(&d, Propagation::Background);
                            }
                        }
                    }
                    // Owners waiting in foreground deletion may now be free.
                    for owner in owners {
                        let Some(r) = self.uids.get(&owner).cloned() else {
                            continue;
                        };
                        let Some(o) = self.lookup(&r) else { continue };
                        if is_deleting(&o.value)
                            && finalizers(&o.value).iter().any(|f| f == FOREGROUND)
                            && !self.blocking_dependents(&owner)
                        {
                            self.drop_finalizer(&r, FOREGROUND);
                        }
                    }
                }
                Gc::CrdRemoved => self.unregister_removed_crds(),
                Gc::Namespace(ns) => {
                    if self.ns_counts.get(&ns).copied().unwrap_or(0) > 0 {
                        continue;
                    }
                    let r = ObjRef {
                        gr: Gr {
                            group: String::new(),
                            plural: "namespaces".into(),
                        },
                        ns: String::new(),
                        name: ns,
                    };
                    if let Some(o) = self.lookup(&r)
                        && is_deleting(&o.value)
                        && finalizers(&o.value).is_empty()
                    {
                        let v = (*o.value).clone();
                        self.remove(&r, v);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::super::deletion::{DeleteOpts, Propagation};
    use super::super::store::Store;
    use super::super::testing::*;

    /// An owner reference to a stored object.
    fn owned_by(owner: &Value, block: bool) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"], "blockOwnerDeletion": block})
    }

    fn cm(s: &mut Store, name: &str, metadata: Value) -> Value {
        let kind = configmaps(s);
        create(s, &kind, Some("default"), configmap(name, metadata))
    }

    fn exists(s: &Store, name: &str) -> bool {
        get(s, &configmaps(s), Some("default"), name).is_some()
    }

    fn delete(s: &mut Store, name: &str, propagation: Propagation) -> Value {
        let opts = DeleteOpts {
            propagation,
            ..Default::default()
        };
        let kind = configmaps(s);
        parse(&s.delete(&kind, Some("default"), name, &opts).unwrap())
    }

    #[test]
    fn dependents_go_once_all_their_owners_are_gone() {
        let mut s = store();
        let o1 = cm(&mut s, "o1", json!({}));
        let o2 = cm(&mut s, "o2", json!({}));
        cm(
            &mut s,
            "d1",
            json!({"ownerReferences": [owned_by(&o1, false)]}),
        );
        cm(
            &mut s,
            "d2",
            json!({"ownerReferences": [owned_by(&o1, false), owned_by(&o2, false)]}),
        );
        delete(&mut s, "o1", Propagation::Background);
        assert!(!exists(&s, "d1"));
        assert!(exists(&s, "d2"));
        delete(&mut s, "o2", Propagation::Background);
        assert!(!exists(&s, "d2"));
    }

    #[test]
    fn collection_is_transitive_and_respects_finalizers() {
        let mut s = store();
        let o = cm(&mut s, "o", json!({}));
        let child = cm(
            &mut s,
            "child",
            json!({"ownerReferences": [owned_by(&o, false)]}),
        );
        cm(
            &mut s,
            "grandchild",
            json!({"ownerReferences": [owned_by(&child, false)]}),
        );
        cm(
            &mut s,
            "held",
            json!({"ownerReferences": [owned_by(&o, false)], "finalizers": ["x.io/hold"]}),
        );
        delete(&mut s, "o", Propagation::Background);
        assert!(!exists(&s, "child"));
        assert!(!exists(&s, "grandchild"));
        let held = get(&s, &configmaps(&s), Some("default"), "held").unwrap();
        assert!(held["metadata"]["deletionTimestamp"].is_string());
    }

    #[test]
    fn orphaning_removes_the_owners_references_and_keeps_the_dependents() {
        let mut s = store();
        let o1 = cm(&mut s, "o1", json!({}));
        let o2 = cm(&mut s, "o2", json!({}));
        cm(
            &mut s,
            "d",
            json!({"ownerReferences": [owned_by(&o1, false), owned_by(&o2, false)]}),
        );
        cm(
            &mut s,
            "e",
            json!({"ownerReferences": [owned_by(&o1, false)]}),
        );
        delete(&mut s, "o1", Propagation::Orphan);
        assert!(!exists(&s, "o1"));
        let kind = configmaps(&s);
        let d = get(&s, &kind, Some("default"), "d").unwrap();
        assert_eq!(
            d["metadata"]["ownerReferences"],
            json!([owned_by(&o2, false)])
        );
        let e = get(&s, &kind, Some("default"), "e").unwrap();
        assert!(e["metadata"].get("ownerReferences").is_none());
        // The remaining owner still collects its dependent.
        delete(&mut s, "o2", Propagation::Background);
        assert!(!exists(&s, "d"));
        assert!(exists(&s, "e"));
    }

    #[test]
    fn foreground_deletion_waits_for_blocking_dependents() {
        let mut s = store();
        let o = cm(&mut s, "o", json!({}));
        cm(
            &mut s,
            "d",
            json!({"ownerReferences": [owned_by(&o, true)], "finalizers": ["x.io/hold"]}),
        );
        let answer = delete(&mut s, "o", Propagation::Foreground);
        assert_eq!(
            answer["metadata"]["finalizers"],
            json!(["foregroundDeletion"])
        );
        assert!(answer["metadata"]["deletionTimestamp"].is_string());
        assert!(exists(&s, "o"));
        let kind = configmaps(&s);
        let mut d = get(&s, &kind, Some("default"), "d").unwrap();
        assert!(d["metadata"]["deletionTimestamp"].is_string());

        d["metadata"].as_object_mut().unwrap().remove("finalizers");
        put(&mut s, &kind, Some("default"), d, false).unwrap();
        assert!(!exists(&s, "d"));
        assert!(!exists(&s, "o"));
    }

    #[test]
    fn foreground_deletion_without_blocking_dependents_is_immediate() {
        let mut s = store();
        let o = cm(&mut s, "o", json!({}));
        cm(
            &mut s,
            "d",
            json!({"ownerReferences": [owned_by(&o, false)]}),
        );
        let answer = delete(&mut s, "o", Propagation::Foreground);
        assert_eq!(answer["kind"], "Status");
        assert!(!exists(&s, "o"));
        assert!(!exists(&s, "d"));
    }

    #[test]
    fn dangling_and_dropped_owner_references_collect_nothing() {
        let mut s = store();
        let gone =
            json!({"metadata": {"name": "gone", "uid": "00000000-0000-4000-8000-000000000000"}});
        cm(
            &mut s,
            "dangling",
            json!({"ownerReferences": [owned_by(&gone, false)]}),
        );
        assert!(exists(&s, "dangling"));

        let o = cm(&mut s, "o", json!({}));
        let mut d = cm(
            &mut s,
            "d",
            json!({"ownerReferences": [owned_by(&o, false)]}),
        );
        let owner_uid = o["metadata"]["uid"].as_str().unwrap();
        assert_eq!(s.dependents[owner_uid].len(), 1);
        d["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("ownerReferences");
        let kind = configmaps(&s);
        put(&mut s, &kind, Some("default"), d, false).unwrap();
        assert!(!s.dependents.contains_key(owner_uid));
        delete(&mut s, "o", Propagation::Background);
        assert!(exists(&s, "d"));
        assert!(exists(&s, "dangling"));
    }
}
