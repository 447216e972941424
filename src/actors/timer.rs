//! One pending wake-up per resource, earliest wins.

use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The single pending timer of a resource actor.
///
/// [`WakeSlot::schedule`] keeps whichever deadline is earlier; every (re)arm gets a new token,
/// so a timer message that fires after it was replaced or cancelled is recognised as stale by
/// [`WakeSlot::fire`].
#[derive(Debug, Default)]
pub struct WakeSlot {
    at: Option<Instant>,
    token: u64,
    task: Option<JoinHandle<()>>,
}

impl WakeSlot {
    /// Arm for `at` unless an earlier wake-up is pending. Returns the token to deliver back
    /// through `send(token, delay)` (which must spawn the delivering task), or `None` if the
    /// existing earlier timer stays.
    pub fn schedule(
        &mut self,
        at: Instant,
        send: impl FnOnce(u64, Duration) -> JoinHandle<()>,
    ) -> Option<u64> {
        if self.at.is_some_and(|cur| cur <= at) {
            return None;
        }
        self.cancel();
        self.token += 1;
        self.at = Some(at);
        let delay = at.saturating_duration_since(Instant::now());
        self.task = Some(send(self.token, delay));
        Some(self.token)
    }

    /// Drop the pending timer, if any.
    pub fn cancel(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
        self.at = None;
        self.token += 1;
    }

    /// A timer with `token` fired: `true` if it is the pending one (which is then cleared).
    pub fn fire(&mut self, token: u64) -> bool {
        if self.at.is_some() && token == self.token {
            self.at = None;
            self.task = None;
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

impl Drop for WakeSlot {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    fn spawn_recorder(log: Arc<Mutex<Vec<u64>>>) -> impl Fn(u64, Duration) -> JoinHandle<()> {
        move |token, delay| {
            let log = log.clone();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                log.lock().unwrap().push(token);
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn earliest_wins_and_later_requests_are_ignored() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut slot = WakeSlot::default();
        let now = Instant::now();
        let t1 = slot.schedule(now + Duration::from_secs(10), spawn_recorder(log.clone()));
        assert!(t1.is_some());
        // a later deadline does not replace the earlier one
        assert!(
            slot.schedule(now + Duration::from_secs(20), spawn_recorder(log.clone()))
                .is_none()
        );
        // an earlier one does, and the old timer never fires
        let t2 = slot
            .schedule(now + Duration::from_secs(1), spawn_recorder(log.clone()))
            .unwrap();
        assert_eq!(slot.deadline(), Some(now + Duration::from_secs(1)));
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(*log.lock().unwrap(), vec![t2]);
        assert!(slot.fire(t2));
        assert!(!slot.fire(t2), "a token fires once");
        assert!(!slot.fire(t1.unwrap()), "a replaced token is stale");
    }

    #[tokio::test(start_paused = true)]
    async fn cancel_stops_the_timer_and_stales_its_token() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut slot = WakeSlot::default();
        let t = slot
            .schedule(
                Instant::now() + Duration::from_secs(1),
                spawn_recorder(log.clone()),
            )
            .unwrap();
        slot.cancel();
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(log.lock().unwrap().is_empty());
        assert!(!slot.fire(t));
        assert_eq!(slot.deadline(), None);
    }
}
