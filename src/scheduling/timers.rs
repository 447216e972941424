//! The timer task: delivers every resource actor's wake-up at its deadline (one pending per
//! actor, arming again replaces it) and hands out run slots with the deliveries.
//!
//! A resource actor re-arms its wake-up on every yield, so arming must be cheap: [`Timers`]
//! keeps every actor's timers in one tokio-util [`DelayQueue`] owned by one task, and arming is a
//! channel send to it. (A spawned `sleep` task per timer, what `ractor::time::send_after` does,
//! costs a task allocation and an abort on every re-arm, and a live task per idle actor.)
//!
//! A due wake-up needs a run slot before its reconcile can start, so the task acquires one and
//! delivers it with the wake-up; an actor whose reconcile was triggered otherwise and found no free
//! slot queues here too ([`Timers::queue`]), and so do activations ([`Timers::activation`]). Who
//! gets the next slot is decided by [`RunSlotQueue`] and [`Lateness`] (`slots.rs`). No actor
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

use super::slots::{Lateness, Next, PollRunSlots, RunSlotQueue, RunSlots};
use crate::hash::FastMap;
use crate::messages::{RunPermit, RunSlot, TimerMsg};

enum Cmd<M: Message> {
    Arm {
        to: ActorRef<M>,
        at: Instant,
        msg: M,
    },
    Cancel(ActorId),
    /// Deliver as soon as a run slot is free (no deadline).
    Queue {
        to: ActorRef<M>,
        msg: M,
    },
    /// Hand a run slot to a new actor's first reconcile (the manager's activation queue).
    Activation(GrantSlot),
}

/// What receives a run slot for an activation (the manager's callback).
pub type GrantSlot = Box<dyn FnOnce(RunPermit) + Send>;

