//! The object store: the revision counter, one table of objects per resource, and create, get and update
//! (PUT, and the result of a PATCH) over them. Every change goes through `put` or `remove`, which take
//! the next revision, keep the counts and indexes, and emit the watch event.
//!
//! Everything here is synchronous and runs under the cluster's lock; the HTTP layer (`service.rs`) parses
//! requests and turns results into responses. The store's other concerns are `impl Store` blocks in files
//! of their own (`kinds.rs`, `crd.rs`, `validation.rs`, `schema.rs`, `list.rs`, `watch.rs`,
//! `deletion.rs`, `gc.rs`; stored objects and metadata accessors are in `object.rs`): see the map in
//! `mod.rs`.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::apply::Ownership;
use super::conversion::{ConversionHooks, to_storage, view};
use super::deletion::{check_no_new_finalizers, finalizers, is_deleting};
use super::error::ApiError;
use super::gc::{Gc, owner_refs};
use super::kinds::{Gr, Kind};
use super::object::{Obj, ObjRef, meta, meta_mut, meta_str, render};
use super::schema::prune;
use super::validation::{
    check_immutable, check_name, check_namespace_field, check_type, normalize,
};
use super::watch::{EvType, Event, Watcher};

/// The objects of one resource, by (namespace, name), and its open watches.
#[derive(Debug, Default)]
pub(super) struct Table {
    pub(super) namespaced: bool,
    pub(super) objects: BTreeMap<(String, String), Obj>,
    pub(super) watchers: Vec<Watcher>,
}

/// Time as seen by the cluster: wall time at creation plus tokio's elapsed time, so that timestamps follow
/// a paused tokio clock.
#[derive(Debug)]
pub(super) struct Clock {
    wall0: jiff::Timestamp,
    inst0: tokio::time::Instant,
}

impl Clock {
    pub(super) fn now(&self) -> String {
        let elapsed = tokio::time::Instant::now().saturating_duration_since(self.inst0);
        let t = jiff::SignedDuration::try_from(elapsed)
            .ok()
            .and_then(|d| self.wall0.checked_add(d).ok())
            .unwrap_or(self.wall0);
        format!("{t:.0}")
    }
}

/// How a write must treat metadata.resourceVersion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteKind {
    Put,
    Patch,
}

/// The successful result of a write.
#[derive(Debug)]
pub(crate) struct Written {
    pub(crate) bytes: Bytes,
}

/// The store: everything the cluster keeps.
#[derive(Debug)]
pub(crate) struct Store {
    pub(super) rev: u64,
    /// (group, version, plural) → the kind served there.
    pub(super) routes: HashMap<(String, String, String), Arc<Kind>>,
    /// Ordered, like everything iterated here, so that runs are deterministic.
    pub(super) tables: BTreeMap<Gr, Table>,
    /// The last events, oldest first, for watch resumption.
    pub(super) history: VecDeque<Arc<Event>>,
    pub(super) history_limit: usize,
    /// Highest revision dropped from the history.
    pub(super) compacted: u64,
    /// uid → object, for garbage collection.
    pub(super) uids: HashMap<String, ObjRef>,
    /// owner uid → dependents naming it.
    pub(super) dependents: HashMap<String, BTreeSet<ObjRef>>,
    /// namespace → how many objects it holds.
    pub(super) ns_counts: HashMap<String, usize>,
    /// How many objects are stored.
    pub(super) count: usize,
    pub(super) rng: fastrand::Rng,
    pub(super) clock: Clock,
    /// Garbage-collection work queued by writes, done before the request answers.
    pub(super) gc: VecDeque<Gc>,
    /// While set (a `dryRun=All` request), writes are computed and checked but neither stored nor sent.
    pub(crate) dry_run: bool,
    /// Conflicts injected by fault injection so far.
    pub(crate) injected_conflicts: u64,
    /// The conversion hooks registered, by (group, kind).
    pub(super) conversion_hooks: ConversionHooks,
}

