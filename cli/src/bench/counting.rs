//! A tower layer that counts the HTTP requests a `kube::Client` sends (every list, watch, get,
//! patch… counts as one request, including each watch connection), and times the runtime's
//! status writes: from the first status write sent to the last one answered.

use std::{
    future::Future,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Instant,
};

use futures::future::Either;
use http::{Method, Request, Response};
use tower::{Layer, Service};

/// When the status writes of a client happened.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StatusWrites {
    /// Status writes answered with success.
    pub count: u64,
    /// When the first status write (successful or not) was sent.
    pub first_sent: Option<Instant>,
    /// When the last successful status write was answered.
    pub last_answered: Option<Instant>,
}

impl StatusWrites {
    /// Seconds from the first status write sent to the last one answered (`None` without a
    /// successful status write).
    pub fn window_seconds(&self) -> Option<f64> {
        let (first, last) = (self.first_sent?, self.last_answered?);
        Some(last.saturating_duration_since(first).as_secs_f64())
    }
}

#[derive(Debug, Default)]
struct Shared {
    requests: AtomicU64,
    /// Wall-clock microseconds of the last watch request sent (0: none yet).
    watch_sent_micros: AtomicU64,
    status_writes: Mutex<StatusWrites>,
}

/// A shared count of requests and record of status writes; clones count into the same total.
#[derive(Debug, Clone, Default)]
pub struct RequestCounter(Arc<Shared>);

impl RequestCounter {
    /// A counter at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Requests counted so far.
    pub fn get(&self) -> u64 {
        self.0.requests.load(Ordering::Relaxed)
    }

    /// When the last watch request was sent, in wall-clock microseconds (`None` before any):
    /// the runtime sees changes written after this through its watch.
    pub fn last_watch_sent_micros(&self) -> Option<u64> {
        Some(self.0.watch_sent_micros.load(Ordering::Acquire)).filter(|&at| at > 0)
    }

    /// The status writes seen so far.
    pub fn status_writes(&self) -> StatusWrites {
        *self
            .0
            .status_writes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn add(&self) {
        self.0.requests.fetch_add(1, Ordering::Relaxed);
    }

    fn status_write_sent(&self, at: Instant) {
        let mut w = self
            .0
            .status_writes
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        w.first_sent.get_or_insert(at);
    }

    fn status_write_answered(&self, at: Instant) {
        let mut w = self
            .0
            .status_writes
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        w.count += 1;
        w.last_answered = Some(w.last_answered.map_or(at, |last| last.max(at)));
    }
}

/// Whether `req` writes a status subresource (a PATCH or PUT of `…/status`).
pub fn is_status_write<B>(req: &Request<B>) -> bool {
    matches!(*req.method(), Method::PATCH | Method::PUT) && req.uri().path().ends_with("/status")
}

/// Whether `req` opens a watch (`watch=true` or `watch=1` in its query).
pub fn is_watch<B>(req: &Request<B>) -> bool {
    req.uri()
        .query()
        .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"))
}

/// Layer that wraps a service in [`Counting`].
#[derive(Debug, Clone, Default)]
pub struct CountingLayer {
    counter: RequestCounter,
}

impl CountingLayer {
    /// A layer that counts into `counter`.
    pub fn new(counter: RequestCounter) -> Self {
        Self { counter }
    }
}

impl<S> Layer<S> for CountingLayer {
    type Service = Counting<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Counting {
            inner,
            counter: self.counter.clone(),
        }
    }
}

/// Service that counts each call (and times status writes), then forwards it unchanged.
#[derive(Debug, Clone)]
pub struct Counting<S> {
    inner: S,
    counter: RequestCounter,
}

