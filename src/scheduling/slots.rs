//! Reconcile-slot admission: what a reconcile slot is ([`ReconcileSlots`]), and who gets the next free one, as
//! plain data.
//!
//! A *reconcile slot* is a permit of the runtime's `max_concurrent_reconciles` semaphore, plus one of the
//! kind's own when its controller sets `Controller::max_concurrent_reconciles`; every reconcile runs on
//! one. The timer task hands them out in the order this module decides:
//!
//! - Reconciles of live actors (due wake-ups, reconciles that found no free slot) wait in one
//!   first-in-first-out queue, and come first: objects already in progress finish before many
//!   more start (each live actor costs memory, and at many new objects that was most of the
//!   time).
//! - Activations (an object getting a live actor, see the glossary in `mod.rs`) get a bounded
//!   share: one slot in [`ACTIVATION_EVERY`], or every slot while no reconcile waits, so new objects
//!   never starve behind objects that yield forever.
//! - While the runtime is CPU-bound ([`Lateness`]: reconciles start well after they were due), the
//!   activations' share shrinks to one in [`HELD_ACTIVATION_EVERY`] (they are *held back*):
//!   starting more objects would add memory and lateness, not throughput.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};
use tokio::time::Instant;
use tokio_util::sync::PollSemaphore;

use crate::messages::ReconcilePermit;

/// The reconcile slots of one kind's reconciles: the runtime's semaphore, shared by every kind, and the
/// kind's own when its controller has a limit of its own. A reconcile holds a permit of each.
#[derive(Clone, Debug)]
pub struct ReconcileSlots {
    runtime: Arc<Semaphore>,
    kind: Option<Arc<Semaphore>>,
    capacity: usize,
}

impl ReconcileSlots {
    /// The runtime's slots (`runtime_capacity` of them once it runs), and `kind_limit` of the
    /// kind's own (`None`: no limit of its own).
    pub fn new(
        runtime: Arc<Semaphore>,
        runtime_capacity: usize,
        kind_limit: Option<usize>,
    ) -> Self {
        Self {
            runtime,
            kind: kind_limit.map(|n| Arc::new(Semaphore::new(n))),
            capacity: kind_limit.map_or(runtime_capacity, |n| n.min(runtime_capacity)),
        }
    }

    /// The most reconciles of the kind that can run at once.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// A slot if one is free now: the kind's first, then the runtime's (a kind at its limit
    /// takes nothing from other kinds).
    pub fn try_acquire(&self) -> Result<ReconcilePermit, TryAcquireError> {
        let kind = match &self.kind {
            Some(kind) => Some(kind.clone().try_acquire_owned()?),
            None => None,
        };
        let runtime = self.runtime.clone().try_acquire_owned()?;
        Ok(ReconcilePermit { runtime, kind })
    }

    /// Whether the runtime's slots are closed: it shuts down and no reconcile may start.
    pub fn is_closed(&self) -> bool {
        self.runtime.is_closed()
    }

    /// The slots as the timer task waits for them.
    pub fn poller(&self) -> PollSlots {
        PollSlots {
            runtime: PollSemaphore::new(self.runtime.clone()),
            kind: self.kind.clone().map(PollSemaphore::new),
            held: None,
        }
    }
}

/// [`ReconcileSlots`] polled for the next free slot: the kind's permit first, kept while the
/// runtime's is awaited (other kinds' reconciles never wait behind it).
#[derive(Debug)]
pub struct PollSlots {
    runtime: PollSemaphore,
    kind: Option<PollSemaphore>,
    held: Option<OwnedSemaphorePermit>,
}

