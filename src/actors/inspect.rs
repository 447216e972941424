//! The actors' side of the runtime's introspection ([`crate::introspect`]): what each object's
//! actor records at the end of a reconcile, kept per kind only while introspection is on, and
//! the kind's reporter, which joins it with what the rest of the runtime knows of the object
//! (its cached version, whether an actor serves it, its references, its shard).

use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use kube::runtime::reflector::ObjectRef;
use tokio::time::Instant;

use super::{ManagedResource, Shared};
use crate::introspect::{
    KindReporter, ObjectReport, ReadyReport, ReconcileReport, ShardReport, WakeReport, bounded,
};
use crate::provisioners::StepRun;
use crate::references::Target;
use crate::status::ResourceStatus;
use crate::triggers::{Cause, Trigger};

/// What an object's actor recorded of its last reconcile.
#[derive(Debug, Default)]
struct Recorded {
    last: Option<Last>,
    /// The steps of the reconcile running now (moved into `last` when it ends).
    steps: Vec<StepRun>,
    wake: Option<(Instant, Trigger)>,
    error_attempts: u32,
}

#[derive(Debug)]
struct Last {
    cause: Cause,
    outcome: &'static str,
    deprovision: bool,
    took: Duration,
    ended: Instant,
    steps: Vec<StepRun>,
}

/// One kind's records, by object.
pub(crate) struct Reports<K: ManagedResource> {
    map: DashMap<ObjectRef<K>, Recorded, ahash::RandomState>,
}

impl<K: ManagedResource> Default for Reports<K> {
    fn default() -> Self {
        Self {
            map: DashMap::default(),
        }
    }
}

impl<K: ManagedResource> Reports<K> {
    /// The steps a reconcile of `key` ran (its provision or deprovision tree).
    pub(crate) fn steps(&self, key: &ObjectRef<K>, steps: Vec<StepRun>) {
        self.map.entry(key.clone()).or_default().steps = steps;
    }

    /// A reconcile of `key` ended.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn ended(
        &self,
        key: &ObjectRef<K>,
        cause: Cause,
        outcome: &'static str,
        deprovision: bool,
        took: Duration,
        wake: Option<(Instant, Trigger)>,
        error_attempts: u32,
    ) {
        let mut r = self.map.entry(key.clone()).or_default();
        let steps = std::mem::take(&mut r.steps);
        r.last = Some(Last {
            cause,
            outcome,
            deprovision,
            took,
            ended: Instant::now(),
            steps,
        });
        r.wake = wake;
        r.error_attempts = error_attempts;
    }

    /// `key` is gone from the API: nothing of it is kept.
    pub(crate) fn gone(&self, key: &ObjectRef<K>) {
        self.map.remove(key);
    }
}

/// The reporter of `shared`'s kind, on the replica `replica`.
pub(crate) fn reporter<K: ManagedResource>(
    shared: Arc<Shared<K>>,
    replica: Arc<str>,
) -> KindReporter {
    Box::new(move |namespace, name| report(&shared, &replica, namespace, name))
}

fn report<K: ManagedResource>(
    shared: &Shared<K>,
    replica: &str,
    namespace: Option<&str>,
    name: &str,
) -> Option<ObjectReport> {
    let mut key = ObjectRef::<K>::new(name);
    if let Some(ns) = namespace {
        key = key.within(ns);
    }
    let object = shared.store.get(&key);
    let undecodable = object
        .is_none()
        .then(|| shared.store.undecodable(&key))
        .flatten();
    let meta = match (&object, &undecodable) {
        (Some(o), _) => o.meta().clone(),
        (None, Some(u)) => u.meta.clone(),
        (None, None) => return None,
    };
    let actor = if undecodable.is_some() {
        "undecodable"
    } else if shared.routes.contains_key(&key) {
        "live"
    } else {
        "passive"
    };
    let ready = object.as_ref().and_then(|o| {
        ResourceStatus::of(o.as_ref()).ready().map(|c| ReadyReport {
            status: c.status.clone(),
            reason: c.reason.clone(),
            message: bounded(&c.message),
            observed_generation: c.observed_generation,
        })
    });
    let now = Instant::now();
    let (last_reconcile, next_wake, error_attempts) = match shared.reports.as_ref()?.map.get(&key) {
        Some(r) => (
            r.last.as_ref().map(|l| ReconcileReport {
                trigger: l.cause.trigger,
                trigger_object: l.cause.object.as_deref().map(str::to_string),
                outcome: l.outcome.to_string(),
                deprovision: l.deprovision,
                took: l.took,
                ago: now.saturating_duration_since(l.ended),
                steps: l.steps.clone(),
            }),
            r.wake
                .filter(|(at, _)| *at > now)
                .map(|(at, trigger)| WakeReport {
                    due_in: at - now,
                    trigger,
                }),
            r.error_attempts,
        ),
        None => (None, None, 0),
    };
    let target = Target::new(
        K::api_version(&()),
        K::kind(&()),
        namespace,
        name.to_string(),
    );
    let names = |ts: Vec<Target>| ts.iter().map(ToString::to_string).collect::<Vec<_>>();
    let [waits_on, holds, referrers] = shared.references.relations(&target).map(names);
    let shard = match (&shared.io.shards, &object) {
        (Some(scope), Some(o)) => {
            let shard = scope.shard_of(o.as_ref());
            Some(ShardReport {
                shard,
                held_here: scope.shards.holds(shard),
            })
        }
        _ => None,
    };
    Some(ObjectReport {
        kind: K::kind(&()).into_owned(),
        namespace: namespace.map(str::to_string),
        name: name.to_string(),
        generation: meta.generation,
        deleting: meta.deletion_timestamp.is_some(),
        actor: actor.to_string(),
        ready,
        last_reconcile,
        next_wake,
        error_attempts,
        waits_on,
        holds,
        referrers,
        shard,
        replica: replica.to_string(),
    })
}
