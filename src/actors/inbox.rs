//! A batching mailbox for an actor that many tasks message at a high rate: the manager.
//!
//! Every object's events, notifications and activations pass through its kind's manager, one
//! serial actor. Through ractor's message port each message is one receive, and tokio's
//! cooperative budget lets a task make only 128 receives per turn before it must yield to every
//! other runnable task. So a manager with a backlog handled 128 messages per turn and then waited
//! for all the passes, API requests and watch streams of the runtime to have their turn
//! (≈ 2.7 ms on two cores in the `chain` benchmark): a readiness notification waited ≈ 150 ms
//! behind the backlog, while the manager itself was busy only ≈ 12 % of the time. (The timer
//! task met the same limit and runs `tokio::task::unconstrained`; the manager cannot, because
//! ractor spawns its task.)
//!
//! Here messages go to a plain unbounded channel, drained with `try_recv` (which takes no
//! budget), and the actor is sent one ractor message, a [`Doorbell`], only when the inbox goes
//! from empty to not empty. One receive then hands over a batch of up to [`BATCH`] messages. The
//! actor stays an ordinary ractor actor — linked children, supervision events (which ractor
//! delivers before messages, and which still interleave between batches), stop and kill — only
//! its high-volume traffic takes this path. No maintained crate offers a budget-free mailbox
//! for a ractor actor; this is the usual "doorbell + queue" pattern in about forty lines.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ractor::ActorRef;
use tokio::sync::mpsc;

/// Most messages one [`Doorbell`] hands over before the actor rings again for the rest (so the
/// supervision events queued meanwhile are handled in between).
pub(crate) const BATCH: usize = 256;

/// The only ractor message of an actor with an [`Inbox`]: "messages are waiting".
#[derive(Debug)]
pub(crate) struct Doorbell;

/// The sending side before the actor exists (its [`ActorRef`] is what rings the bell).
pub(crate) struct Unbound<M> {
    tx: mpsc::UnboundedSender<M>,
    rung: Arc<AtomicBool>,
}

impl<M> Clone for Unbound<M> {
    fn clone(&self) -> Self {
        Unbound {
            tx: self.tx.clone(),
            rung: self.rung.clone(),
        }
    }
}

/// Sends to an actor with a batching inbox. Cheap to clone.
pub(crate) struct Inbox<M> {
    tx: mpsc::UnboundedSender<M>,
    rung: Arc<AtomicBool>,
    bell: ActorRef<Doorbell>,
}

impl<M> Clone for Inbox<M> {
    fn clone(&self) -> Self {
        Inbox {
            tx: self.tx.clone(),
            rung: self.rung.clone(),
            bell: self.bell.clone(),
        }
    }
}

/// The receiving side, kept in the actor's state.
pub(crate) struct Receiver<M> {
    rx: mpsc::UnboundedReceiver<M>,
    rung: Arc<AtomicBool>,
}

/// A new inbox: bind the sender to the actor once it is spawned; give it the receiver.
pub(crate) fn channel<M>() -> (Unbound<M>, Receiver<M>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let rung = Arc::new(AtomicBool::new(false));
    (
        Unbound {
            tx,
            rung: rung.clone(),
        },
        Receiver { rx, rung },
    )
}

impl<M> Unbound<M> {
    /// The sender that rings `bell`, the actor owning the receiver.
    pub(crate) fn bind(&self, bell: ActorRef<Doorbell>) -> Inbox<M> {
        Inbox {
            tx: self.tx.clone(),
            rung: self.rung.clone(),
            bell,
        }
    }
}

impl<M> Inbox<M> {
    /// Queue `msg`; `false` if the actor is gone.
    pub(crate) fn send(&self, msg: M) -> bool {
        if self.tx.send(msg).is_err() {
            return false;
        }
        self.ring()
    }

    /// Ring the bell unless a ring is already pending: the pending one will find every message
    /// queued before it is answered (see [`Receiver::open`]).
    pub(crate) fn ring(&self) -> bool {
        if self.rung.swap(true, Ordering::SeqCst) {
            return true;
        }
        self.bell.cast(Doorbell).is_ok()
    }
}

