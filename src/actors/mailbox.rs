//! The manager's batching mailbox: many tasks message one manager at a high rate.
//!
//! Every object's events, notifications and activations pass through its kind's manager, one
//! serial actor. Through ractor's message port each message is one receive, and tokio's
//! cooperative budget lets a task make only 128 receives per scheduler turn before it must yield
//! to every other runnable task. A manager with a backlog then handled 128 messages and waited for
//! every reconcile, API request and watch stream of the runtime to have its turn, so a readiness
//! notification waited behind the whole backlog while the manager itself was mostly idle
//! (BENCHMARKS.md has the `chain` figures). The timer task met the same limit and runs
//! `tokio::task::unconstrained`; the manager cannot, because ractor spawns its task.
//!
//! Here messages go to a plain unbounded channel, drained with `try_recv` (which takes no
//! budget), and the actor is sent one ractor message, [`MailWaiting`], only when the mailbox goes
//! from empty to not empty. One receive then hands over a batch of up to [`BATCH`] messages. The
//! actor stays an ordinary ractor actor (linked children, supervision events, which ractor
//! delivers before messages and which still interleave between batches, stop and kill); only its
//! high-volume traffic takes this path. No maintained crate offers a budget-free mailbox for a
//! ractor actor; this is the usual "signal + queue" pattern in about forty lines.
//!
//! Messages go in one of three lanes, read in turn while more than one holds messages, so no
//! lane waits behind more than the others' share:
//! - the main lane ([`Mailbox::send`]): changes, notifications, timers, run slots;
//! - the *back* lane ([`Mailbox::send_back`]): actors handing their object back as they
//!   passivate. The manager can see that some are on their way ([`Receiver::back_pending`]) and
//!   wait for them instead of spawning more actors;
//! - the *low* lane ([`Mailbox::send_low`]): messages that may wait, the start-up list's objects,
//!   which arrive by the hundred thousand in a fraction of a second (in one queue, a change that
//!   came after them waited until the manager had handled every one).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ractor::ActorRef;
use tokio::sync::mpsc;

pub(crate) use crate::messages::MailWaiting;

/// Most messages one [`MailWaiting`] hands over before the actor signals again for the rest (so the
/// supervision events queued meanwhile are handled in between).
pub(crate) const BATCH: usize = 256;

/// The sending side before the actor exists (its [`ActorRef`] is what signals the owner).
pub(crate) struct UnboundMailbox<M> {
    tx: mpsc::UnboundedSender<M>,
    back: mpsc::UnboundedSender<M>,
    low: mpsc::UnboundedSender<M>,
    signalled: Arc<AtomicBool>,
}

impl<M> Clone for UnboundMailbox<M> {
    fn clone(&self) -> Self {
        UnboundMailbox {
            tx: self.tx.clone(),
            back: self.back.clone(),
            low: self.low.clone(),
            signalled: self.signalled.clone(),
        }
    }
}

/// Sends to an actor with a batching mailbox. Cheap to clone.
pub(crate) struct Mailbox<M> {
    tx: mpsc::UnboundedSender<M>,
    back: mpsc::UnboundedSender<M>,
    low: mpsc::UnboundedSender<M>,
    signalled: Arc<AtomicBool>,
    owner: ActorRef<MailWaiting>,
}

impl<M> Clone for Mailbox<M> {
    fn clone(&self) -> Self {
        Mailbox {
            tx: self.tx.clone(),
            back: self.back.clone(),
            low: self.low.clone(),
            signalled: self.signalled.clone(),
            owner: self.owner.clone(),
        }
    }
}

/// The receiving side, kept in the actor's state.
pub(crate) struct Receiver<M> {
    rx: mpsc::UnboundedReceiver<M>,
    back: mpsc::UnboundedReceiver<M>,
    low: mpsc::UnboundedReceiver<M>,
    /// Which lane is read first next time (0 main, 1 back, 2 low): the lanes take turns.
    turn: u8,
    signalled: Arc<AtomicBool>,
}

