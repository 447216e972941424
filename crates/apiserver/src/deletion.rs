//! Deletion: DELETE of one object or a collection, with preconditions and a propagation policy;
//! finalizers (an object that has some is only marked with `deletionTimestamp` and goes once the last one
//! is removed; none may be added meanwhile); and namespaces, which are marked `Terminating`, have their
//! contents deleted, and go once empty. What becomes of an object's dependents is in `gc.rs`.

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Value, json};

use super::error::ApiError;
use super::gc::{FOREGROUND, Gc};
use super::kinds::Kind;
use super::list::{ListOpts, list_json};
use super::object::{Obj, ObjRef, meta, meta_mut, meta_str, render};
use super::store::Store;
use super::watch::EvType;

/// Deletion propagation policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Propagation {
    #[default]
    Background,
    Foreground,
    Orphan,
}

/// Options of a DELETE.
#[derive(Debug, Clone, Default)]
pub(crate) struct DeleteOpts {
    pub(crate) propagation: Propagation,
    pub(crate) uid: Option<String>,
    pub(crate) resource_version: Option<String>,
}

pub(super) fn finalizers(v: &Value) -> Vec<String> {
    meta(v)
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

pub(super) fn set_finalizers(v: &mut Value, f: Vec<String>) {
    let m = meta_mut(v);
    if f.is_empty() {
        m.remove("finalizers");
    } else {
        m.insert("finalizers".into(), json!(f));
    }
}

pub(super) fn is_deleting(v: &Value) -> bool {
    meta(v)
        .and_then(|m| m.get("deletionTimestamp"))
        .is_some_and(|t| !t.is_null())
}

/// No finalizer may be added to an object that is being deleted.
pub(super) fn check_no_new_finalizers(
    kind: &Kind,
    name: &str,
    old: &Value,
    new: &Value,
) -> Result<(), ApiError> {
    if is_deleting(old) {
        let had: HashSet<String> = finalizers(old).into_iter().collect();
        let added: Vec<String> = finalizers(new)
            .into_iter()
            .filter(|f| !had.contains(f))
            .collect();
        if !added.is_empty() {
            return Err(ApiError::invalid(
                &kind.gr.group,
                &kind.kind,
                name,
                "metadata.finalizers",
                format!(
                    "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
                ),
            ));
        }
    }
    Ok(())
}

impl Store {
    /// DELETE. Answers the object as deleted (or marked for deletion), or a success `Status`
    /// for kinds that answer one.
    pub(crate) fn delete(
        &mut self,
        kind: &Kind,
        ns: Option<&str>,
        name: &str,
        opts: &DeleteOpts,
    ) -> Result<Bytes, ApiError> {
        let r = Self::objref(kind, ns, name);
        let cur = self
            .lookup(&r)
            .cloned()
            .ok_or_else(|| ApiError::not_found(kind.subject(name)))?;
        if let Some(uid) = &opts.uid
            && meta_str(&cur.value, "uid") != Some(uid.as_str())
        {
            return Err(ApiError::precondition(
                kind.subject(name),
                format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta_str(&cur.value, "uid").unwrap_or_default()
                ),
            ));
        }
        if let Some(rv) = &opts.resource_version
            && meta_str(&cur.value, "resourceVersion") != Some(rv.as_str())
        {
            return Err(ApiError::precondition(
                kind.subject(name),
                format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    meta_str(&cur.value, "resourceVersion").unwrap_or_default()
                ),
            ));
        }
        let (obj, gone) = self.delete_ref(&r, opts.propagation);
        self.run_gc();
        if gone && !kind.delete_returns_object {
            let mut details = json!({"name": name, "kind": kind.gr.plural,
                "uid": meta_str(&obj.value, "uid").unwrap_or_default()});
            if !kind.gr.group.is_empty() {
                details["group"] = json!(kind.gr.group);
            }
            let s = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details});
            return Ok(Bytes::from(serde_json::to_vec(&s).unwrap_or_default()));
        }
        render(&obj.value, &obj.bytes, kind)
    }

    /// DELETE of a collection: deletes every match, answers the list of what was deleted.
    pub(crate) fn delete_collection(
        &mut self,
        kind: &Kind,
        ns: Option<&str>,
        opts: &ListOpts,
        del: &DeleteOpts,
    ) -> Result<Vec<u8>, ApiError> {
        let refs: Vec<ObjRef> = match self.tables.get(&kind.gr) {
            Some(t) => t
                .objects
                .iter()
                .filter(|(k, o)| {
                    (!kind.namespaced || ns.is_none_or(|ns| ns == k.0))
                        && opts.labels.matches(&o.value)
                        && opts.fields.matches(&o.value)
                })
                .map(|(k, _)| ObjRef {
                    gr: kind.gr.clone(),
                    ns: k.0.clone(),
                    name: k.1.clone(),
                })
                .collect(),
            None => Vec::new(),
        };
        let mut items = Vec::new();
        for r in refs {
            let (o, _) = self.delete_ref(&r, del.propagation);
            items.push(render(&o.value, &o.bytes, kind)?);
        }
        self.run_gc();
        let head = json!({"kind": kind.list_kind, "apiVersion": kind.api_version,
            "metadata": {"resourceVersion": self.rev.to_string()}});
        Ok(list_json(&head, &items))
    }

    /// Deletes one existing object per policy. Answers its last state and whether it is gone.
    pub(super) fn delete_ref(&mut self, r: &ObjRef, policy: Propagation) -> (Obj, bool) {
        let Some(cur) = self.lookup(r).cloned() else {
            return (
                Obj {
                    value: Arc::new(Value::Null),
                    bytes: Bytes::from_static(b"null"),
                },
                true,
            );
        };
        if is_deleting(&cur.value) {
            return (cur, false);
        }
        let uid = meta_str(&cur.value, "uid").unwrap_or_default().to_string();
        let is_namespace = r.gr.group.is_empty() && r.gr.plural == "namespaces";
        if policy == Propagation::Orphan {
            self.orphan_dependents(&uid);
        }
        let mut v = (*cur.value).clone();
        let mut fins = finalizers(&v);
        let blocking = self.blocking_dependents(&uid);
        if policy == Propagation::Foreground && blocking && !fins.iter().any(|f| f == FOREGROUND) {
            fins.push(FOREGROUND.to_string());
            set_finalizers(&mut v, fins.clone());
        }
        let ns_busy = is_namespace && self.ns_counts.get(&r.name).copied().unwrap_or(0) > 0;
        if fins.is_empty() && !ns_busy {
            let obj = self.remove(r, v);
            return (obj, true);
        }
        let now = self.clock.now();
        let m = meta_mut(&mut v);
        m.insert("deletionTimestamp".into(), json!(now));
        m.insert("deletionGracePeriodSeconds".into(), json!(0));
        // Marking an object for deletion bumps its generation, as on the real server.
        if let Some(g) = m.get("generation").and_then(Value::as_i64) {
            m.insert("generation".into(), json!(g + 1));
        }
        if is_namespace {
            v["status"] = json!({"phase": "Terminating"});
        }
        let obj = self.put(r, v, EvType::Modified);
        if policy == Propagation::Foreground {
            let deps = self.dependents_of(&uid);
            for d in deps {
                self.delete_ref(&d, Propagation::Background);
            }
            self.gc.push_back(Gc::Removed {
                uid: String::new(),
                owners: vec![uid],
            });
        }
        if is_namespace {
            let contents: Vec<ObjRef> = self
                .tables
                .iter()
                .filter(|(_, t)| t.namespaced)
                .flat_map(|(gr, t)| {
                    t.objects
                        .range((r.name.clone(), String::new())..)
                        .take_while(|(k, _)| k.0 == r.name)
                        .map(|(k, _)| ObjRef {
                            gr: gr.clone(),
                            ns: k.0.clone(),
                            name: k.1.clone(),
                        })
                })
                .collect();
            for c in contents {
                self.delete_ref(&c, Propagation::Background);
            }
            self.gc.push_back(Gc::Namespace(r.name.clone()));
        }
        let latest = if self.dry_run {
            obj
        } else {
            self.lookup(r).cloned().unwrap_or(obj)
        };
        (latest, false)
    }

    /// Removes a finalizer from an existing object (an internal controller's write).
    pub(super) fn drop_finalizer(&mut self, r: &ObjRef, fin: &str) {
        let Some(o) = self.lookup(r).cloned() else {
            return;
        };
        let mut v = (*o.value).clone();
        let fins: Vec<String> = finalizers(&v).into_iter().filter(|f| f != fin).collect();
        set_finalizers(&mut v, fins.clone());
        let is_namespace = r.gr.group.is_empty() && r.gr.plural == "namespaces";
        if fins.is_empty()
            && is_deleting(&v)
            && !(is_namespace && self.ns_counts.get(&r.name).copied().unwrap_or(0) > 0)
        {
            self.remove(r, (*o.value).clone());
        } else {
            self.put(r, v, EvType::Modified);
        }
    }

    /// A namespace is removed only once empty.
    pub(super) fn namespace_blocks(&self, kind: &Kind, name: &str) -> bool {
        kind.gr.plural == "namespaces"
            && kind.gr.group.is_empty()
            && self.ns_counts.get(name).copied().unwrap_or(0) > 0
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::super::selector::LabelSelector;
    use super::super::testing::*;
    use super::*;

    fn uid(v: &Value) -> String {
        v["metadata"]["uid"].as_str().unwrap().to_string()
    }

    #[test]
    fn without_finalizers_an_object_goes_at_once_and_delete_answers_a_status() {
        let mut s = store();
        let cm = configmaps(&s);
        let a = create(&mut s, &cm, Some("default"), configmap("a", json!({})));
        let mut rx = watch_all(&mut s, &cm);
        let answer = parse(
            &s.delete(&cm, Some("default"), "a", &DeleteOpts::default())
                .unwrap(),
        );
        assert_eq!(answer["kind"], "Status");
        assert_eq!(answer["status"], "Success");
        assert_eq!(
            answer["details"],
            json!({"name": "a", "kind": "configmaps", "uid": uid(&a)})
        );
        assert!(get(&s, &cm, Some("default"), "a").is_none());
        let (ty, last) = rx.try_recv().unwrap();
        assert_eq!(ty, EvType::Deleted);
        assert_eq!(
            parse(&last)["metadata"]["resourceVersion"],
            s.revision().to_string()
        );
        let err = s
            .delete(&cm, Some("default"), "a", &DeleteOpts::default())
            .unwrap_err();
        assert_eq!(err.code, 404);
    }

    #[test]
    fn finalizers_keep_a_deleted_object_until_they_are_removed() {
        let mut s = store();
        let cm = configmaps(&s);
        let body = configmap("a", json!({"finalizers": ["x.io/a", "x.io/b"]}));
        create(&mut s, &cm, Some("default"), body);
        let marked = parse(
            &s.delete(&cm, Some("default"), "a", &DeleteOpts::default())
                .unwrap(),
        );
        assert!(marked["metadata"]["deletionTimestamp"].is_string());
        assert_eq!(marked["metadata"]["deletionGracePeriodSeconds"], 0);
        assert_eq!(get(&s, &cm, Some("default"), "a").unwrap(), marked);

        // Deleting again changes nothing.
        let rev = s.revision();
        s.delete(&cm, Some("default"), "a", &DeleteOpts::default())
            .unwrap();
        assert_eq!(s.revision(), rev);

        // No finalizer may be added meanwhile.
        let mut added = marked.clone();
        added["metadata"]["finalizers"] = json!(["x.io/a", "x.io/b", "x.io/c"]);
        let err = put(&mut s, &cm, Some("default"), added, false).unwrap_err();
        assert_eq!(err.code, 422);
        assert_eq!(
            err.details.unwrap()["causes"][0]["field"],
            "metadata.finalizers"
        );

        // Removing one keeps the object.
        let mut fewer = marked.clone();
        fewer["metadata"]["finalizers"] = json!(["x.io/b"]);
        let last = put(&mut s, &cm, Some("default"), fewer, false).unwrap();
        assert_eq!(
            get(&s, &cm, Some("default"), "a").unwrap()["metadata"]["finalizers"],
            json!(["x.io/b"])
        );

        // Removing the last deletes it: the answer is the written state at its old resourceVersion, the
        // DELETED event the last stored state at a new one.
        let mut rx = watch_all(&mut s, &cm);
        let mut cleared = last.clone();
        cleared["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("finalizers");
        let answer = put(&mut s, &cm, Some("default"), cleared, false).unwrap();
        assert!(answer["metadata"].get("finalizers").is_none());
        assert_eq!(
            answer["metadata"]["resourceVersion"],
            last["metadata"]["resourceVersion"]
        );
        assert!(get(&s, &cm, Some("default"), "a").is_none());
        let (ty, event) = rx.try_recv().unwrap();
        let event = parse(&event);
        assert_eq!(ty, EvType::Deleted);
        assert_eq!(event["metadata"]["finalizers"], json!(["x.io/b"]));
        assert_eq!(
            event["metadata"]["resourceVersion"],
            s.revision().to_string()
        );
    }

    #[test]
    fn marking_for_deletion_bumps_the_generation() {
        let mut s = store();
        let deployments = kind(&s, "apps", "v1", "deployments");
        let body =
            json!({"metadata": {"name": "d", "finalizers": ["x.io/a"]}, "spec": {"replicas": 1}});
        let created = create(&mut s, &deployments, Some("default"), body);
        assert_eq!(created["metadata"]["generation"], 1);
        let marked = parse(
            &s.delete(&deployments, Some("default"), "d", &DeleteOpts::default())
                .unwrap(),
        );
        assert_eq!(marked["metadata"]["generation"], 2);
    }

    #[test]
    fn preconditions_must_match() {
        let mut s = store();
        let cm = configmaps(&s);
        let a = create(&mut s, &cm, Some("default"), configmap("a", json!({})));
        let rv = a["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_string();
        let wrong_uid = DeleteOpts {
            uid: Some("other".into()),
            ..Default::default()
        };
        let wrong_rv = DeleteOpts {
            resource_version: Some("1".into()),
            ..Default::default()
        };
        for opts in [wrong_uid, wrong_rv] {
            let err = s.delete(&cm, Some("default"), "a", &opts).unwrap_err();
            assert_eq!((err.code, err.reason), (409, "Conflict"));
            assert!(
                err.message.contains("Precondition failed"),
                "{}",
                err.message
            );
        }
        assert!(get(&s, &cm, Some("default"), "a").is_some());
        let right = DeleteOpts {
            uid: Some(uid(&a)),
            resource_version: Some(rv),
            ..Default::default()
        };
        s.delete(&cm, Some("default"), "a", &right).unwrap();
        assert!(get(&s, &cm, Some("default"), "a").is_none());
    }

    #[test]
    fn a_deleted_namespace_terminates_its_contents_then_goes() {
        let mut s = store();
        let cm = configmaps(&s);
        let namespaces = kind(&s, "", "v1", "namespaces");
        namespace(&mut s, "team");
        create(&mut s, &cm, Some("team"), configmap("plain", json!({})));
        let held = configmap("held", json!({"finalizers": ["x.io/hold"]}));
        create(&mut s, &cm, Some("team"), held);
        create(&mut s, &cm, Some("default"), configmap("other", json!({})));

        let answer = parse(
            &s.delete(&namespaces, None, "team", &DeleteOpts::default())
                .unwrap(),
        );
        assert_eq!(answer["kind"], "Namespace");
        assert_eq!(answer["status"]["phase"], "Terminating");
        assert!(answer["metadata"]["deletionTimestamp"].is_string());
        assert!(get(&s, &cm, Some("team"), "plain").is_none());
        assert!(
            get(&s, &cm, Some("team"), "held").unwrap()["metadata"]["deletionTimestamp"]
                .is_string()
        );
        assert!(get(&s, &namespaces, None, "team").is_some());
        assert!(get(&s, &cm, Some("default"), "other").is_some());

        let mut released = get(&s, &cm, Some("team"), "held").unwrap();
        released["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("finalizers");
        put(&mut s, &cm, Some("team"), released, false).unwrap();
        assert!(get(&s, &cm, Some("team"), "held").is_none());
        assert!(get(&s, &namespaces, None, "team").is_none());
    }

    #[test]
    fn delete_collection_deletes_only_the_matches() {
        let mut s = store();
        let cm = configmaps(&s);
        labelled_configmaps(
            &mut s,
            &[
                ("default", "a", "web"),
                ("default", "b", "web"),
                ("default", "c", "db"),
                ("kube-system", "d", "web"),
            ],
        );
        let opts = ListOpts {
            labels: LabelSelector::parse("app=web").unwrap(),
            ..Default::default()
        };
        let answer = s
            .delete_collection(&cm, Some("default"), &opts, &DeleteOpts::default())
            .unwrap();
        let answer = parse(&answer);
        assert_eq!(answer["kind"], "ConfigMapList");
        assert_eq!(
            answer["metadata"]["resourceVersion"],
            s.revision().to_string()
        );
        assert_eq!(item_names(&answer), ["a", "b"]);
        assert!(get(&s, &cm, Some("default"), "a").is_none());
        assert!(get(&s, &cm, Some("default"), "c").is_some());
        assert!(get(&s, &cm, Some("kube-system"), "d").is_some());
    }

    #[test]
    fn a_dry_run_delete_answers_but_changes_nothing() {
        let mut s = store();
        let cm = configmaps(&s);
        create(&mut s, &cm, Some("default"), configmap("a", json!({})));
        let rev = s.revision();
        s.dry_run = true;
        let answer = parse(
            &s.delete(&cm, Some("default"), "a", &DeleteOpts::default())
                .unwrap(),
        );
        s.dry_run = false;
        assert_eq!(answer["status"], "Success");
        assert!(get(&s, &cm, Some("default"), "a").is_some());
        assert_eq!(s.revision(), rev);
    }
}