/// Handle to a timer task that delivers messages to actors at deadlines; one pending timer per
/// actor (arming again replaces it). The task ends when every handle is dropped.
///
/// With run slots, the task is also where reconciles wait for a slot: due deliveries and
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

    /// Due reconciles and activations waiting for a run slot.
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
    /// Spawns the timer task on the current tokio runtime; it delivers without run slots.
    #[cfg(any(test, feature = "bench-internals"))]
    pub fn start() -> Self {
        Self::spawn(None)
    }

    /// Spawns the timer task on the current tokio runtime; every delivery waits for, and
    /// carries, a permit of `slots`.
    pub fn with_run_slots(slots: &RunSlots) -> Self {
        Self::spawn(Some(slots.poller()))
    }

    fn spawn(slots: Option<PollRunSlots>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let lateness = Arc::new(Lateness::new(Instant::now()));
        let gauges = Arc::new(Gauges::default());
        let task = TimerTask {
            gauges: gauges.clone(),
            queue: DelayQueue::new(),
            actors: FastMap::default(),
            waiting: RunSlotQueue::default(),
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

    /// Whether the task runs: it ends only if it fails (a panic), or once every holder of
    /// these timers is gone. Holding the check keeps nothing alive.
    pub fn liveness(&self) -> impl Fn() -> bool + Send + Sync + 'static {
        let weak = self.tx.downgrade();
        move || weak.upgrade().is_some_and(|tx| !tx.is_closed())
    }

    /// A reader of what the task holds (for metrics).
    pub fn gauges(&self) -> TimerGauges {
        TimerGauges(self.gauges.clone())
    }

    /// A wake-up sent at `sent` (its [`RunSlot::given_at`], or its deadline if it came
    /// without a slot) is running its reconcile now: tells the task whether the runtime is saturated
    /// (see [`Lateness`]). Time spent waiting for a run slot does not count: that is the
    /// concurrency limit at work, not the workers falling behind.
    pub fn woke(&self, sent: Instant) {
        self.lateness.woke(sent, Instant::now());
    }

    /// Whether an activation may take a free run slot without asking the task: no reconcile waits
    /// for a slot there, and activations are not held back because wake-ups run late (see
    /// [`Lateness`]). Otherwise a free slot is the next waiting reconcile's, or held back, and the
    /// activation waits for its turn ([`Timers::activation`]).
    pub fn activation_may_skip_queue(&self) -> bool {
        !self.lateness.passes_wait.load(Ordering::Relaxed) && !self.lateness.holding(Instant::now())
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
    /// is already due and waiting for a run slot still arrives.
    pub fn cancel(&self, id: ActorId) {
        let _ = self.tx.send(Cmd::Cancel(id));
    }

    /// Deliver `msg` to `to` with a run slot, as soon as one is free (in turn with due timers).
    pub fn queue(&self, to: &ActorRef<M>, msg: M) {
        let _ = self.tx.send(Cmd::Queue {
            to: to.clone(),
            msg,
        });
    }

    /// Call `give` with a run slot for an activation, as soon as one is free and it is the
    /// activations' turn (see [`RunSlotQueue`]). Only with run slots: without, or once they
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

/// The task's state: armed wake-ups by actor, and who waits for a run slot.
struct TimerTask<M: Message> {
    queue: DelayQueue<ActorId>,
    actors: FastMap<ActorId, Armed<M>>,
    /// Due deliveries and activations waiting for a run slot (only with `slots`).
    waiting: RunSlotQueue<(ActorRef<M>, M), GrantSlot>,
    hold_back: HoldBack,
    slots: Option<PollRunSlots>,
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

    /// Deliver now, or queue for a run slot.
    fn due(&mut self, to: ActorRef<M>, msg: M) {
        if self.slots.is_some() {
            self.waiting.push_pass((to, msg));
        } else {
            let _ = to.cast(msg);
        }
    }

    /// Give `slot` to the next waiting activation if `activation` (its turn), else to the next
    /// waiting reconcile, stamped with `now`: the time the task read at the start of this round (no
    /// clock read per delivery; a round's deliveries take microseconds, and a delivery the task
    /// itself was slow to make counts as late, which it is).
    fn give(&mut self, slot: RunPermit, activation: bool, now: Instant) {
        match self.waiting.next(activation) {
            Some(Next::Activation(give)) => give(slot),
            Some(Next::Pass((to, mut msg))) => {
                msg.give_slot(RunSlot {
                    permit: slot,
                    given_at: now,
                });
                let _ = to.cast(msg);
            }
            None => {}
        }
    }

    /// One turn of the task: takes commands, collects expiries and hands out run slots until
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
                if !activation && !self.waiting.passes_wait() {
                    if self.waiting.activations_wait() {
                        self.hold_back.wake_when_over(now, cx);
                    }
                    break;
                }
                let Some(slots) = &mut self.slots else { break };
                match slots.poll_acquire(cx) {
                    Poll::Ready(Some(slot)) => self.give(slot, activation, now),
                    // Closed: the runtime is shutting down and no pass may start.
                    Poll::Ready(None) => {
                        self.waiting.clear();
                    }
                    Poll::Pending => break,
                }
                left -= 1;
            }
            let waiting = self.waiting.passes_wait();
            if waiting != self.hold_back.lateness.passes_wait.load(Ordering::Relaxed) {
                self.hold_back
                    .lateness
                    .passes_wait
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
mod tests {
    use super::super::slots::{ACTIVATION_EVERY, HELD_ACTIVATION_EVERY, HELD_FOR};
    use super::*;
    use ractor::{Actor, ActorProcessingErr};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;
    use tokio::sync::Semaphore;

    /// What a [`Recorder`] received, each with the (virtual) time it arrived.
    type Log<M> = Arc<Mutex<Vec<(M, Instant)>>>;

    /// Records what it receives (a delivery's run slot included, so a test decides when slots
    /// are released).
    struct Recorder<M>(Log<M>);

    impl<M: TimerMsg> Actor for Recorder<M> {
        type Msg = M;
        type State = ();
        type Arguments = ();
        async fn pre_start(&self, _: ActorRef<M>, _: ()) -> Result<(), ActorProcessingErr> {
            Ok(())
        }
        async fn handle(
            &self,
            _: ActorRef<M>,
            msg: M,
            _: &mut (),
        ) -> Result<(), ActorProcessingErr> {
            self.0.lock().unwrap().push((msg, Instant::now()));
            Ok(())
        }
    }

    async fn recorder() -> (ActorRef<u32>, Log<u32>) {
        let log = Arc::new(Mutex::new(Vec::new()));
        let (a, _) = Actor::spawn(None, Recorder(log.clone()), ()).await.unwrap();
        (a, log)
    }

    #[tokio::test(start_paused = true)]
    async fn a_timer_task_that_dies_is_seen_dead() {
        let timers = Timers::start();
        let alive = timers.liveness();
        assert!(alive());
        let (a, _log) = recorder().await;
        // Past the queue's range (about two years; the runtime bounds its wake-ups to one):
        // the task panics.
        timers.arm(
            &a,
            Instant::now() + Duration::from_secs(3 * 365 * 24 * 3600),
            1,
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!alive(), "the dead task is seen");
        drop(timers);
    }

    #[tokio::test(start_paused = true)]
    async fn delivers_at_the_deadline_and_rearming_replaces() {
        let timers = Timers::start();
        let (a, log) = recorder().await;
        let (b, log_b) = recorder().await;
        let t0 = Instant::now();
        timers.arm(&a, t0 + Duration::from_secs(5), 1);
        // re-arming replaces the first one (message and deadline), earlier or later
        timers.arm(&a, t0 + Duration::from_secs(3), 2);
        timers.arm(&a, t0 + Duration::from_secs(7), 3);
        timers.arm(&b, t0 + Duration::from_secs(1), 4);
        tokio::time::sleep(Duration::from_secs(10)).await;
        let got: Vec<(u32, u64)> = log
            .lock()
            .unwrap()
            .iter()
            .map(|(m, at)| (*m, (*at - t0).as_secs()))
            .collect();
        assert_eq!(got, vec![(3, 7)]);
        assert_eq!(
            *log_b.lock().unwrap(),
            vec![(4, t0 + Duration::from_secs(1))]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_due_timer_is_delivered_at_once_and_replaces_the_pending_one() {
        let timers = Timers::start();
        let (a, log) = recorder().await;
        let t0 = Instant::now();
        timers.arm(&a, t0 + Duration::from_secs(5), 1);
        timers.arm(&a, t0, 2);
        // no time passes: the due one arrives without the clock moving
        for _ in 0..100 {
            if !log.lock().unwrap().is_empty() {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(*log.lock().unwrap(), vec![(2, t0)]);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(
            log.lock().unwrap().len(),
            1,
            "the replaced timer never fires"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn cancel_drops_the_pending_timer_and_only_that_actors() {
        let timers = Timers::start();
        let (a, log) = recorder().await;
        let (b, log_b) = recorder().await;
        let t0 = Instant::now();
        timers.arm(&a, t0 + Duration::from_secs(1), 1);
        timers.arm(&b, t0 + Duration::from_secs(2), 2);
        timers.cancel(a.get_id());
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(log.lock().unwrap().is_empty());
        assert_eq!(log_b.lock().unwrap().len(), 1);
        // armed again after a cancel: delivered
        timers.arm(&a, Instant::now() + Duration::from_secs(1), 5);
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(
            log.lock().unwrap().iter().map(|e| e.0).collect::<Vec<_>>(),
            vec![5]
        );
    }

    /// A delivery that carries the run slot it was given (held until the actor drops it).
    #[derive(Debug)]
    struct Slotted(u32, Option<RunSlot>);

    impl TimerMsg for Slotted {
        fn give_slot(&mut self, slot: RunSlot) {
            self.1 = Some(slot);
        }
    }

    type SlotLog = Log<Slotted>;

    /// Ask the task for an activation slot; when given, log it as delivery `n`.
    fn log_activation(timers: &Timers<Slotted>, log: &SlotLog, n: u32) {
        let log = log.clone();
        timers.activation(Box::new(move |permit| {
            let slot = RunSlot {
                permit,
                given_at: Instant::now(),
            };
            log.lock()
                .unwrap()
                .push((Slotted(n, Some(slot)), Instant::now()));
        }));
    }

    /// Due deliveries and queued ones wait for a run slot in one first-in-first-out queue, and
    /// each arrives with its slot; a cancelled timer takes none.
    #[tokio::test(start_paused = true)]
    async fn deliveries_wait_for_a_run_slot_in_order_and_carry_it() {
        let slots = Arc::new(Semaphore::new(1));
        let timers = Timers::with_run_slots(&RunSlots::new(slots.clone(), None));
        let log = SlotLog::default();
        let (a, _) = Actor::spawn(None, Recorder(log.clone()), ()).await.unwrap();
        let (b, _) = Actor::spawn(None, Recorder(log.clone()), ()).await.unwrap();
        let (c, _) = Actor::spawn(None, Recorder(log.clone()), ()).await.unwrap();
        let t0 = Instant::now();
        let held = slots.clone().acquire_owned().await.unwrap();
        timers.queue(&b, Slotted(1, None));
        timers.arm(&a, t0 + Duration::from_secs(1), Slotted(2, None));
        timers.arm(&c, t0 + Duration::from_secs(1), Slotted(3, None));
        timers.cancel(c.get_id());
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(log.lock().unwrap().is_empty(), "no slot, no delivery");

        drop(held);
        tokio::time::sleep(Duration::from_millis(10)).await;
        let first = {
            let mut got = log.lock().unwrap();
            assert_eq!(got.len(), 1, "one slot, one delivery");
            assert_eq!(got[0].0.0, 1, "queued first, delivered first");
            assert!(got[0].0.1.is_some(), "the delivery carries its slot");
            assert_eq!(slots.available_permits(), 0);
            got[0].0.1.take()
        };
        drop(first);
        tokio::time::sleep(Duration::from_millis(10)).await;
        {
            let mut got = log.lock().unwrap();
            let seen: Vec<u32> = order(&got);
            assert_eq!(seen, vec![1, 2], "the cancelled timer is not delivered");
            assert!(got[1].1 >= t0 + Duration::from_secs(2));
            got[1].0.1.take();
        }
        assert_eq!(slots.available_permits(), 1, "no slot is left behind");
        // Idle again: a slot released while nothing waits stays free for others.
        let again = slots.clone().try_acquire_owned();
        assert!(again.is_ok());
    }

    /// Reconciles of live actors come first, but every [`ACTIVATION_EVERY`]th slot goes to a waiting
    /// activation, and activations get every slot once no reconcile waits.
    #[tokio::test(start_paused = true)]
    async fn activations_get_a_bounded_share_of_the_slots() {
        assert_eq!(ACTIVATION_EVERY, 4, "the expected order below assumes 4");
        let slots = Arc::new(Semaphore::new(1));
        let timers = Timers::with_run_slots(&RunSlots::new(slots.clone(), None));
        let log = SlotLog::default();
        let held = slots.clone().acquire_owned().await.unwrap();
        let mut actors = Vec::new();
        for n in 1..=6 {
            let (a, _) = Actor::spawn(None, Recorder(log.clone()), ()).await.unwrap();
            timers.queue(&a, Slotted(n, None));
            actors.push(a);
        }
        for n in [101, 102, 103] {
            log_activation(&timers, &log, n);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        drop(held);
        // Each holder releases its slot once it has it: the slot goes round one at a time.
        for given in 1..=9 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let mut got = log.lock().unwrap();
            assert_eq!(
                got.len(),
                given,
                "one slot, one at a time: {:?}",
                order(&got)
            );
            let slot = got[given - 1].0.1.take();
            assert!(slot.is_some(), "every delivery carries its slot");
        }
        let got: Vec<u32> = order(&log.lock().unwrap());
        assert_eq!(got, vec![1, 2, 3, 101, 4, 5, 6, 102, 103]);
        assert_eq!(slots.available_permits(), 1);
    }

    /// While reconciles report that they run late ([`SATURATED_LATENESS`](super::run_slots::SATURATED_LATENESS)), activations may not take
    /// free slots directly and get one slot in [`HELD_ACTIVATION_EVERY`]; once no late reconcile has
    /// been reported for [`HELD_FOR`], they get free slots again.
    #[tokio::test(start_paused = true)]
    async fn activations_are_held_back_while_passes_run_late() {
        assert_eq!(
            HELD_ACTIVATION_EVERY, 32,
            "the expected order below assumes 32"
        );
        let slots = Arc::new(Semaphore::new(1));
        let timers = Timers::with_run_slots(&RunSlots::new(slots.clone(), None));
        assert!(timers.activation_may_skip_queue());
        let run_late = || {
            for _ in 0..8 {
                timers.woke(Instant::now() - Duration::from_millis(50));
            }
        };
        run_late();
        assert!(!timers.activation_may_skip_queue(), "held back");
        let log = SlotLog::default();
        let held = slots.clone().acquire_owned().await.unwrap();
        for n in 1..=40 {
            let (a, _) = Actor::spawn(None, Recorder(log.clone()), ()).await.unwrap();
            timers.queue(&a, Slotted(n, None));
        }
        for n in [101, 102] {
            log_activation(&timers, &log, n);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
        drop(held);
        // The slot goes round one at a time while passes keep running late.
        for given in 1..=41 {
            run_late();
            tokio::time::sleep(Duration::from_millis(1)).await;
            let mut got = log.lock().unwrap();
            assert_eq!(got.len(), given, "{:?}", order(&got));
            got[given - 1].0.1.take();
        }
        let expected: Vec<u32> = (1..=31).chain([101]).chain(32..=40).collect();
        assert_eq!(order(&log.lock().unwrap()), expected);
        // No pass waits, but activations are still held back until no late pass was reported
        // for a while.
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(log.lock().unwrap().len(), 41, "still held back");
        tokio::time::sleep(HELD_FOR).await;
        assert_eq!(order(&log.lock().unwrap()).last(), Some(&102));
        assert!(timers.activation_may_skip_queue());
    }

    fn order(log: &[(Slotted, Instant)]) -> Vec<u32> {
        log.iter().map(|(Slotted(n, _), _)| *n).collect()
    }

    /// Once the run slots are closed (shutdown), nothing waiting is delivered and the task still
    /// takes commands and ends with its handles.
    #[tokio::test(start_paused = true)]
    async fn closed_run_slots_deliver_nothing() {
        let slots = Arc::new(Semaphore::new(0));
        let timers = Timers::with_run_slots(&RunSlots::new(slots.clone(), None));
        let log = SlotLog::default();
        let (a, _) = Actor::spawn(None, Recorder(log.clone()), ()).await.unwrap();
        timers.queue(&a, Slotted(1, None));
        tokio::time::sleep(Duration::from_millis(10)).await;
        slots.close();
        timers.arm(
            &a,
            Instant::now() + Duration::from_secs(1),
            Slotted(2, None),
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(log.lock().unwrap().is_empty());
        assert!(!timers.tx.is_closed(), "the task is still running");
        drop(timers);
    }

    /// More wake-ups due at the same moment than one turn of the task handles: all arrive, at
    /// their deadline, and the task still takes commands (it yields between turns).
    #[tokio::test(start_paused = true)]
    async fn more_due_wake_ups_than_one_turn_all_arrive_on_time() {
        let timers = Timers::start();
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut actors = Vec::new();
        for _ in 0..(2 * TURN + 100) {
            let (a, _) = Actor::spawn(None, Recorder(log.clone()), ()).await.unwrap();
            actors.push(a);
        }
        let t0 = Instant::now();
        for (i, a) in actors.iter().enumerate() {
            timers.arm(a, t0 + Duration::from_secs(1), i as u32);
        }
        let (late, late_log) = recorder().await;
        timers.arm(&late, t0 + Duration::from_secs(2), 7);
        tokio::time::sleep(Duration::from_secs(3)).await;
        let got = log.lock().unwrap();
        assert_eq!(got.len(), actors.len());
        assert!(got.iter().all(|(_, at)| *at == t0 + Duration::from_secs(1)));
        let mut ids: Vec<u32> = got.iter().map(|e| e.0).collect();
        ids.sort();
        assert_eq!(ids, (0..actors.len() as u32).collect::<Vec<_>>());
        assert_eq!(
            *late_log.lock().unwrap(),
            vec![(7, t0 + Duration::from_secs(2))]
        );
    }
}