impl<M> Receiver<M> {
    /// Answer a [`Doorbell`]: from now on a new message rings again. Call before draining, so a
    /// message sent while the batch is handled is not left without a ring.
    pub(crate) fn open(&self) {
        self.rung.store(false, Ordering::SeqCst);
    }

    /// The next queued message, if any (takes no cooperative budget).
    pub(crate) fn next(&mut self) -> Option<M> {
        self.rx.try_recv().ok()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use ractor::{Actor, ActorProcessingErr};
    use std::sync::Mutex;

    /// A test actor with an inbox: records what it receives, in batches of at most [`BATCH`].
    pub(crate) struct Sink<M> {
        pub seen: Arc<Mutex<Vec<M>>>,
        pub rings: Arc<Mutex<u32>>,
        pub inbox: Unbound<M>,
    }

    pub(crate) struct SinkState<M> {
        rx: Receiver<M>,
        me: Inbox<M>,
    }

    /// A spawned [`Sink`]: its inbox, what it received, how many doorbells it answered.
    pub(crate) struct Spawned<M> {
        pub inbox: Inbox<M>,
        pub seen: Arc<Mutex<Vec<M>>>,
        pub rings: Arc<Mutex<u32>>,
        pub actor: ActorRef<Doorbell>,
        pub handle: tokio::task::JoinHandle<()>,
    }

    impl<M: Send + Sync + 'static> Sink<M> {
        pub(crate) async fn spawn() -> Spawned<M> {
            let (unbound, rx) = channel();
            let sink = Sink {
                seen: Arc::default(),
                rings: Arc::default(),
                inbox: unbound.clone(),
            };
            let (seen, rings) = (sink.seen.clone(), sink.rings.clone());
            let (actor, handle) = Actor::spawn(None, sink, rx).await.unwrap();
            Spawned {
                inbox: unbound.bind(actor.clone()),
                seen,
                rings,
                actor,
                handle,
            }
        }
    }

    impl<M: Send + Sync + 'static> Actor for Sink<M> {
        type Msg = Doorbell;
        type State = SinkState<M>;
        type Arguments = Receiver<M>;

        async fn pre_start(
            &self,
            myself: ActorRef<Doorbell>,
            rx: Receiver<M>,
        ) -> Result<SinkState<M>, ActorProcessingErr> {
            Ok(SinkState {
                rx,
                me: self.inbox.bind(myself),
            })
        }

        async fn handle(
            &self,
            _: ActorRef<Doorbell>,
            _: Doorbell,
            st: &mut SinkState<M>,
        ) -> Result<(), ActorProcessingErr> {
            *self.rings.lock().unwrap() += 1;
            st.rx.open();
            for _ in 0..BATCH {
                let Some(m) = st.rx.next() else {
                    return Ok(());
                };
                self.seen.lock().unwrap().push(m);
            }
            st.me.ring();
            Ok(())
        }
    }

    #[tokio::test]
    async fn every_message_arrives_in_order_in_batches() {
        let Spawned {
            inbox,
            seen,
            rings,
            actor,
            handle,
        } = Sink::<u32>::spawn().await;
        let n = 10 * BATCH as u32 + 7;
        // Two senders, each in order; on this single-threaded runtime both finish before the
        // actor runs, so it finds everything queued.
        let (a, b) = (inbox.clone(), inbox.clone());
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
        // One doorbell per batch, not one per message.
        let rings = *rings.lock().unwrap();
        assert_eq!(rings, (2 * n as usize).div_ceil(BATCH) as u32);
        actor.stop(None);
        handle.await.unwrap();
        assert!(!inbox.send(1), "sending to a stopped actor fails");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_message_sent_while_a_batch_is_handled_is_not_lost() {
        let Spawned {
            inbox,
            seen,
            actor,
            handle,
            ..
        } = Sink::<u32>::spawn().await;
        // Trickle messages one at a time, waiting for each: every one must be handled on its own
        // ring or the pending one, never stranded in the queue.
        for i in 0..2000u32 {
            assert!(inbox.send(i));
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
