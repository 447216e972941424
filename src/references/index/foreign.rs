//! References on objects of kinds this runtime does not manage (another operator's network, a
//! cloud resource's custom resource): no actor of this runtime waits on their referrers before
//! deleting them, so the reference is also a finalizer of the referrer's own on the target,
//! which the target's controller sees as any other finalizer and the API server honours.
//!
//! - The finalizer is named as the reference annotation is (`ref.<domain>/<hash>`, the hash
//!   the referrer's [`target_hash`](crate::hash::target_hash)): one per referrer, so one
//!   referrer's release never touches another's, and no other finalizer is ever ours.
//! - The referrer lists what it holds on such kinds in an annotation of its own
//!   ([`OperatorNames::held_references_annotation`](crate::names::OperatorNames::held_references_annotation)),
//!   written before the finalizer goes onto a target and trimmed after it is removed. The
//!   list is a superset of the finalizers placed, whatever crashes in between: the
//!   referrer's deletion releases everything it lists before the runtime's finalizer leaves
//!   the referrer, on whichever replica runs it after a restart or a shard move.
//! - The list is the referrer author's to edit. What it names is only ever released, under
//!   this referrer's own key, and only where that key is found on the target: editing it can
//!   make the operator write nothing a write of the referrer's own could not.

use super::*;
use crate::references::MAX_FOREIGN_REFERENCES;

/// Attempts of a guarded finalizer write whose guard failed (the target changed in between).
const GUARDED_ATTEMPTS: usize = 5;

impl ReferenceIndex {
    /// Whether `t` is of a kind this runtime does not manage.
    pub(super) fn is_foreign(&self, t: &Target) -> bool {
        self.kind(t).is_none()
    }

    /// The API of `t`: its kind's when managed, else resolved by discovery.
    pub(super) async fn target_api(
        &self,
        t: &Target,
    ) -> Result<Api<DynamicObject>, ReferenceError> {
        if let Some(k) = self.kind(t) {
            return Ok(k.dynamic_api(t));
        }
        match &self.external {
            Some(ext) => ext.api_for(t).await,
            None => Err(ReferenceError::UnmanagedTarget(t.clone())),
        }
    }

    /// Refuse a reference on a kind this runtime does not manage from a referrer whose
    /// deletion would not wait to release it.
    pub(super) fn check_referrer(&self, from: &Target) -> Result<(), ReferenceError> {
        match self.kind(from) {
            Some(k) if !k.uses_finalizer() => {
                Err(ReferenceError::ReferrerWithoutFinalizer(from.clone()))
            }
            _ => Ok(()),
        }
    }

    /// What `from`'s annotation lists: as last written here, and as its kind's cached object
    /// says (both: the cache may lag behind a write of this runtime's, or of the replica that
    /// ran `from` before a shard move). A superset of what `from` holds on kinds the runtime
    /// does not manage (a target is listed before its finalizer is placed and stays listed
    /// until it is removed), so never taken for held: an add still checks the target.
    pub(super) fn recorded(&self, from: &Target) -> BTreeSet<Target> {
        let mut listed: BTreeSet<Target> = self
            .kind(from)
            .map(|k| k.held_recorded(from))
            .unwrap_or_default()
            .into_iter()
            .collect();
        if let Some(r) = self.records.get(from) {
            listed.extend(r.iter().cloned());
        }
        listed
    }

    /// Make `from`'s annotation list `listed` (nothing written when it does already).
    pub(super) async fn write_record(
        &self,
        from: &Target,
        listed: BTreeSet<Target>,
    ) -> Result<(), ReferenceError> {
        if self.recorded(from) == listed {
            return Ok(());
        }
        if listed.len() > MAX_FOREIGN_REFERENCES {
            return Err(ReferenceError::TooManyForeignReferences(from.clone()));
        }
        let Some(k) = self.kind(from) else {
            // A referrer of no kind of this runtime's (an index's unit test): nothing to list on.
            self.records.insert(from.clone(), listed);
            return Ok(());
        };
        let value = if listed.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::to_string(&listed.iter().collect::<Vec<_>>())?.into()
        };
        let mut annotations = serde_json::Map::new();
        annotations.insert(self.keys().held().to_string(), value);
        if let Some(former) = self.keys().former_held() {
            annotations.insert(former.to_string(), serde_json::Value::Null);
        }
        let patch = serde_json::json!({ "metadata": { "annotations": annotations } });
        match k
            .dynamic_api(from)
            .patch(&from.name, &self.patch_params(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => {}
            // The referrer is gone: nothing of it can be protected any more.
            Err(kube::Error::Api(s)) if s.code == 404 => {
                return Err(ReferenceError::TargetMissing(from.clone()));
            }
            Err(e) => return Err(ReferenceError::Kube(e)),
        }
        self.records.insert(from.clone(), listed);
        Ok(())
    }

