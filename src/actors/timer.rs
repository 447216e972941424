//! Timers of the resource actors: one pending wake-up per resource (earliest wins), delivered by
//! one timer task per controller, which also hands out the run slots passes wait for.
//!
//! A resource actor re-arms its wake-up on every yield, so arming must be cheap: [`Timers`]
//! keeps every actor's timers in one tokio-util [`DelayQueue`] owned by one task, and arming is a
//! channel send to it. (A spawned `sleep` task per timer — what `ractor::time::send_after` does —
//! costs a task allocation and an abort on every re-arm, and a live task per idle actor.)
//!
//! A due wake-up needs a run slot (a permit of the runtime's `max_concurrent_runs` semaphore)
//! before its pass can start, so the task acquires one and delivers it with the wake-up; an
//! actor whose pass was triggered otherwise and found no free slot queues here too
//! ([`Timers::queue`]). No actor waits for a slot in its handler.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::Arc;
use std::task::Poll;

use ractor::{ActorId, ActorRef, Message};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::Instant;
use tokio_util::sync::PollSemaphore;
use tokio_util::time::{DelayQueue, delay_queue};

use super::FastMap;

/// The single pending wake-up of a resource actor: deadline and token bookkeeping only.
///
/// [`WakeSlot::schedule`] keeps whichever deadline is earlier; every (re)arm gets a new token,
/// so a timer message that fires after it was replaced or cancelled is recognised as stale by
/// [`WakeSlot::fire`]. Delivering the timer is the caller's job (the actor arms [`Timers`]).
#[derive(Debug, Default)]
pub struct WakeSlot {
    at: Option<Instant>,
    token: u64,
}

impl WakeSlot {
    /// Arm for `at` unless an earlier wake-up is pending. Returns the token the timer must
    /// deliver back, or `None` if the existing earlier timer stays.
    pub fn schedule(&mut self, at: Instant) -> Option<u64> {
        if self.at.is_some_and(|cur| cur <= at) {
            return None;
        }
        self.token += 1;
        self.at = Some(at);
        Some(self.token)
    }

    /// Drop the pending wake-up, if any: `true` if one was pending (its timer should be
    /// cancelled; if it fires anyway its token is stale).
    pub fn cancel(&mut self) -> bool {
        self.token += 1;
        self.at.take().is_some()
    }

    /// A timer with `token` fired: `true` if it is the pending one (which is then cleared).
    pub fn fire(&mut self, token: u64) -> bool {
        if self.at.is_some() && token == self.token {
            self.at = None;
            true
        } else {
            false
        }
    }

    /// When the pending timer fires, if one is pending.
    pub fn deadline(&self) -> Option<Instant> {
        self.at
    }
}

/// A message the timer task delivers. With run slots ([`Timers::with_run_slots`]) every delivery
/// carries the run slot the task acquired for it, so the receiving actor runs its pass at once
/// instead of waiting for a slot inside its handler.
pub trait TimerMsg: Message {
    /// Attach the run slot acquired for this delivery.
    fn give_slot(&mut self, slot: OwnedSemaphorePermit);
}

/// Tests deliver plain numbers; the slot is released at once.
impl TimerMsg for u32 {
    fn give_slot(&mut self, _: OwnedSemaphorePermit) {}
}

/// Benchmarks deliver plain numbers; the slot is released at once.
impl TimerMsg for u64 {
    fn give_slot(&mut self, _: OwnedSemaphorePermit) {}
}

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
    /// Hand a run slot to a new actor's first pass (the manager's activation queue).
    Activation(Activation),
}

/// What receives a run slot for an activation.
pub type Activation = Box<dyn FnOnce(OwnedSemaphorePermit) + Send>;

/// When passes of live actors and activations both wait for run slots, one slot in this many
/// goes to an activation. Live actors come first so that objects already in progress finish
/// before many more start (each live actor costs ≈ 8 KiB, and at 10k new objects that memory
/// was most of the time); activations still get a bounded share, so new objects never starve
/// behind objects that yield forever.
pub const ACTIVATION_EVERY: u32 = 4;

