//! A concurrency limit like kube-apiserver's API Priority and Fairness ([`Apf`]): at most
//! `seats` requests are served at once, at most `queue` more wait for a seat, and one more is
//! answered `429 TooManyRequests` with `Retry-After: 1`, as kube-apiserver answers a request its
//! priority level has no room for. Watches are exempt (long-running requests hold no seat
//! there either). With [`Faults::latency`](crate::Faults::latency) a request holds its seat for
//! that long, so a client that sends more than the seats see latency rise, and past the
//! queue, 429s.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The concurrency limit of [`ApiServer::set_apf`](crate::ApiServer::set_apf).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Apf {
    /// Requests served at once (kube-apiserver: a priority level's concurrency shares).
    pub seats: usize,
    /// Requests that may wait for a seat; one more is answered 429.
    pub queue: usize,
}

/// The seats and the queue of one [`Apf`] setting.
#[derive(Debug)]
pub(crate) struct Gate {
    seats: Arc<Semaphore>,
    waiting: AtomicUsize,
    queue: usize,
}

/// A seat held while one request is served.
pub(crate) struct Seat {
    _permit: OwnedSemaphorePermit,
}

impl Gate {
    pub(crate) fn new(apf: Apf) -> Self {
        Gate {
            seats: Arc::new(Semaphore::new(apf.seats.max(1))),
            waiting: AtomicUsize::new(0),
            queue: apf.queue,
        }
    }

    /// A seat, at once or after waiting in the queue; `None`: the queue is full (answer 429).
    pub(crate) async fn enter(&self) -> Option<Seat> {
        if let Ok(seat) = self.seats.clone().try_acquire_owned() {
            return Some(Seat { _permit: seat });
        }
        let queued = self.waiting.fetch_add(1, Ordering::AcqRel);
        if queued >= self.queue {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        /// Leaves the queue however the wait ends (its future may be dropped).
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let _waiting = Waiting(&self.waiting);
        let permit = self.seats.clone().acquire_owned().await.ok()?;
        Some(Seat { _permit: permit })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn past_the_seats_requests_queue_and_past_the_queue_they_are_refused() {
        let gate = Arc::new(Gate::new(Apf { seats: 2, queue: 1 }));
        let a = gate.enter().await.expect("a seat");
        let _b = gate.enter().await.expect("a seat");
        let queued = tokio::spawn({
            let gate = gate.clone();
            async move { gate.enter().await.is_some() }
        });
        // The queued one is waiting once the counter says so (a barrier, not a sleep).
        while gate.waiting.load(Ordering::Acquire) == 0 {
            tokio::task::yield_now().await;
        }
        assert!(gate.enter().await.is_none(), "the queue is full: refused");
        drop(a);
        assert!(
            queued.await.unwrap(),
            "a freed seat goes to the queued request"
        );
        assert_eq!(gate.waiting.load(Ordering::Acquire), 0);
    }
}
