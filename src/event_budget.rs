//! How many Events each object may still publish: a token bucket per object, so a flapping
//! object cannot flood the API server with Events (plain data).
//!
//! The figures are client-go's Event spam filter's (`EventSourceObjectSpamFilter`): a burst of
//! 25 per object, then one more every 5 minutes.

use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Events an object may publish at once.
pub(crate) const BURST: f64 = 25.0;
/// One more Event per object every this long.
pub(crate) const REFILL_EVERY: Duration = Duration::from_secs(300);
/// Entries are pruned (those whose bucket would be full again) every this many publishes.
const PRUNE_EVERY: u32 = 4096;

struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn refilled(&self, now: Instant) -> f64 {
        let gained =
            now.saturating_duration_since(self.at).as_secs_f64() / REFILL_EVERY.as_secs_f64();
        (self.tokens + gained).min(BURST)
    }
}

/// Per-object token buckets of Events.
pub(crate) struct EventBudget<Key> {
    inner: Mutex<Inner<Key>>,
}

struct Inner<Key> {
    buckets: ahash::AHashMap<Key, Bucket>,
    since_prune: u32,
}

impl<Key: Hash + Eq + Clone> Default for EventBudget<Key> {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Inner {
                buckets: ahash::AHashMap::default(),
                since_prune: 0,
            }),
        }
    }
}

impl<Key: Hash + Eq + Clone> EventBudget<Key> {
    /// Take one Event of `key`'s budget: `false` when it has none left now.
    pub(crate) fn take(&self, key: &Key, now: Instant) -> bool {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.since_prune += 1;
        if inner.since_prune >= PRUNE_EVERY {
            inner.since_prune = 0;
            inner.buckets.retain(|_, b| b.refilled(now) < BURST);
        }
        let bucket = inner.buckets.entry(key.clone()).or_insert(Bucket {
            tokens: BURST,
            at: now,
        });
        let tokens = bucket.refilled(now);
        bucket.at = now;
        if tokens >= 1.0 {
            bucket.tokens = tokens - 1.0;
            true
        } else {
            bucket.tokens = tokens;
            false
        }
    }

    /// Forget `key` (its object is gone).
    pub(crate) fn forget(&self, key: &Key) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.buckets.remove(key);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().unwrap().buckets.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_burst_then_one_per_refill_period_per_object() {
        let budget = EventBudget::<&str>::default();
        let now = Instant::now();
        for _ in 0..BURST as usize {
            assert!(budget.take(&"a", now));
        }
        assert!(!budget.take(&"a", now), "the burst is spent");
        assert!(budget.take(&"b", now), "another object has its own budget");
        let later = now + REFILL_EVERY;
        assert!(budget.take(&"a", later), "one more after a refill period");
        assert!(!budget.take(&"a", later));
        budget.forget(&"a");
        assert!(budget.take(&"a", later), "a forgotten object starts full");
    }

    #[tokio::test(start_paused = true)]
    async fn full_buckets_are_pruned() {
        let budget = EventBudget::<u32>::default();
        let now = Instant::now();
        for i in 0..PRUNE_EVERY - 1 {
            assert!(budget.take(&i, now));
        }
        assert_eq!(budget.len(), (PRUNE_EVERY - 1) as usize);
        // Long after, every bucket is full again: the next take prunes them all but its own.
        assert!(budget.take(&u32::MAX, now + REFILL_EVERY * 30));
        assert_eq!(budget.len(), 1);
    }
}
