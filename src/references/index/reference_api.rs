//! The reference API the provisioners' contexts call ([`ReferenceApi`]), served by the index.

use super::*;

#[async_trait]
impl ReferenceApi for ReferenceIndex {
    async fn readiness(&self, from: &Target, target: &Target) -> Readiness {
        self.readiness_of_target(from, target, None).await
    }

    async fn readiness_when(
        &self,
        from: &Target,
        target: &Target,
        when: &ReadyWhen<'_>,
    ) -> Readiness {
        self.readiness_of_target(from, target, Some(when)).await
    }

    /// On a target of a kind the runtime does not manage, the reference is also a finalizer
    /// of `from`'s, listed on `from` first ([`foreign`](super::foreign)).
    async fn add_reference(&self, from: &Target, target: &Target) -> Result<(), ReferenceError> {
        if self.held.get(from).is_some_and(|s| s.contains(target)) {
            return Ok(());
        }
        self.record_adding(from, &[target]).await?;
        self.retry_add(from, target).await
    }

    async fn release_reference(
        &self,
        from: &Target,
        target: &Target,
    ) -> Result<(), ReferenceError> {
        self.release_one(from, target).await?;
        self.record_removing(from, &[target]).await
    }

    async fn hold_references(
        &self,
        from: &Target,
        targets: &[Target],
    ) -> Result<(), ReferenceError> {
        // What `from` holds: taken by this runtime, or learned from the targets' annotations
        // when their kind was first listed (so also what an earlier run took), or from its
        // own list of targets of kinds the runtime does not manage.
        let held: Vec<Target> = self.held_by(from);
        let adding: Vec<&Target> = targets.iter().filter(|t| !held.contains(t)).collect();
        self.record_adding(from, &adding).await?;
        for t in adding {
            self.retry_add(from, t).await?;
        }
        let mut releasing: BTreeSet<Target> = self.recorded(from);
        releasing.extend(held);
        releasing.retain(|t| !targets.contains(t));
        for t in &releasing {
            self.release_one(from, t).await?;
        }
        let released: Vec<&Target> = releasing.iter().collect();
        self.record_removing(from, &released).await
    }

    async fn set_references(
        &self,
        from: &Target,
        selection: &Selection,
        names: &BTreeSet<String>,
    ) -> Result<(), ReferenceError> {
        let probe = selection.target(selection.namespace.as_deref(), "");
        let api = self.target_api(&probe).await?;
        let params = kube::api::ListParams::default().labels(&selection.labels);
        let selected = api.list(&params).await?;
        // Every name must be in the selection before anything is written.
        let found: BTreeSet<&str> = selected
            .items
            .iter()
            .filter_map(|o| o.metadata.name.as_deref())
            .collect();
        if let Some(missing) = names.iter().find(|n| !found.contains(n.as_str())) {
            let ns = selection.namespace.as_deref().or(from.namespace.as_deref());
            return Err(ReferenceError::TargetMissing(selection.target(ns, missing)));
        }
        let foreign = self.is_foreign(&probe);
        let (key, former) = self.keys().reference_annotations(from);
        // Adds first, then releases: every write is idempotent, so a reconcile that fails half-way
        // is completed by the next one.
        let mut adding = Vec::new();
        let mut release = Vec::new();
        for o in &selected.items {
            let Some(name) = o.metadata.name.as_deref() else {
                continue;
            };
            let target = selection.target(o.metadata.namespace.as_deref(), name);
            let annotations = o.metadata.annotations.as_ref();
            let carries = annotations.is_some_and(|a| a.contains_key(&key));
            let carries_former = former
                .as_ref()
                .is_some_and(|f| annotations.is_some_and(|a| a.contains_key(f)));
            // On a kind this runtime does not manage, the finalizer is part of the reference.
            let finalized = !foreign
                || o.metadata
                    .finalizers
                    .as_ref()
                    .is_some_and(|f| f.contains(&key));
            if names.contains(name) {
                // One held under the former domain only is taken under the current one too.
                if carries && finalized {
                    self.held.entry(from.clone()).or_default().insert(target);
                } else {
                    adding.push(target);
                }
            } else if carries
                || carries_former
                || self.held.get(from).is_some_and(|h| h.contains(&target))
            {
                release.push(target);
            }
        }
        let to_add: Vec<&Target> = adding.iter().collect();
        self.record_adding(from, &to_add).await?;
        for target in &adding {
            self.retry_add(from, target).await?;
        }
        for target in &release {
            self.release_one(from, target).await?;
        }
        let released: Vec<&Target> = release.iter().collect();
        self.record_removing(from, &released).await
    }
}

