//! The runtime's implementation of [`ReferenceApi`]: one index shared by every controller of a
//! runtime. Readiness of managed targets comes from their actors, of other kinds from
//! [`external`](super::external) watches; references are persisted as annotations on their
//! targets and indexed here; deletion waits on live referrers.

use std::collections::BTreeSet;
use std::sync::{Arc, Weak};

use dashmap::DashMap;
use kube::api::{Api, DynamicObject, Patch, PatchParams};

use async_trait::async_trait;

use super::external;
use super::{Readiness, ReadyWhen, ReferenceApi, ReferenceError, Selection, Target, referrers_in};
use crate::messages::{Cause, Trigger};

/// What the index needs from each managed kind (implemented by the runtime per controller).
pub(crate) trait IndexedKind: Send + Sync {
    /// Whether the kind's cache finished its first list.
    fn synced(&self) -> bool;
    /// Whether the store's view of the target is current. Not when the replica watches only
    /// the shards it holds and the target is in another's: then its readiness and existence
    /// are read from a watch of its kind, as for a kind this runtime does not manage.
    fn in_view(&self, target: &Target) -> bool;
    /// Readiness from the store.
    fn readiness(&self, target: &Target) -> Readiness;
    /// What the target's own actor last reported of its readiness (for a target in view, ahead
    /// of its cached status: the watch event of its status write may not be in yet).
    fn said(&self, target: &Target) -> Option<Readiness>;
    /// Records what the target's actor last reported (`None`: nothing, its status says; kept
    /// with the target's cached object, and gone with it).
    fn set_said(&self, target: &Target, said: Option<Readiness>);
    /// Records that the target's actor reported it Ready for `generation`: only while the
    /// cached object is of that generation (a newer one is not Ready until its own reconcile
    /// says so). Whether it was recorded.
    fn set_said_ready_at(&self, target: &Target, generation: Option<i64>) -> bool {
        let _ = generation;
        self.set_said(target, Some(Readiness::Ready));
        true
    }
    /// Whether the target exists (in any state).
    fn exists(&self, target: &Target) -> bool;
    /// Whether the target exists and is being deleted.
    fn deleting(&self, target: &Target) -> bool;
    /// The persisted referrers of the target (from its annotations in the store).
    fn referrers(&self, target: &Target) -> Vec<Target>;
    /// Wake the target's actor (activating it if passive), for `cause`.
    fn notify(&self, target: &Target, cause: Cause);
    /// A dynamic API for patching the target's annotations.
    fn dynamic_api(&self, target: &Target) -> Api<DynamicObject>;
    /// What the cached object `from` lists as its references on kinds this runtime does not
    /// manage ([`Keys::held_in`](crate::names::Keys::held_in)).
    fn held_recorded(&self, from: &Target) -> Vec<Target> {
        let _ = from;
        Vec::new()
    }
    /// Whether the kind's objects carry the runtime's finalizer (their deletion waits for
    /// their deprovision, and for their references on other kinds to be released).
    fn uses_finalizer(&self) -> bool {
        true
    }
    /// Whether the kind is watched in every namespace (or is cluster-scoped): then a watch of
    /// it for targets out of view may be cluster-wide; else it is of the target's namespace,
    /// where the operator's roles grant it.
    fn watches_every_namespace(&self) -> bool {
        true
    }
}

/// A registered kind: apiVersion, kind, and its handle.
type KindEntry = (String, String, Arc<dyn IndexedKind>);

/// At most this many targets are remembered per waiting resource: a spec that names many
/// missing objects, or changes its names over and over, cannot grow the index without bound.
pub(crate) const MAX_WAITS_PER_RESOURCE: usize = 64;

/// How many entries the reference index holds ([`ReferenceIndex::sizes`]), for the metrics.
#[cfg(any(feature = "metrics", test))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct IndexSizes {
    pub(crate) waited_on: usize,
    pub(crate) missing: usize,
    pub(crate) waiting: usize,
    pub(crate) holding: usize,
}

