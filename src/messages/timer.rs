//! What the timer task delivers: a message of the receiving actor's own type, carrying the run
//! slot the task acquired for the reconcile it triggers (see the glossary in `src/actors/mod.rs`).

use ractor::Message;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

/// A message the timer task can deliver. With reconcile slots, every delivery carries the reconcile slot
/// the task acquired for it, so the receiving actor runs its reconcile at once instead of waiting for
/// a slot inside its handler.
pub trait TimerMsg: Message {
    /// Attach the reconcile slot acquired for this delivery.
    fn give_slot(&mut self, slot: ReconcileSlot);
}

/// A reconcile slot: the permit of the runtime's semaphore (`max_concurrent_reconciles`), and of the
/// kind's own when its controller has a limit of its own (`Controller::max_concurrent_reconciles`).
/// Dropping it frees both.
#[derive(Debug)]
// Held, not read (outside tests and benchmarks): dropping the permits frees the slots.
#[allow(dead_code)]
pub struct ReconcilePermit {
    /// The permit of the runtime-wide limit.
    pub runtime: OwnedSemaphorePermit,
    /// The permit of the kind's limit, if it has one.
    pub kind: Option<OwnedSemaphorePermit>,
}

/// A reconcile slot the timer task handed out with a delivery, and when it did: the receiver tells
/// how long the delivery waited for the workers from how long it waited for the slot.
#[derive(Debug)]
pub struct ReconcileSlot {
    /// The reconcile slot.
    pub permit: ReconcilePermit,
    /// When the timer task sent it.
    pub given_at: Instant,
}

/// Tests deliver plain numbers; the slot is released at once.
impl TimerMsg for u32 {
    fn give_slot(&mut self, _: ReconcileSlot) {}
}

/// Benchmarks deliver plain numbers; the slot is released at once.
impl TimerMsg for u64 {
    fn give_slot(&mut self, _: ReconcileSlot) {}
}
