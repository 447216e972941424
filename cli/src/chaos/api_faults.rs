//! Faults injected into the operator's own API client: a tower layer under kube's client that
//! answers some requests itself, the way a loaded or flaky apiserver does, before they reach the
//! network.
//!
//! Watches pass untouched (their breaks come from restarting the control plane). Every other
//! request may be delayed, and may be answered with a `500 InternalError`, a
//! `429 TooManyRequests` with `Retry-After: 1`, or (writes to existing objects: PUT and PATCH)
//! a `409 Conflict`, each without reaching the apiserver. Decisions come from one generator
//! seeded by `--seed`, in the order requests are made.
//!
//! The in-process cluster has its own fault injection (`actorcile::cluster::Faults`); this layer
//! is for a real apiserver, where only the client can be made to fail on purpose.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;

use super::lines::Lines;

/// How often each fault is injected.
#[derive(Clone, Copy, Debug, Default, clap::Args, serde::Serialize, serde::Deserialize)]
pub struct ApiFaultRates {
    /// Fraction of non-watch requests answered `500 InternalError`
    #[arg(long, default_value_t = 0.05, value_parser = super::fraction)]
    pub api_error_rate: f64,
    /// Fraction of updates and patches answered `409 Conflict`
    #[arg(long, default_value_t = 0.05, value_parser = super::fraction)]
    pub api_conflict_rate: f64,
    /// Fraction of non-watch requests answered `429 TooManyRequests` with `Retry-After: 1`
    #[arg(long, default_value_t = 0.02, value_parser = super::fraction)]
    pub api_throttle_rate: f64,
    /// Most latency added to a non-watch request, in milliseconds (uniform in [0, this])
    #[arg(long, default_value_t = 20)]
    pub api_latency_ms: u64,
}

/// The layer; see the module docs.
#[derive(Clone)]
pub struct ApiFaults {
    rates: ApiFaultRates,
    rng: Arc<Mutex<fastrand::Rng>>,
    record: Option<Arc<(Lines, u32)>>,
}

impl ApiFaults {
    /// Faults at `rates`, decided by a generator seeded with `seed`.
    pub fn new(rates: ApiFaultRates, seed: u64) -> Self {
        Self {
            rates,
            rng: Arc::new(Mutex::new(fastrand::Rng::with_seed(seed))),
            record: None,
        }
    }

    /// Also append a line `fault api-<status> <incarnation>` to `lines` for every answer
    /// injected.
    pub fn record(mut self, lines: Lines, incarnation: u32) -> Self {
        self.record = Some(Arc::new((lines, incarnation)));
        self
    }

    /// The decision for one request: a delay, and an answer in place of the apiserver's.
    fn decide<B>(&self, req: &Request<B>) -> (Duration, Option<StatusCode>) {
        let watch = req
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
        let write = matches!(*req.method(), http::Method::PUT | http::Method::PATCH);
        if watch {
            return (Duration::ZERO, None);
        }
        let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        let delay = Duration::from_millis(rng.u64(0..=self.rates.api_latency_ms));
        let roll = rng.f64();
        let (e, t) = (self.rates.api_error_rate, self.rates.api_throttle_rate);
        let answer = if roll < e {
            Some(StatusCode::INTERNAL_SERVER_ERROR)
        } else if roll < e + t {
            Some(StatusCode::TOO_MANY_REQUESTS)
        } else if write && rng.f64() < self.rates.api_conflict_rate {
            Some(StatusCode::CONFLICT)
        } else {
            None
        };
        if let (Some(code), Some(record)) = (answer, &self.record) {
            record
                .0
                .write(format_args!("fault api-{} {}", code.as_u16(), record.1));
        }
        (delay, answer)
    }
}

/// Errors of a response body under kube's client stack.
type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// A response body under kube's client stack (what its layers see).
type ResponseBody = Box<dyn http_body::Body<Data = Bytes, Error = BoxError> + Send + Unpin>;

/// A `Status` answer as kube-apiserver writes one.
fn status_answer(code: StatusCode) -> Response<ResponseBody> {
    let reason = match code {
        StatusCode::CONFLICT => "Conflict",
        StatusCode::TOO_MANY_REQUESTS => "TooManyRequests",
        _ => "InternalError",
    };
    let body = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": format!("injected by actorcile chaos: {reason}"),
        "reason": reason,
        "code": code.as_u16(),
    });
    let mut answer = Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "application/json");
    if code == StatusCode::TOO_MANY_REQUESTS {
        answer = answer.header(http::header::RETRY_AFTER, "1");
    }
    answer
        .body(Box::new(
            http_body_util::Full::new(Bytes::from(body.to_string()))
                .map_err(|never| -> BoxError { match never {} }),
        ) as ResponseBody)
        .expect("a static status answer is a valid response")
}

impl<S> tower::Layer<S> for ApiFaults {
    type Service = ApiFaultsService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        ApiFaultsService {
            faults: self.clone(),
            inner,
        }
    }
}

/// The service of [`ApiFaults`].
#[derive(Clone)]
pub struct ApiFaultsService<S> {
    faults: ApiFaults,
    inner: S,
}

impl<S, B> tower::Service<Request<B>> for ApiFaultsService<S>
where
    S: tower::Service<Request<B>, Response = Response<ResponseBody>>,
    S::Future: Send + 'static,
{
    type Response = Response<ResponseBody>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Response<ResponseBody>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let (delay, answer) = self.faults.decide(&req);
        // An injected answer never calls the inner service (its readiness goes unused, which
        // tower allows); a request that goes through is sent when its future is first polled,
        // after the delay.
        let sent = match answer {
            Some(_) => None,
            None => Some(self.inner.call(req)),
        };
        Box::pin(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            match (answer, sent) {
                (_, Some(sent)) => sent.await,
                (code, None) => Ok(status_answer(
                    code.unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                )),
            }
        })
    }
}