/// The runtime-wide reference and readiness index.
pub(crate) struct ReferenceIndex {
    /// (apiVersion, kind) → handle. A handful of kinds: a scan, and no key to allocate per lookup.
    kinds: std::sync::RwLock<Vec<KindEntry>>,
    /// target → resources waiting for it to become Ready.
    waiters: DashMap<Target, BTreeSet<Target>, ahash::RandomState>,
    /// referrer → targets it references (rebuilt from annotations; kept up to date on writes).
    held: DashMap<Target, BTreeSet<Target>, ahash::RandomState>,
    /// target → resources that found it missing: re-checked when it appears (waiters of a
    /// target that exists are woken only when it becomes Ready).
    missing: DashMap<Target, BTreeSet<Target>, ahash::RandomState>,
    /// resource → the targets it registered on in `waiters` and `missing`, oldest first, at
    /// most [`MAX_WAITS_PER_RESOURCE`]: what its deletion takes out of them, so that those
    /// maps hold no more than the live resources' waits, whatever names they give.
    waits: DashMap<Target, std::collections::VecDeque<Target>, ahash::RandomState>,
    /// referrer → the targets of kinds the runtime does not manage its own annotation lists
    /// (as last written or read): see [`foreign`].
    records: DashMap<Target, BTreeSet<Target>, ahash::RandomState>,
    /// The field manager of the reference writes (the runtime's).
    field_manager: String,
    /// The annotation keys references are persisted under.
    keys: Arc<crate::names::Keys>,
    /// Watches of kinds the runtime does not manage (`None`: an index without a client, whose
    /// targets of such kinds read as missing).
    pub(super) external: Option<external::ExternalKinds>,
    /// This index, for the watch tasks it starts.
    me: Weak<ReferenceIndex>,
}

impl Default for ReferenceIndex {
    fn default() -> Self {
        Self::new(
            crate::names::STANDALONE_FIELD_MANAGER,
            Arc::new(crate::names::Keys::standalone()),
        )
    }
}

impl std::fmt::Debug for ReferenceIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReferenceIndex")
            .field("kinds", &self.kinds.read().map(|k| k.len()).unwrap_or(0))
            .field("waiters", &self.waiters.len())
            .finish()
    }
}

impl ReferenceIndex {
    /// An empty index whose reference writes carry `field_manager`, under `keys`.
    fn new(field_manager: &str, keys: Arc<crate::names::Keys>) -> Self {
        Self {
            kinds: Default::default(),
            waiters: Default::default(),
            held: Default::default(),
            missing: Default::default(),
            waits: Default::default(),
            records: Default::default(),
            field_manager: field_manager.into(),
            keys,
            external: None,
            me: Weak::new(),
        }
    }

