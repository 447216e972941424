//! Server-side apply, simplified: field ownership per apply manager, kept in `metadata.managedFields`.
//!
//! Every leaf an apply body sets (scalars, lists — lists are atomic, as for CRDs without list-type
//! markers — and empty maps) is owned by its manager. Applying again:
//! * a field another manager owns with a different value is a conflict (409) unless `force`, which takes
//!   the field over;
//! * a field the manager owned before and no longer sends is removed, unless another manager owns it;
//! * the body is then merged into the object.
//!
//! A plain update or patch ([`update_managed`]) that changes a field another manager owns takes
//! it, as the real server's does: the field becomes its manager's, in an `Update` entry, so that the
//! next apply of the manager that owned it conflicts (or, forced, takes it back); fields it removes
//! are no one's. (A create, and a write of fields nobody owns, record nothing: see there.)

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use super::error::ApiError;

/// A path of object keys from the root to a field.
pub(crate) type Path = Vec<String>;

/// The fields an apply body sets. `status_only` for an apply to `/status`; `skip_status` when the kind has
/// a status subresource (the main resource ignores status).
pub(crate) fn field_set(body: &Value, status_only: bool, skip_status: bool) -> BTreeSet<Path> {
    let mut out = BTreeSet::new();
    let Some(obj) = body.as_object() else {
        return out;
    };
    for (k, v) in obj {
        let wanted = match k.as_str() {
            "apiVersion" | "kind" => false,
            "status" => status_only || !skip_status,
            "metadata" => !status_only,
            _ => !status_only,
        };
        if !wanted {
            continue;
        }
        if k == "metadata" {
            if let Some(m) = v.as_object() {
                for mk in ["labels", "annotations", "finalizers", "ownerReferences"] {
                    if let Some(mv) = m.get(mk) {
                        leaves(mv, vec!["metadata".into(), mk.into()], &mut out);
                    }
                }
            }
        } else {
            leaves(v, vec![k.clone()], &mut out);
        }
    }
    out
}

fn leaves(v: &Value, path: Path, out: &mut BTreeSet<Path>) {
    match v.as_object() {
        Some(m) if !m.is_empty() => {
            for (k, c) in m {
                let mut p = path.clone();
                p.push(k.clone());
                leaves(c, p, out);
            }
        }
        _ => {
            out.insert(path);
        }
    }
}

/// The `fieldsV1` form of a field set: `{"f:spec": {".": {}, "f:size": {}}}`.
pub(crate) fn to_fields_v1(set: &BTreeSet<Path>) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut node = &mut root;
        for (i, key) in path.iter().enumerate() {
            let entry = node.entry(format!("f:{key}")).or_insert_with(|| json!({}));
            let Some(child) = entry.as_object_mut() else {
                break;
            };
            if i + 1 < path.len() {
                child.entry(".").or_insert_with(|| json!({}));
            }
            node = child;
        }
    }
    Value::Object(root)
}

/// Reads a `fieldsV1` back into a field set (leaves are nodes without `f:` children).
pub(crate) fn from_fields_v1(v: &Value) -> BTreeSet<Path> {
    fn walk(v: &Value, path: Path, out: &mut BTreeSet<Path>) {
        let children: Vec<(&str, &Value)> = v
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, c)| k.strip_prefix("f:").map(|k| (k, c)))
                    .collect()
            })
            .unwrap_or_default();
        if children.is_empty() {
            if !path.is_empty() {
                out.insert(path);
            }
            return;
        }
        for (k, c) in children {
            let mut p = path.clone();
            p.push(k.to_string());
            walk(c, p, out);
        }
    }
    let mut out = BTreeSet::new();
    walk(v, Vec::new(), &mut out);
    out
}

fn get_path<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(v, |node, k| node.get(k))
}

fn remove_path(v: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut node = v;
    for k in parents {
        match node.get_mut(k) {
            Some(n) => node = n,
            None => return,
        }
    }
    if let Some(m) = node.as_object_mut() {
        m.remove(last);
    }
}

fn dotted(path: &[String]) -> String {
    path.iter().map(|k| format!(".{k}")).collect()
}

/// Who a write's fields belong to, for [`Store::update`](super::store::Store::update).
pub(crate) enum Ownership<'a> {
    /// An apply's `managedFields`, as [`apply`] made them.
    Applied(Value),
    /// A plain update or patch by `manager` ([`update_managed`]; the store reads its clock
    /// only for an object that has `managedFields`).
    Updated { manager: &'a str },
    /// The server's own writes (garbage collection, finalizers it removes): nothing changes
    /// hands.
    Kept,
}

