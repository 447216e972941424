//! Timers of the resource actors: one pending wake-up per resource (earliest wins), delivered by
//! one timer task per controller.
//!
//! A resource actor re-arms its wake-up on every yield, so arming must be cheap: [`Timers`] keeps every actor's timers in one tokio-util
//! [`DelayQueue`] owned by one task, and arming is a channel send to it. (A spawned `sleep` task
//! per timer — what `ractor::time::send_after` does — costs a task allocation and an abort on
//! every re-arm, and a live task per idle actor.)

use std::future::poll_fn;

use futures::FutureExt;

use ractor::{ActorId, ActorRef, Message};
use tokio::sync::mpsc;
use tokio::time::Instant;
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

enum Cmd<M: Message> {
    Arm {
        to: ActorRef<M>,
        at: Instant,
        msg: M,
    },
    Cancel(ActorId),
}

/// Handle to a timer task that delivers messages to actors at deadlines; one pending timer per
/// actor (arming again replaces it). The task ends when every handle is dropped.
pub struct Timers<M: Message> {
    tx: mpsc::UnboundedSender<Cmd<M>>,
}

impl<M: Message> Timers<M> {
    /// Spawns the timer task on the current tokio runtime.
    pub fn start() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        // Unconstrained: see `run`.
        tokio::spawn(tokio::task::unconstrained(run(rx)));
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

    /// Drop the actor's pending timer, if any (also when it stopped or failed).
    pub fn cancel(&self, id: ActorId) {
        let _ = self.tx.send(Cmd::Cancel(id));
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
}

impl<M: Message> Wheel<M> {
    fn apply(&mut self, cmd: Cmd<M>) {
        match cmd {
            Cmd::Arm { to, at, msg } => {
                let id = to.get_id();
                if at <= Instant::now() {
                    // Already due: deliver now, not at the timer wheel's next millisecond tick.
                    self.apply(Cmd::Cancel(id));
                    let _ = to.cast(msg);
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
        }
    }

    fn expired(&mut self, id: ActorId) {
        if let Some(armed) = self.actors.remove(&id) {
            let _ = armed.to.cast(armed.msg);
        }
    }
}

/// Most commands or expiries handled in one turn before the task yields to the scheduler.
const TURN: usize = 1024;

/// The timer task. It runs outside tokio's cooperative budget (`unconstrained`, see
/// [`Timers::start`]): every resource actor's wake-up passes through this one task, and with the
/// budget it was preempted every 128 operations and queued behind the very actors waiting for
/// their wake-ups (yield: wake-ups 3–5 ms late at 1 ms delays, and 20–30 % longer runs). It
/// yields on its own instead, after [`TURN`] items.
async fn run<M: Message>(mut rx: mpsc::UnboundedReceiver<Cmd<M>>) {
    let mut wheel = Wheel {
        queue: DelayQueue::new(),
        actors: FastMap::default(),
    };
    loop {
        let full_turn = tokio::select! {
            cmd = rx.recv() => match cmd {
                Some(cmd) => {
                    wheel.apply(cmd);
                    // Take what else is queued before looking at the clock again.
                    let mut n = 1;
                    while n < TURN && let Ok(cmd) = rx.try_recv() {
                        wheel.apply(cmd);
                        n += 1;
                    }
                    n == TURN
                }
                None => return,
            },
            Some(expired) = poll_fn(|cx| wheel.queue.poll_expired(cx)), if !wheel.queue.is_empty() => {
                wheel.expired(expired.into_inner());
                // Deliver everything else that is due in this turn, not one per turn of the
                // select. (`now_or_never` polls with a no-op waker; the select polls the queue
                // with the task's own waker again before the task sleeps.)
                let mut n = 1;
                while n < TURN
                    && let Some(Some(expired)) =
                        poll_fn(|cx| wheel.queue.poll_expired(cx)).now_or_never()
                {
                    wheel.expired(expired.into_inner());
                    n += 1;
                }
                n == TURN
            }
        };
        if full_turn {
            tokio::task::yield_now().await;
        }
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

    /// Records what it receives, with the (virtual) time it arrived.
    struct Recorder(Arc<Mutex<Vec<(u32, Instant)>>>);

    impl Actor for Recorder {
        type Msg = u32;
        type State = ();
        type Arguments = ();
        async fn pre_start(&self, _: ActorRef<u32>, _: ()) -> Result<(), ActorProcessingErr> {
            Ok(())
        }
        async fn handle(
            &self,
            _: ActorRef<u32>,
            msg: u32,
            _: &mut (),
        ) -> Result<(), ActorProcessingErr> {
            self.0.lock().unwrap().push((msg, Instant::now()));
            Ok(())
        }
    }

    async fn recorder() -> (ActorRef<u32>, Arc<Mutex<Vec<(u32, Instant)>>>) {
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
