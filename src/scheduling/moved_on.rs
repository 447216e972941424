//! A provision reconcile cancelled when its object moves on: a new generation, a deletion, or
//! the object gone arrives while its steps still await (a slow call made for the old intent).
//! The reconcile is cut at its next await point, outside any
//! [`Context::shielded`](crate::provisioners::Context::shielded) future, and the object runs
//! again at once on what arrived.
//!
//! The feeder sees each event before the actor does (the actor is busy in its reconcile and
//! reads its mailbox only after it): it looks the object up in [`InFlight`], the reconciles
//! of the kind that run now, and cancels the one whose object moved on. A deprovision reconcile is
//! never cancelled: nothing newer than a deletion can arrive.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;

use dashmap::DashMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::ObjectRef;
use tokio_util::sync::CancellationToken;

/// Why a reconcile was cancelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MovedOn {
    /// A newer generation of the object arrived (its spec changed).
    Generation,
    /// The object is being deleted.
    Deleting,
    /// The object is gone.
    Gone,
}

impl MovedOn {
    /// For logs.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            MovedOn::Generation => "a newer generation arrived",
            MovedOn::Deleting => "the object is being deleted",
            MovedOn::Gone => "the object is gone",
        }
    }
}

/// Whether `meta` (just observed) moves on from a provision reconcile of `generation`.
pub(crate) fn moved_on(generation: Option<i64>, meta: &ObjectMeta) -> Option<MovedOn> {
    if meta.deletion_timestamp.is_some() {
        return Some(MovedOn::Deleting);
    }
    match (generation, meta.generation) {
        (Some(running), Some(seen)) if seen > running => Some(MovedOn::Generation),
        _ => None,
    }
}

/// One running provision reconcile.
#[derive(Debug)]
struct Running {
    generation: Option<i64>,
    token: CancellationToken,
    why: std::sync::Mutex<Option<MovedOn>>,
}

/// The provision reconciles of one kind that run now and may be cancelled, by object.
pub(crate) struct InFlight<K: kube::Resource>
where
    K::DynamicType: std::hash::Hash + Eq,
{
    running: DashMap<ObjectRef<K>, std::sync::Arc<Running>, ahash::RandomState>,
    /// `running`'s length, read without locking the map's shards: the feeder looks an event up
    /// only while some reconcile runs.
    len: AtomicUsize,
    enabled: bool,
}

impl<K: kube::Resource> InFlight<K>
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    /// `enabled`: the controller's reconciles are cancelled when their object moves on.
    pub(crate) fn new(enabled: bool) -> Self {
        Self {
            running: DashMap::default(),
            len: AtomicUsize::new(0),
            enabled,
        }
    }

    /// A provision reconcile of `key` at `generation` starts; `None` when the controller
    /// opted out. Dropping the registration ends it.
    pub(crate) fn start<'a>(
        &'a self,
        key: &'a ObjectRef<K>,
        generation: Option<i64>,
    ) -> Option<Registration<'a, K>> {
        if !self.enabled {
            return None;
        }
        let running = std::sync::Arc::new(Running {
            generation,
            token: CancellationToken::new(),
            why: Default::default(),
        });
        if self.running.insert(key.clone(), running.clone()).is_none() {
            self.len.fetch_add(1, Ordering::Relaxed);
        }
        Some(Registration {
            map: self,
            key,
            running,
        })
    }

    /// The feeder observed `meta` of `key`: cancel its running reconcile if the object moved on.
    pub(crate) fn observed(&self, key: &ObjectRef<K>, meta: &ObjectMeta) {
        if self.len.load(Ordering::Relaxed) == 0 {
            return;
        }
        if let Some(running) = self.running.get(key)
            && let Some(why) = moved_on(running.generation, meta)
        {
            running.cancel(why);
        }
    }

    /// The feeder saw `key` deleted from the API.
    pub(crate) fn gone(&self, key: &ObjectRef<K>) {
        if self.len.load(Ordering::Relaxed) == 0 {
            return;
        }
        if let Some(running) = self.running.get(key) {
            running.cancel(MovedOn::Gone);
        }
    }
}

impl Running {
    fn cancel(&self, why: MovedOn) {
        let mut first = self.why.lock().unwrap_or_else(|e| e.into_inner());
        first.get_or_insert(why);
        self.token.cancel();
    }
}

