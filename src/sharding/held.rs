//! [`Shards`]: which shards this replica holds now, the fencing deadline of each, and the
//! reconciles in flight per shard (what the keeper changes and the actors ask).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, watch};
use tokio::time::Instant;

/// Which shards this replica holds now, shared by the keeper (which changes it) and the actors
/// (which ask it before every reconcile).
pub(crate) struct Shards {
    /// Per shard: held (`true`) or not. Reconciles in flight wait on it to see a loss.
    held: Vec<watch::Sender<bool>>,
    /// Per shard: the fencing deadline, as nanoseconds since `base` (0: not held). A shard is
    /// held only before it, whatever the keeper has got round to.
    valid_until: Vec<AtomicU64>,
    base: Instant,
    /// Per shard: being given up ([`Shards::drain`]): held, but no new reconcile starts.
    draining: Vec<AtomicBool>,
    /// Per shard: reconciles running now.
    in_flight: Vec<AtomicUsize>,
    idle: Vec<Notify>,
    /// Called with a shard's number when this replica acquires it (each manager runs the
    /// shard's objects).
    listeners: Mutex<Vec<Listener>>,
    /// Bumped on every acquisition and loss (the watches of [`ShardWatch::HeldShards`]
    /// follow the held set).
    changes: watch::Sender<u64>,
}

/// What runs when a shard is acquired ([`Shards::on_acquired`]).
type Listener = Box<dyn Fn(u32) + Send + Sync>;

impl Shards {
    pub(crate) fn new(count: u32) -> Self {
        let n = count as usize;
        Self {
            held: (0..n).map(|_| watch::channel(false).0).collect(),
            valid_until: (0..n).map(|_| AtomicU64::new(0)).collect(),
            base: Instant::now(),
            draining: (0..n).map(|_| AtomicBool::new(false)).collect(),
            in_flight: (0..n).map(|_| AtomicUsize::new(0)).collect(),
            idle: (0..n).map(|_| Notify::new()).collect(),
            listeners: Mutex::new(Vec::new()),
            changes: watch::channel(0).0,
        }
    }

    /// A receiver that sees every change of the held set from now on.
    pub(crate) fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    pub(crate) fn count(&self) -> u32 {
        self.held.len() as u32
    }

    /// Whether this replica holds `shard` now: acquired, and before its fencing deadline.
    pub(crate) fn holds(&self, shard: u32) -> bool {
        let i = shard as usize;
        let until = self.valid_until[i].load(Ordering::Acquire);
        *self.held[i].borrow() && self.nanos(Instant::now()) < until
    }

    /// The shards held now, in order.
    pub(crate) fn held(&self) -> Vec<u32> {
        (0..self.count()).filter(|&s| self.holds(s)).collect()
    }

    /// The shards the keeper holds, in order, whether or not a renewal is late (what the
    /// watches of [`ShardWatch::HeldShards`] select).
    pub(crate) fn claimed(&self) -> Vec<u32> {
        (0..self.count())
            .filter(|&s| *self.held[s as usize].borrow())
            .collect()
    }

    fn nanos(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.base).as_nanos() as u64
    }

    /// Call `f` with each shard this replica acquires from now on.
    pub(crate) fn on_acquired(&self, f: Listener) {
        self.listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(f);
    }

    /// `shard` is held until `until` (acquired or renewed), and runs new reconciles again if
    /// it was being drained. On an acquisition, or the end of a drain that did not end in a
    /// give-up, the listeners run its objects (those a drain turned away were handed back).
    pub(crate) fn hold_until(&self, shard: u32, until: Instant) {
        let i = shard as usize;
        self.valid_until[i].store(self.nanos(until).max(1), Ordering::Release);
        let undrained = self.draining[i].swap(false, Ordering::AcqRel);
        // Only the keeper changes `held`: said before it is so, as a loss is said after.
        let acquired = !*self.held[i].borrow();
        if acquired {
            tracing::info!(shard, "acquired shard");
            self.held[i].send_replace(true);
            self.changes.send_modify(|n| *n += 1);
        }
        if acquired || undrained {
            for f in self
                .listeners
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
            {
                f(shard);
            }
        }
    }

    /// Start giving `shard` up: it stays held (its reconciles in flight go on, and their writes
    /// pass the fence), but no new reconcile starts. [`Shards::drained`] waits for the last.
    pub(crate) fn drain(&self, shard: u32) {
        self.draining[shard as usize].store(true, Ordering::Release);
    }

    /// `shard` is not held any more: its reconciles in flight are abandoned, no new one starts.
    pub(crate) fn lose(&self, shard: u32) {
        let i = shard as usize;
        self.valid_until[i].store(0, Ordering::Release);
        self.draining[i].store(false, Ordering::Release);
        if self.held[i].send_replace(false) {
            tracing::info!(shard, "shard no longer held: its reconciles stop");
            self.changes.send_modify(|n| *n += 1);
        }
    }

    /// Enter a reconcile of an object of `shard`: `None` if the shard is not held, or is
    /// being drained.
    pub(crate) fn enter(self: &Arc<Self>, shard: u32) -> Option<ReconcileGuard> {
        if !self.holds(shard) || self.draining[shard as usize].load(Ordering::Acquire) {
            return None;
        }
        self.in_flight[shard as usize].fetch_add(1, Ordering::AcqRel);
        Some(ReconcileGuard {
            lost: self.held[shard as usize].subscribe(),
            shards: self.clone(),
            shard,
        })
    }

    /// Wait until no reconcile of `shard` runs (at most until `deadline`); `false` if some
    /// still did.
    pub(crate) async fn drained(&self, shard: u32, deadline: Instant) -> bool {
        let i = shard as usize;
        let wait = async {
            loop {
                let notified = self.idle[i].notified();
                if self.in_flight[i].load(Ordering::Acquire) == 0 {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout_at(deadline, wait).await.is_ok()
    }
}

impl std::fmt::Debug for Shards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shards")
            .field("count", &self.count())
            .field("held", &self.held())
            .finish()
    }
}

/// A reconcile of an object of a held shard; dropped when the reconcile ends.
pub(crate) struct ReconcileGuard {
    shards: Arc<Shards>,
    shard: u32,
    lost: watch::Receiver<bool>,
}

impl ReconcileGuard {
    /// Resolves when the shard is lost (the reconcile must stop).
    pub(crate) async fn lost(&mut self) {
        let _ = self.lost.wait_for(|held| !held).await;
    }

    /// What tells, by the clock, whether the shard is still held (see [`Shards::holds`]).
    pub(crate) fn check(&self) -> HeldCheck {
        HeldCheck {
            shards: self.shards.clone(),
            shard: self.shard,
        }
    }
}

/// Whether one shard is held, asked by the clock ([`ReconcileGuard::check`]).
pub(crate) struct HeldCheck {
    shards: Arc<Shards>,
    shard: u32,
}

impl HeldCheck {
    /// [`Shards::holds`] for the shard.
    pub(crate) fn holds(&self) -> bool {
        self.shards.holds(self.shard)
    }
}

impl Drop for ReconcileGuard {
    fn drop(&mut self) {
        let i = self.shard as usize;
        if self.shards.in_flight[i].fetch_sub(1, Ordering::AcqRel) == 1 {
            self.shards.idle[i].notify_waiters();
        }
    }
}
