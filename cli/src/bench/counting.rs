//! A tower layer that counts the HTTP requests a `kube::Client` sends (every list, watch, get,
//! patch… counts as one request, including each watch connection).

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
};

use tower::{Layer, Service};

/// A shared count of requests; clones count into the same total.
#[derive(Debug, Clone, Default)]
pub struct RequestCounter(Arc<AtomicU64>);

impl RequestCounter {
    /// A counter at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Requests counted so far.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    fn add(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
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

/// Service that counts each call, then forwards it unchanged.
#[derive(Debug, Clone)]
pub struct Counting<S> {
    inner: S,
    counter: RequestCounter,
}

impl<S, R> Service<R> for Counting<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        self.counter.add();
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http::{Request, Response};
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::{Api, Client, client::Body};
    use std::convert::Infallible;
    use tower::ServiceExt;

    #[tokio::test]
    async fn counts_each_call_and_forwards() {
        let counter = RequestCounter::new();
        let mut svc =
            CountingLayer::new(counter.clone()).layer(tower::service_fn(|x: u32| async move {
                Ok::<_, Infallible>(x * 2)
            }));
        assert_eq!(counter.get(), 0);
        for i in 0..3u32 {
            let out = svc.ready().await.unwrap().call(i).await.unwrap();
            assert_eq!(out, i * 2);
        }
        assert_eq!(counter.get(), 3);
        // A clone of the service counts into the same total.
        let mut clone = svc.clone();
        clone.ready().await.unwrap().call(1).await.unwrap();
        assert_eq!(counter.get(), 4);
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
