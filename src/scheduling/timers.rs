//! The timer task: delivers every resource actor's wake-up at its deadline (one pending per
//! actor, arming again replaces it) and hands out reconcile slots with the deliveries.
//!
//! A resource actor re-arms its wake-up on every yield, so arming must be cheap: [`Timers`]
//! keeps every actor's timers in one tokio-util [`DelayQueue`] owned by one task, and arming is a
//! channel send to it. (A spawned `sleep` task per timer, what `ractor::time::send_after` does,
//! costs a task allocation and an abort on every re-arm, and a live task per idle actor.)
//!
//! A due wake-up needs a reconcile slot before its reconcile can start, so the task acquires one and
//! delivers it with the wake-up; an actor whose reconcile was triggered otherwise and found no free
//! slot queues here too ([`Timers::queue`]), and so do activations ([`Timers::activation`]). Who
//! gets the next slot is decided by [`SlotQueue`] and [`Lateness`] (`slots.rs`). No actor
//! waits for a slot in its handler.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;

use ractor::{ActorId, ActorRef, Message};
use tokio::sync::mpsc;
use tokio::time::{Instant, Sleep};
use tokio_util::time::{DelayQueue, delay_queue};

use super::slots::{Lateness, Next, PollSlots, ReconcileSlots, SlotQueue};
use crate::hash::FastMap;
use crate::messages::{ReconcilePermit, ReconcileSlot, TimerMsg};

enum Cmd<M: Message> {
    Arm {
        to: ActorRef<M>,
        at: Instant,
        msg: M,
    },
    Cancel(ActorId),
    /// Deliver as soon as a reconcile slot is free (no deadline).
    Queue {
        to: ActorRef<M>,
        msg: M,
    },
    /// Hand a reconcile slot to a new actor's first reconcile (the manager's activation queue).
    Activation(GrantSlot),
}

/// What receives a reconcile slot for an activation (the manager's callback).
pub type GrantSlot = Box<dyn FnOnce(ReconcilePermit) + Send>;

/// Handle to a timer task that delivers messages to actors at deadlines; one pending timer per
/// actor (arming again replaces it). The task ends when every handle is dropped.
///
/// With reconcile slots, the task is also where reconciles wait for a slot: due deliveries and
/// [`Timers::queue`]d ones wait in one first-in-first-out queue, and each is delivered with a
/// slot. An actor so never waits for a slot inside its handler (where it could not take other
/// messages, and where every wait cost it a second poll and a place in the semaphore's waiter
/// list: most reconciles of a busy runtime wait for a slot).
pub struct Timers<M: Message> {
    tx: mpsc::UnboundedSender<Cmd<M>>,
    lateness: Arc<Lateness>,
    gauges: Arc<Gauges>,
}

/// Reads what a timer task holds, as of the end of its last turn.
#[derive(Clone, Debug)]
pub struct TimerGauges(Arc<Gauges>);

impl TimerGauges {
    /// Wake-ups armed and not yet due.
    pub fn armed(&self) -> u64 {
        self.0.armed.load(Ordering::Relaxed)
    }

    /// Due reconciles and activations waiting for a reconcile slot.
    pub fn waiting(&self) -> u64 {
        self.0.waiting.load(Ordering::Relaxed)
    }
}

/// What the task holds, as of the end of its last turn (for metrics).
#[derive(Debug, Default)]
struct Gauges {
    armed: AtomicU64,
    waiting: AtomicU64,
}

impl<M: TimerMsg> Timers<M> {
    /// Spawns the timer task on the current tokio runtime; it delivers without reconcile slots.
    #[cfg(any(test, feature = "bench-internals"))]
    pub fn start() -> Self {
        Self::spawn(None)
    }

    /// Spawns the timer task on the current tokio runtime; every delivery waits for, and
    /// carries, a permit of `slots`.
    pub fn with_slots(slots: &ReconcileSlots) -> Self {
        Self::spawn(Some(slots.poller()))
    }

    fn spawn(slots: Option<PollSlots>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let lateness = Arc::new(Lateness::new(Instant::now()));
        let gauges = Arc::new(Gauges::default());
        let task = TimerTask {
            gauges: gauges.clone(),
            queue: DelayQueue::new(),
            actors: FastMap::default(),
            waiting: SlotQueue::default(),
            hold_back: HoldBack {
                lateness: lateness.clone(),
                timer: None,
            },
            slots,
        };
        // Unconstrained: see `TimerTask::poll_turn`.
        tokio::spawn(tokio::task::unconstrained(run(task, rx)));
        Self {
            tx,
            lateness,
            gauges,
        }
    }