/// The `managedFields` after a plain update (a PUT, or a merge or JSON patch) by `manager`
/// turned `current` into `next`: the fields it changed that another entry owned are taken from
/// that entry and become its own, in its `Update` entry (with `subresource: status` for a write
/// to `/status`), as on the real server, so that an applier's next apply of them conflicts; the
/// fields it removed are taken from every entry; entries left without fields go. Simplified: a
/// field nobody owned is not recorded as the updater's (the real server records it), so an
/// object no apply touched keeps no `managedFields` and costs nothing here.
pub(crate) fn update_managed(
    current: &Value,
    next: &Value,
    manager: &str,
    status_only: bool,
    skip_status: bool,
    api_version: &str,
    now: &str,
) -> Value {
    let entries: Vec<Value> = current
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if entries.is_empty() {
        return Value::Array(entries);
    }
    let before = field_set(current, status_only, skip_status);
    let after = field_set(next, status_only, skip_status);
    let changed: BTreeSet<Path> = after
        .iter()
        .filter(|p| get_path(current, p) != get_path(next, p))
        .cloned()
        .collect();
    let removed: BTreeSet<Path> = before.difference(&after).cloned().collect();
    if changed.is_empty() && removed.is_empty() {
        return Value::Array(entries);
    }
    let subresource = status_only.then_some("status");
    let is_mine = |e: &Value| {
        e.get("manager").and_then(Value::as_str) == Some(manager)
            && e.get("operation").and_then(Value::as_str) == Some("Update")
            && e.get("subresource").and_then(Value::as_str) == subresource
    };
    let mut mine: Option<(Value, BTreeSet<Path>)> = None;
    let mut taken: BTreeSet<Path> = BTreeSet::new();
    let mut managed: Vec<Value> = Vec::new();
    for mut e in entries {
        let mut set = e.get("fieldsV1").map(from_fields_v1).unwrap_or_default();
        let had = set.len();
        set.retain(|p| !removed.contains(p));
        if is_mine(&e) {
            mine = Some((e, set));
            continue;
        }
        taken.extend(set.iter().filter(|p| changed.contains(*p)).cloned());
        set.retain(|p| !changed.contains(p));
        if set.is_empty() {
            continue;
        }
        if set.len() != had {
            e["fieldsV1"] = to_fields_v1(&set);
        }
        managed.push(e);
    }
    let (entry, mut set) = match mine {
        Some((e, set)) => (Some(e), set),
        None => (None, BTreeSet::new()),
    };
    let grew = taken.iter().any(|p| !set.contains(p));
    set.extend(taken);
    if !set.is_empty() {
        let mut entry = entry.unwrap_or_else(|| {
            let mut e = json!({"manager": manager, "operation": "Update", "apiVersion": api_version,
                "time": now, "fieldsType": "FieldsV1"});
            if let Some(sub) = subresource {
                e["subresource"] = json!(sub);
            }
            e
        });
        if grew {
            entry["time"] = json!(now);
        }
        entry["fieldsV1"] = to_fields_v1(&set);
        managed.push(entry);
    }
    managed.sort_by_key(|e| e.get("manager").and_then(Value::as_str).map(str::to_string));
    Value::Array(managed)
}

/// The result of an apply: the object to write and its new `managedFields`.
pub(crate) struct Applied {
    pub(crate) object: Value,
    pub(crate) managed: Value,
}

/// What an apply request asks.
pub(crate) struct ApplyRequest<'a> {
    pub(crate) body: &'a Value,
    pub(crate) manager: &'a str,
    pub(crate) force: bool,
    pub(crate) status_only: bool,
    pub(crate) skip_status: bool,
    pub(crate) api_version: &'a str,
    pub(crate) now: &'a str,
}