/// Handle to a timer task that delivers messages to actors at deadlines; one pending timer per
/// actor (arming again replaces it). The task ends when every handle is dropped.
///
/// With run slots, the task is also where passes wait for a slot: due deliveries and
/// [`Timers::queue`]d ones wait in one first-in-first-out queue, and each is delivered with a
/// slot. An actor so never waits for a slot inside its handler (where it could not take other
/// messages, and where every wait cost it a second poll and a place in the semaphore's waiter
/// list: most passes of a busy runtime wait for a slot).
pub struct Timers<M: Message> {
    tx: mpsc::UnboundedSender<Cmd<M>>,
}

impl<M: TimerMsg> Timers<M> {
    /// Spawns the timer task on the current tokio runtime; it delivers without run slots.
    pub fn start() -> Self {
        Self::spawn(None)
    }

    /// Spawns the timer task on the current tokio runtime; every delivery waits for, and
    /// carries, a permit of `slots`.
    pub fn with_run_slots(slots: Arc<Semaphore>) -> Self {
        Self::spawn(Some(PollSemaphore::new(slots)))
    }

    fn spawn(slots: Option<PollSemaphore>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let wheel = Wheel {
            queue: DelayQueue::new(),
            actors: FastMap::default(),
            ready: VecDeque::new(),
            activations: VecDeque::new(),
            since_activation: 0,
            slots,
        };
        // Unconstrained: see `Wheel::poll_turn`.
        tokio::spawn(tokio::task::unconstrained(run(wheel, rx)));
        Self { tx }
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
    /// activations' turn (see [`ACTIVATION_EVERY`]). Only with run slots: without, or once they
    /// are closed, `give` is never called.
    pub fn activation(&self, give: Activation) {
        let _ = self.tx.send(Cmd::Activation(give));
    }
}

/// One actor's pending timer.
struct Armed<M: Message> {
    to: ActorRef<M>,
    key: delay_queue::Key,
    msg: M,
}

struct Wheel<M: Message> {
    queue: DelayQueue<ActorId>,
    actors: FastMap<ActorId, Armed<M>>,
    /// Due deliveries waiting for a run slot, oldest first (only with `slots`).
    ready: VecDeque<(ActorRef<M>, M)>,
    /// Activations waiting for a run slot, oldest first (only with `slots`).
    activations: VecDeque<Activation>,
    /// Slots given to `ready` since the last activation got one.
    since_activation: u32,
    slots: Option<PollSemaphore>,
}

impl<M: TimerMsg> Wheel<M> {
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
                    self.activations.push_back(give);
                }
            }
        }
    }

    fn expired(&mut self, id: ActorId) {
        if let Some(armed) = self.actors.remove(&id) {
            self.due(armed.to, armed.msg);
        }
    }

    /// Deliver now, or queue for a run slot.
    fn due(&mut self, to: ActorRef<M>, msg: M) {
        if self.slots.is_some() {
            self.ready.push_back((to, msg));
        } else {
            let _ = to.cast(msg);
        }
    }

    /// Give `slot` to the next waiting pass or activation (see [`ACTIVATION_EVERY`]).
    fn give(&mut self, slot: OwnedSemaphorePermit) {
        let activation_turn =
            self.ready.is_empty() || self.since_activation + 1 >= ACTIVATION_EVERY;
        if activation_turn && let Some(give) = self.activations.pop_front() {
            self.since_activation = 0;
            give(slot);
        } else if let Some((to, mut msg)) = self.ready.pop_front() {
            self.since_activation += 1;
            msg.give_slot(slot);
            let _ = to.cast(msg);
        }
    }

    /// One turn of the task: takes commands, collects expiries and hands out run slots until
    /// none of them can progress (`Pending`, wakers registered) or [`TURN`] items were handled
    /// (`Ready(false)`: the caller yields). `Ready(true)` once every handle is dropped.
    ///
    /// The task runs outside tokio's cooperative budget (`unconstrained`, see
    /// [`Timers::spawn`]): every resource actor's wake-up passes through this one task, and
    /// with the budget it was preempted every 128 operations and queued behind the very actors
    /// waiting for their wake-ups (yield: wake-ups 3–5 ms late at 1 ms delays, and 20–30 %
    /// longer runs). It yields on its own instead, after [`TURN`] items.
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
            while left > 0 && !(self.ready.is_empty() && self.activations.is_empty()) {
                let Some(slots) = &mut self.slots else { break };
                match slots.poll_acquire(cx) {
                    Poll::Ready(Some(slot)) => self.give(slot),
                    // Closed: the runtime is shutting down and no pass may start.
                    Poll::Ready(None) => {
                        self.ready.clear();
                        self.activations.clear();
                    }
                    Poll::Pending => break,
                }
                left -= 1;
            }
            if left == 0 {
                return Poll::Ready(false);
            }
            if left == before {
                return Poll::Pending;
            }
        }
    }
}