    /// Add `from`'s targets in `adding` of kinds the runtime does not manage to its list,
    /// before their finalizers are placed.
    pub(super) async fn record_adding(
        &self,
        from: &Target,
        adding: &[&Target],
    ) -> Result<(), ReferenceError> {
        let foreign: Vec<Target> = adding
            .iter()
            .filter(|t| self.is_foreign(t))
            .map(|t| (*t).clone())
            .collect();
        if foreign.is_empty() {
            return Ok(());
        }
        self.check_referrer(from)?;
        let mut listed = self.recorded(from);
        listed.extend(foreign);
        self.write_record(from, listed).await
    }

    /// Take `removed` (released) out of `from`'s list, if it lists any of them.
    pub(super) async fn record_removing(
        &self,
        from: &Target,
        removed: &[&Target],
    ) -> Result<(), ReferenceError> {
        if !removed.iter().any(|t| self.is_foreign(t)) {
            return Ok(());
        }
        let mut listed = self.recorded(from);
        for t in removed {
            listed.remove(*t);
        }
        self.write_record(from, listed).await
    }

    /// One attempt to put `from`'s reference on `target`, of a kind the runtime does not
    /// manage: its annotation and its finalizer, in one JSON patch. The patch appends to
    /// lists and maps that exist (so it cannot undo another writer's change to them), and is
    /// guarded by the resourceVersion seen where it must create one. A failed guard is a
    /// [`ReferenceError::Conflict`], retried.
    pub(super) async fn try_add_foreign(
        &self,
        from: &Target,
        target: &Target,
    ) -> Result<(), ReferenceError> {
        let api = self.target_api(target).await?;
        let current = self.live_target(&api, target).await?;
        let (key, _) = self.keys().reference_annotations(from);
        let value = serde_json::to_string(from)?;
        let meta = &current.metadata;
        let annotated = meta
            .annotations
            .as_ref()
            .is_some_and(|a| a.get(&key) == Some(&value));
        let finalized = meta.finalizers.as_ref().is_some_and(|f| f.contains(&key));
        if !(annotated && finalized) {
            let mut ops = Vec::new();
            let mut guard = false;
            if !annotated {
                ops.push(match &meta.annotations {
                    Some(_) => serde_json::json!({
                        "op": "add",
                        "path": format!("/metadata/annotations/{}", pointer(&key)),
                        "value": value,
                    }),
                    None => {
                        guard = true;
                        serde_json::json!({
                            "op": "add", "path": "/metadata/annotations", "value": { &key: value },
                        })
                    }
                });
            }
            if !finalized {
                ops.push(match &meta.finalizers {
                    Some(_) => serde_json::json!({
                        "op": "add", "path": "/metadata/finalizers/-", "value": key,
                    }),
                    None => {
                        guard = true;
                        serde_json::json!({
                            "op": "add", "path": "/metadata/finalizers", "value": [key],
                        })
                    }
                });
            }
            if guard {
                ops.insert(
                    0,
                    serde_json::json!({
                        "op": "test", "path": "/metadata/resourceVersion",
                        "value": meta.resource_version,
                    }),
                );
            }
            let written = self.json_patch(&api, target, ops).await?;
            return self.added(from, target, &written).await;
        }
        // Carried already (taken before a restart): held.
        self.added(from, target, &current).await
    }