/// A running provision reconcile, registered in [`InFlight`] until dropped.
pub(crate) struct Registration<'a, K: kube::Resource>
where
    K::DynamicType: std::hash::Hash + Eq,
{
    map: &'a InFlight<K>,
    key: &'a ObjectRef<K>,
    running: std::sync::Arc<Running>,
}

impl<K: kube::Resource> Registration<'_, K>
where
    K::DynamicType: std::hash::Hash + Eq,
{
    /// `reconcile`, or `Err(why)` once the object moved on, at the first point where
    /// `reconcile` awaits and `shielded()` is false.
    pub(crate) async fn unless_moved_on<T>(
        &self,
        reconcile: impl Future<Output = T>,
        shielded: impl Fn() -> bool,
    ) -> Result<T, MovedOn> {
        let mut reconcile = pin!(reconcile);
        let mut cancelled = pin!(self.running.token.cancelled());
        std::future::poll_fn(|cx| {
            if let Poll::Ready(out) = reconcile.as_mut().poll(cx) {
                return Poll::Ready(Ok(out));
            }
            // A shield drops only while `reconcile` is polled, so the check after each poll
            // sees it: no wake-up is needed for the shield's end.
            if cancelled.as_mut().poll(cx).is_ready() && !shielded() {
                let why = *self.running.why.lock().unwrap_or_else(|e| e.into_inner());
                return Poll::Ready(Err(why.unwrap_or(MovedOn::Generation)));
            }
            Poll::Pending
        })
        .await
    }
}

impl<K: kube::Resource> Drop for Registration<'_, K>
where
    K::DynamicType: std::hash::Hash + Eq,
{
    fn drop(&mut self) {
        let ours = |_: &ObjectRef<K>, r: &std::sync::Arc<Running>| {
            std::sync::Arc::ptr_eq(r, &self.running)
        };
        if self.map.running.remove_if(self.key, ours).is_some() {
            self.map.len.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    fn meta(generation: i64, deleting: bool) -> ObjectMeta {
        ObjectMeta {
            generation: Some(generation),
            deletion_timestamp: deleting.then(|| Time(Default::default())),
            ..Default::default()
        }
    }

    #[test]
    fn only_a_newer_generation_or_a_deletion_moves_on() {
        assert_eq!(
            moved_on(Some(2), &meta(2, false)),
            None,
            "its own generation"
        );
        assert_eq!(moved_on(Some(2), &meta(1, false)), None, "an older one");
        assert_eq!(
            moved_on(Some(2), &meta(3, false)),
            Some(MovedOn::Generation)
        );
        assert_eq!(moved_on(Some(2), &meta(2, true)), Some(MovedOn::Deleting));
        assert_eq!(
            moved_on(None, &meta(9, false)),
            None,
            "no generation to compare"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_reconcile_is_cut_when_its_object_moves_on_but_not_while_shielded() {
        let map = InFlight::<ConfigMap>::new(true);
        let key = ObjectRef::new("a").within("ns");
        let reg = map.start(&key, Some(1)).expect("enabled");
        let shield = AtomicBool::new(true);
        let start = tokio::time::Instant::now();
        {
            let run = reg.unless_moved_on(
                async {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    shield.store(false, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_secs(600)).await;
                },
                || shield.load(Ordering::Relaxed),
            );
            let mut run = pin!(run);
            assert!(futures::poll!(run.as_mut()).is_pending());
            map.observed(&key, &meta(1, false));
            map.observed(&key, &meta(2, false));
            assert_eq!(run.await, Err(MovedOn::Generation));
        }
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(1),
            "cut when the shield dropped, not before and not after the slow call"
        );
        drop(reg);
        assert_eq!(map.len.load(Ordering::Relaxed), 0);
        map.gone(&key); // nothing runs: nothing to cancel
        assert!(
            InFlight::<ConfigMap>::new(false)
                .start(&key, Some(1))
                .is_none()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_reconcile_nothing_moved_keeps_its_result() {
        let map = InFlight::<ConfigMap>::new(true);
        let key = ObjectRef::new("a").within("ns");
        let reg = map.start(&key, Some(1)).expect("enabled");
        let out = reg
            .unless_moved_on(
                async {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    7
                },
                || false,
            )
            .await;
        assert_eq!(out, Ok(7));
        // A second registration of the key replaces the first; the first's drop leaves it.
        let again = map.start(&key, Some(2)).expect("enabled");
        drop(reg);
        map.gone(&key);
        assert!(again.running.token.is_cancelled());
    }
}
