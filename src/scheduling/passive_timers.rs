//! The wake-ups of passivated objects (a poll, an error retry, a dependency's fallback re-check):
//! one task per manager keeps them all in one tokio-util [`DelayQueue`] and tells the manager
//! (through the function it was started with) when one is due.
//!
//! A passive object has no actor, so the resource actors' [`Timers`](super::Timers) (keyed by
//! actor) cannot hold its wake-up. A sleeping task per passive object could, but costs a task's
//! memory per idle object (`examples/idle_memory --poll-secs 3600` measures it; BENCHMARKS.md
//! has the figures) and a spawn and an abort per passivation. Here an entry costs one shared key
//! in a map and in the queue.

use std::future::poll_fn;
use std::sync::Arc;
use std::time::Duration;

use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::time::{DelayQueue, delay_queue};

use crate::ManagedResource;
use crate::hash::FastMap;

enum Cmd<K: ManagedResource> {
    /// Wake `key` at `at` with `token`, replacing any pending wake-up of `key`.
    Arm(ObjectRef<K>, u64, Instant),
    /// Drop `key`'s pending wake-up.
    Cancel(ObjectRef<K>),
}

/// Arms and cancels the pending wake-ups of a manager's passive objects (at most one each).
///
/// Commands are buffered until [`PassiveTimers::flush`], which the manager calls once per
/// batch of messages it handled: one wake-up of the task per batch rather than per command.
pub(crate) struct PassiveTimers<K: ManagedResource> {
    tx: mpsc::UnboundedSender<Vec<Cmd<K>>>,
    buffered: Vec<Cmd<K>>,
}

impl<K: ManagedResource> PassiveTimers<K> {
    /// Start the task; a due wake-up calls `wake(key, token)`. It ends when this handle is
    /// dropped, or when `wake` answers `false` (the manager is gone).
    pub(crate) fn start(wake: impl Fn(ObjectRef<K>, u64) -> bool + Send + 'static) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        // Outside the cooperative budget, like the resource actors' timer task: under load a
        // budgeted task waits a whole scheduler turn per 128 operations.
        tokio::spawn(tokio::task::unconstrained(run(rx, wake)));
        PassiveTimers {
            tx,
            buffered: Vec::new(),
        }
    }

    /// Call `wake(key, token)` in `after`, unless re-armed or cancelled first.
    pub(crate) fn arm(&mut self, key: ObjectRef<K>, token: u64, after: Duration) {
        self.buffered.push(Cmd::Arm(
            key,
            token,
            Instant::now() + crate::scheduling::bounded_delay(after),
        ));
    }

    /// Drop `key`'s pending wake-up, if any. (One already sent still arrives: the manager
    /// checks its token.)
    pub(crate) fn cancel(&mut self, key: ObjectRef<K>) {
        self.buffered.push(Cmd::Cancel(key));
    }

    /// Hand the buffered commands to the task.
    pub(crate) fn flush(&mut self) {
        if !self.buffered.is_empty() {
            let _ = self.tx.send(std::mem::take(&mut self.buffered));
        }
    }
}

async fn run<K: ManagedResource>(
    mut rx: mpsc::UnboundedReceiver<Vec<Cmd<K>>>,
    wake: impl Fn(ObjectRef<K>, u64) -> bool,
) {
    let mut queue: DelayQueue<(Arc<ObjectRef<K>>, u64)> = DelayQueue::new();
    let mut pending: FastMap<Arc<ObjectRef<K>>, delay_queue::Key> = FastMap::default();
    loop {
        tokio::select! {
            cmds = rx.recv() => {
                let Some(cmds) = cmds else {
                    return;
                };
                for cmd in cmds {
                    match cmd {
                        Cmd::Arm(key, token, at) => {
                            if let Some(old) = pending.remove(&key) {
                                queue.remove(&old);
                            }
                            let key = Arc::new(key);
                            let entry = queue.insert_at((key.clone(), token), at);
                            pending.insert(key, entry);
                        }
                        Cmd::Cancel(key) => {
                            if let Some(old) = pending.remove(&key) {
                                queue.remove(&old);
                            }
                        }
                    }
                }
            }
            Some(due) = poll_fn(|cx| queue.poll_expired(cx)) => {
                let (key, token) = due.into_inner();
                pending.remove(&key);
                if pending.capacity() > 1024 && pending.capacity() > 8 * pending.len() {
                    pending.shrink_to(2 * pending.len());
                }
                let key = Arc::unwrap_or_clone(key);
                if !wake(key, token) {
                    return; // the manager is gone
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use std::sync::Mutex;

    fn key(name: &str) -> ObjectRef<ConfigMap> {
        ObjectRef::new(name).within("default")
    }

    #[tokio::test(start_paused = true)]
    async fn due_wake_ups_arrive_once_with_their_token_and_rearming_or_cancelling_replaces_them() {
        let seen: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
        let mut timers = PassiveTimers::start({
            let seen = seen.clone();
            move |k: ObjectRef<ConfigMap>, t| {
                seen.lock().unwrap().push((k.name, t));
                true
            }
        });
        timers.arm(key("a"), 1, Duration::from_secs(10));
        timers.arm(key("b"), 2, Duration::from_secs(20));
        timers.arm(key("a"), 3, Duration::from_secs(30)); // replaces a's first
        timers.cancel(key("b"));
        timers.arm(key("c"), 4, Duration::from_secs(5));
        timers.cancel(key("never-armed"));
        timers.flush();
        let woken = || -> Vec<(String, u64)> { seen.lock().unwrap().clone() };
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert_eq!(woken(), [("c".to_string(), 4)]);
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert_eq!(
            woken(),
            [("c".to_string(), 4)],
            "a was re-armed to 30 s, b cancelled"
        );
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(woken(), [("c".to_string(), 4), ("a".to_string(), 3)]);
        // Arming again after a wake-up works, and the task forgot what fired.
        timers.arm(key("c"), 5, Duration::from_secs(1));
        timers.flush();
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(woken().last(), Some(&("c".to_string(), 5)));
    }
}
