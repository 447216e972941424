//! Faults injected into the operator's own API client: a tower layer under kube's client that
//! answers some requests itself, the way a loaded or flaky apiserver does, loses the answers of
//! some writes that did land, and breaks some watch streams.
//!
//! A request that is not a watch may be delayed, and may be answered with a `500
//! InternalError`, a `429 TooManyRequests` with `Retry-After: 1`, or (writes to existing
//! objects: PUT and PATCH) a `409 Conflict`, each without reaching the apiserver. A write (POST,
//! PUT, PATCH, DELETE) may instead reach the apiserver and have its answer lost: held past the
//! operator's write timeout ([`super::operator::WRITE_TIMEOUT`]), then answered `504` — the
//! write landed, the client cannot know.
//!
//! A watch stream may be cut in the middle of an event (half of one of its first data frames,
//! then an error); a resumed watch (one from a resourceVersion) may be answered with the
//! `410 Expired` error event kube-apiserver sends when that version is too old, so the watcher
//! lists again; and a watch may stall: a bookmark at the version it resumes from, then nothing
//! for a few seconds, then the apiserver's events as they came, in order.
//!
//! Decisions come from one generator seeded by `--seed`, in the order requests are made.
//!
//! The in-process cluster has its own fault injection (`actorcile::cluster::Faults`); this layer
//! is for a real apiserver, where only the client can be made to fail on purpose.

use std::future::Future;
use std::pin::Pin;
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
    /// Fraction of writes that reach the apiserver and whose answer is lost (held past the
    /// operator's write timeout, then `504`)
    #[arg(long, default_value_t = 0.02, value_parser = super::fraction)]
    pub api_lost_answer_rate: f64,
    /// Fraction of watch streams cut in the middle of an event
    #[arg(long, default_value_t = 0.3, value_parser = super::fraction)]
    pub watch_cut_rate: f64,
    /// Fraction of resumed watches answered `410 Expired` (the watcher lists again)
    #[arg(long, default_value_t = 0.3, value_parser = super::fraction)]
    pub watch_expire_rate: f64,
    /// Fraction of watch streams that stall: a bookmark, then nothing for 2–8 s, then their
    /// events
    #[arg(long, default_value_t = 0.2, value_parser = super::fraction)]
    pub watch_stall_rate: f64,
}

impl ApiFaultRates {
    /// The same rates as command-line arguments (for the operator's process).
    pub fn command_line(self) -> Vec<String> {
        [
            ("--api-error-rate", self.api_error_rate.to_string()),
            ("--api-conflict-rate", self.api_conflict_rate.to_string()),
            ("--api-throttle-rate", self.api_throttle_rate.to_string()),
            ("--api-latency-ms", self.api_latency_ms.to_string()),
            (
                "--api-lost-answer-rate",
                self.api_lost_answer_rate.to_string(),
            ),
            ("--watch-cut-rate", self.watch_cut_rate.to_string()),
            ("--watch-expire-rate", self.watch_expire_rate.to_string()),
            ("--watch-stall-rate", self.watch_stall_rate.to_string()),
        ]
        .into_iter()
        .flat_map(|(k, v)| [k.to_string(), v])
        .collect()
    }
}

/// What the layer does with one request.
#[derive(Debug, Clone, PartialEq)]
enum Fate {
    /// Answered with this status after the delay, without reaching the apiserver.
    Answer(Duration, StatusCode),
    /// A watch answered with a `410 Expired` error event at once.
    Expire,
    /// Sent to the apiserver.
    Through(Through),
}

/// What the layer does with a request it sends.
#[derive(Debug, Clone, PartialEq)]
enum Through {
    /// Sent after the delay, its answer passed on.
    Pass(Duration),
    /// Sent after the delay; its answer held past the write timeout, then a `504`.
    Lose(Duration),
    /// A watch whose stream is cut in the middle of its data frame number `n` (from 0).
    Cut(usize),
    /// A watch whose stream starts with a bookmark at this resourceVersion (none if empty),
    /// then is silent for the duration before its events flow.
    Stall(String, Duration),
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