    /// Whether the task slots: it ends only if it fails (a panic), or once every holder of
    /// these timers is gone. Holding the check keeps nothing alive.
    pub fn liveness(&self) -> impl Fn() -> bool + Send + Sync + 'static {
        let weak = self.tx.downgrade();
        move || weak.upgrade().is_some_and(|tx| !tx.is_closed())
    }

    /// A reader of what the task holds (for metrics).
    pub fn gauges(&self) -> TimerGauges {
        TimerGauges(self.gauges.clone())
    }

    /// A wake-up sent at `sent` (its [`ReconcileSlot::given_at`], or its deadline if it came
    /// without a slot) is running its reconcile now: tells the task whether the runtime is saturated
    /// (see [`Lateness`]). Time spent waiting for a reconcile slot does not count: that is the
    /// concurrency limit at work, not the workers falling behind.
    pub fn woke(&self, sent: Instant) {
        self.lateness.woke(sent, Instant::now());
    }

    /// Whether an activation may take a free reconcile slot without asking the task: no reconcile waits
    /// for a slot there, and activations are not held back because wake-ups run late (see
    /// [`Lateness`]). Otherwise a free slot is the next waiting reconcile's, or held back, and the
    /// activation waits for its turn ([`Timers::activation`]).
    pub fn activation_may_skip_queue(&self) -> bool {
        !self.lateness.reconciles_wait.load(Ordering::Relaxed)
            && !self.lateness.holding(Instant::now())
    }

    /// Deliver `msg` to `to` at `at`, replacing the actor's pending timer, if any.
    pub fn arm(&self, to: &ActorRef<M>, at: Instant, msg: M) {
        let _ = self.tx.send(Cmd::Arm {
            to: to.clone(),
            at,
            msg,
        });
    }

    /// Drop the actor's pending timer, if any (also when it stopped or failed). A delivery that
    /// is already due and waiting for a reconcile slot still arrives.
    pub fn cancel(&self, id: ActorId) {
        let _ = self.tx.send(Cmd::Cancel(id));
    }

    /// Deliver `msg` to `to` with a reconcile slot, as soon as one is free (in turn with due timers).
    pub fn queue(&self, to: &ActorRef<M>, msg: M) {
        let _ = self.tx.send(Cmd::Queue {
            to: to.clone(),
            msg,
        });
    }

    /// Call `give` with a reconcile slot for an activation, as soon as one is free and it is the
    /// activations' turn (see [`SlotQueue`]). Only with reconcile slots: without, or once they
    /// are closed, `give` is never called.
    pub fn activation(&self, give: GrantSlot) {
        let _ = self.tx.send(Cmd::Activation(give));
    }
}

/// One actor's pending timer.
struct Armed<M: Message> {
    to: ActorRef<M>,
    key: delay_queue::Key,
    msg: M,
}

/// The task's state: armed wake-ups by actor, and who waits for a reconcile slot.
struct TimerTask<M: Message> {
    queue: DelayQueue<ActorId>,
    actors: FastMap<ActorId, Armed<M>>,
    /// Due deliveries and activations waiting for a reconcile slot (only with `slots`).
    waiting: SlotQueue<(ActorRef<M>, M), GrantSlot>,
    hold_back: HoldBack,
    slots: Option<PollSlots>,
    gauges: Arc<Gauges>,
}

/// Wakes the task when activations stop being held back (see [`Lateness`]).
struct HoldBack {
    lateness: Arc<Lateness>,
    /// Wakes the task when the hold ends, while held activations wait and nothing else would.
    timer: Option<Pin<Box<Sleep>>>,
}

impl HoldBack {
    /// Make sure the task is woken when the hold ends (the timer is re-armed and registered
    /// only when that time changed).
    fn wake_when_over(&mut self, now: Instant, cx: &mut std::task::Context<'_>) {
        let Some(until) = self.lateness.held_until(now) else {
            return;
        };
        match &mut self.timer {
            Some(timer) if timer.deadline() == until => {}
            timer => {
                let timer = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(until)));
                timer.as_mut().reset(until);
                // Registers the waker: `until` is still ahead, so this is pending (and if the
                // clock passed it meanwhile, the task is woken and sees so on its next turn).
                let _ = timer.as_mut().poll(cx);
            }
        }
    }
}

impl<M: TimerMsg> TimerTask<M> {
    fn apply(&mut self, cmd: Cmd<M>, now: Instant) {
        match cmd {
            Cmd::Arm { to, at, msg } => {
                let id = to.get_id();
                if at <= now {
                    // Already due: deliver now, not at the timer wheel's next millisecond tick.
                    self.apply(Cmd::Cancel(id), now);
                    self.due(to, msg);
                    return;
                }
                match self.actors.get_mut(&id) {
                    Some(armed) => {
                        self.queue.reset_at(&armed.key, at);
                        armed.msg = msg;
                    }
                    None => {
                        let key = self.queue.insert_at(id, at);
                        self.actors.insert(id, Armed { to, key, msg });
                    }
                }
            }
            Cmd::Cancel(id) => {
                if let Some(armed) = self.actors.remove(&id) {
                    self.queue.remove(&armed.key);
                }
            }
            Cmd::Queue { to, msg } => self.due(to, msg),
            Cmd::Activation(give) => {
                if self.slots.is_some() {
                    self.waiting.push_activation(give);
                }
            }
        }
    }

