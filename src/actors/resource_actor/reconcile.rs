//! One reconcile: when it starts (a reconcile slot, the shard's fence), the provisioner tree run over
//! the newest object, and the status it leaves, decided in [`crate::after_reconcile`].

use super::*;

impl<K: ManagedResource> ResourceActor<K> {
    pub(super) fn context(
        &self,
        obj: Arc<K>,
        status: Arc<ResourceStatus>,
        config: Option<Arc<dyn std::any::Any + Send + Sync>>,
    ) -> Context<K> {
        let client = self.shared.io.client_for(&obj).clone();
        let child_label = self
            .shared
            .io
            .shards
            .as_ref()
            .and_then(|s| s.child_label_of(&obj));
        Context::with_parts(
            obj,
            client,
            status,
            self.shared.io.parts.clone(),
            config,
            child_label,
        )
    }

    /// What the reconcile's steps wrote to the object: their versions are the reconcile's own writes,
    /// and the newest is where the runtime's status write builds on. `true` if a step met a
    /// write by someone else (the object runs again).
    pub(super) fn take_written(st: &mut ResourceState<K>, cx: &Context<K>) -> bool {
        let written = cx.take_written();
        st.own_writes.extend(written.versions);
        st.status_fields = written.status_fields;
        if let Some(latest) = written.latest {
            st.remember(latest);
        }
        written.saw_others
    }

