//! When reconciles start: the reconcile slots every reconcile needs, who gets the next one, the
//! timer task that delivers wake-ups with their slots, the manager's activation queue, and a
//! reconcile's deadline and cancellation.
//! Plain data and one tokio task each; nothing here knows an actor's state, only the
//! [`ActorRef`](ractor::ActorRef) a delivery goes to.
//!
//! | file | what it holds |
//! |---|---|
//! | `slots.rs` | what a reconcile slot is ([`ReconcileSlots`]), and who gets the next one, with the lateness heuristic (plain data) |
//! | `timers.rs` | the timer task: delivers wake-ups at their deadline, hands out reconcile slots ([`Timers`]) |
//! | `activation_queue.rs` | who gets a live actor next: changes before the start-up list (plain data) |
//! | `fair.rs` | fair shares across tenants: a queue that serves its tenants in turn, by weight (plain data) |
//! | `wake_up.rs` | a resource actor's one pending wake-up (plain data) |
//! | `passive_timers.rs` | the wake-ups of passive objects (no actor), one task per manager |
//! | `deadline.rs` | a reconcile stopped at the policy's `reconcile_timeout` |
//! | `moved_on.rs` | a provision reconcile cancelled when its object moves on (new generation, deletion) |
//! | `aimd.rs` | the adaptive concurrency limit's rule: additive increase, multiplicative decrease on 429s and rising latency (plain data; [`crate::adaptive`] applies it) |
//!
//! The words (reconcile slot, wake-up, activation, held back) are the glossary's in
//! [`crate::actors`].

mod activation_queue;
pub(crate) mod aimd;
pub(crate) mod deadline;
pub(crate) mod fair;
pub(crate) mod moved_on;
mod passive_timers;
mod slots;
mod timers;
mod wake_up;

pub(crate) use activation_queue::ActivationQueue;
pub(crate) use passive_timers::PassiveTimers;
pub(crate) use slots::ReconcileSlots;
#[cfg(feature = "bench-internals")]
pub use timers::Timers;
#[cfg(not(feature = "bench-internals"))]
pub(crate) use timers::Timers;
pub(crate) use timers::bounded_delay;
#[cfg(feature = "bench-internals")]
pub use wake_up::PendingWakeUp;
#[cfg(not(feature = "bench-internals"))]
pub(crate) use wake_up::PendingWakeUp;
