//! A kind as the reference index sees it ([`crate::references::IndexedKind`]).

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::reflector::ObjectRef;

use crate::ManagedResource;
use crate::actors::Shared;
use crate::actors::mailbox::Mailbox;
use crate::messages::{Cause, ManagerMsg, ResourceMsg};
use crate::references::{IndexedKind, Readiness, Target};

/// What the reference index sees of one kind: its store, its routes and its manager.
pub(crate) struct KindView<K: ManagedResource> {
    pub(crate) shared: Arc<Shared<K>>,
    pub(crate) synced: Arc<AtomicBool>,
    pub(crate) manager: OnceLock<Mailbox<ManagerMsg<K>>>,
}

fn key_of<K: ManagedResource>(t: &Target) -> ObjectRef<K> {
    let r = ObjectRef::<K>::new(&t.name);
    match &t.namespace {
        Some(ns) => r.within(ns),
        None => r,
    }
}

impl<K: ManagedResource> IndexedKind for KindView<K> {
    fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }
    fn in_view(&self, target: &Target) -> bool {
        self.shared.in_view(&key_of::<K>(target))
    }
    fn watches_every_namespace(&self) -> bool {
        self.shared.store.every_namespace()
    }
    fn readiness(&self, target: &Target) -> Readiness {
        match self.shared.store.readiness(&key_of::<K>(target)) {
            // Not in the store before the kind's first list is complete: it may not be listed
            // yet. Missing is only said once the list is in (`ReferenceIndex::kind_synced`
            // wakes the waiters then, so they see it).
            None if !self.synced() => Readiness::NotReady,
            None => Readiness::Missing,
            Some((true, _, _)) => Readiness::Deleting,
            Some((false, status, generation)) => status_readiness(&status, generation),
        }
    }
    fn said(&self, target: &Target) -> Option<Readiness> {
        self.shared.store.said(&key_of::<K>(target))
    }
    fn set_said(&self, target: &Target, said: Option<Readiness>) {
        self.shared.store.set_said(&key_of::<K>(target), said);
    }
    fn set_said_ready_at(&self, target: &Target, generation: Option<i64>) -> bool {
        self.shared
            .store
            .set_ready_at(&key_of::<K>(target), generation)
    }
    fn exists(&self, target: &Target) -> bool {
        self.shared.store.contains(&key_of::<K>(target))
    }
    fn deleting(&self, target: &Target) -> bool {
        self.shared
            .store
            .deleting(&key_of::<K>(target))
            .unwrap_or(false)
    }
    fn referrers(&self, target: &Target) -> Vec<Target> {
        self.shared
            .store
            .get(&key_of::<K>(target))
            .and_then(|o| {
                o.meta()
                    .annotations
                    .as_ref()
                    .map(|a| self.shared.references.referrers_in(a))
            })
            .unwrap_or_default()
    }
    fn held_recorded(&self, from: &Target) -> Vec<Target> {
        self.shared
            .store
            .get(&key_of::<K>(from))
            .and_then(|o| {
                o.meta()
                    .annotations
                    .as_ref()
                    .map(|a| self.shared.references.keys().held_in(a))
            })
            .unwrap_or_default()
    }
    fn uses_finalizer(&self) -> bool {
        self.shared.rules.use_finalizer
    }
    fn notify(&self, target: &Target, cause: Cause) {
        let key = key_of::<K>(target);
        if let Some(a) = self.shared.routes.get(&key)
            && a.cast(ResourceMsg::Notify(cause.clone())).is_ok()
        {
            return;
        }
        if let Some(m) = self.manager.get() {
            m.send(ManagerMsg::Notify(key, cause));
        }
    }
    fn dynamic_api(&self, target: &Target) -> Api<DynamicObject> {
        let ar = ApiResource::erase::<K>(&());
        match &target.namespace {
            Some(ns) => Api::namespaced_with(Client::clone(&self.shared.io.client), ns, &ar),
            None => Api::all_with(Client::clone(&self.shared.io.client), &ar),
        }
    }
}

/// The readiness a cached object's status says, for an object at `generation`: Ready only when
/// its status is of that generation (a Ready of an older one is not Ready: the spec changed
/// since), Failed by the phase, else not Ready.
fn status_readiness(status: &crate::status::ResourceStatus, generation: Option<i64>) -> Readiness {
    let current = generation.is_none()
        || status.observed_generation.is_none()
        || status.observed_generation == generation;
    if status.is_ready() && current {
        Readiness::Ready
    } else if status.phase == Some(crate::status::Phase::Failed) {
        Readiness::Failed
    } else {
        Readiness::NotReady
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{Phase, ReadyReason, ResourceStatus};

    #[test]
    fn a_ready_status_of_an_older_generation_is_not_ready() {
        let ready_at = |g| {
            ResourceStatus::default().with_ready(
                Phase::Ready,
                true,
                ReadyReason::Provisioned,
                "done",
                Some(g),
            )
        };
        assert_eq!(status_readiness(&ready_at(2), Some(2)), Readiness::Ready);
        assert_eq!(status_readiness(&ready_at(1), Some(2)), Readiness::NotReady);
        assert_eq!(status_readiness(&ready_at(2), None), Readiness::Ready);
        assert_eq!(
            status_readiness(&ResourceStatus::default(), Some(1)),
            Readiness::NotReady
        );
    }
}