    /// Run a reconcile if one is due, on `slot` (delivered with the message), the slot the manager
    /// handed over for the first reconcile, or a free one. With none free, the reconcile stays due and the
    /// timer task is asked for a slot: the actor does not wait in its handler, where it could
    /// take no other message.
    pub(super) async fn reconcile_if_due(
        &self,
        myself: &ActorRef<ResourceMsg<K>>,
        st: &mut ResourceState<K>,
        slot: Option<ReconcilePermit>,
    ) {
        if !st.dirty {
            return;
        }
        let slot = match slot.or_else(|| st.permit.take()) {
            Some(slot) => slot,
            None => match self.shared.slots.try_acquire() {
                Ok(slot) => slot,
                Err(TryAcquireError::NoPermits) => {
                    if !st.queued {
                        st.queued = true;
                        self.shared.timers.queue(myself, ResourceMsg::Slot(None));
                    }
                    return;
                }
                Err(TryAcquireError::Closed) => return, // the runtime is shutting down
            },
        };
        // With sharding: only while this replica holds the object's shard (see `fenced`).
        let mut fence = None;
        let shard = match (&self.shared.io.shards, &st.undecodable, &st.object) {
            (Some(scope), Some(u), _) => Some((scope, Some(scope.shard_of_undecodable(&u.meta)))),
            (Some(scope), None, Some(obj)) => Some((scope, scope.runnable_shard(obj))),
            _ => None,
        };
        if let Some((scope, shard)) = shard {
            match shard.and_then(|shard| scope.shards.enter(shard)) {
                Some(guard) => fence = Some(guard),
                None => {
                    drop(slot);
                    self.abandon(myself, st);
                    return;
                }
            }
        }
        st.dirty = false;
        let cause = st.cause.take().unwrap_or(Cause::of(Trigger::Again));
        self.cancel_wake(myself, st);
        let started = Instant::now();
        self.shared.io.kind_metrics.triggered(cause.trigger);
        if let Some(due) = st.due_since.take() {
            self.shared
                .io
                .kind_metrics
                .due_to_start
                .observe(started.saturating_duration_since(due));
        }
        let span = tracing::info_span!(
            "reconcile",
            kind = %self.shared.io.kind_metrics.kind,
            namespace = st.key.namespace.as_deref().unwrap_or(""),
            name = %st.key.name,
            generation = tracing::field::Empty,
            trigger = cause.trigger.as_str(),
            trigger_object = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        if !span.is_disabled() {
            if let Some(g) = st.object.as_ref().and_then(|o| o.meta().generation) {
                span.record("generation", g);
            }
            if let Some(about) = &cause.object {
                span.record("trigger_object", about.as_ref());
            }
        }
        // Boxed: the reconcile's state machine is large, and inline it would make every idle
        // actor's task that large.
        let running = self.shared.io.kind_metrics.running(started);
        let ran = {
            let mut reconcile = Box::pin(self.reconcile(myself, st, slot)).instrument(span.clone());
            match fence.as_mut() {
                None => Some(reconcile.await),
                // The shard is lost mid-reconcile: the reconcile is dropped where it is (its writes are
                // refused from the loss on, by the shard's fenced client). The fence is also
                // checked before every poll of the reconcile, by the clock: a replica that continues
                // after a pause past its renew deadline (or starved of CPU as long) runs no more
                // of the reconcile's code, outside Kubernetes included, before its keeper has caught up.
                Some(guard) => {
                    let held = guard.check();
                    let fenced = std::future::poll_fn(|cx| {
                        if !held.holds() {
                            return std::task::Poll::Ready(None);
                        }
                        std::future::Future::poll(std::pin::Pin::new(&mut reconcile), cx).map(Some)
                    });
                    tokio::select! {
                        biased;
                        _ = guard.lost() => None,
                        result = fenced => result,
                    }
                }
            }
        };
        drop(fence);
        drop(running);
        let Some(result) = ran else {
            tracing::info!(object = %st.key, "shard lost: reconcile abandoned");
            self.abandon(myself, st);
            return;
        };
        if let Some(result) = result {
            span.record("outcome", result.as_str());
            self.shared
                .io
                .kind_metrics
                .reconciled(result, started.elapsed());
        }
        if let Some(reports) = &self.shared.reports {
            let deprovision = st
                .object
                .as_ref()
                .is_some_and(|o| o.meta().deletion_timestamp.is_some());
            let wake_for = st.wake_for.unwrap_or(Trigger::Requeue);
            reports.ended(
                &st.key,
                cause,
                result.map_or("skipped", ReconcileResult::as_str),
                deprovision,
                started.elapsed(),
                st.wake.deadline().map(|at| (at, wake_for)),
                st.error_attempts,
            );
        }
    }

    /// What the reconcile's steps returned, for the introspection (when it is on).
    pub(super) fn log_steps(&self, st: &ResourceState<K>, cx: &Context<K>) {
        if let (Some(reports), Some(log)) = (&self.shared.reports, cx.step_log()) {
            reports.steps(&st.key, log.take());
        }
    }

    /// The object's actorcile status, parsed once per object version.
    pub(super) fn status_of(
        st: &mut ResourceState<K>,
        obj: &K,
        v: Option<u64>,
    ) -> Arc<ResourceStatus> {
        match &st.status_cache {
            Some((cv, s)) if v.is_some() && *cv == v => s.clone(),
            _ => {
                let s = Arc::new(ResourceStatus::of(obj));
                st.status_cache = Some((v, s.clone()));
                s
            }
        }
    }

    /// One provision or deprovision reconcile over the newest known object.
    ///
    /// The hot path (a provision reconcile whose status does not change, e.g. every reconcile of a yield
    /// loop) makes no API request and allocates little; the cold parts (deletion, finalizer, status
    /// write) are boxed so they do not bloat the reconcile's future.
    pub(super) async fn reconcile(
        &self,
        myself: &ActorRef<ResourceMsg<K>>,
        st: &mut ResourceState<K>,
        _slot: ReconcilePermit,
    ) -> Option<ReconcileResult> {
        let shared = &self.shared;
        if let Some(u) = st.undecodable.clone() {
            return Box::pin(self.undecodable_reconcile(st, u)).await;
        }
        let mut obj = st.object.clone()?;
        if shared.references.keys().is_ignored(obj.meta()) {
            // The operator's brake: no reconcile, no write, until the annotation goes.
            st.last_reconciled_version = version_of(obj.as_ref());
            st.own_writes.clear();
            Metrics::inc(&shared.io.metrics.ignored);
            return None;
        }
        let deleting = obj.meta().deletion_timestamp.is_some();
        // The current finalizer or a former one (an operator that migrated names).
        let has_finalizer = obj
            .finalizers()
            .iter()
            .any(|f| shared.io.finalizers.owns(f));
        // Parsed once per reconcile: on a yield loop's reconcile the string is cold memory.
        let mut version = version_of(obj.as_ref());
        st.last_reconciled_version = version;
        st.own_writes.clear();
        let released = || st.released.is_some() && st.released == obj.meta().uid;
        if deleting && (!has_finalizer || released()) {
            // Never provisioned by us, or already cleaned up: nothing of ours to undo.
            return None;
        }
        let _in_flight = shared.io.metrics.reconcile_started(deleting);
        let mut status = Self::status_of(st, obj.as_ref(), version);
        let generation = obj.meta().generation;
        // The provider config as the reconcile starts (`None` inside: the controller has one, and
        // it does not exist).
        let config = shared.config.as_ref().map(|c| c.current());
        let mut saw_others = false;

        let Reconciled { outcome, desired } = if deleting {
            match Box::pin(self.deletion_reconcile(st, &obj, &status, config.flatten())).await {
                Some(reconcile) => reconcile,
                // deprovisioned; the object disappears and the feeder reports it
                None => return Some(ReconcileResult::Done),
            }
        } else {
            let mut pre_failure = None;
            let claim_finalizer = shared
                .io
                .finalizers
                .needs_claim(obj.finalizers(), shared.rules.use_finalizer);
            let label = shared
                .io
                .shards
                .as_ref()
                .and_then(|s| s.missing_label(obj.as_ref()));
            if claim_finalizer || label.is_some() {
                let label = label.as_ref().map(|(k, v)| (&**k, v.as_str()));
                match Box::pin(writes::claim(
                    &shared.io,
                    obj.as_ref(),
                    shared.rules.use_finalizer,
                    label,
                ))
                .await
                {
                    Ok(o) => {
                        st.record_write(o, shared.rules.prune_cache);
                        obj = st.object.clone().unwrap_or(obj);
                        version = version_of(obj.as_ref());
                    }
                    Err(e) => {
                        pre_failure = Some(Outcome::failed(
                            Reason::new(
                                "FinalizerAddFailed",
                                "could not add the finalizer (or the shard label)",
                            ),
                            e,
                        ));
                    }
                }
            }
            let outcome = match (pre_failure, config) {
                (Some(o), _) => o,
                (None, Some(None)) => Outcome::UserActionRequired(Reason::new(
                    ReadyReason::ConfigMissing.as_str(),
                    match shared
                        .config
                        .as_ref()
                        .map(|c| (c.describe(), c.unreadable()))
                    {
                        Some((config, Some(field))) => format!(
                            "the provider config {config} cannot be read: the value at `{field}` does not fit its type; provisioning resumes when it can"
                        ),
                        config => format!(
                            "the provider config {} does not exist; provisioning resumes when it does",
                            config.map_or("", |(c, _)| c)
                        ),
                    },
                )),
                (None, config) => {
                    // A yield loop runs on the same object and status reconcile after reconcile: reuse
                    // the context (building one clones the client and three Arcs). A config
                    // change re-runs every object with a new context.
                    let config = config.flatten();
                    let cx = st
                        .cx
                        .take()
                        .filter(|cx| cx.has_parts(&obj, &status) && cx.has_config(&config))
                        .unwrap_or_else(|| self.context(obj.clone(), status.clone(), config));
                    let run = deadline::within(
                        shared.rules.policy.reconcile_timeout,
                        shared.rules.tree.provision(&cx),
                    );
                    // Cut when a new generation or the deletion arrives meanwhile (see
                    // `scheduling::moved_on`), outside the steps' shielded work.
                    let outcome = match shared.in_flight.start(&st.key, generation) {
                        Some(running) => running.unless_moved_on(run, || cx.is_shielded()).await,
                        None => Ok(run.await),
                    };
                    saw_others = Self::take_written(st, &cx);
                    self.log_steps(st, &cx);
                    let outcome = match outcome {
                        Ok(outcome) => outcome,
                        Err(why) => {
                            tracing::info!(object = %st.target, why = why.as_str(), "the object moved on: reconcile cancelled, running again");
                            st.last_outcome = None;
                            st.trigger_reconcile(myself, Cause::of(Trigger::Again));
                            return Some(ReconcileResult::Cancelled);
                        }
                    };
                    st.cx = Some(cx);
                    outcome
                }
            };
            Reconciled {
                outcome,
                desired: None,
            }
        };

        // The steps' own writes (conditions, locks, finalizers) are the object now: the status
        // write builds on them.
        if let Some(latest) = st.object.clone()
            && !Arc::ptr_eq(&latest, &obj)
        {
            obj = latest;
            version = version_of(obj.as_ref());
            status = Self::status_of(st, obj.as_ref(), version);
        }

        if let Outcome::Failed { reason, errors } = &outcome {
            for e in errors {
                tracing::warn!(object = %st.target, reason = %reason, error = %e, "provisioning failed");
            }
        }

        // The status this reconcile leaves, and what follows it: decided in `after_reconcile`,
        // carried out here. The steps' status fields count only where the status does not hold
        // them yet.
        let mut fields = std::mem::take(&mut st.status_fields);
        if crate::status::holds_fields(obj.as_ref(), &fields) {
            fields.clear();
        }
        let at = At {
            generation,
            deleting,
            version,
        };
        let plan = after_reconcile::plan_status(
            st.last_outcome.as_ref(),
            &outcome,
            at,
            !fields.is_empty(),
            &status,
            desired,
            shared.rules.write_status,
        );
        let ready = plan.ready();
        let write = match &plan {
            StatusPlan::Write { desired } => {
                Box::pin(self.write_status(st, &obj, &status, desired, &fields, &outcome)).await
            }
            StatusPlan::Unchanged | StatusPlan::Leave { .. } => StatusWrite::Written,
        };
        if let Some(now) = plan.wakes_waiters(&status, write) {
            shared.references.changed(&st.target, now);
        }
        let next = after_reconcile::after_write(
            Ended {
                outcome: &outcome,
                ready,
                write,
                announced: st.was_ready,
                saw_others,
            },
            Delays {
                yield_delay: shared.rules.policy.yield_delay,
                dependency_poll: shared.rules.policy.dependency_poll,
                conflict_retry: shared
                    .rules
                    .policy
                    .error_backoff
                    .min
                    .max(Duration::from_millis(10)),
            },
        );
        if let Some(ready) = next.announce {
            // Ready is of the generation this reconcile read: not recorded over a newer
            // one cached meanwhile (its own reconcile follows, and says so).
            let recorded = if ready {
                shared.references.mark_ready_at(&st.target, generation)
            } else {
                shared.references.mark_ready(&st.target, false);
                true
            };
            if recorded {
                st.was_ready = Some(ready);
            }
        }
        // Keyed on the version the reconcile ended with (its own status write, if any).
        match next.remember {
            Some(true) => {
                let end_version = st.object.as_deref().and_then(version_of);
                st.last_outcome = Some(OutcomeKey::of(&outcome, generation, deleting, end_version));
            }
            Some(false) => st.last_outcome = None,
            None => {}
        }
        if let Some(retry) = next.retry {
            self.schedule_wake(myself, st, retry, Trigger::Again);
        }
        match next.backoff {
            Backoff::Grow => {
                let retry = self.next_error_backoff(st);
                self.schedule_wake(myself, st, retry, Trigger::Backoff);
            }
            Backoff::Reset => {
                st.error_backoff = None;
                st.error_attempts = 0;
            }
            Backoff::Keep => {}
        }
        let wake_for = match (&next.wake, &outcome) {
            (Some(Wake::Poll), _) => Trigger::Poll,
            (_, Outcome::Yield { .. }) => Trigger::Yield,
            _ => Trigger::Requeue,
        };
        let wake = match next.wake {
            Some(Wake::After(d)) => Some(d),
            Some(Wake::Poll) => {
                let seed = shared
                    .rules
                    .policy
                    .seed
                    .map(|s| s ^ key_hash(&st.key) ^ st.last_reconciled_version.unwrap_or(0));
                shared
                    .config
                    .as_ref()
                    .and_then(|c| c.poll_interval())
                    .or(shared.rules.policy.poll_interval)
                    .map(|p| jitter(p, shared.rules.policy.poll_jitter, seed))
            }
            None => None,
        };
        if let Some(d) = wake {
            self.schedule_wake(myself, st, d, wake_for);
        }
        if next.reconcile_again {
            // A step's write met someone else's: run again on what they wrote.
            st.trigger_reconcile(myself, Cause::of(Trigger::Again));
        }
        if st.wake.deadline().is_none() {
            st.cx = None; // nothing due soon: an idle actor keeps no context
        }
        Some(ReconcileResult::of(&outcome))
    }

    /// Patch the status subresource to `desired`; on a reason change, publish an Event (and
    /// a Warning Event when the outcome's reason code was invalid and the runtime's stood in).
    pub(super) async fn write_status(
        &self,
        st: &mut ResourceState<K>,
        obj: &Arc<K>,
        status: &ResourceStatus,
        desired: &ResourceStatus,
        fields: &serde_json::Map<String, serde_json::Value>,
        outcome: &Outcome,
    ) -> StatusWrite {
        let shared = &self.shared;
        let transition = desired.ready().map(|c| &c.reason) != status.ready().map(|c| &c.reason);
        match writes::patch_status(&shared.io, obj, desired, fields).await {
            Ok(o) => {
                if !shared.status_checks.kept(desired, &o) {
                    writes::publish_status_pruned(&shared.io, &o).await;
                }
                if !crate::status::holds_fields(&o, fields) {
                    let names: Vec<&str> = fields.keys().map(String::as_str).collect();
                    tracing::warn!(object = %st.target, fields = ?names, "the API server dropped status fields a step set: declare them in the CRD's status schema");
                }
                st.record_write(o, shared.rules.prune_cache);
            }
            // The object is gone (nothing to write), or the kind has no status subresource.
            Err(kube::Error::Api(s)) if s.code == 404 => {
                if shared.status_checks.served::<K>(&shared.io.client).await {
                    return StatusWrite::Written;
                }
                writes::publish_status_not_served(&shared.io, obj.as_ref()).await;
                return StatusWrite::Failed;
            }
            // Someone else wrote the object since this reconcile read it: its watch event runs the
            // object again, and that reconcile writes on what they wrote instead of over it.
            Err(kube::Error::Api(s)) if s.code == 409 => {
                tracing::debug!(object = %st.target, "status write conflicted; running again");
                Metrics::inc(&shared.io.metrics.status_conflicts);
                return StatusWrite::Conflicted;
            }
            // Invalid: a validation rule or the schema refuses it. Writing it again unchanged
            // would be refused again, so it backs off (as any failed write) and says why.
            Err(kube::Error::Api(s)) if s.code == 422 => {
                Metrics::inc(&shared.io.metrics.status_rejected);
                writes::publish_status_rejected(&shared.io, obj.as_ref(), &s.message).await;
                return StatusWrite::Failed;
            }
            Err(e) => {
                tracing::warn!(object = %st.target, error = %e, "status write failed; retrying");
                return StatusWrite::Failed;
            }
        }
        if transition {
            let reason = desired.ready().map_or("", |c| c.reason.as_str());
            if let Some(r) = outcome.reason().filter(|r| !r.has_valid_code()) {
                writes::publish_invalid_reason(&shared.io, obj.as_ref(), r.code(), reason).await;
            }
            let message = desired.ready().map(|c| c.message.as_str());
            writes::publish_transition(&shared.io, obj.as_ref(), outcome, reason, message).await;
        }
        StatusWrite::Written
    }
}
