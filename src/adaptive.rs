//! Adaptive concurrency: a reconcile-slot limit that follows what the API server can take,
//! instead of a fixed `max_concurrent_reconciles` chosen in advance. Too many reconciles at
//! once and kube-apiserver's API Priority and Fairness queues their requests and then answers
//! 429, and every request waits longer; too few and objects wait for slots while the server
//! idles.
//!
//! [`AdaptiveConcurrency`] is a tower layer for the runtime's client (it sees every API answer:
//! its latency, whether it was a 429, and how many requests were in flight) and the limit the
//! runtime's reconcile slots follow. Once a round (as many answers as the limit) the limit
//! moves: halved after a 429; a tenth lower when the server queues more than
//! [`AimdPolicy::queue_tolerance`] × log10(limit) of its requests (estimated as TCP Vegas
//! does, from the round's mean latency against the fastest recent answer); one higher when the
//! slots were in use and next to nothing queued; between [`AimdPolicy::min`] and the policy's
//! `max_concurrent_reconciles`. Opt-in: without it the slots are fixed.
//!
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! use actorcile::adaptive::{AdaptiveConcurrency, AimdPolicy};
//! use actorcile::prelude::*;
//!
//! let adaptive = AdaptiveConcurrency::new(AimdPolicy::default());
//! // kube's client with its retries of 429s above the adaptive layer, which so sees each one.
//! let client = adaptive.client(kube::Config::infer().await?)?;
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
    /// A queue past the tolerance multiplies it by this (default 0.9).
    pub on_queue: f64,
    /// How many of the runtime's requests may wait at the server, per decade of the limit,
    /// before the limit goes down (default 6: 7 queued at 16 slots, 11 at 64); below half
    /// that the limit may grow. The queue is the requests in flight times
    /// `1 - fastest recent answer / a round's mean latency`.
    pub queue_tolerance: f64,
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
            on_queue: 0.9,
            queue_tolerance: 6.0,
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
    /// Slots to hold back from reconciles (`max - limit`), which the parking task holds as
    /// reconciles give them back.
    want_parked: AtomicUsize,
    changed: Notify,
    limit: AtomicUsize,
    /// Requests sent through the layer and not answered yet (watches not counted).
    in_flight: AtomicUsize,
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
                want_parked: AtomicUsize::new(0),
                changed: Notify::new(),
                limit: AtomicUsize::new(0),
                in_flight: AtomicUsize::new(0),
            }),
        }
    }

    /// A client for `config` whose every request this limit sees: kube's default stack with
    /// its retries of 429, 503 and 504 answers moved outside this layer. Inside it (where
    /// [`ClientBuilder::with_layer`](kube::client::ClientBuilder::with_layer) alone leaves
    /// them), a 429 is retried before this layer sees it and reaches it only as a slow answer.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// use actorcile::adaptive::{AdaptiveConcurrency, AimdPolicy};
    ///
    /// let adaptive = AdaptiveConcurrency::new(AimdPolicy::default());
    /// let client = adaptive.client(kube::Config::infer().await?)?;
    /// # let _ = client;
    /// # Ok(()) }
    /// ```
    pub fn client(&self, config: kube::Config) -> Result<kube::Client, kube::Error> {
        self.client_with(config, tower::layer::util::Identity::new())
    }

    /// [`client`](Self::client) with `layer` between kube's stack and this limit's layer, so
    /// that it too sees every attempt of a retried request: the runtime's
    /// [`ApiMetrics`](crate::metrics::ApiMetrics), say.
    pub fn client_with<L, B>(
        &self,
        mut config: kube::Config,
        layer: L,
    ) -> Result<kube::Client, kube::Error>
    where
        L: tower::Layer<KubeStack>,
        L::Service: tower::Service<
                http::Request<kube::client::Body>,
                Response = http::Response<B>,
                Error = tower::BoxError,
            > + Send
            + 'static,
        <L::Service as tower::Service<http::Request<kube::client::Body>>>::Future: Send + 'static,
        B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
        B::Error: Into<tower::BoxError>,
    {
        config.default_retry = false;
        Ok(kube::client::ClientBuilder::try_from(config)?
            .with_layer(&layer)
            .with_layer(self)
            // The retries clone the service under them; kube's own stack is not `Clone`.
            .with_layer(&tower::buffer::BufferLayer::new(1024))
            .with_layer(&tower::retry::RetryLayer::new(
                kube::client::retry::RetryPolicy::server_retry(),
            ))
            .build())
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
            on_queue: p.on_queue.clamp(0.05, 1.0),
            queue_tolerance: p.queue_tolerance.max(0.5),
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

    /// One answer of the API server, `latency` after its request, a 429 or not, `in_flight`
    /// requests out (this one included).
    fn answered(&self, latency: Duration, throttled: bool, in_flight: usize) {
        let Some((slots, _)) = self.inner.slots.get() else {
            return;
        };
        let saturated = slots.available_permits() == 0;
        let limit = {
            let mut rule = self.inner.rule.lock().unwrap_or_else(|e| e.into_inner());
            match rule.as_mut() {
                Some(r) => r.answer(latency, throttled, saturated, in_flight),
                None => return,
            }
        };
        self.set(limit);
    }
}

