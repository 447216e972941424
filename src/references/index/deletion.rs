//! Deletion ordering: whether a target being deleted must wait (foreground deletion of its
//! owned children, live referrers, a cycle among them).

use super::*;
use crate::status::ReadyReason;

/// The finalizer Kubernetes' garbage collector puts on an owner deleted in the foreground.
pub(super) const FOREGROUND_DELETION: &str = "foregroundDeletion";

/// Why a deletion cannot proceed yet.
#[derive(Clone, Debug)]
pub(crate) struct Blocked {
    pub reason: ReadyReason,
    pub message: String,
}

impl ReferenceIndex {
    /// Whether deleting `target` (whose object is `obj`) must wait: foreground deletion of
    /// owned children, or live referrers (a cycle among them is reported as such).
    pub(crate) fn deletion_blocked<K: kube::Resource>(
        &self,
        target: &Target,
        obj: &K,
    ) -> Option<Blocked> {
        if obj
            .meta()
            .finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|f| f == FOREGROUND_DELETION))
        {
            return Some(Blocked {
                reason: ReadyReason::Deprovisioning,
                message: "waiting for owned children to be deleted (foreground deletion)".into(),
            });
        }
        let referrers = obj
            .meta()
            .annotations
            .as_ref()
            .map(|a| self.referrers_in(a))
            .unwrap_or_default();
        if referrers.is_empty() {
            return None;
        }
        let mut live = Vec::new();
        for r in referrers {
            match self.kind(&r) {
                // A referrer of a kind this runtime does not manage cannot release: count it,
                // so nothing is deleted under a user's feet.
                None => live.push(r),
                Some(k) if !k.in_view(&r) => {
                    if self.exists_elsewhere(target, &r) {
                        live.push(r);
                    }
                }
                Some(k) if !k.synced() || k.exists(&r) => live.push(r),
                Some(_) => {}
            }
        }
        if live.is_empty() {
            return None;
        }
        // What blocks the deletion is now known to hold the target, as the annotations say
        // (this runtime may never have run those referrers: another replica's shard, or a
        // reference taken after this runtime's start-up rebuild): when one leaves the store,
        // `gone` wakes the target at once instead of the fallback poll.
        self.learn(target, &live);
        let names: Vec<String> = live.iter().map(|t| t.to_string()).collect();
        let message = match self.find_cycle(target) {
            Some(cycle) => format!(
                "reference cycle, deletion cannot proceed: {}",
                cycle
                    .iter()
                    .map(|t| t.to_string())
                    .collect::<Vec<_>>()
                    .join(" -> ")
            ),
            None => format!("in use by {}", names.join(", ")),
        };
        Some(Blocked {
            reason: ReadyReason::InUse,
            message,
        })
    }

    /// Whether `referrer`, of a managed kind but not in this replica's view (another
    /// replica's shard), exists: by the watch of its kind, and counted as existing until that
    /// watch has listed. `target` is woken when `referrer` changes or goes.
    fn exists_elsewhere(&self, target: &Target, referrer: &Target) -> bool {
        let Some(ext) = &self.external else {
            return true;
        };
        self.waiters
            .entry(referrer.clone())
            .or_default()
            .insert(target.clone());
        self.note_wait(target, referrer);
        let in_namespace = self
            .kind(referrer)
            .is_some_and(|k| !k.watches_every_namespace());
        ext.kind_of(&self.me, referrer, in_namespace)
            .exists(referrer)
            .unwrap_or(true)
    }

    /// A cycle of deleting resources each held by the next, starting and ending at `start`.
    fn find_cycle(&self, start: &Target) -> Option<Vec<Target>> {
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        let mut seen = BTreeSet::new();
        while let Some((t, path)) = stack.pop() {
            let Some(k) = self.kind(&t) else { continue };
            for r in k.referrers(&t) {
                if &r == start {
                    let mut p = path.clone();
                    p.push(r);
                    return Some(p);
                }
                let deleting = self.kind(&r).is_some_and(|k| k.deleting(&r));
                if deleting && seen.insert(r.clone()) {
                    let mut p = path.clone();
                    p.push(r.clone());
                    stack.push((r, p));
                }
            }
        }
        None
    }
}
