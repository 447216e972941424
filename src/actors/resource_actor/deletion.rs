//! Deletion: the deprovision reconcile, the release of what the object held once its finalizer
//! is gone, and an object its kind's type cannot hold.

use super::*;

impl<K: ManagedResource> ResourceActor<K> {
    /// A deprovision reconcile: `None` once deprovisioned and the finalizer is gone.
    pub(super) async fn deletion_reconcile(
        &self,
        st: &mut ResourceState<K>,
        obj: &Arc<K>,
        status: &Arc<ResourceStatus>,
        config: Option<Arc<dyn std::any::Any + Send + Sync>>,
    ) -> Option<Reconciled> {
        let shared = &self.shared;
        let target = st.target.clone();
        let generation = obj.meta().generation;
        if st.deprovisioned.is_some() && st.deprovisioned == obj.meta().uid {
            // The tree ran to its end for this deletion; only the finalizer is left to remove.
            return self
                .release(st, obj.clone(), status.clone(), generation)
                .await;
        }
        if let Some(blocked) = shared.references.deletion_blocked(&target, obj.as_ref()) {
            let desired =
                status.while_deprovisioning(blocked.reason, blocked.message.clone(), generation);
            if desired != **status {
                // What this object holds may now be blocked differently (e.g. a cycle
                // closed): let those targets re-check. Only on change, so it settles.
                shared.references.notify_held(&target);
            }
            return Some(Reconciled {
                outcome: Outcome::Waiting {
                    target: (*target).clone(),
                    reason: Reason::new("InUse", blocked.message),
                },
                desired: Some(desired),
            });
        }
        let cx = self.context(obj.clone(), status.clone(), config);
        let outcome = deadline::within(
            shared.rules.policy.reconcile_timeout,
            shared.rules.tree.deprovision(&cx),
        )
        .await;
        self.log_steps(st, &cx);
        if Self::take_written(st, &cx) {
            // A step's write met someone else's: run again on theirs.
            st.mark_due(Cause::of(Trigger::Again));
        }
        // The steps' own writes (conditions, their finalizers) are the object now; its status
        // is parsed again only if they wrote.
        let (obj, status) = match st.object.clone() {
            Some(latest) if !Arc::ptr_eq(&latest, obj) => {
                let status = Arc::new(ResourceStatus::of(latest.as_ref()));
                (latest, status)
            }
            _ => (obj.clone(), status.clone()),
        };
        if !outcome.is_done() {
            let desired = status.after_deprovision(&outcome, generation);
            return Some(Reconciled {
                outcome,
                desired: Some(desired),
            });
        }
        st.deprovisioned = obj.meta().uid.clone();
        self.release(st, obj, status, generation).await
    }