    /// The fate of one request (recorded when it is a fault).
    fn decide<B>(&self, req: &Request<B>) -> Fate {
        let query = req.uri().query().unwrap_or("");
        let param = |name: &str| {
            query
                .split('&')
                .find_map(|p| p.strip_prefix(name)?.strip_prefix('='))
        };
        let watch = matches!(param("watch"), Some("true" | "1"));
        let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        let r = &self.rates;
        let fate = if watch {
            let resumes = param("resourceVersion").filter(|v| !v.is_empty() && *v != "0");
            let roll = rng.f64();
            if roll < r.watch_cut_rate {
                Fate::Through(Through::Cut(rng.usize(0..4)))
            } else if roll < r.watch_cut_rate + r.watch_expire_rate && resumes.is_some() {
                Fate::Expire
            } else if roll < r.watch_cut_rate + r.watch_expire_rate + r.watch_stall_rate {
                let stall = Duration::from_millis(rng.u64(2000..=8000));
                Fate::Through(Through::Stall(
                    resumes.unwrap_or_default().to_string(),
                    stall,
                ))
            } else {
                Fate::Through(Through::Pass(Duration::ZERO))
            }
        } else {
            let method = req.method();
            let update = matches!(*method, http::Method::PUT | http::Method::PATCH);
            let write = update || matches!(*method, http::Method::POST | http::Method::DELETE);
            let delay = Duration::from_millis(rng.u64(0..=r.api_latency_ms));
            let roll = rng.f64();
            let (e, t) = (r.api_error_rate, r.api_throttle_rate);
            if roll < e {
                Fate::Answer(delay, StatusCode::INTERNAL_SERVER_ERROR)
            } else if roll < e + t {
                Fate::Answer(delay, StatusCode::TOO_MANY_REQUESTS)
            } else if update && rng.f64() < r.api_conflict_rate {
                Fate::Answer(delay, StatusCode::CONFLICT)
            } else if write && rng.f64() < r.api_lost_answer_rate {
                Fate::Through(Through::Lose(delay))
            } else {
                Fate::Through(Through::Pass(delay))
            }
        };
        let kind = match &fate {
            Fate::Through(Through::Pass(_)) => None,
            Fate::Answer(_, code) => Some(format!("api-{}", code.as_u16())),
            Fate::Expire => Some("watch-expired".to_string()),
            Fate::Through(Through::Lose(_)) => Some("lost-answer".to_string()),
            Fate::Through(Through::Cut(_)) => Some("watch-cut".to_string()),
            Fate::Through(Through::Stall(..)) => Some("watch-stalled".to_string()),
        };
        if let (Some(kind), Some(record)) = (kind, &self.record) {
            record.0.write(format_args!("fault {kind} {}", record.1));
        }
        fate
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
        StatusCode::GATEWAY_TIMEOUT => "Timeout",
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
        .body(full(body.to_string()))
        .expect("a static status answer is a valid response")
}

/// A whole body of `text`.
fn full(text: String) -> ResponseBody {
    Box::new(
        http_body_util::Full::new(Bytes::from(text))
            .map_err(|never| -> BoxError { match never {} }),
    )
}

/// The stream of a watch that kube-apiserver answers when its resourceVersion is too old.
fn expired_watch() -> Response<ResponseBody> {
    let event = serde_json::json!({
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "injected by actorcile chaos: too old resource version",
            "reason": "Expired",
            "code": 410,
        },
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(full(format!("{event}\n")))
        .expect("a static watch answer is a valid response")
}

/// A watch body cut in the middle of its data frame number `at`: half of that frame, then an
/// error.
struct CutBody {
    inner: ResponseBody,
    at: usize,
    /// `None` once cut: the error is due; `Some(true)` once it was given.
    state: Option<bool>,
}

impl http_body::Body for CutBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        match self.state {
            Some(true) => return Poll::Ready(None),
            None => {
                self.state = Some(true);
                return Poll::Ready(Some(Err("watch stream cut by actorcile chaos".into())));
            }
            Some(false) => {}
        }
        let frame = match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            other => return other,
        };
        let Some(data) = frame.data_ref().filter(|d| !d.is_empty()) else {
            return Poll::Ready(Some(Ok(frame)));
        };
        if self.at > 0 {
            self.at -= 1;
            return Poll::Ready(Some(Ok(frame)));
        }
        let half = data.slice(..data.len() / 2);
        self.state = None;
        Poll::Ready(Some(Ok(http_body::Frame::data(half))))
    }
}

/// A watch body that starts with `first` (a bookmark), then is silent until `until`, then is
/// the apiserver's.
struct StalledBody {
    inner: ResponseBody,
    first: Option<Bytes>,
    until: Pin<Box<tokio::time::Sleep>>,
}

impl http_body::Body for StalledBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(http_body::Frame::data(first))));
        }
        if self.until.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        Pin::new(&mut self.inner).poll_frame(cx)
    }
}

/// A bookmark at `resource_version` (kube's watcher reads only its version; it is where the
/// watch resumes from, so nothing moves).
fn bookmark(resource_version: &str) -> Bytes {
    let event = serde_json::json!({
        "type": "BOOKMARK",
        "object": {"apiVersion": "", "kind": "", "metadata": {"resourceVersion": resource_version}},
    });
    Bytes::from(format!("{event}\n"))
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
        // An injected answer never calls the inner service (its readiness goes unused, which
        // tower allows); a request that goes through is sent when its future is first polled,
        // after the delay.
        let sent = match self.faults.decide(&req) {
            Fate::Answer(delay, code) => Err((delay, status_answer(code))),
            Fate::Expire => Err((Duration::ZERO, expired_watch())),
            Fate::Through(through) => Ok((through, self.inner.call(req))),
        };
        Box::pin(async move {
            let (through, sent) = match sent {
                Err((delay, answer)) => {
                    tokio::time::sleep(delay).await;
                    return Ok(answer);
                }
                Ok(sent) => sent,
            };
            match through {
                Through::Pass(delay) => {
                    tokio::time::sleep(delay).await;
                    sent.await
                }
                Through::Lose(delay) => {
                    tokio::time::sleep(delay).await;
                    // The write lands; whatever the apiserver answered is lost.
                    drop(sent.await);
                    tokio::time::sleep(super::operator::WRITE_TIMEOUT + Duration::from_secs(1))
                        .await;
                    Ok(status_answer(StatusCode::GATEWAY_TIMEOUT))
                }
                Through::Cut(at) => Ok(sent.await?.map(|inner| {
                    Box::new(CutBody {
                        inner,
                        at,
                        state: Some(false),
                    }) as ResponseBody
                })),
                Through::Stall(version, stall) => Ok(sent.await?.map(|inner| {
                    Box::new(StalledBody {
                        inner,
                        first: (!version.is_empty()).then(|| bookmark(&version)),
                        until: Box::pin(tokio::time::sleep(stall)),
                    }) as ResponseBody
                })),
            }
        })
    }
}