/// Most commands, expiries or deliveries handled in one turn before the task yields to the
/// scheduler.
const TURN: usize = 1024;

/// The timer task.
async fn run<M: TimerMsg>(mut wheel: Wheel<M>, mut rx: mpsc::UnboundedReceiver<Cmd<M>>) {
    while !poll_fn(|cx| wheel.poll_turn(cx, &mut rx)).await {
        tokio::task::yield_now().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ractor::{Actor, ActorProcessingErr};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    #[test]
    fn earliest_wins_and_later_requests_are_ignored() {
        let mut slot = WakeSlot::default();
        let now = Instant::now();
        let t1 = slot.schedule(now + Duration::from_secs(10)).unwrap();
        // a later deadline does not replace the earlier one
        assert!(slot.schedule(now + Duration::from_secs(20)).is_none());
        // an earlier one does, and the replaced token is stale
        let t2 = slot.schedule(now + Duration::from_secs(1)).unwrap();
        assert_eq!(slot.deadline(), Some(now + Duration::from_secs(1)));
        assert!(!slot.fire(t1), "a replaced token is stale");
        assert!(slot.fire(t2));
        assert!(!slot.fire(t2), "a token fires once");
        assert_eq!(slot.deadline(), None);
    }

    #[test]
    fn cancel_stales_the_token() {
        let mut slot = WakeSlot::default();
        let t = slot.schedule(Instant::now()).unwrap();
        assert!(slot.cancel());
        assert!(!slot.cancel(), "nothing pending any more");
        assert!(!slot.fire(t));
        assert_eq!(slot.deadline(), None);
    }

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
    struct Slotted(u32, Option<OwnedSemaphorePermit>);

    impl TimerMsg for Slotted {
        fn give_slot(&mut self, slot: OwnedSemaphorePermit) {
            self.1 = Some(slot);
        }
    }

    type SlotLog = Log<Slotted>;

    /// Due deliveries and queued ones wait for a run slot in one first-in-first-out queue, and
    /// each arrives with its slot; a cancelled timer takes none.
    #[tokio::test(start_paused = true)]
    async fn deliveries_wait_for_a_run_slot_in_order_and_carry_it() {
        let slots = Arc::new(Semaphore::new(1));
        let timers = Timers::with_run_slots(slots.clone());
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

    /// Passes of live actors come first, but every [`ACTIVATION_EVERY`]th slot goes to a waiting
    /// activation, and activations get every slot once no pass waits.
    #[tokio::test(start_paused = true)]
    async fn activations_get_a_bounded_share_of_the_slots() {
        assert_eq!(ACTIVATION_EVERY, 4, "the expected order below assumes 4");
        let slots = Arc::new(Semaphore::new(1));
        let timers = Timers::with_run_slots(slots.clone());
        let log = SlotLog::default();
        let held = slots.clone().acquire_owned().await.unwrap();
        let mut actors = Vec::new();
        for n in 1..=6 {
            let (a, _) = Actor::spawn(None, Recorder(log.clone()), ()).await.unwrap();
            timers.queue(&a, Slotted(n, None));
            actors.push(a);
        }
        for n in [101, 102, 103] {
            let log = log.clone();
            timers.activation(Box::new(move |slot| {
                log.lock()
                    .unwrap()
                    .push((Slotted(n, Some(slot)), Instant::now()));
            }));
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

    fn order(log: &[(Slotted, Instant)]) -> Vec<u32> {
        log.iter().map(|(Slotted(n, _), _)| *n).collect()
    }

    /// Once the run slots are closed (shutdown), nothing waiting is delivered and the task still
    /// takes commands and ends with its handles.
    #[tokio::test(start_paused = true)]
    async fn closed_run_slots_deliver_nothing() {
        let slots = Arc::new(Semaphore::new(0));
        let timers = Timers::with_run_slots(slots.clone());
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
