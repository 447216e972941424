//! Supervision: a resource actor that failed, restarted with backoff within the restart intensity,
//! else quarantined or escalated.

use super::*;

impl<K: ManagedResource> Manager<K> {
    /// A linked resource actor stopped or failed.
    pub(super) fn supervise(
        &self,
        event: SupervisionEvent,
        st: &mut ManagerState<K>,
    ) -> Result<(), ActorProcessingErr> {
        match event {
            SupervisionEvent::ActorTerminated(cell, _, _) => {
                let id = cell.get_id();
                let Some(key) = self.retire(st, id) else {
                    // An idle actor (stopped at shutdown): it serves nothing.
                    st.idle.retain(|a| a.get_id() != id);
                    return Ok(());
                };
                // A serving actor stops only at shutdown, or when the manager's mailbox is
                // closed: forget the object. (Passivation and a deleted object hand the actor
                // back without stopping.)
                if matches!(
                    st.objects.get(&key).map(|s| &s.life),
                    Some(Life::Live { id: live, .. }) if *live == id
                ) {
                    st.objects.remove(&key);
                }
            }
            SupervisionEvent::ActorFailed(cell, err) => {
                // A failed actor ran no `post_stop`: drop its timer here.
                self.shared.timers.cancel(cell.get_id());
                let Some(key) = self.retire(st, cell.get_id()) else {
                    return Ok(());
                };
                Metrics::dec(&self.shared.io.metrics.live_actors);
                self.on_failure(st, key, err)?;
            }
            _ => {}
        }
        Ok(())
    }

    /// A live actor failed with `error`: restart it after the backoff, or past the restart
    /// intensity quarantine the object or escalate (the manager fails with an [`Escalation`]).
    pub(super) fn on_failure(
        &self,
        st: &mut ManagerState<K>,
        key: ObjectRef<K>,
        error: ActorProcessingErr,
    ) -> Result<(), ActorProcessingErr> {
        let policy = &self.shared.rules.policy.restart;
        let now = Instant::now();
        let entry = st.objects.get_or_insert_with(&key, || Entry {
            life: Life::Restarting,
            restarts: None,
        });
        let seed = self.shared.rules.policy.seed.map(|s| s ^ key_hash(&key));
        let after = entry
            .restarts
            .get_or_insert_default()
            .failed(policy, now, seed);
        let delay = match after {
            AfterFailure::Restart { failures, delay } => {
                tracing::warn!(object = %key, error = %error, failures, "resource actor failed");
                if self.shared.io.parts.recorder.is_some()
                    && let Some(obj) = self.shared.store.get(&key)
                {
                    let (shared, error) = (self.shared.clone(), error.to_string());
                    tokio::spawn(async move {
                        writes::publish_restarted(&shared.io, obj.as_ref(), failures, &error).await;
                    });
                }
                delay
            }
            AfterFailure::Exhausted { failures } => {
                tracing::warn!(object = %key, error = %error, failures, "resource actor failed past the restart intensity");
                match policy.on_exhausted {
                    Exhausted::Escalate => {
                        return Err(Box::new(Escalation {
                            kind: K::kind(&()).into_owned(),
                            object: key.to_string(),
                            failures,
                            window: policy.window,
                            cause: Arc::from(error),
                        }));
                    }
                    Exhausted::Quarantine => {
                        let obj = self.shared.store.get(&key);
                        let deleting = obj
                            .as_ref()
                            .is_some_and(|o| o.meta().deletion_timestamp.is_some());
                        entry.life = Life::Quarantined {
                            generation: obj.as_ref().and_then(|o| o.meta().generation),
                            deleting,
                        };
                        Metrics::inc(&self.shared.io.metrics.quarantined);
                        // A deleting object cannot change its way out (its deletion is the
                        // change), and waiting forever would leave its finalizer: it is tried
                        // again after the longest error backoff, each time until it fails past
                        // the intensity again.
                        let retry = deleting.then_some(self.shared.rules.policy.error_backoff.max);
                        if let Some(obj) = obj {
                            let message = match retry {
                                None => format!(
                                    "the resource's actor failed {failures} times within {}s; not restarted until the resource changes",
                                    policy.window.as_secs()
                                ),
                                Some(retry) => format!(
                                    "the resource's actor failed {failures} times within {}s while deleting; tried again in {}s",
                                    policy.window.as_secs(),
                                    retry.as_secs()
                                ),
                            };
                            writes::quarantine_status(self.shared.io.clone(), obj, message);
                        }
                        let Some(retry) = retry else {
                            return Ok(());
                        };
                        entry.life = Life::Restarting;
                        let me = st.me.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(retry).await;
                            me.send(ManagerMsg::Restart(key));
                        });
                        return Ok(());
                    }
                }
            }
        };
        entry.life = Life::Restarting;
        let me = st.me.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            me.send(ManagerMsg::Restart(key));
        });
        Ok(())
    }
}