impl PollSlots {
    /// The next slot; `Ready(None)` once the slots are closed.
    pub fn poll_acquire(&mut self, cx: &mut Context<'_>) -> Poll<Option<ReconcilePermit>> {
        if let Some(kind) = &mut self.kind
            && self.held.is_none()
        {
            match kind.poll_acquire(cx) {
                Poll::Ready(Some(permit)) => self.held = Some(permit),
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
        self.runtime.poll_acquire(cx).map(|runtime| {
            runtime.map(|runtime| ReconcilePermit {
                runtime,
                kind: self.held.take(),
            })
        })
    }
}

/// When reconciles of live actors and activations both wait for reconcile slots, one slot in this many
/// goes to an activation.
pub const ACTIVATION_EVERY: u32 = 4;

/// A wake-up whose reconcile starts later than this after its deadline, on a moving average, says
/// the runtime is saturated (CPU-bound): the live actors already have more work than the
/// workers get through. Activations are then held back to one slot in [`HELD_ACTIVATION_EVERY`]
/// until reconciles start on time again. Reconciles that wait on I/O leave the workers idle and their
/// wake-ups on time, so they are never held back (nor under the simulator's virtual clock,
/// where no wake-up is late).
pub const SATURATED_LATENESS: Duration = Duration::from_millis(5);

/// While wake-ups run late ([`SATURATED_LATENESS`]), one slot in this many still goes to an
/// activation, so new objects are never starved by live ones that stay busy. A share of the
/// reconciles, not a rate: a fixed rate could start objects faster than a slow runtime finishes
/// them.
pub const HELD_ACTIVATION_EVERY: u32 = 32;

/// The hold-back ends this long after the last late wake-up was reported, so it cannot outlive
/// the work that caused it.
pub const HELD_FOR: Duration = Duration::from_millis(10);

/// Weight of a new lateness sample in the moving average: 1 / this.
const LATENESS_SMOOTHING: u64 = 8;

/// The two queues that wait for reconcile slots: reconciles (`P`) and activations (`A`), each oldest
/// first.
#[derive(Debug)]
pub struct SlotQueue<P, A> {
    reconciles: VecDeque<P>,
    activations: VecDeque<A>,
    /// Slots given to reconciles since an activation last got one.
    since_activation: u32,
}

/// Who a reconcile slot goes to.
#[derive(Debug, PartialEq, Eq)]
pub enum Next<P, A> {
    /// The oldest waiting reconcile.
    Reconcile(P),
    /// The oldest waiting activation.
    Activation(A),
}

impl<P, A> Default for SlotQueue<P, A> {
    fn default() -> Self {
        Self {
            reconciles: VecDeque::new(),
            activations: VecDeque::new(),
            since_activation: 0,
        }
    }
}

impl<P, A> SlotQueue<P, A> {
    /// A reconcile waits for a slot.
    pub fn push_reconcile(&mut self, reconcile: P) {
        self.reconciles.push_back(reconcile);
    }

    /// An activation waits for a slot.
    pub fn push_activation(&mut self, activation: A) {
        self.activations.push_back(activation);
    }

    /// Whether a reconcile waits.
    pub fn reconciles_wait(&self) -> bool {
        !self.reconciles.is_empty()
    }

    /// Reconciles and activations waiting.
    pub fn len(&self) -> usize {
        self.reconciles.len() + self.activations.len()
    }

    /// Whether an activation waits.
    pub fn activations_wait(&self) -> bool {
        !self.activations.is_empty()
    }

    /// Whether a slot acquired now goes to an activation; `held`: activations are held back
    /// ([`Lateness::holding`]).
    pub fn activation_turn(&self, held: bool) -> bool {
        if self.activations.is_empty() {
            return false;
        }
        let every = if held {
            HELD_ACTIVATION_EVERY
        } else {
            ACTIVATION_EVERY
        };
        (self.reconciles.is_empty() && !held) || self.since_activation + 1 >= every
    }

    /// Take who gets the slot acquired now: the next activation if `activation` (its turn, see
    /// [`SlotQueue::activation_turn`]), else the next reconcile.
    pub fn next(&mut self, activation: bool) -> Option<Next<P, A>> {
        if activation && let Some(a) = self.activations.pop_front() {
            self.since_activation = 0;
            return Some(Next::Activation(a));
        }
        let reconcile = self.reconciles.pop_front()?;
        self.since_activation += 1;
        Some(Next::Reconcile(reconcile))
    }

    /// Drop everything waiting (the reconcile slots are closed: the runtime shuts down).
    pub fn clear(&mut self) {
        self.reconciles.clear();
        self.activations.clear();
    }
}

/// How late wake-ups run, as resource actors report them: a moving average, and when it was last
/// updated, in one word (written with plain loads and stores: a lost update only drops one
/// sample of a heuristic, and a read-modify-write would make every actor wait for the line).
#[derive(Debug)]
pub struct Lateness {
    epoch: Instant,
    /// Milliseconds from `epoch` to the last sample, plus one (0: no sample yet), in the high
    /// half; the moving average of lateness in microseconds in the low half.
    state: AtomicU64,
    /// Whether reconciles wait for reconcile slots in the timer task (written by the task when that
    /// changes).
    pub reconciles_wait: AtomicBool,
}

impl Lateness {
    /// No sample yet; times are kept relative to `epoch`.
    pub fn new(epoch: Instant) -> Self {
        Self {
            epoch,
            state: AtomicU64::new(0),
            reconciles_wait: AtomicBool::new(false),
        }
    }

    /// A wake-up sent at `sent` started its reconcile at `now`.
    pub fn woke(&self, sent: Instant, now: Instant) {
        let late_us = u64::try_from(now.saturating_duration_since(sent).as_micros())
            .unwrap_or(u64::MAX)
            .min(u64::from(u32::MAX));
        let at_ms = u64::try_from(now.saturating_duration_since(self.epoch).as_millis())
            .unwrap_or(u64::MAX)
            .min(u64::from(u32::MAX) - 1)
            + 1;
        let avg = self.state.load(Ordering::Relaxed) & u64::from(u32::MAX);
        let avg = avg - avg / LATENESS_SMOOTHING + late_us / LATENESS_SMOOTHING;
        self.state.store(at_ms << 32 | avg, Ordering::Relaxed);
    }

    /// Until when activations are held back, if they are at `now`: while the average lateness
    /// is above [`SATURATED_LATENESS`], and for [`HELD_FOR`] after the last sample.
    pub fn held_until(&self, now: Instant) -> Option<Instant> {
        let state = self.state.load(Ordering::Relaxed);
        let at_ms = (state >> 32).checked_sub(1)?;
        let avg = Duration::from_micros(state & u64::from(u32::MAX));
        if avg <= SATURATED_LATENESS {
            return None;
        }
        let until = self.epoch + Duration::from_millis(at_ms) + HELD_FOR;
        (now < until).then_some(until)
    }

    /// Whether activations are held back at `now`.
    pub fn holding(&self, now: Instant) -> bool {
        self.held_until(now).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kind's own limit bounds its reconciles and leaves the runtime's other slots to other
    /// kinds; polled, the kind's slot is kept while the runtime's is awaited.
    #[tokio::test]
    async fn a_kinds_limit_bounds_its_slots_within_the_runtimes() {
        let runtime = Arc::new(Semaphore::new(3));
        let kind = ReconcileSlots::new(runtime.clone(), 4, Some(1));
        let other = ReconcileSlots::new(runtime.clone(), 4, None);
        let first = kind.try_acquire().expect("a free slot");
        assert!(matches!(
            kind.try_acquire(),
            Err(TryAcquireError::NoPermits)
        ));
        assert_eq!(
            runtime.available_permits(),
            2,
            "a refused kind takes none of the runtime's"
        );
        let a = other
            .try_acquire()
            .expect("other kinds are not bound by it");
        let b = other
            .try_acquire()
            .expect("other kinds are not bound by it");
        drop(first);
        let c = other.try_acquire().expect("the runtime's slot it freed");
        // Kind slot free, runtime's taken: the poller holds the kind's and waits.
        let mut poller = kind.poller();
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(poller.poll_acquire(&mut cx).is_pending());
        assert!(
            matches!(kind.try_acquire(), Err(TryAcquireError::NoPermits)),
            "held by the poller"
        );
        drop(a);
        let Poll::Ready(Some(permit)) = poller.poll_acquire(&mut cx) else {
            panic!("the runtime's slot is free again");
        };
        assert!(permit.kind.is_some());
        drop((permit, b, c));
        assert_eq!(runtime.available_permits(), 3, "every slot back");
        assert!(kind.try_acquire().is_ok(), "the kind's slot is back");
        runtime.close();
        assert!(kind.is_closed());
        assert!(matches!(other.try_acquire(), Err(TryAcquireError::Closed)));
    }

    /// Take slots one at a time until both queues are empty; `held` for every slot.
    fn drain(q: &mut SlotQueue<u32, u32>, held: bool) -> Vec<u32> {
        let mut order = Vec::new();
        while q.reconciles_wait() || q.activations_wait() {
            let activation = q.activation_turn(held);
            if !activation && !q.reconciles_wait() {
                break; // held back with no reconcile waiting: the slot stays free
            }
            match q.next(activation) {
                Some(Next::Reconcile(p)) | Some(Next::Activation(p)) => order.push(p),
                None => break,
            }
        }
        order
    }

    #[test]
    fn reconciles_come_first_and_activations_get_every_fourth_slot() {
        assert_eq!(ACTIVATION_EVERY, 4, "the expected order below assumes 4");
        let mut q = SlotQueue::default();
        (1..=6).for_each(|p| q.push_reconcile(p));
        [101, 102, 103]
            .into_iter()
            .for_each(|a| q.push_activation(a));
        // once no reconcile waits, activations take every slot
        assert_eq!(drain(&mut q, false), vec![1, 2, 3, 101, 4, 5, 6, 102, 103]);
    }

    #[test]
    fn held_back_activations_get_one_slot_in_thirty_two_and_none_unasked() {
        assert_eq!(
            HELD_ACTIVATION_EVERY, 32,
            "the expected order below assumes 32"
        );
        let mut q = SlotQueue::default();
        (1..=40).for_each(|p| q.push_reconcile(p));
        [101, 102].into_iter().for_each(|a| q.push_activation(a));
        let expected: Vec<u32> = (1..=31).chain([101]).chain(32..=40).collect();
        assert_eq!(drain(&mut q, true), expected);
        // no reconcile waits, but a held-back activation still does not take a free slot
        assert!(q.activations_wait() && !q.activation_turn(true));
        assert!(q.activation_turn(false), "once the hold ends, it does");
    }

    #[test]
    fn a_slot_with_nobody_waiting_goes_to_nobody() {
        let mut q: SlotQueue<u32, u32> = SlotQueue::default();
        assert_eq!(q.next(true), None);
        q.push_activation(7);
        q.clear();
        assert!(!q.activations_wait() && !q.reconciles_wait());
    }

    #[test]
    fn late_wake_ups_hold_activations_back_until_they_stop() {
        let t0 = Instant::now();
        let late = Lateness::new(t0);
        assert!(!late.holding(t0), "no sample, no hold");
        // on-time wake-ups never hold
        for _ in 0..50 {
            late.woke(t0, t0 + Duration::from_millis(1));
        }
        assert!(!late.holding(t0 + Duration::from_millis(1)));
        // a run of late ones lifts the moving average past the threshold
        let now = t0 + Duration::from_millis(100);
        for _ in 0..8 {
            late.woke(now - Duration::from_millis(50), now);
        }
        assert!(late.holding(now));
        let until = late.held_until(now).expect("held");
        assert_eq!(until, t0 + Duration::from_millis(100) + HELD_FOR);
        assert!(late.holding(until - Duration::from_millis(1)));
        assert!(
            !late.holding(until),
            "the hold ends HELD_FOR after the last report"
        );
    }
}