    fn expired(&mut self, id: ActorId) {
        if let Some(armed) = self.actors.remove(&id) {
            self.due(armed.to, armed.msg);
        }
    }

    fn update_gauges(&self) {
        let g = &self.gauges;
        g.armed.store(self.actors.len() as u64, Ordering::Relaxed);
        g.waiting
            .store(self.waiting.len() as u64, Ordering::Relaxed);
    }

    /// Deliver now, or queue for a reconcile slot.
    fn due(&mut self, to: ActorRef<M>, msg: M) {
        if self.slots.is_some() {
            self.waiting.push_reconcile((to, msg));
        } else {
            let _ = to.cast(msg);
        }
    }

    /// Give `slot` to the next waiting activation if `activation` (its turn), else to the next
    /// waiting reconcile, stamped with `now`: the time the task read at the start of this round (no
    /// clock read per delivery; a round's deliveries take microseconds, and a delivery the task
    /// itself was slow to make counts as late, which it is).
    fn give(&mut self, slot: ReconcilePermit, activation: bool, now: Instant) {
        match self.waiting.next(activation) {
            Some(Next::Activation(give)) => give(slot),
            Some(Next::Reconcile((to, mut msg))) => {
                msg.give_slot(ReconcileSlot {
                    permit: slot,
                    given_at: now,
                });
                let _ = to.cast(msg);
            }
            None => {}
        }
    }

    /// One turn of the task: takes commands, collects expiries and hands out reconcile slots until
    /// none of them can progress (`Pending`, wakers registered) or [`TURN`] items were handled
    /// (`Ready(false)`: the caller yields). `Ready(true)` once every handle is dropped.
    ///
    /// The task runs outside tokio's cooperative budget (`unconstrained`, see
    /// [`Timers::spawn`]): every resource actor's wake-up passes through this one task, and
    /// with the budget it was preempted every 128 operations and queued behind the very actors
    /// waiting for their wake-ups, which then ran late. It yields on its own instead, after
    /// [`TURN`] items.
    fn poll_turn(
        &mut self,
        cx: &mut std::task::Context<'_>,
        rx: &mut mpsc::UnboundedReceiver<Cmd<M>>,
    ) -> Poll<bool> {
        let mut left = TURN;
        loop {
            let before = left;
            let now = Instant::now();
            while left > 0 {
                match rx.poll_recv(cx) {
                    Poll::Ready(Some(cmd)) => self.apply(cmd, now),
                    Poll::Ready(None) => return Poll::Ready(true),
                    Poll::Pending => break,
                }
                left -= 1;
            }
            while left > 0 && !self.queue.is_empty() {
                match self.queue.poll_expired(cx) {
                    Poll::Ready(Some(expired)) => self.expired(expired.into_inner()),
                    _ => break,
                }
                left -= 1;
            }
            while left > 0 && self.slots.is_some() {
                let held = self.hold_back.lateness.holding(now);
                let activation = self.waiting.activation_turn(held);
                if !activation && !self.waiting.reconciles_wait() {
                    if self.waiting.activations_wait() {
                        self.hold_back.wake_when_over(now, cx);
                    }
                    break;
                }
                let Some(slots) = &mut self.slots else { break };
                match slots.poll_acquire(cx) {
                    Poll::Ready(Some(slot)) => self.give(slot, activation, now),
                    // Closed: the runtime is shutting down and no reconcile may start.
                    Poll::Ready(None) => {
                        self.waiting.clear();
                    }
                    Poll::Pending => break,
                }
                left -= 1;
            }
            let waiting = self.waiting.reconciles_wait();
            if waiting
                != self
                    .hold_back
                    .lateness
                    .reconciles_wait
                    .load(Ordering::Relaxed)
            {
                self.hold_back
                    .lateness
                    .reconciles_wait
                    .store(waiting, Ordering::Relaxed);
            }
            if left == 0 {
                self.update_gauges();
                return Poll::Ready(false);
            }
            if left == before {
                self.update_gauges();
                return Poll::Pending;
            }
        }
    }
}

/// Most commands, expiries or deliveries handled in one turn before the task yields to the
/// scheduler.
const TURN: usize = 1024;

/// `delay` as a wake-up the timers can hold: at most [`MAX_DURATION`] (a year; the timer
/// queue refuses deadlines past about two, and `now + delay` overflows for absurd values). A
/// delay reaches here from a provisioner's yield, a config object's poll interval or a lock's
/// time read from an object's status: input, never trusted to be small.
///
/// [`MAX_DURATION`]: crate::policy::MAX_DURATION
pub(crate) fn bounded_delay(delay: std::time::Duration) -> std::time::Duration {
    delay.min(crate::policy::MAX_DURATION)
}

/// The timer task.
async fn run<M: TimerMsg>(mut task: TimerTask<M>, mut rx: mpsc::UnboundedReceiver<Cmd<M>>) {
    while !poll_fn(|cx| task.poll_turn(cx, &mut rx)).await {
        tokio::task::yield_now().await;
    }
}

#[cfg(test)]
mod tests;
