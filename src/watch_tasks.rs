//! The runtime's watch tasks, supervised: a watch that ends (a panic on an object no one
//! expected, or a stream that ended) is started again with backoff instead of leaving its kind
//! unwatched while the probes say all is well. While one is down, `/readyz` fails naming it, and
//! every restart is counted (`actorcile_watch_restarts_total`).
//!
//! The watches themselves retry the API's errors (kube's watcher backoff); this is the layer
//! above, for the task itself.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use backon::BackoffBuilder;
use tokio::task::JoinHandle;

use crate::health::Health;

/// A task that ran this long before it ended starts its backoff afresh.
const HEALTHY_RUN: Duration = Duration::from_secs(60);

/// Aborts a task when dropped: the supervisor's own abort (the runtime's shutdown) ends the
/// task it supervises.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Supervise the task `start` spawns, named `name` in logs and probes: `start(n)` is called
/// for the `n`th run (0 first), again after each end, after a backoff of 100 ms doubling to
/// 30 s. Each restart is counted in `restarts`. The returned task ends only when aborted.
pub(crate) fn supervise(
    name: String,
    health: Arc<Health>,
    restarts: Arc<AtomicU64>,
    mut start: impl FnMut(u32) -> JoinHandle<()> + Send + 'static,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let backoff = || {
            backon::ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(100))
                .with_max_delay(Duration::from_secs(30))
                .without_max_times()
                .build()
        };
        let mut delays = backoff();
        let mut run = 0u32;
        loop {
            let started = tokio::time::Instant::now();
            let task = start(run);
            let _abort = AbortOnDrop(task.abort_handle());
            let why = match task.await {
                Ok(()) => "it ended".to_string(),
                Err(e) if e.is_panic() => {
                    let payload = e.into_panic();
                    let message = payload
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| payload.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "a panic".to_string());
                    format!("it panicked: {}", crate::event_recorder::sanitise(&message))
                }
                // Aborted from outside the supervisor: not ours to restart.
                Err(_) => return,
            };
            if started.elapsed() >= HEALTHY_RUN {
                delays = backoff();
            }
            let delay = delays.next().unwrap_or(Duration::from_secs(30));
            tracing::error!(watch = %name, %why, restart_in = ?delay, "a watch task stopped; starting it again");
            health.watch_down(&name, &why);
            restarts.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(delay).await;
            run = run.saturating_add(1);
            health.watch_up(&name);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[tokio::test(start_paused = true)]
    async fn a_task_that_panics_is_restarted_counted_and_fails_readiness_until_then() {
        let health = Arc::new(Health::default());
        health.set_started();
        let restarts = Arc::new(AtomicU64::new(0));
        let runs = Arc::new(Mutex::new(Vec::new()));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let supervisor = {
            let runs = runs.clone();
            supervise(
                "the Widget watch".into(),
                health.clone(),
                restarts.clone(),
                move |n| {
                    runs.lock().unwrap().push(n);
                    let tx = tx.clone();
                    tokio::spawn(async move {
                        let _ = tx.send(n);
                        if n == 0 {
                            panic!("a mapper met a hostile object");
                        }
                        std::future::pending::<()>().await
                    })
                },
            )
        };
        assert_eq!(rx.recv().await, Some(0));
        // The panic is seen, and the restart waits for its backoff: not ready meanwhile.
        while restarts.load(Ordering::Relaxed) == 0 {
            tokio::task::yield_now().await;
        }
        let probe = health.ready();
        assert!(!probe.ok, "{probe:?}");
        assert!(
            probe.detail.contains("the Widget watch") && probe.detail.contains("hostile"),
            "{probe:?}"
        );
        assert_eq!(rx.recv().await, Some(1), "started again");
        assert!(health.ready().ok, "{:?}", health.ready());
        assert_eq!(*runs.lock().unwrap(), [0, 1]);
        // Aborting the supervisor ends the task it runs.
        supervisor.abort();
        let _ = supervisor.await;
        tokio::task::yield_now().await;
        assert!(
            rx.recv().await.is_none(),
            "the task (and its sender) is gone"
        );
    }
}