/// Holds back as many slots as the limit leaves out, and gives them back when the limit
/// rises. Ends when the slots close (the runtime stopped).
///
/// When the limit falls, it waits for the slots it left out in one request: tokio's semaphore
/// is fair, so the slots reconciles give back go to it before any other reconcile starts, and
/// the reconciles running come down to the limit as fast as they end. It keeps its place in
/// line while the limit falls further, and asks for the rest after.
async fn park(inner: Arc<Inner>, slots: Arc<Semaphore>) {
    let mut parked: Option<OwnedSemaphorePermit> = None;
    loop {
        let have = parked.as_ref().map_or(0, OwnedSemaphorePermit::num_permits);
        let want = inner.want_parked.load(Ordering::Relaxed);
        if have > want {
            match parked.as_mut() {
                Some(p) if want > 0 => drop(p.split(have - want)),
                _ => parked = None,
            }
            continue;
        }
        if have == want {
            if slots.is_closed() {
                return;
            }
            tokio::select! {
                _ = inner.changed.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            continue;
        }
        let need = want - have;
        let acquire = slots
            .clone()
            .acquire_many_owned(u32::try_from(need).unwrap_or(u32::MAX));
        tokio::pin!(acquire);
        loop {
            tokio::select! {
                got = &mut acquire => {
                    let Ok(got) = got else { return };
                    match parked.as_mut() {
                        Some(p) => p.merge(got),
                        None => parked = Some(got),
                    }
                    break;
                }
                _ = inner.changed.notified() => {
                    // The limit rose meanwhile: ask again for fewer.
                    if inner.want_parked.load(Ordering::Relaxed) < want {
                        break;
                    }
                }
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

/// The service [`ClientBuilder::try_from`](kube::client::ClientBuilder) builds from a
/// `kube::Config`: what the layer given to [`AdaptiveConcurrency::client_with`] wraps.
pub type KubeStack = tower::util::BoxService<
    http::Request<kube::client::Body>,
    http::Response<Box<kube::client::DynBody>>,
    tower::BoxError,
>;

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
        let out = (!watch).then(|| InFlight::new(&limit.inner));
        let fut = self.inner.call(req);
        Box::pin(async move {
            let res = fut.await;
            if let Some(out) = out
                && let Ok(r) = &res
            {
                let throttled = r.status() == http::StatusCode::TOO_MANY_REQUESTS;
                limit.answered(sent.elapsed(), throttled, out.count());
            }
            res
        })
    }
}

/// One request counted in flight until it is answered or dropped.
struct InFlight(Arc<Inner>);

impl InFlight {
    fn new(inner: &Arc<Inner>) -> Self {
        inner.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(inner.clone())
    }

    /// The requests in flight now, this one included.
    fn count(&self) -> usize {
        self.0.in_flight.load(Ordering::Relaxed)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
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
        adaptive.answered(Duration::from_millis(2), true, 16);
        assert_eq!(adaptive.limit(), 8);
        drop(held);
        settled(8).await;
        // Prompt answers while the 8 are in use: it grows again, one a round.
        let held = slots.clone().acquire_many_owned(8).await.unwrap();
        for _ in 0..40 {
            adaptive.answered(Duration::from_millis(2), false, 8);
        }
        assert!(adaptive.limit() > 8, "{}", adaptive.limit());
        drop(held);
        settled(adaptive.limit()).await;
    }
}