    /// Remove `from`'s reference from `target`, of a kind the runtime does not manage: its
    /// finalizer and its annotation (current and former domain), each where it is found (a
    /// target that carries neither is not written), guarded by the finalizers' indexes.
    pub(super) async fn remove_foreign(
        &self,
        from: &Target,
        target: &Target,
    ) -> Result<(), ReferenceError> {
        let api = match self.target_api(target).await {
            Ok(api) => api,
            // A kind no longer served (its CRD deleted): nothing of it is left to release.
            Err(ReferenceError::TargetMissing(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        let (key, former) = self.keys().reference_annotations(from);
        let ours = |f: &str| f == key || former.as_deref() == Some(f);
        for _ in 0..GUARDED_ATTEMPTS {
            let current = match api.get_opt(&target.name).await {
                Ok(Some(o)) => o,
                Ok(None) => return Ok(()),
                Err(e) => return Err(ReferenceError::Kube(e)),
            };
            let meta = &current.metadata;
            let mut ops = Vec::new();
            let finalizers = meta.finalizers.as_deref().unwrap_or_default();
            for (i, f) in finalizers.iter().enumerate().rev() {
                if ours(f) {
                    let path = format!("/metadata/finalizers/{i}");
                    ops.push(serde_json::json!({"op": "test", "path": path, "value": f}));
                    ops.push(serde_json::json!({"op": "remove", "path": path}));
                }
            }
            for k in std::iter::once(&key).chain(former.as_ref()) {
                if meta.annotations.as_ref().is_some_and(|a| a.contains_key(k)) {
                    let path = format!("/metadata/annotations/{}", pointer(k));
                    ops.push(serde_json::json!({"op": "remove", "path": path}));
                }
            }
            if ops.is_empty() {
                return Ok(());
            }
            match self.json_patch(&api, target, ops).await {
                Ok(_) | Err(ReferenceError::TargetMissing(_)) => return Ok(()),
                Err(ReferenceError::Conflict(_)) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(ReferenceError::Conflict(target.clone()))
    }

    /// A JSON patch of `target`. A `test` that failed (the target changed since it was read)
    /// is [`ReferenceError::Conflict`]: the API server answers it `422`, as it does an invalid
    /// object, so a `422` is a conflict when the target's resourceVersion moved meanwhile.
    async fn json_patch(
        &self,
        api: &Api<DynamicObject>,
        target: &Target,
        ops: Vec<serde_json::Value>,
    ) -> Result<DynamicObject, ReferenceError> {
        let patch: json_patch::Patch =
            serde_json::from_value(serde_json::Value::Array(ops)).expect("static JSON patch shape");
        match api
            .patch(
                &target.name,
                &self.patch_params(),
                &Patch::Json::<()>(patch),
            )
            .await
        {
            Ok(o) => Ok(o),
            Err(kube::Error::Api(s)) if s.code == 404 => {
                Err(ReferenceError::TargetMissing(target.clone()))
            }
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 422 => {
                Err(ReferenceError::Conflict(target.clone()))
            }
            Err(e) => Err(ReferenceError::Kube(e)),
        }
    }

    /// Before `from`'s own finalizer is removed (its deprovision is done): release every
    /// reference it holds on kinds the runtime does not manage, as known here and as its
    /// annotations (`meta`) list. `Err` leaves the finalizer on `from` (the deletion is tried
    /// again): once `from` is gone, nothing would find those finalizers any more.
    /// Each attempt is abandoned after `timeout`, counted in `timeouts`.
    pub(crate) async fn release_foreign(
        &self,
        from: &Target,
        meta: &kube::api::ObjectMeta,
        timeout: Option<std::time::Duration>,
        timeouts: &std::sync::atomic::AtomicU64,
    ) -> Result<(), ReferenceError> {
        let mut targets = self.recorded(from);
        if let Some(a) = &meta.annotations {
            targets.extend(self.keys().held_in(a));
        }
        targets.extend(self.held_by(from));
        targets.retain(|t| self.is_foreign(t));
        for t in targets {
            crate::object_api::bounded(timeout, timeouts, self.remove_foreign(from, &t)).await?;
            if let Some(mut h) = self.held.get_mut(from) {
                h.remove(&t);
            }
            if let Some(mut r) = self.records.get_mut(from) {
                r.remove(&t);
            }
        }
        Ok(())
    }
}

/// `key` as a JSON Pointer member (`~` and `/` escaped).
fn pointer(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}
