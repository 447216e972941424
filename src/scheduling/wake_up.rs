//! A resource actor's pending wake-up: at most one, the earliest wins.
//!
//! Plain bookkeeping, no timer: the actor asks the timer task ([`Timers`](super::Timers))
//! to deliver the wake-up, and this tells it whether a delivery is still the pending one.

use tokio::time::Instant;

/// The single pending wake-up of a resource actor: deadline and token bookkeeping only.
///
/// [`PendingWakeUp::schedule`] keeps whichever deadline is earlier; every (re)arm gets a new
/// token, so a delivery that arrives after it was replaced or cancelled is recognised as stale
/// by [`PendingWakeUp::fire`].
#[derive(Debug, Default)]
pub struct PendingWakeUp {
    at: Option<Instant>,
    token: u64,
}

impl PendingWakeUp {
    /// Arm for `at` unless an earlier wake-up is pending. Returns the token the timer must
    /// deliver back, or `None` if the existing earlier wake-up stays.
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

    /// A wake-up with `token` was delivered: `true` if it is the pending one (which is then
    /// cleared).
    pub fn fire(&mut self, token: u64) -> bool {
        if self.at.is_some() && token == self.token {
            self.at = None;
            true
        } else {
            false
        }
    }

    /// When the pending wake-up is due, if one is pending.
    pub fn deadline(&self) -> Option<Instant> {
        self.at
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn earliest_wins_and_later_requests_are_ignored() {
        let mut slot = PendingWakeUp::default();
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
        let mut slot = PendingWakeUp::default();
        let t = slot.schedule(Instant::now()).unwrap();
        assert!(slot.cancel());
        assert!(!slot.cancel(), "nothing pending any more");
        assert!(!slot.fire(t));
        assert_eq!(slot.deadline(), None);
    }
}