/// A status write's response future, which notes when the write was answered.
type Timed<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, B, RB> Service<Request<B>> for Counting<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    RB: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Either<S::Future, Timed<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        self.counter.add();
        if is_watch(&req) {
            let at = super::workload::wall_micros();
            self.counter
                .0
                .watch_sent_micros
                .store(at, Ordering::Release);
        }
        if !is_status_write(&req) {
            return Either::Left(self.inner.call(req));
        }
        self.counter.status_write_sent(Instant::now());
        let counter = self.counter.clone();
        let response = self.inner.call(req);
        Either::Right(Box::pin(async move {
            let response = response.await;
            if matches!(&response, Ok(r) if r.status().is_success()) {
                counter.status_write_answered(Instant::now());
            }
            response
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::{Api, Client, client::Body};
    use std::convert::Infallible;
    use tower::ServiceExt;

    fn request(method: Method, path: &str) -> Request<()> {
        Request::builder()
            .method(method)
            .uri(path)
            .body(())
            .unwrap()
    }

    #[tokio::test]
    async fn counts_each_call_and_forwards() {
        let counter = RequestCounter::new();
        let mut svc =
            CountingLayer::new(counter.clone()).layer(tower::service_fn(
                |req: Request<()>| async move {
                    Ok::<_, Infallible>(Response::new(req.uri().path().len()))
                },
            ));
        assert_eq!(counter.get(), 0);
        for path in ["/a", "/bb", "/ccc"] {
            let out = svc
                .ready()
                .await
                .unwrap()
                .call(request(Method::GET, path))
                .await
                .unwrap();
            assert_eq!(*out.body(), path.len());
        }
        assert_eq!(counter.get(), 3);
        // A clone of the service counts into the same total.
        let mut clone = svc.clone();
        clone
            .ready()
            .await
            .unwrap()
            .call(request(Method::GET, "/d"))
            .await
            .unwrap();
        assert_eq!(counter.get(), 4);
        assert_eq!(counter.status_writes(), StatusWrites::default());
    }

    #[test]
    fn recognises_status_writes() {
        let status = "/apis/g/v1/namespaces/ns/things/a/status";
        assert!(is_status_write(&request(Method::PATCH, status)));
        assert!(is_status_write(&request(Method::PUT, status)));
        assert!(!is_status_write(&request(Method::GET, status)));
        assert!(!is_status_write(&request(
            Method::PATCH,
            "/apis/g/v1/namespaces/ns/things/a"
        )));
        assert!(!is_status_write(&request(
            Method::PATCH,
            "/api/v1/namespaces/ns/configmaps/status-child"
        )));
    }

    #[tokio::test]
    async fn times_status_writes_from_first_sent_to_last_answered() {
        let counter = RequestCounter::new();
        // Status writes take 20 ms to answer; a write of `…/fail/status` is refused.
        let mut svc = CountingLayer::new(counter.clone()).layer(tower::service_fn(
            |req: Request<()>| async move {
                let mut response = Response::new(());
                if is_status_write(&req) {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    if req.uri().path().contains("/fail/") {
                        *response.status_mut() = http::StatusCode::CONFLICT;
                    }
                }
                Ok::<_, Infallible>(response)
            },
        ));
        assert_eq!(counter.status_writes().window_seconds(), None);
        let before = Instant::now();
        let first = svc
            .ready()
            .await
            .unwrap()
            .call(request(Method::PATCH, "/x/a/status"));
        let second = svc
            .ready()
            .await
            .unwrap()
            .call(request(Method::PATCH, "/x/b/status"));
        let (a, b) = futures::join!(first, second);
        a.unwrap();
        b.unwrap();
        let after_writes = Instant::now();
        svc.ready()
            .await
            .unwrap()
            .call(request(Method::GET, "/x/a"))
            .await
            .unwrap();
        svc.ready()
            .await
            .unwrap()
            .call(request(Method::PATCH, "/x/fail/status"))
            .await
            .unwrap();
        let w = counter.status_writes();
        assert_eq!(counter.get(), 4);
        assert_eq!(w.count, 2, "the refused write is not counted");
        let first_sent = w.first_sent.unwrap();
        let last = w.last_answered.unwrap();
        assert!(first_sent >= before && last <= after_writes, "{w:?}");
        let window = w.window_seconds().unwrap();
        assert!(
            (0.02..=after_writes.duration_since(before).as_secs_f64()).contains(&window),
            "{window}"
        );
    }

    #[tokio::test]
    async fn counts_kube_client_requests() {
        let counter = RequestCounter::new();
        let service = tower::service_fn(|req: Request<Body>| async move {
            assert_eq!(req.uri().path(), "/api/v1/namespaces/ns/configmaps/cm");
            let body = serde_json::json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "cm", "namespace": "ns"},
                "data": {"k": "v"}
            });
            Ok::<_, Infallible>(Response::new(http_body_util_full(body.to_string())))
        });
        let client = Client::new(CountingLayer::new(counter.clone()).layer(service), "ns");
        let api: Api<ConfigMap> = Api::default_namespaced(client);
        let cm = tokio::time::timeout(std::time::Duration::from_secs(10), api.get("cm"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(cm.data.unwrap()["k"], "v");
        assert_eq!(counter.get(), 1);
        let _ = api.get("cm").await.unwrap();
        assert_eq!(counter.get(), 2);
    }

    fn http_body_util_full(s: String) -> Body {
        Body::from(Bytes::from(s))
    }
}