/// A new mailbox: bind the sender to the actor once it is spawned; give it the receiver.
pub(crate) fn channel<M>() -> (UnboundMailbox<M>, Receiver<M>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let (back_tx, back_rx) = mpsc::unbounded_channel();
    let (low_tx, low_rx) = mpsc::unbounded_channel();
    let signalled = Arc::new(AtomicBool::new(false));
    (
        UnboundMailbox {
            tx,
            back: back_tx,
            low: low_tx,
            signalled: signalled.clone(),
        },
        Receiver {
            rx,
            back: back_rx,
            low: low_rx,
            turn: 0,
            signalled,
        },
    )
}

impl<M> UnboundMailbox<M> {
    /// The sender that signals `owner`, the actor owning the receiver.
    pub(crate) fn bind(&self, owner: ActorRef<MailWaiting>) -> Mailbox<M> {
        Mailbox {
            tx: self.tx.clone(),
            back: self.back.clone(),
            low: self.low.clone(),
            signalled: self.signalled.clone(),
            owner,
        }
    }
}

impl<M> Mailbox<M> {
    /// Queue `msg`; `false` if the actor is gone.
    pub(crate) fn send(&self, msg: M) -> bool {
        if self.tx.send(msg).is_err() {
            return false;
        }
        self.signal()
    }

    /// Queue `msg` in the back lane (see the module docs); `false` if the actor is gone.
    pub(crate) fn send_back(&self, msg: M) -> bool {
        if self.back.send(msg).is_err() {
            return false;
        }
        self.signal()
    }

    /// Queue `msg` in the low lane (see the module docs); `false` if the actor is gone.
    pub(crate) fn send_low(&self, msg: M) -> bool {
        if self.low.send(msg).is_err() {
            return false;
        }
        self.signal()
    }

    /// Ring the owner unless a signal is already pending: the pending one will find every message
    /// queued before it is answered (see [`Receiver::open`]).
    pub(crate) fn signal(&self) -> bool {
        if self.signalled.swap(true, Ordering::SeqCst) {
            return true;
        }
        self.owner.cast(MailWaiting).is_ok()
    }
}

impl<M> Receiver<M> {
    /// Answer a [`MailWaiting`]: from now on a new message signals again. Call before draining, so a
    /// message sent while the batch is handled is not left without a signal.
    pub(crate) fn open(&self) {
        self.signalled.store(false, Ordering::SeqCst);
    }

    /// The next queued message, if any (takes no cooperative budget): the lanes take turns
    /// while more than one holds messages.
    pub(crate) fn next(&mut self) -> Option<M> {
        let start = self.turn;
        self.turn = (self.turn + 1) % 3;
        (0..3).find_map(|i| {
            let lane = match (start + i) % 3 {
                0 => &mut self.rx,
                1 => &mut self.back,
                _ => &mut self.low,
            };
            lane.try_recv().ok()
        })
    }

    /// Whether messages wait in the back lane: actors that passivated, about to be idle.
    pub(crate) fn back_pending(&self) -> bool {
        !self.back.is_empty()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use ractor::{Actor, ActorProcessingErr};
    use std::sync::Mutex;

    /// A test actor with an mailbox: records what it receives, in batches of at most [`BATCH`].
    pub(crate) struct Sink<M> {
        pub seen: Arc<Mutex<Vec<M>>>,
        pub signals: Arc<Mutex<u32>>,
        pub mailbox: UnboundMailbox<M>,
    }

    pub(crate) struct SinkState<M> {
        rx: Receiver<M>,
        me: Mailbox<M>,
    }

    /// A spawned [`Sink`]: its mailbox, what it received, how many mail-waiting signals it answered.
    pub(crate) struct Spawned<M> {
        pub mailbox: Mailbox<M>,
        pub seen: Arc<Mutex<Vec<M>>>,
        pub signals: Arc<Mutex<u32>>,
        pub actor: ActorRef<MailWaiting>,
        pub handle: tokio::task::JoinHandle<()>,
    }

    impl<M: Send + Sync + 'static> Sink<M> {
        pub(crate) async fn spawn() -> Spawned<M> {
            let (unbound, rx) = channel();
            let sink = Sink {
                seen: Arc::default(),
                signals: Arc::default(),
                mailbox: unbound.clone(),
            };
            let (seen, signals) = (sink.seen.clone(), sink.signals.clone());
            let (actor, handle) = Actor::spawn(None, sink, rx).await.unwrap();
            Spawned {
                mailbox: unbound.bind(actor.clone()),
                seen,
                signals,
                actor,
                handle,
            }
        }
    }