impl ReferenceIndex {
    /// [`ReferenceIndex::try_add_reference`], retried on a conflict (another referrer wrote
    /// the target in between: normal when many objects reference one target), with jittered
    /// backoff, up to [`REFERENCE_WRITE_ATTEMPTS`] times; [`ReferenceError::Conflict`] only
    /// after that.
    async fn retry_add(&self, from: &Target, target: &Target) -> Result<(), ReferenceError> {
        use backon::Retryable;
        let backoff = backon::ExponentialBuilder::default()
            .with_min_delay(std::time::Duration::from_millis(5))
            .with_max_delay(std::time::Duration::from_millis(500))
            .with_jitter()
            .with_max_times(REFERENCE_WRITE_ATTEMPTS - 1);
        (|| self.try_add_reference(from, target))
            .retry(backoff)
            .when(|e| matches!(e, ReferenceError::Conflict(_)))
            .await
    }

    /// Release `from`'s reference on `target` (its list of references on kinds the runtime
    /// does not manage is left to the caller).
    async fn release_one(&self, from: &Target, target: &Target) -> Result<(), ReferenceError> {
        self.remove_reference(from, target).await?;
        if let Some(mut s) = self.held.get_mut(from) {
            s.remove(target);
        }
        self.wake(target, super::about(from));
        Ok(())
    }

    /// One guarded attempt of [`ReferenceApi::add_reference`].
    async fn try_add_reference(
        &self,
        from: &Target,
        target: &Target,
    ) -> Result<(), ReferenceError> {
        if self.is_foreign(target) {
            return self.try_add_foreign(from, target).await;
        }
        let api = self.target_api(target).await?;
        // A merge patch of one annotation: it cannot conflict with other referrers' writes (a
        // resourceVersion-guarded write did, under many referrers of one target). The object
        // it returns tells whether the target's deletion had begun before the write; if so, the
        // reference is taken back and refused, so no reference is ever added to a target
        // whose deprovision may already have started. A deletion that begins after the write
        // sees the reference (its event comes after the write).
        self.live_target(&api, target).await?;
        // Under the current domain. One the referrer holds under the former domain stays until
        // it is released (with this one): taking this one back below must not release it.
        let (key, _) = self.keys().reference_annotations(from);
        let patch = serde_json::json!({
            "metadata": { "annotations": { key: serde_json::to_string(from)? } }
        });
        let written = match api
            .patch(&target.name, &self.patch_params(), &Patch::Merge(patch))
            .await
        {
            Ok(o) => o,
            Err(kube::Error::Api(s)) if s.code == 404 => {
                return Err(ReferenceError::TargetMissing(target.clone()));
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                return Err(ReferenceError::Conflict(target.clone()));
            }
            Err(e) => return Err(ReferenceError::Kube(e)),
        };
        self.added(from, target, &written).await
    }

    /// `target` as the server has it, to take a reference on: missing is
    /// [`ReferenceError::TargetMissing`], being deleted [`ReferenceError::TargetDeleting`].
    pub(super) async fn live_target(
        &self,
        api: &Api<DynamicObject>,
        target: &Target,
    ) -> Result<DynamicObject, ReferenceError> {
        let current = match api.get_opt(&target.name).await {
            Ok(Some(o)) => o,
            Ok(None) => return Err(ReferenceError::TargetMissing(target.clone())),
            Err(e) => return Err(ReferenceError::Kube(e)),
        };
        if current.metadata.deletion_timestamp.is_some() {
            return Err(ReferenceError::TargetDeleting(target.clone()));
        }
        Ok(current)
    }

    /// After a write that put `from`'s reference on `target` and returned `written`: held, or,
    /// when the target's deletion had begun before the write, taken back and refused.
    pub(super) async fn added(
        &self,
        from: &Target,
        target: &Target,
        written: &DynamicObject,
    ) -> Result<(), ReferenceError> {
        if written.metadata.deletion_timestamp.is_some() {
            if let Err(e) = self.remove_reference(from, target).await {
                tracing::warn!(from = %from, target = %target, error = %e, "could not take back a reference to a target being deleted");
            }
            return Err(ReferenceError::TargetDeleting(target.clone()));
        }
        self.held
            .entry(from.clone())
            .or_default()
            .insert(target.clone());
        Ok(())
    }
}