    /// After a deprovision tree that ran to its end: the finalizer's removal, then the
    /// references' release. `None` once the finalizer is gone.
    pub(super) async fn release(
        &self,
        st: &mut ResourceState<K>,
        obj: Arc<K>,
        status: Arc<ResourceStatus>,
        generation: Option<i64>,
    ) -> Option<Reconciled> {
        let shared = &self.shared;
        let target = st.target.clone();
        // The finalizer goes first, the references after: a target this object referenced can
        // only proceed once this object is gone (when ours was its last finalizer), so the API
        // never shows a referenced object vanish before its referrers. A crash in between
        // leaves references of an object that no longer exists, which block nothing.
        // Other finalizers will hold the object once ours is gone: its status says it is
        // deprovisioned, not what it said while it lived. (With ours the last, the object goes
        // at once, and nothing needs saying.)
        let mut obj = obj;
        let others: Vec<&String> = obj
            .finalizers()
            .iter()
            .filter(|f| !shared.io.finalizers.owns(f))
            .collect();
        if shared.rules.write_status && !others.is_empty() {
            let message = format!(
                "deprovisioned; waiting for the other finalizers: {}",
                others
                    .iter()
                    .map(|f| f.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            let desired =
                status.while_deprovisioning(ReadyReason::Deprovisioned, message, generation);
            if desired != *status {
                match writes::patch_status(&shared.io, obj.as_ref(), &desired, &Default::default())
                    .await
                {
                    Ok(o) => {
                        st.record_write(o, shared.rules.prune_cache);
                        if let Some(latest) = st.object.clone() {
                            obj = latest;
                        }
                    }
                    // Not worth holding the finalizer for: the deletion goes on, and the
                    // status says Deprovisioning meanwhile.
                    Err(e) => {
                        tracing::debug!(object = %target, error = %e, "could not write the deprovisioned status")
                    }
                }
            }
        }
        // References on kinds this runtime does not manage are finalizers on their targets,
        // found from this object's own list: released while the object still exists, so a
        // crash cannot leave them on targets nothing would find them on again.
        if let Err(e) = shared
            .references
            .release_foreign(
                &target,
                obj.meta(),
                shared.rules.policy.write_timeout,
                &shared.io.metrics.write_timeouts,
            )
            .await
        {
            return Some(Reconciled {
                outcome: Outcome::failed(
                    Reason::new(
                        "ReferenceReleaseFailed",
                        "could not release a reference on an object of another kind",
                    ),
                    e,
                ),
                desired: Some(status.while_deprovisioning(
                    ReadyReason::Errored,
                    "retrying the release of references",
                    generation,
                )),
            });
        }
        let held = shared.references.take_held(&target);
        match writes::remove_finalizer(&shared.io, obj.as_ref()).await {
            Ok(left) => {
                st.released = obj.meta().uid.clone();
                st.deprovisioned = None;
                shared
                    .references
                    .release_all(
                        &target,
                        held,
                        shared.rules.policy.write_timeout,
                        &shared.io.metrics.write_timeouts,
                    )
                    .await;
                writes::publish_released(&shared.io, obj.as_ref()).await;
                // Remember the object without our finalizer (and its version as our own write),
                // so no later event or notification can make a reconcile deprovision it again.
                match left {
                    Some(o) => st.record_write(o, shared.rules.prune_cache),
                    None => st.object = None,
                }
                st.error_backoff = None;
                st.error_attempts = 0;
                None
            }
            Err(e) => {
                shared.references.restore_held(&target, held);
                Some(Reconciled {
                    outcome: Outcome::failed(
                        Reason::new("FinalizerRemovalFailed", "could not remove the finalizer"),
                        e,
                    ),
                    desired: Some(status.while_deprovisioning(
                        ReadyReason::Errored,
                        "retrying finalizer removal",
                        generation,
                    )),
                })
            }
        }
    }

    /// The reconcile of an object that the kind's type cannot hold: no provisioner runs (they need
    /// the spec), and its status says why: phase Failed, Ready `False` with reason
    /// `Undecodable` and a message naming the field (never its value), written when it is not
    /// already so, with a Warning Event on the transition. Deleting, it keeps its finalizer and
    /// says so: deprovisioning needs the spec, and removing the finalizer without it would
    /// abandon what the object provisioned. It stays a referrer all along (what it holds stays
    /// held). The object's next change runs it again: a decodable one as usual.
    pub(super) async fn undecodable_reconcile(
        &self,
        st: &mut ResourceState<K>,
        u: Arc<crate::lenient::Undecodable>,
    ) -> Option<ReconcileResult> {
        let shared = &self.shared;
        st.last_reconciled_version = crate::object_api::meta_version(&u.meta);
        st.own_writes.clear();
        st.cx = None;
        st.last_outcome = None;
        if shared.references.keys().is_ignored(&u.meta) {
            Metrics::inc(&shared.io.metrics.ignored);
            return None;
        }
        let deleting = u.meta.deletion_timestamp.is_some();
        let ours = u
            .meta
            .finalizers
            .iter()
            .flatten()
            .any(|f| shared.io.finalizers.owns(f));
        if deleting && !ours {
            return None; // never provisioned by us: nothing of ours to undo
        }
        if st.was_ready != Some(false) {
            shared.references.mark_ready(&st.target, false);
            shared.store.set_ready(&st.key, false);
            st.was_ready = Some(false);
        }
        let mut message = u.message();
        if deleting {
            message.push_str(&format!(
                "; its deletion waits: deprovisioning needs the object's spec (change the object to one the operator can read, or remove the finalizer {} by hand to abandon what it provisioned)",
                shared.io.finalizers.current
            ));
        }
        let current = u.status.clone().unwrap_or_default();
        let desired = current.with_ready(
            Phase::Failed,
            false,
            ReadyReason::Undecodable,
            message.clone(),
            u.meta.generation,
        );
        let transition =
            current.ready().map(|c| c.reason.as_str()) != Some(ReadyReason::Undecodable.as_str());
        if shared.rules.write_status && desired != current {
            match writes::patch_undecodable_status(&shared.io, &u, &desired).await {
                Ok(written) => {
                    if let Some(v) = version_of(&written) {
                        st.own_writes.push(v);
                    }
                }
                Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
                    // Changed (its event runs it again) or gone.
                    return Some(ReconcileResult::Terminal);
                }
                Err(e) => {
                    tracing::warn!(object = %st.target, error = %e, "could not write the status of an object the operator cannot read");
                }
            }
        }
        if transition {
            writes::publish_undecodable(&shared.io, &u, message).await;
        }
        Some(ReconcileResult::Terminal)
    }
}