    impl<M: Send + Sync + 'static> Actor for Sink<M> {
        type Msg = MailWaiting;
        type State = SinkState<M>;
        type Arguments = Receiver<M>;

        async fn pre_start(
            &self,
            myself: ActorRef<MailWaiting>,
            rx: Receiver<M>,
        ) -> Result<SinkState<M>, ActorProcessingErr> {
            Ok(SinkState {
                rx,
                me: self.mailbox.bind(myself),
            })
        }

        async fn handle(
            &self,
            _: ActorRef<MailWaiting>,
            _: MailWaiting,
            st: &mut SinkState<M>,
        ) -> Result<(), ActorProcessingErr> {
            *self.signals.lock().unwrap() += 1;
            st.rx.open();
            for _ in 0..BATCH {
                let Some(m) = st.rx.next() else {
                    return Ok(());
                };
                self.seen.lock().unwrap().push(m);
            }
            st.me.signal();
            Ok(())
        }
    }

    #[tokio::test]
    async fn every_message_arrives_in_order_in_batches() {
        let Spawned {
            mailbox,
            seen,
            signals,
            actor,
            handle,
        } = Sink::<u32>::spawn().await;
        let n = 10 * BATCH as u32 + 7;
        // Two senders, each in order; on this single-threaded runtime both finish before the
        // actor runs, so it finds everything queued.
        let (a, b) = (mailbox.clone(), mailbox.clone());
        let ta = tokio::spawn(async move { (0..n).all(|i| a.send(2 * i)) });
        let tb = tokio::spawn(async move { (0..n).all(|i| b.send(2 * i + 1)) });
        assert!(ta.await.unwrap() && tb.await.unwrap());
        tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while seen.lock().unwrap().len() < 2 * n as usize {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("every message is handled");
        let seen = seen.lock().unwrap().clone();
        let evens: Vec<u32> = seen.iter().copied().filter(|m| m % 2 == 0).collect();
        let odds: Vec<u32> = seen.iter().copied().filter(|m| m % 2 == 1).collect();
        assert_eq!(evens, (0..n).map(|i| 2 * i).collect::<Vec<_>>());
        assert_eq!(odds, (0..n).map(|i| 2 * i + 1).collect::<Vec<_>>());
        // One mail-waiting signal per batch, not one per message.
        let signals = *signals.lock().unwrap();
        assert_eq!(signals, (2 * n as usize).div_ceil(BATCH) as u32);
        actor.stop(None);
        handle.await.unwrap();
        assert!(!mailbox.send(1), "sending to a stopped actor fails");
    }

    #[test]
    fn the_lanes_take_turns_while_more_than_one_holds_messages() {
        let (mailbox, mut rx) = channel::<u32>();
        for i in 0..5 {
            mailbox.low.send(100 + i).unwrap();
        }
        for i in 0..2 {
            mailbox.tx.send(i).unwrap();
        }
        mailbox.back.send(50).unwrap();
        assert!(rx.back_pending());
        let order: Vec<u32> = std::iter::from_fn(|| rx.next()).collect();
        // A burst in the low lane does not hold back what comes after it in the others.
        assert_eq!(order, vec![0, 50, 100, 1, 101, 102, 103, 104]);
        assert!(!rx.back_pending());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_message_sent_while_a_batch_is_handled_is_not_lost() {
        let Spawned {
            mailbox,
            seen,
            actor,
            handle,
            ..
        } = Sink::<u32>::spawn().await;
        // Trickle messages one at a time, waiting for each: every one must be handled on its own
        // signal or the pending one, never stranded in the queue.
        for i in 0..2000u32 {
            assert!(mailbox.send(i));
            if i % 3 == 0 {
                tokio::time::timeout(std::time::Duration::from_secs(10), async {
                    while seen.lock().unwrap().len() <= i as usize {
                        tokio::task::yield_now().await;
                    }
                })
                .await
                .unwrap_or_else(|_| panic!("message {i} was stranded"));
            }
        }
        actor.stop(None);
        handle.await.unwrap();
    }
}
