//! Adaptive concurrency: a reconcile-slot limit that follows what the API server can take,
//! instead of a fixed `max_concurrent_reconciles` chosen in advance. Too many reconciles at
//! once and kube-apiserver's API Priority and Fairness answers 429 and every request waits
//! longer; too few and objects wait for slots while the server idles.
//!
//! [`AdaptiveConcurrency`] is a tower layer for the runtime's client (it sees every API answer:
//! its latency and whether it was a 429) and the limit the runtime's reconcile slots follow:
//! additive increase while every slot is in use and answers come promptly, multiplicative
//! decrease on a 429 or when answers take longer than [`AimdPolicy::latency_tolerance`] × the
//! fastest recent one, between [`AimdPolicy::min`] and the policy's
//! `max_concurrent_reconciles`. Opt-in: without it the slots are fixed.
//!
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! use actorcile::adaptive::{AdaptiveConcurrency, AimdPolicy};
//! use actorcile::prelude::*;
//!
//! let adaptive = AdaptiveConcurrency::new(AimdPolicy::default());
//! let config = kube::Config::infer().await?;
//! let client: kube::Client = kube::client::ClientBuilder::try_from(config)?
//!     .with_layer(&adaptive)
//!     .build();
//! let names = actorcile::names::OperatorNames::new("bucket-operator", "buckets.example.com");
//! let builder = Runtime::builder(client, names).adaptive_concurrency(adaptive);
//! # let _ = builder;
//! # Ok(()) }
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::scheduling::aimd::{Aimd, Rule};

/// The rule's bounds and factors.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AimdPolicy {
    /// The limit never goes below this (default 2).
    pub min: usize,
    /// Where it starts (default 8); the policy's `max_concurrent_reconciles` is the most.
    pub initial: usize,
    /// A 429 multiplies the limit by this (default 0.5).
    pub on_throttle: f64,
    /// Latency past the tolerance multiplies it by this (default 0.9).
    pub on_latency: f64,
    /// Answers slower than this × the fastest recent one mean the server is queueing
    /// (default 2.0).
    pub latency_tolerance: f64,
    /// How long the fastest answer stays the baseline before it is measured again (default
    /// 10 s): a server that got slower for good is followed.
    pub baseline_window: Duration,
}

impl Default for AimdPolicy {
    fn default() -> Self {
        AimdPolicy {
            min: 2,
            initial: 8,
            on_throttle: 0.5,
            on_latency: 0.9,
            latency_tolerance: 2.0,
            baseline_window: Duration::from_secs(10),
        }
    }
}

/// The adaptive limit and the client layer that feeds it (cloning shares it).
#[derive(Clone, Debug)]
pub struct AdaptiveConcurrency {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    policy: AimdPolicy,
    rule: Mutex<Option<Aimd>>,
    /// The runtime's reconcile slots, once it started ([`AdaptiveConcurrency::attach`]).
    slots: OnceLock<(Arc<Semaphore>, usize)>,
    /// Slots held back from reconciles: `max - limit` of them once the parking task caught up.
    parked: Mutex<Vec<OwnedSemaphorePermit>>,
    want_parked: AtomicUsize,
    changed: Notify,
    limit: AtomicUsize,
}

impl AdaptiveConcurrency {
    /// A limit following `policy`; it takes effect once given to
    /// [`RuntimeBuilder::adaptive_concurrency`](crate::runtime::RuntimeBuilder::adaptive_concurrency).
    pub fn new(policy: AimdPolicy) -> Self {
        AdaptiveConcurrency {
            inner: Arc::new(Inner {
                policy,
                rule: Mutex::new(None),
                slots: OnceLock::new(),
                parked: Mutex::new(Vec::new()),
                want_parked: AtomicUsize::new(0),
                changed: Notify::new(),
                limit: AtomicUsize::new(0),
            }),
        }
    }

    /// The limit now (0 before the runtime started).
    pub fn limit(&self) -> usize {
        self.inner.limit.load(Ordering::Relaxed)
    }

    /// The runtime's reconcile slots, `max` of them: from now on, the limit holds back
    /// `max - limit` of them. Once only (a second runtime on the same limit is ignored).
    pub(crate) fn attach(&self, slots: Arc<Semaphore>, max: usize) {
        if self.inner.slots.set((slots.clone(), max)).is_err() {
            tracing::warn!(
                "an adaptive concurrency limit serves one runtime; this one keeps fixed slots"
            );
            return;
        }
        let p = self.inner.policy;
        let rule = Rule {
            min: p.min.clamp(1, max) as f64,
            max: max as f64,
            on_throttle: p.on_throttle.clamp(0.05, 1.0),
            on_latency: p.on_latency.clamp(0.05, 1.0),
            tolerance: p.latency_tolerance.max(1.0),
            baseline_window: p.baseline_window,
        };
        let aimd = Aimd::new(rule, p.initial as f64);
        self.set(aimd.limit());
        *self.inner.rule.lock().unwrap_or_else(|e| e.into_inner()) = Some(aimd);
        tokio::spawn(park(self.inner.clone(), slots));
    }