    /// The runtime's index: reference writes carry `field_manager`, under `keys`; readiness
    /// of targets of kinds the runtime does not manage is watched through `client`, each
    /// kind's watch stopped after nobody waited on it for `watch_idle`.
    pub(crate) fn for_runtime(
        field_manager: &str,
        keys: Arc<crate::names::Keys>,
        client: kube::Client,
        watch_idle: std::time::Duration,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| Self {
            external: Some(external::ExternalKinds::new(client, watch_idle)),
            me: me.clone(),
            ..Self::new(field_manager, keys)
        })
    }

    /// The annotation keys references are persisted under.
    pub(crate) fn keys(&self) -> &crate::names::Keys {
        &self.keys
    }

    /// The referrers persisted in a target's annotations.
    pub(crate) fn referrers_in(
        &self,
        annotations: &std::collections::BTreeMap<String, String>,
    ) -> Vec<Target> {
        referrers_in(&self.keys, annotations)
    }

    /// The kinds the runtime does not manage whose objects are watched now, as
    /// (apiVersion, kind).
    pub(crate) fn watched_external_kinds(&self) -> Vec<(String, String)> {
        self.external
            .as_ref()
            .map(|e| e.watched())
            .unwrap_or_default()
    }

    fn patch_params(&self) -> PatchParams {
        crate::object_api::patch_params(&self.field_manager)
    }

    pub(crate) fn register_kind(
        &self,
        api_version: &str,
        kind: &str,
        handle: Arc<dyn IndexedKind>,
    ) {
        let mut kinds = self.kinds.write().unwrap_or_else(|e| e.into_inner());
        kinds.retain(|(a, k, _)| !(a == api_version && k == kind));
        kinds.push((api_version.to_string(), kind.to_string(), handle));
    }

    /// Forget every kind (at shutdown): a kind's handle holds its controller's state, which
    /// holds this index, and the cycle would keep both alive after the runtime stopped.
    /// Also stops the watches of kinds the runtime does not manage.
    pub(crate) fn unregister_kinds(&self) {
        self.kinds
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        if let Some(e) = &self.external {
            e.stop_all();
        }
    }

    /// Wake (and forget) everyone waiting on `target` or who found it missing: it changed, and
    /// they ask again (re-registering if they still wait).
    pub(super) fn wake_waiters_of(&self, target: &Target) {
        let waiting = self.waiters.remove(target).map(|(_, w)| w);
        let missed = self.missing.remove(target).map(|(_, w)| w);
        let cause = about(target);
        for w in waiting.into_iter().chain(missed).flatten() {
            self.wake(&w, cause.clone());
        }
    }

    /// Wake everyone waiting on any object of a kind.
    pub(super) fn wake_waiters_of_kind(&self, api_version: &str, kind: &str) {
        let of_kind = |t: &Target| t.api_version == api_version && t.kind == kind;
        let targets: Vec<Target> = self
            .waiters
            .iter()
            .map(|e| e.key().clone())
            .chain(self.missing.iter().map(|e| e.key().clone()))
            .filter(|t| of_kind(t))
            .collect();
        for t in targets {
            self.wake_waiters_of(&t);
        }
    }

    /// Whether anyone waits on, or found missing, an object of a kind.
    pub(super) fn waits_on_kind(&self, api_version: &str, kind: &str) -> bool {
        let of_kind = |t: &Target| t.api_version == api_version && t.kind == kind;
        self.waiters
            .iter()
            .any(|e| of_kind(e.key()) && !e.value().is_empty())
            || self
                .missing
                .iter()
                .any(|e| of_kind(e.key()) && !e.value().is_empty())
    }

    /// Readiness of `target` (`when` decides Ready for a kind the runtime does not manage),
    /// registering `from` as its waiter.
    async fn readiness_of_target(
        &self,
        from: &Target,
        target: &Target,
        when: Option<&ReadyWhen<'_>>,
    ) -> Readiness {
        // Register first, then check: whoever comes second sees the other (no lost wake-up).
        self.waiters
            .entry(target.clone())
            .or_default()
            .insert(from.clone());
        self.note_wait(from, target);
        let managed = self.kind(target);
        let in_view = managed.as_ref().is_some_and(|k| k.in_view(target));
        let said = managed
            .as_ref()
            .filter(|_| in_view)
            .and_then(|k| k.said(target));
        let r = if said == Some(Readiness::Ready) {
            Readiness::Ready
        } else {
            match (managed, &self.external) {
                // What its actor said of a failure or a step back is ahead of its cached
                // status; a deletion (the cache's own news) comes first.
                (Some(k), _) if in_view => match (k.readiness(target), said) {
                    (r @ (Readiness::Deleting | Readiness::Missing), _) | (r, None) => r,
                    (_, Some(said)) => said,
                },
                (managed, Some(ext)) => {
                    let in_namespace = managed.is_some_and(|k| !k.watches_every_namespace());
                    let kind = ext.kind_of(&self.me, target, in_namespace);
                    kind.first_list().await;
                    kind.readiness(target, when)
                }
                (Some(k), None) => k.readiness(target),
                (None, None) => Readiness::Missing,
            }
        };
        if r == Readiness::Ready
            && let Some(mut w) = self.waiters.get_mut(target)
        {
            w.remove(from);
        }
        if r == Readiness::Missing {
            self.missing
                .entry(target.clone())
                .or_default()
                .insert(from.clone());
        }
        r
    }

    /// Remember that `from` registered on `target`; past [`MAX_WAITS_PER_RESOURCE`] targets
    /// its oldest registration is dropped (its wake-up is then the fallback poll's).
    fn note_wait(&self, from: &Target, target: &Target) {
        let dropped = {
            let mut waits = self.waits.entry(from.clone()).or_default();
            if waits.contains(target) {
                return;
            }
            waits.push_back(target.clone());
            if waits.len() > MAX_WAITS_PER_RESOURCE {
                waits.pop_front()
            } else {
                None
            }
        };
        if let Some(old) = dropped {
            self.unregister(from, &old);
        }
    }

    /// Take `from` out of what waits on `target` (an emptied set goes).
    fn unregister(&self, from: &Target, target: &Target) {
        for map in [&self.waiters, &self.missing] {
            map.remove_if_mut(target, |_, set| {
                set.remove(from);
                set.is_empty()
            });
        }
    }

    /// How many entries the index's maps hold (targets waited on or found missing, resources
    /// waiting, referrers holding).
    #[cfg(any(feature = "metrics", test))]
    pub(crate) fn sizes(&self) -> IndexSizes {
        IndexSizes {
            waited_on: self.waiters.len(),
            missing: self.missing.len(),
            waiting: self.waits.len(),
            holding: self.held.len(),
        }
    }

    fn kind(&self, t: &Target) -> Option<Arc<dyn IndexedKind>> {
        self.kind_named(&t.api_version, &t.kind)
    }

    fn kind_named(&self, api_version: &str, kind: &str) -> Option<Arc<dyn IndexedKind>> {
        let kinds = self.kinds.read().unwrap_or_else(|e| e.into_inner());
        kinds
            .iter()
            .find(|(a, k, _)| a == api_version && k == kind)
            .map(|(_, _, h)| h.clone())
    }

    /// Record what a referrer holds, from a target's persisted annotations (start-up rebuild).
    pub(crate) fn learn(&self, target: &Target, referrers: &[Target]) {
        for r in referrers {
            self.held
                .entry(r.clone())
                .or_default()
                .insert(target.clone());
        }
    }

    /// A kind finished a list: its first (reconciles start while it is still arriving), or a
    /// relist after its watch broke, which drops from the store what was deleted meanwhile
    /// without a delete event. Until the first, the store could not say whether an object of
    /// the kind exists, so a target not listed yet read as not Ready rather than missing, and
    /// `deletion_blocked` counted every referrer of the kind as live. For those that do not
    /// exist, wake whoever waits for them (to see them missing) and whatever they held (to
    /// delete it), now instead of at the next fallback poll.
    pub(crate) fn kind_synced(&self, api_version: &str, kind: &str) {
        let Some(handle) = self.kind_named(api_version, kind) else {
            return;
        };
        let absent =
            |t: &Target| t.api_version == api_version && t.kind == kind && !handle.exists(t);
        let gone: Vec<Target> = self
            .held
            .iter()
            .map(|e| e.key().clone())
            .filter(|r| absent(r))
            .collect();
        for r in gone {
            self.notify_held(&r);
        }
        let waited_for: Vec<(Target, Cause)> = self
            .waiters
            .iter()
            .filter(|e| absent(e.key()))
            .flat_map(|e| {
                let cause = about(e.key());
                e.value()
                    .iter()
                    .map(|w| (w.clone(), cause.clone()))
                    .collect::<Vec<_>>()
            })
            .collect();
        for (w, cause) in waited_for {
            self.wake(&w, cause);
        }
    }

    /// Set by a resource's own actor after each reconcile; on Ready, wake every waiter. Not
    /// Ready takes back a Ready said before, and keeps what [`ReferenceIndex::changed`] said
    /// (else the target's cached status is read).
    pub(crate) fn mark_ready(&self, target: &Target, ready: bool) {
        if let Some(k) = self.kind(target) {
            if ready {
                k.set_said(target, Some(Readiness::Ready));
            } else if k.said(target) == Some(Readiness::Ready) {
                k.set_said(target, None);
            }
        }
        if ready {
            self.wake_waiters(target);
        }
    }

    /// `target`'s actor wrote a status that changes its readiness otherwise than to Ready (to
    /// `now`: it failed, or went back to progressing, or is being deleted): record it, and wake
    /// (and forget) everyone waiting on it; each looks again and waits anew if it must. They
    /// read `now`, not the cached status (which the write's watch event has not changed yet).
    pub(crate) fn changed(&self, target: &Target, now: Readiness) {
        if let Some(k) = self.kind(target) {
            k.set_said(target, Some(now));
        }
        self.wake_waiters(target);
    }

    /// Wake (and forget) everyone waiting on `target`.
    fn wake_waiters(&self, target: &Target) {
        if let Some((_, waiters)) = self.waiters.remove(target) {
            let cause = about(target);
            for w in waiters {
                self.wake(&w, cause.clone());
            }
        }
    }

    /// Set by a resource's own actor when a reconcile of `generation` ended Ready: recorded,
    /// and its waiters woken, only while the cached object is of that generation (a newer
    /// one's reconcile says so for itself). Whether it was recorded.
    pub(crate) fn mark_ready_at(&self, target: &Target, generation: Option<i64>) -> bool {
        if let Some(k) = self.kind(target)
            && !k.set_said_ready_at(target, generation)
        {
            return false;
        }
        self.wake_waiters(target);
        true
    }

    /// `target`'s actor starts serving it for the first time (it may be new): those that found
    /// it missing re-check, so a status that said it does not exist says what it is now. (One
    /// that found it missing just as it appeared keeps that status until it is Ready.)
    pub(crate) fn appeared(&self, target: &Target) {
        if let Some((_, waiters)) = self.missing.remove(target) {
            let cause = about(target);
            for w in waiters {
                self.wake(&w, cause.clone());
            }
        }
    }

    /// A resource is gone: forget its readiness and wake those waiting on it (they re-check).
    pub(crate) fn forget(&self, target: &Target) {
        if let Some(k) = self.kind(target) {
            k.set_said(target, None);
        }
        self.held.remove(target);
        self.records.remove(target);
        self.wake_waiters(target);
    }

    /// The targets `from` holds references on (a copy: callers await while iterating).
    fn held_by(&self, from: &Target) -> Vec<Target> {
        self.held
            .get(from)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// What `t` waits on to become Ready, the targets its references hold, and the objects
    /// whose references hold it (for the runtime's introspection).
    pub(crate) fn relations(&self, t: &Target) -> [Vec<Target>; 3] {
        let waits = self
            .waits
            .get(t)
            .map(|w| {
                w.iter()
                    .filter(|x| self.waiters.get(*x).is_some_and(|ws| ws.contains(t)))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        let referrers = self.kind(t).map(|k| k.referrers(t)).unwrap_or_default();
        [waits, self.held_by(t), referrers]
    }

    /// Wake every target `from` holds a reference on (their deletion state may depend on
    /// `from`'s, e.g. a cycle that just closed).
    pub(crate) fn notify_held(&self, from: &Target) {
        let cause = about(from);
        for t in self.held_by(from) {
            self.wake(&t, cause.clone());
        }
    }

    /// Wake `t`'s actor (through its kind's runtime), which runs its reconcile: whether its
    /// kind is managed here. (Also what [`RuntimeHandle::reconcile`](crate::runtime::RuntimeHandle::reconcile)
    /// asks from outside.)
    pub(crate) fn wake(&self, t: &Target, cause: Cause) -> bool {
        match self.kind(t) {
            Some(k) => {
                k.notify(t, cause);
                true
            }
            None => false,
        }
    }

    /// Take what `from` holds out of the index, before its finalizer is removed: from then on
    /// its disappearance from the store (whose watch event can come before the removal's
    /// answer) neither wakes a target early nor forgets references still persisted on them.
    /// [`release_all`](Self::release_all) writes the releases; if the finalizer removal fails,
    /// [`restore_held`](Self::restore_held) puts them back.
    pub(crate) fn take_held(&self, from: &Target) -> BTreeSet<Target> {
        self.held.remove(from).map(|(_, t)| t).unwrap_or_default()
    }

    /// Put back what [`take_held`](Self::take_held) took (the finalizer is still on).
    pub(crate) fn restore_held(&self, from: &Target, targets: BTreeSet<Target>) {
        if !targets.is_empty() {
            self.held.entry(from.clone()).or_default().extend(targets);
        }
    }

    /// Release the references `from` held (taken by [`take_held`](Self::take_held), once its
    /// finalizer is removed); each target is woken as its reference goes. A release that still
    /// fails after a few retries is logged and kept: the target is woken anyway (it proceeds
    /// if `from` has left the store), and [`gone`](Self::gone) wakes it again when `from`
    /// leaves the store later.
    /// Each attempt is abandoned after `timeout` (the policy's `write_timeout`), counted in
    /// `timeouts`.
    pub(crate) async fn release_all(
        &self,
        from: &Target,
        targets: BTreeSet<Target>,
        timeout: Option<std::time::Duration>,
        timeouts: &std::sync::atomic::AtomicU64,
    ) {
        use backon::Retryable;
        let mut kept = Vec::new();
        for t in targets {
            let backoff = backon::ExponentialBuilder::default()
                .with_min_delay(std::time::Duration::from_millis(50))
                .with_max_delay(std::time::Duration::from_secs(1))
                .with_max_times(REFERENCE_WRITE_ATTEMPTS - 1);
            if let Err(e) =
                (|| crate::object_api::bounded(timeout, timeouts, self.release_reference(from, &t)))
                    .retry(backoff)
                    .await
            {
                tracing::warn!(from = %from, target = %t, error = %e, "could not release reference");
                kept.push(t);
            }
        }
        self.forget(from);
        if !kept.is_empty() {
            self.held
                .entry(from.clone())
                .or_default()
                .extend(kept.iter().cloned());
            let cause = about(from);
            for t in &kept {
                self.wake(t, cause.clone());
            }
        }
    }

    /// `from` is gone from its kind's store: wake those waiting on it and every target it still
    /// held (they find it missing and proceed), and forget it.
    pub(crate) fn gone(&self, from: &Target) {
        // Those waiting on it find it missing now, not at their next poll.
        self.wake_waiters(from);
        if self.held.contains_key(from) {
            self.notify_held(from);
            self.forget(from);
        }
        self.records.remove(from);
        if let Some((_, targets)) = self.waits.remove(from) {
            for t in targets {
                self.unregister(from, &t);
            }
        }
    }

    /// Whether any object holds a reference (known to this runtime).
    #[cfg(test)]
    pub(crate) fn holds_any(&self) -> bool {
        !self.held.is_empty()
    }

    /// Whether any resource holds references or waits on a target: what a deletion has to
    /// tell the index.
    pub(crate) fn holds_or_waits_any(&self) -> bool {
        !self.held.is_empty() || !self.waits.is_empty()
    }

    /// The annotations of a merge patch that removes `from`'s reference (its key, and the
    /// former domain's): each set to `null`.
    fn released(&self, from: &Target) -> serde_json::Value {
        let (key, former) = self.keys.reference_annotations(from);
        let mut released = serde_json::Map::new();
        released.insert(key, serde_json::Value::Null);
        if let Some(former) = former {
            released.insert(former, serde_json::Value::Null);
        }
        released.into()
    }

    /// Remove `from`'s reference from `target`: on a managed kind its annotation (a merge
    /// patch with `null`), on another its finalizer too ([`foreign`]).
    async fn remove_reference(&self, from: &Target, target: &Target) -> Result<(), ReferenceError> {
        if self.is_foreign(target) {
            return self.remove_foreign(from, target).await;
        }
        let api = self.target_api(target).await?;
        let patch = serde_json::json!({
            "metadata": { "annotations": self.released(from) }
        });
        match api
            .patch(&target.name, &self.patch_params(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(ReferenceError::Kube(e)),
        }
    }
}

mod deletion;
mod foreign;
mod reference_api;

/// How often a reference write is tried when the target keeps changing under it.
pub(crate) const REFERENCE_WRITE_ATTEMPTS: usize = 10;

#[cfg(test)]
#[path = "index_tests.rs"]
mod tests;

/// A wake-up of a reference's other end, `t` (the target that changed, or the referrer that
/// released it).
pub(crate) fn about(t: &Target) -> Cause {
    Cause::about(Trigger::Reference, &t.kind, t.namespace.as_deref(), &t.name)
}