/// The object with everything except metadata (and status when it is a subresource): generation bumps
/// when this changes.
fn spec_part(v: &Value, skip_status: bool) -> Map<String, Value> {
    let mut m = v.as_object().cloned().unwrap_or_default();
    m.remove("metadata");
    if skip_status {
        m.remove("status");
    }
    m
}

impl Store {
    pub(crate) fn new(history_limit: usize, seed: u64) -> Store {
        let mut s = Store {
            rev: 0,
            routes: HashMap::new(),
            tables: BTreeMap::new(),
            history: VecDeque::new(),
            history_limit: history_limit.max(1),
            compacted: 0,
            uids: HashMap::new(),
            dependents: HashMap::new(),
            ns_counts: HashMap::new(),
            count: 0,
            rng: fastrand::Rng::with_seed(seed),
            clock: Clock {
                wall0: jiff::Timestamp::now(),
                inst0: tokio::time::Instant::now(),
            },
            gc: VecDeque::new(),
            dry_run: false,
            injected_conflicts: 0,
            conversion_hooks: ConversionHooks::default(),
        };
        s.register_builtins();
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let kind =
                s.routes[&(String::new(), "v1".to_string(), "namespaces".to_string())].clone();
            let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
            s.create(&kind, None, body, None)
                .expect("built-in namespace is valid");
        }
        s
    }

    pub(crate) fn now(&self) -> String {
        self.clock.now()
    }

    pub(crate) fn object_count(&self) -> usize {
        self.count
    }

    pub(crate) fn revision(&self) -> u64 {
        self.rev
    }

    pub(super) fn new_uid(&mut self) -> String {
        let a = self.rng.u64(..);
        let b = self.rng.u64(..);
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xfff,
            ((b >> 48) & 0x3fff) | 0x8000,
            b & 0xffff_ffff_ffff
        )
    }

    // ---- low-level writes: every change goes through `put` or `remove` -------------------------------

    pub(super) fn put(&mut self, r: &ObjRef, mut value: Value, ty: EvType) -> Obj {
        if self.dry_run {
            return Obj::new(value);
        }
        self.rev += 1;
        meta_mut(&mut value).insert("resourceVersion".into(), json!(self.rev.to_string()));
        let bytes = Bytes::from(serde_json::to_vec(&value).unwrap_or_default());
        let value = Arc::new(value);
        let obj = Obj {
            value: value.clone(),
            bytes: bytes.clone(),
        };
        let table = self.tables.entry(r.gr.clone()).or_default();
        let old = table
            .objects
            .insert((r.ns.clone(), r.name.clone()), obj.clone());
        if old.is_none() {
            self.count += 1;
            if !r.ns.is_empty() {
                *self.ns_counts.entry(r.ns.clone()).or_default() += 1;
            }
            if let Some(uid) = meta_str(&value, "uid") {
                self.uids.insert(uid.to_string(), r.clone());
            }
        }
        let old_value = old.map(|o| o.value);
        self.index(r, old_value.as_deref(), Some(&value));
        self.emit(Event {
            rev: self.rev,
            gr: r.gr.clone(),
            ty,
            value,
            bytes,
            old: old_value,
        });
        obj
    }

    pub(super) fn remove(&mut self, r: &ObjRef, mut value: Value) -> Obj {
        if self.dry_run {
            return Obj::new(value);
        }
        let Some(old) = self
            .tables
            .get_mut(&r.gr)
            .and_then(|t| t.objects.remove(&(r.ns.clone(), r.name.clone())))
        else {
            return Obj::new(value);
        };
        self.rev += 1;
        meta_mut(&mut value).insert("resourceVersion".into(), json!(self.rev.to_string()));
        let bytes = Bytes::from(serde_json::to_vec(&value).unwrap_or_default());
        let value = Arc::new(value);
        self.count -= 1;
        if !r.ns.is_empty()
            && let Some(c) = self.ns_counts.get_mut(&r.ns)
        {
            *c -= 1;
            if *c == 0 {
                self.gc.push_back(Gc::Namespace(r.ns.clone()));
            }
        }
        let uid = meta_str(&value, "uid").unwrap_or_default().to_string();
        self.uids.remove(&uid);
        self.index(r, Some(&old.value), None);
        self.gc.push_back(Gc::Removed {
            uid,
            owners: owner_refs(&value).into_iter().map(|o| o.0).collect(),
        });
        if r.gr.plural == "customresourcedefinitions" && r.gr.group == "apiextensions.k8s.io" {
            self.gc.push_back(Gc::CrdRemoved);
        }
        self.emit(Event {
            rev: self.rev,
            gr: r.gr.clone(),
            ty: EvType::Deleted,
            value: value.clone(),
            bytes: bytes.clone(),
            old: Some(old.value),
        });
        Obj { value, bytes }
    }

    pub(super) fn lookup(&self, r: &ObjRef) -> Option<&Obj> {
        self.tables
            .get(&r.gr)?
            .objects
            .get(&(r.ns.clone(), r.name.clone()))
    }

    // ---- requests ------------------------------------------------------------------------------------

    pub(super) fn objref(kind: &Kind, ns: Option<&str>, name: &str) -> ObjRef {
        ObjRef {
            gr: kind.gr.clone(),
            ns: if kind.namespaced {
                ns.unwrap_or_default().to_string()
            } else {
                String::new()
            },
            name: name.to_string(),
        }
    }

    /// GET one object.
    pub(crate) fn get(&self, kind: &Kind, ns: Option<&str>, name: &str) -> Result<Bytes, ApiError> {
        let r = Self::objref(kind, ns, name);
        let o = self
            .lookup(&r)
            .ok_or_else(|| ApiError::not_found(kind.subject(name)))?;
        render(&o.value, &o.bytes, kind)
    }

    /// POST. `managed`: the `managedFields` to record (server-side apply), otherwise none.
    pub(crate) fn create(
        &mut self,
        kind: &Kind,
        ns: Option<&str>,
        mut body: Value,
        managed: Option<Value>,
    ) -> Result<Written, ApiError> {
        check_type(kind, &mut body)?;
        if !body.get("metadata").is_none_or(Value::is_object) {
            return Err(ApiError::bad_request("metadata must be an object"));
        }
        check_namespace_field(kind, ns, &mut body)?;
        self.check_namespace_accepts(kind, ns, &body)?;
        if meta_str(&body, "resourceVersion").is_some_and(|v| !v.is_empty()) {
            return Err(ApiError::storage(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        let generate = meta_str(&body, "generateName")
            .unwrap_or_default()
            .to_string();
        let mut name = meta_str(&body, "name").unwrap_or_default().to_string();
        if name.is_empty() {
            if generate.is_empty() {
                return Err(ApiError::invalid(
                    &kind.gr.group,
                    &kind.kind,
                    "",
                    "metadata.name",
                    "Required value: name or generateName is required".into(),
                ));
            }
            const ALNUM: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
            for _ in 0..16 {
                let suffix: String = (0..5)
                    .map(|_| ALNUM[self.rng.usize(..ALNUM.len())] as char)
                    .collect();
                name = format!("{generate}{suffix}");
                if self.lookup(&Self::objref(kind, ns, &name)).is_none() {
                    break;
                }
            }
        }
        check_name(kind, &name)?;
        normalize(kind, &name, &mut body)?;
        if let Some(schema) = &kind.schema {
            prune(&mut body, schema, true);
        }
        let r = Self::objref(kind, ns, &name);
        if self.lookup(&r).is_some() {
            return Err(ApiError::already_exists(kind.subject(&name)));
        }
        if kind.gr.plural == "customresourcedefinitions" {
            self.prepare_crd(&mut body, &name)?;
        }
        let uid = self.new_uid();
        let now = self.clock.now();
        let m = meta_mut(&mut body);
        m.insert("name".into(), json!(name));
        for f in [
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "managedFields",
            "selfLink",
            "resourceVersion",
        ] {
            m.remove(f);
        }
        m.insert("uid".into(), json!(uid));
        m.insert("creationTimestamp".into(), json!(now));
        if let Some(managed) = managed {
            m.insert("managedFields".into(), managed);
        }
        if kind.generation {
            m.insert("generation".into(), json!(1));
        } else {
            m.remove("generation");
        }
        if kind.gr.plural == "namespaces" {
            body["spec"] = json!({"finalizers": ["kubernetes"]});
            body["status"] = json!({"phase": "Active"});
        } else if kind.status && kind.gr.plural != "customresourcedefinitions" {
            body.as_object_mut().map(|o| o.remove("status"));
        }
        let body = to_storage(kind, body)?;
        let obj = self.put(&r, body, EvType::Added);
        if kind.gr.plural == "customresourcedefinitions" && !self.dry_run {
            self.register_crd(&obj.value);
        }
        self.run_gc();
        Ok(Written {
            bytes: render(&obj.value, &obj.bytes, kind)?,
        })
    }

    /// PUT (replace) or the result of a PATCH: `new` is the full desired object; `ownership`
    /// says who its fields belong to.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn update(
        &mut self,
        kind: &Kind,
        ns: Option<&str>,
        name: &str,
        mut new: Value,
        status_only: bool,
        how: WriteKind,
        inject_conflict: bool,
        ownership: Ownership<'_>,
    ) -> Result<Written, ApiError> {
        check_type(kind, &mut new)?;
        if !new.get("metadata").is_none_or(Value::is_object) {
            return Err(ApiError::bad_request("metadata must be an object"));
        }
        let r = Self::objref(kind, ns, name);
        let old = self
            .lookup(&r)
            .cloned()
            .ok_or_else(|| ApiError::not_found(kind.subject(name)))?;
        match meta_str(&new, "name") {
            Some(n) if n == name => {}
            other => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({}) does not match the name on the URL ({name})",
                    other.unwrap_or_default()
                )));
            }
        }
        check_namespace_field(kind, ns, &mut new)?;
        let old_rv = meta_str(&old.value, "resourceVersion")
            .unwrap_or_default()
            .to_string();
        match meta_str(&new, "resourceVersion") {
            Some(rv) if !rv.is_empty() && rv != old_rv => {
                return Err(ApiError::conflict(kind.subject(name)));
            }
            Some(rv) if !rv.is_empty() => {}
            _ if how == WriteKind::Put && kind.custom => {
                return Err(ApiError::invalid(
                    &kind.gr.group,
                    &kind.gr.plural,
                    name,
                    "metadata.resourceVersion",
                    "Invalid value: 0x0: must be specified for an update".into(),
                ));
            }
            _ => {}
        }
        let old_uid = meta_str(&old.value, "uid").unwrap_or_default();
        if let Some(uid) = meta_str(&new, "uid").filter(|u| !u.is_empty() && *u != old_uid) {
            return Err(ApiError::precondition(
                kind.subject(name),
                format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {old_uid}"
                ),
            ));
        }
        if inject_conflict {
            self.injected_conflicts += 1;
            return Err(ApiError::conflict(kind.subject(name)));
        }
        if !status_only {
            check_immutable(kind, name, &old.value, &new)?;
        }
        // The stored object as this version reads it (it may be stored in another version).
        let old_view = view(kind, &old.value)?;
        let old_v: &Value = &old_view;
        // A write that sets `managedFields` (to something else than they are) is taken as
        // written, as on the real server; otherwise an update records who changed what.
        let mut wrote_managed = false;
        let mut next = if status_only {
            let mut n = old_v.clone();
            match new.get("status") {
                Some(s) => n["status"] = s.clone(),
                None => {
                    n.as_object_mut().map(|o| o.remove("status"));
                }
            }
            n
        } else {
            let om = meta(old_v).cloned().unwrap_or_default();
            let m = meta_mut(&mut new);
            for f in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
            ] {
                match om.get(f) {
                    Some(v) => m.insert(f.into(), v.clone()),
                    None => m.remove(f),
                };
            }
            wrote_managed = m
                .get("managedFields")
                .is_some_and(|mf| Some(mf) != om.get("managedFields"));
            // managedFields are kept unless the write sets them (as on the real server).
            if !m.contains_key("managedFields")
                && let Some(mf) = om.get("managedFields")
            {
                m.insert("managedFields".into(), mf.clone());
            }
            m.remove("selfLink");
            if kind.status {
                match old_v.get("status") {
                    Some(s) => new["status"] = s.clone(),
                    None => {
                        new.as_object_mut().map(|o| o.remove("status"));
                    }
                }
            }
            check_no_new_finalizers(kind, name, old_v, &new)?;
            normalize(kind, name, &mut new)?;
            if kind.gr.plural == "customresourcedefinitions" {
                self.prepare_crd(&mut new, name)?;
            }
            new
        };
        if let Some(schema) = &kind.schema {
            prune(&mut next, schema, true);
        }
        meta_mut(&mut next).insert("resourceVersion".into(), json!(old_rv));
        match ownership {
            Ownership::Applied(managed) => {
                meta_mut(&mut next).insert("managedFields".into(), managed);
            }
            // An object no apply touched has no entries to take fields from: nothing to do.
            Ownership::Updated { manager }
                if !wrote_managed && old_v.pointer("/metadata/managedFields").is_some() =>
            {
                let now = self.clock.now();
                let managed = super::apply::update_managed(
                    old_v,
                    &next,
                    manager,
                    status_only,
                    kind.status,
                    &kind.api_version,
                    &now,
                );
                // No entry at all is no `managedFields`, as on the real server.
                if managed.as_array().is_some_and(Vec::is_empty) {
                    meta_mut(&mut next).remove("managedFields");
                } else {
                    meta_mut(&mut next).insert("managedFields".into(), managed);
                }
            }
            Ownership::Updated { .. } | Ownership::Kept => {}
        }
        if kind.generation && spec_part(old_v, kind.status) != spec_part(&next, kind.status) {
            let g = meta(old_v)
                .and_then(|m| m.get("generation"))
                .and_then(Value::as_i64)
                .unwrap_or(0);
            meta_mut(&mut next).insert("generation".into(), json!(g + 1));
        }
        let next = to_storage(kind, next)?;
        if next == *old.value {
            // No-op writes store nothing and send no event, as on the real server.
            return Ok(Written {
                bytes: render(&old.value, &old.bytes, kind)?,
            });
        }
        let obj = if is_deleting(&next)
            && finalizers(&next).is_empty()
            && !self.namespace_blocks(kind, name)
        {
            // As the real server: the write is not stored but the object is deleted; the DELETED event
            // carries the last stored state, the answer the written one (at its old resourceVersion).
            self.remove(&r, (*old.value).clone());
            Obj::new(next)
        } else {
            self.put(&r, next, EvType::Modified)
        };
        if kind.gr.plural == "customresourcedefinitions"
            && !self.dry_run
            && self.lookup(&r).is_some()
        {
            self.register_crd(&obj.value);
        }
        self.run_gc();
        Ok(Written {
            bytes: render(&obj.value, &obj.bytes, kind)?,
        })
    }

    /// The current object as `kind`'s version reads it (for patches), if it exists.
    pub(crate) fn current(
        &self,
        kind: &Kind,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Option<Value>, ApiError> {
        match self.lookup(&Self::objref(kind, ns, name)) {
            Some(o) => Ok(Some(view(kind, &o.value)?.into_owned())),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests;