    fn set(&self, limit: usize) {
        let Some((_, max)) = self.inner.slots.get() else {
            return;
        };
        if self.inner.limit.swap(limit, Ordering::Relaxed) != limit {
            tracing::debug!(limit, "adaptive concurrency: reconcile slots");
            self.inner
                .want_parked
                .store(max.saturating_sub(limit), Ordering::Relaxed);
            self.inner.changed.notify_one();
        }
    }

    /// One answer of the API server, `latency` after its request, a 429 or not.
    fn answered(&self, latency: Duration, throttled: bool) {
        let Some((slots, _)) = self.inner.slots.get() else {
            return;
        };
        let saturated = slots.available_permits() == 0;
        let limit = {
            let mut rule = self.inner.rule.lock().unwrap_or_else(|e| e.into_inner());
            match rule.as_mut() {
                Some(r) => r.answer(latency, throttled, saturated),
                None => return,
            }
        };
        self.set(limit);
    }
}

/// Holds back as many slots as the limit leaves out: takes them as reconciles give them back,
/// and gives them back when the limit rises. Ends when the slots close (the runtime stopped).
async fn park(inner: Arc<Inner>, slots: Arc<Semaphore>) {
    loop {
        if slots.is_closed() {
            return;
        }
        let want = inner.want_parked.load(Ordering::Relaxed);
        let have = inner.parked.lock().unwrap_or_else(|e| e.into_inner()).len();
        if have > want {
            inner
                .parked
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .truncate(want);
            continue;
        }
        let tick = tokio::time::sleep(Duration::from_secs(1));
        if have < want {
            tokio::select! {
                permit = slots.clone().acquire_owned() => match permit {
                    Ok(p) => inner.parked.lock().unwrap_or_else(|e| e.into_inner()).push(p),
                    Err(_) => return,
                },
                _ = inner.changed.notified() => {}
                _ = tick => {}
            }
        } else {
            tokio::select! {
                _ = inner.changed.notified() => {}
                _ = tick => {}
            }
        }
    }
}

impl<S> tower::Layer<S> for AdaptiveConcurrency {
    type Service = AdaptiveService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        AdaptiveService {
            inner,
            limit: self.clone(),
        }
    }
}

/// The service of [`AdaptiveConcurrency`]: times each request to its answer's headers.
#[derive(Clone, Debug)]
pub struct AdaptiveService<S> {
    inner: S,
    limit: AdaptiveConcurrency,
}

impl<S, B, R> tower::Service<http::Request<B>> for AdaptiveService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        // A watch's answer comes when its stream starts: no measure of the server's load.
        let watch = req
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
        let limit = self.limit.clone();
        let sent = Instant::now();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let res = fut.await;
            if !watch && let Ok(r) = &res {
                let throttled = r.status() == http::StatusCode::TOO_MANY_REQUESTS;
                limit.answered(sent.elapsed(), throttled);
            }
            res
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_slots_follow_the_limit_down_and_up() {
        let slots = Arc::new(Semaphore::new(32));
        let adaptive = AdaptiveConcurrency::new(AimdPolicy {
            initial: 16,
            ..AimdPolicy::default()
        });
        adaptive.attach(slots.clone(), 32);
        let settled = |want: usize| {
            let slots = slots.clone();
            async move {
                tokio::time::timeout(Duration::from_secs(60), async {
                    while slots.available_permits() != want {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                })
                .await
                .unwrap_or_else(|_| panic!("{} slots free, not {want}", slots.available_permits()))
            }
        };
        settled(16).await;
        assert_eq!(adaptive.limit(), 16);
        // A 429 while reconciles hold every slot: half the limit, once they give theirs back.
        let held = slots.clone().acquire_many_owned(16).await.unwrap();
        adaptive.answered(Duration::from_millis(2), true);
        assert_eq!(adaptive.limit(), 8);
        drop(held);
        settled(8).await;
        // Prompt answers while the 8 are in use: it grows again, one a round.
        let held = slots.clone().acquire_many_owned(8).await.unwrap();
        for _ in 0..40 {
            adaptive.answered(Duration::from_millis(2), false);
        }
        assert!(adaptive.limit() > 8, "{}", adaptive.limit());
        drop(held);
        settled(adaptive.limit()).await;
    }
}
