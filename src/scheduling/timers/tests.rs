//! The tests of `scheduling/timers.rs`.

use super::super::slots::{ACTIVATION_EVERY, HELD_ACTIVATION_EVERY, HELD_FOR};
use super::*;
use ractor::{Actor, ActorProcessingErr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;

/// What a [`Recorder`] received, each with the (virtual) time it arrived.
type Log<M> = Arc<Mutex<Vec<(M, Instant)>>>;

/// Records what it receives (a delivery's reconcile slot included, so a test decides when slots
/// are released).
struct Recorder<M>(Log<M>);

impl<M: TimerMsg> Actor for Recorder<M> {
    type Msg = M;
    type State = ();
    type Arguments = ();
    async fn pre_start(&self, _: ActorRef<M>, _: ()) -> Result<(), ActorProcessingErr> {
        Ok(())
    }
    async fn handle(&self, _: ActorRef<M>, msg: M, _: &mut ()) -> Result<(), ActorProcessingErr> {
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

/// A delivery that carries the reconcile slot it was given (held until the actor drops it).
#[derive(Debug)]
struct Slotted(u32, Option<ReconcileSlot>);

impl TimerMsg for Slotted {
    fn give_slot(&mut self, slot: ReconcileSlot) {
        self.1 = Some(slot);
    }
}

type SlotLog = Log<Slotted>;

/// Ask the task for an activation slot; when given, log it as delivery `n`.
fn log_activation(timers: &Timers<Slotted>, log: &SlotLog, n: u32) {
    let log = log.clone();
    timers.activation(Box::new(move |permit| {
        let slot = ReconcileSlot {
            permit,
            given_at: Instant::now(),
        };
        log.lock()
            .unwrap()
            .push((Slotted(n, Some(slot)), Instant::now()));
    }));
}

/// Due deliveries and queued ones wait for a reconcile slot in one first-in-first-out queue, and
/// each arrives with its slot; a cancelled timer takes none.
#[tokio::test(start_paused = true)]
async fn deliveries_wait_for_a_reconcile_slot_in_order_and_carry_it() {
    let slots = Arc::new(Semaphore::new(1));
    let timers = Timers::with_slots(&ReconcileSlots::new(
        slots.clone(),
        slots.available_permits(),
        None,
    ));
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
    let timers = Timers::with_slots(&ReconcileSlots::new(
        slots.clone(),
        slots.available_permits(),
        None,
    ));
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

/// While reconciles report that they run late ([`SATURATED_LATENESS`](crate::scheduling::slots::SATURATED_LATENESS)), activations may not take
/// free slots directly and get one slot in [`HELD_ACTIVATION_EVERY`]; once no late reconcile has
/// been reported for [`HELD_FOR`], they get free slots again.
#[tokio::test(start_paused = true)]
async fn activations_are_held_back_while_reconciles_run_late() {
    assert_eq!(
        HELD_ACTIVATION_EVERY, 32,
        "the expected order below assumes 32"
    );
    let slots = Arc::new(Semaphore::new(1));
    let timers = Timers::with_slots(&ReconcileSlots::new(
        slots.clone(),
        slots.available_permits(),
        None,
    ));
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
    // The slot goes round one at a time while reconciles keep running late.
    for given in 1..=41 {
        run_late();
        tokio::time::sleep(Duration::from_millis(1)).await;
        let mut got = log.lock().unwrap();
        assert_eq!(got.len(), given, "{:?}", order(&got));
        got[given - 1].0.1.take();
    }
    let expected: Vec<u32> = (1..=31).chain([101]).chain(32..=40).collect();
    assert_eq!(order(&log.lock().unwrap()), expected);
    // No reconcile waits, but activations are still held back until no late reconcile was reported
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

/// Once the reconcile slots are closed (shutdown), nothing waiting is delivered and the task still
/// takes commands and ends with its handles.
#[tokio::test(start_paused = true)]
async fn closed_run_slots_deliver_nothing() {
    let slots = Arc::new(Semaphore::new(0));
    let timers = Timers::with_slots(&ReconcileSlots::new(
        slots.clone(),
        slots.available_permits(),
        None,
    ));
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