/// Applies `req.body` to `current` (`None`: the object is created).
pub(crate) fn apply(current: Option<&Value>, req: &ApplyRequest<'_>) -> Result<Applied, ApiError> {
    let new_fields = field_set(req.body, req.status_only, req.skip_status);
    let entries: Vec<Value> = current
        .and_then(|c| c.pointer("/metadata/managedFields"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut others: Vec<(Value, BTreeSet<Path>)> = Vec::new();
    let mut mine_before: Option<(Value, BTreeSet<Path>)> = None;
    for e in entries {
        let set = e.get("fieldsV1").map(from_fields_v1).unwrap_or_default();
        if e.get("manager").and_then(Value::as_str) == Some(req.manager)
            && e.get("operation").and_then(Value::as_str) == Some("Apply")
        {
            mine_before = Some((e, set));
        } else {
            others.push((e, set));
        }
    }
    // Conflicts with other managers over fields whose value would change.
    if let Some(cur) = current {
        let mut conflicts = Vec::new();
        for (e, set) in &mut others {
            let owner = e
                .get("manager")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let contested: Vec<Path> = set
                .iter()
                .filter(|p| new_fields.contains(*p) && get_path(cur, p) != get_path(req.body, p))
                .cloned()
                .collect();
            if req.force {
                for p in &contested {
                    set.remove(p);
                }
            } else {
                conflicts.extend(contested.into_iter().map(|p| (owner.clone(), p)));
            }
        }
        if !conflicts.is_empty() {
            let causes: Vec<Value> = conflicts
                .iter()
                .map(|(m, p)| {
                    json!({"reason": "FieldManagerConflict", "message": format!("conflict with {m:?}"),
                           "field": dotted(p)})
                })
                .collect();
            let list: Vec<String> = conflicts
                .iter()
                .map(|(m, p)| format!("conflict with {m:?}: {}", dotted(p)))
                .collect();
            let n = conflicts.len();
            return Err(ApiError {
                plain: false,
                code: 409,
                reason: "Conflict",
                message: format!(
                    "Apply failed with {n} conflict{}: {}",
                    if n == 1 { "" } else { "s" },
                    list.join(", ")
                ),
                details: Some(json!({"causes": causes})),
            });
        }
    }
    let mut object = current.cloned().unwrap_or_else(|| json!({}));
    // Fields this manager stops sending, that nobody else owns, go.
    if let Some((_, before)) = &mine_before {
        for p in before.difference(&new_fields) {
            if !others.iter().any(|(_, s)| s.contains(p)) {
                remove_path(&mut object, p);
            }
        }
    }
    json_patch::merge(&mut object, req.body);
    // The manager's entry keeps its time when its fields did not change (so a no-op apply stays a no-op).
    let time = match &mine_before {
        Some((e, before)) if *before == new_fields => {
            e.get("time").cloned().unwrap_or(json!(req.now))
        }
        _ => json!(req.now),
    };
    let mut managed: Vec<Value> = others
        .into_iter()
        .filter_map(|(mut e, set)| {
            if set.is_empty() {
                return None;
            }
            e["fieldsV1"] = to_fields_v1(&set);
            Some(e)
        })
        .collect();
    let mine = json!({"manager": req.manager, "operation": "Apply", "apiVersion": req.api_version,
        "time": time, "fieldsType": "FieldsV1", "fieldsV1": to_fields_v1(&new_fields)});
    // Entries are kept sorted by manager, so the list does not churn.
    managed.push(mine);
    managed.sort_by_key(|e| e.get("manager").and_then(Value::as_str).map(str::to_string));
    Ok(Applied {
        object,
        managed: Value::Array(managed),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req<'a>(body: &'a Value, manager: &'a str, force: bool) -> ApplyRequest<'a> {
        ApplyRequest {
            body,
            manager,
            force,
            status_only: false,
            skip_status: true,
            api_version: "x/v1",
            now: "t",
        }
    }

    #[test]
    fn fields_round_trip() {
        let body = json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "a", "labels": {"l": "1"}},
            "spec": {"a": 1, "b": {"c": [1, 2]}, "e": {}}, "status": {"s": 1}});
        let set = field_set(&body, false, true);
        let want: BTreeSet<Path> = [
            vec!["metadata", "labels", "l"],
            vec!["spec", "a"],
            vec!["spec", "b", "c"],
            vec!["spec", "e"],
        ]
        .into_iter()
        .map(|p| p.into_iter().map(String::from).collect())
        .collect();
        assert_eq!(set, want);
        assert_eq!(from_fields_v1(&to_fields_v1(&set)), set);
        assert_eq!(to_fields_v1(&set)["f:spec"]["."], json!({}));
    }

    #[test]
    fn an_update_takes_the_fields_it_changes_from_their_apply_manager() {
        let b1 = json!({"metadata": {"name": "a"}, "data": {"size": "1", "keep": "k"}});
        let a1 = apply(None, &req(&b1, "op", false)).unwrap();
        let mut cur = a1.object.clone();
        cur["metadata"]["managedFields"] = a1.managed.clone();
        // kubectl edit changes one field: it is the editor's now, the rest stays the operator's.
        let mut next = cur.clone();
        next["data"]["size"] = json!("edited");
        let managed = update_managed(&cur, &next, "kubectl-edit", false, true, "v1", "t2");
        let owners = |managed: &Value, path: &[&str]| -> Vec<String> {
            let path: Path = path.iter().map(|s| s.to_string()).collect();
            managed
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| from_fields_v1(&e["fieldsV1"]).contains(&path))
                .map(|e| {
                    format!(
                        "{}:{}",
                        e["manager"].as_str().unwrap(),
                        e["operation"].as_str().unwrap()
                    )
                })
                .collect()
        };
        assert_eq!(owners(&managed, &["data", "size"]), ["kubectl-edit:Update"]);
        assert_eq!(owners(&managed, &["data", "keep"]), ["op:Apply"]);
        next["metadata"]["managedFields"] = managed;
        // The operator's apply now conflicts with the editor; forced, it takes the field back
        // and the editor's entry, left with nothing, goes.
        let err = apply(Some(&next), &req(&b1, "op", false)).err().unwrap();
        assert_eq!(
            err.message,
            "Apply failed with 1 conflict: conflict with \"kubectl-edit\": .data.size"
        );
        let forced = apply(Some(&next), &req(&b1, "op", true)).unwrap();
        assert_eq!(forced.object["data"]["size"], "1");
        assert_eq!(owners(&forced.managed, &["data", "size"]), ["op:Apply"]);
        assert_eq!(
            forced.managed.as_array().unwrap().len(),
            1,
            "{}",
            forced.managed
        );
        // A write that changes nothing moves nothing; a removed field is no one's.
        assert_eq!(
            update_managed(&next, &next, "x", false, true, "v1", "t3"),
            next["metadata"]["managedFields"]
        );
        let mut gone = next.clone();
        gone["data"].as_object_mut().unwrap().remove("keep");
        let managed = update_managed(&next, &gone, "x", false, true, "v1", "t3");
        assert!(owners(&managed, &["data", "keep"]).is_empty(), "{managed}");
    }

    #[test]
    fn an_update_of_fields_nobody_owns_records_nothing() {
        let cur = json!({"metadata": {"name": "a"}, "spec": {"x": 1}});
        let mut next = cur.clone();
        next["status"] = json!({"phase": "Ready"});
        assert_eq!(
            update_managed(&cur, &next, "op", true, true, "x/v1", "t"),
            json!([])
        );
        // A status field an applier owns, written to /status by another: its Update entry of
        // the status subresource.
        let b = json!({"metadata": {"name": "a"}, "status": {"phase": "Pending"}});
        let mut status_req = req(&b, "applier", false);
        status_req.status_only = true;
        let a = apply(Some(&cur), &status_req).unwrap();
        let mut cur = a.object.clone();
        cur["metadata"]["managedFields"] = a.managed.clone();
        let mut next = cur.clone();
        next["status"]["phase"] = json!("Ready");
        let managed = update_managed(&cur, &next, "op", true, true, "x/v1", "t2");
        assert_eq!(
            managed,
            json!([{"manager": "op", "operation": "Update", "apiVersion": "x/v1", "time": "t2",
                "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {".": {}, "f:phase": {}}},
                "subresource": "status"}])
        );
    }

    #[test]
    fn ownership_conflicts_and_removal() {
        let b1 = json!({"metadata": {"name": "a", "labels": {"l": "1"}}, "spec": {"size": 1}});
        let a1 = apply(None, &req(&b1, "m1", false)).unwrap();
        let mut obj = a1.object.clone();
        obj["metadata"]["managedFields"] = a1.managed.clone();
        // Another manager changing an owned field conflicts; the same value does not.
        let b2 = json!({"metadata": {"name": "a"}, "spec": {"size": 2}});
        let err = apply(Some(&obj), &req(&b2, "m2", false)).err().unwrap();
        assert_eq!((err.code, err.reason), (409, "Conflict"));
        assert_eq!(
            err.message,
            "Apply failed with 1 conflict: conflict with \"m1\": .spec.size"
        );
        let same = json!({"metadata": {"name": "a"}, "spec": {"size": 1}});
        assert!(apply(Some(&obj), &req(&same, "m2", false)).is_ok());
        // Force takes over.
        let forced = apply(Some(&obj), &req(&b2, "m2", true)).unwrap();
        assert_eq!(forced.object["spec"]["size"], 2);
        let m1_fields = forced
            .managed
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["manager"] == "m1")
            .unwrap();
        assert!(m1_fields["fieldsV1"]["f:spec"].get("f:size").is_none());
        // The owner dropping a field removes it.
        let b3 = json!({"metadata": {"name": "a"}, "spec": {"size": 1}});
        let a3 = apply(Some(&obj), &req(&b3, "m1", false)).unwrap();
        assert!(a3.object["metadata"]["labels"].get("l").is_none());
    }
}
