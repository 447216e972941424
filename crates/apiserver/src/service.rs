//! The HTTP face of the cluster: a `tower::Service` that routes Kubernetes API requests to the store.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::Inner;
use super::apply;
use super::error::ApiError;
use super::kinds::Kind;
use super::routing::{Route, Target, Verb, delete_opts, list_opts, parse_json, query_map, route};
use super::store::{Store, WriteKind};
use super::watch::{EvType, WatchItem};

/// The cluster as a `tower::Service`: hand it to [`kube::Client::new`] (or use
/// [`ApiServer::client`](super::ApiServer::client)). Cheap to clone; every clone serves the same cluster.
///
/// It accepts any request body type (`kube::client::Body`, `http_body_util::Full<Bytes>`, …) and never fails
/// at the service level: every error is an HTTP response carrying a Kubernetes `Status`.
#[derive(Clone)]
pub struct ApiService {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for ApiService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiService").finish_non_exhaustive()
    }
}

/// The response body of [`ApiService`]: a complete JSON document, or a watch stream of
/// newline-delimited `WatchEvent`s that ends when the watch times out (`timeoutSeconds`), when the client
/// drops it, or when its resource stops being served.
pub struct ApiBody {
    inner: BodyInner,
}

impl std::fmt::Debug for ApiBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiBody").finish_non_exhaustive()
    }
}

enum BodyInner {
    Full(Option<Bytes>),
    Watch(WatchBody),
}

struct WatchBody {
    frames: VecDeque<Bytes>,
    rx: Option<mpsc::UnboundedReceiver<WatchItem>>,
    deadline: Pin<Box<tokio::time::Sleep>>,
    bookmarks: Option<Bookmarks>,
}

/// How often a watch that allows bookmarks gets one (besides the one that ends it), as the real server.
const BOOKMARK_EVERY: Duration = Duration::from_secs(60);

/// What a watch needs to send `BOOKMARK` events.
struct Bookmarks {
    inner: Arc<Inner>,
    kind: String,
    api_version: String,
    next: Pin<Box<tokio::time::Sleep>>,
}

impl WatchBody {
    /// Queues a `BOOKMARK` at the current revision, after every event up to it. Events are sent under the
    /// store's lock, so draining the channel under that lock delivers all events the bookmark covers.
    fn bookmark(&mut self) {
        let (Some(b), Some(rx)) = (&self.bookmarks, self.rx.as_mut()) else {
            return;
        };
        let rev = {
            let store = b.inner.store.lock().unwrap_or_else(|p| p.into_inner());
            while let Ok(item) = rx.try_recv() {
                push_item(&mut self.frames, item);
            }
            store.revision()
        };
        let obj = json!({"kind": b.kind, "apiVersion": b.api_version,
            "metadata": {"resourceVersion": rev.to_string()}});
        let bytes = Bytes::from(serde_json::to_vec(&obj).unwrap_or_default());
        push_item(&mut self.frames, (EvType::Bookmark, bytes));
    }
}

fn push_item(frames: &mut VecDeque<Bytes>, (ty, obj): WatchItem) {
    frames.push_back(Bytes::from_static(ty.prefix()));
    frames.push_back(obj);
    frames.push_back(Bytes::from_static(b"}\n"));
}

impl http_body::Body for ApiBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match &mut self.get_mut().inner {
            BodyInner::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            BodyInner::Watch(w) => loop {
                if let Some(f) = w.frames.pop_front() {
                    return Poll::Ready(Some(Ok(Frame::data(f))));
                }
                let Some(rx) = w.rx.as_mut() else {
                    return Poll::Ready(None);
                };
                match rx.poll_recv(cx) {
                    Poll::Ready(Some(item)) => push_item(&mut w.frames, item),
                    Poll::Ready(None) => {
                        w.rx = None;
                        return Poll::Ready(None);
                    }
                    Poll::Pending => {
                        if w.deadline.as_mut().poll(cx).is_ready() {
                            w.bookmark();
                            w.rx = None;
                            continue;
                        }
                        let due = w
                            .bookmarks
                            .as_mut()
                            .is_some_and(|b| b.next.as_mut().poll(cx).is_ready());
                        if due {
                            if let Some(b) = w.bookmarks.as_mut() {
                                b.next
                                    .as_mut()
                                    .reset(tokio::time::Instant::now() + BOOKMARK_EVERY);
                            }
                            w.bookmark();
                            continue;
                        }
                        return Poll::Pending;
                    }
                }
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            BodyInner::Full(b) => b.is_none(),
            BodyInner::Watch(w) => w.rx.is_none() && w.frames.is_empty(),
        }
    }
}

fn json_response(code: u16, body: impl Into<Bytes>) -> Response<ApiBody> {
    let mut r = Response::new(ApiBody {
        inner: BodyInner::Full(Some(body.into())),
    });
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

fn error_response(e: &ApiError) -> Response<ApiBody> {
    if e.plain {
        let mut r = json_response(e.code, format!("{}\n", e.message));
        r.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        return r;
    }
    json_response(
        e.code,
        serde_json::to_vec(&e.to_status()).unwrap_or_default(),
    )
}

fn watch_response(
    first: Vec<WatchItem>,
    rx: Option<mpsc::UnboundedReceiver<WatchItem>>,
    timeout: Duration,
    bookmarks: Option<Bookmarks>,
) -> Response<ApiBody> {
    let mut frames = VecDeque::with_capacity(first.len() * 3);
    for item in first {
        push_item(&mut frames, item);
    }
    let body = WatchBody {
        frames,
        rx,
        deadline: Box::pin(tokio::time::sleep(timeout)),
        bookmarks,
    };
    let mut r = Response::new(ApiBody {
        inner: BodyInner::Watch(body),
    });
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

impl<B> tower::Service<Request<B>> for ApiService
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = Response<ApiBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ApiBody>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let inner = self.inner.clone();
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let body = match body.collect().await {
                Ok(b) => b.to_bytes(),
                Err(e) => {
                    let e: Box<dyn std::error::Error + Send + Sync> = e.into();
                    return Ok(error_response(&ApiError::bad_request(format!(
                        "reading request body: {e}"
                    ))));
                }
            };
            Ok(handle(&inner, parts, body).await)
        })
    }
}

mod admitted;
use admitted::admit_and_execute;

async fn handle(inner: &Arc<Inner>, parts: http::request::Parts, body: Bytes) -> Response<ApiBody> {
    inner.stats.total.fetch_add(1, Ordering::Relaxed);
    let q = query_map(&parts.uri);
    let target = match route(
        &inner.store.lock().unwrap_or_else(|p| p.into_inner()),
        parts.uri.path(),
    ) {
        Ok(t) => t,
        Err(e) => return error_response(&e),
    };
    let route = match target {
        Target::Document(doc) => {
            return if parts.method == Method::GET {
                json_response(200, serde_json::to_vec(&doc).unwrap_or_default())
            } else {
                error_response(&ApiError::method_not_allowed())
            };
        }
        Target::Resource(r) => r,
    };
    let is_watch = q.get("watch").is_some_and(|w| w == "true" || w == "1");
    let verb = Verb::of(&parts.method, route.name.is_some(), is_watch);
    let counter = match verb {
        Verb::Get => &inner.stats.get,
        Verb::List => &inner.stats.list,
        Verb::Watch => &inner.stats.watch,
        Verb::Create => &inner.stats.create,
        Verb::Update => &inner.stats.update,
        Verb::Patch => &inner.stats.patch,
        Verb::Delete => &inner.stats.delete,
        Verb::Other => return error_response(&ApiError::method_not_allowed()),
    };
    counter.fetch_add(1, Ordering::Relaxed);
    // The status subresource serves get, update and patch only.
    if route.status && !matches!(verb, Verb::Get | Verb::Update | Verb::Patch) {
        return error_response(&ApiError::method_not_allowed());
    }
    // A namespaced kind addressed without a namespace: only list and watch make sense.
    if route.kind.namespaced && route.ns.is_none() && !matches!(verb, Verb::List | Verb::Watch) {
        return error_response(&if route.name.is_some() {
            ApiError::no_route()
        } else {
            ApiError::method_not_allowed()
        });
    }
    // A seat for the request's whole service (its injected latency included).
    let gate = match verb {
        Verb::Watch => None,
        _ => inner.apf.lock().unwrap_or_else(|p| p.into_inner()).clone(),
    };
    let _seat = match gate {
        Some(gate) => match gate.enter().await {
            Some(seat) => Some(seat),
            None => {
                inner.stats.throttled.fetch_add(1, Ordering::Relaxed);
                let mut r = error_response(&ApiError::too_many_requests());
                r.headers_mut().insert(
                    http::header::RETRY_AFTER,
                    http::HeaderValue::from_static("1"),
                );
                return r;
            }
        },
        None => None,
    };
    let decision = inner
        .faults
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .decide(
            verb == Verb::Watch,
            matches!(verb, Verb::Update | Verb::Patch),
        );
    if !decision.delay.is_zero() {
        tokio::time::sleep(decision.delay).await;
    }
    if decision.error {
        inner.stats.injected_errors.fetch_add(1, Ordering::Relaxed);
        return error_response(&ApiError::internal(
            "injected fault (actorcile in-process cluster)",
        ));
    }
    if matches!(verb, Verb::Create | Verb::Update | Verb::Patch) && !route.status {
        let webhooks = inner.webhooks_for(&route.kind.gr.group, &route.kind.gr.plural);
        if !webhooks.is_empty() {
            let admitted = admit_and_execute(
                inner,
                &parts,
                &q,
                &body,
                &route,
                verb,
                decision.conflict,
                &webhooks,
            );
            return admitted.await.unwrap_or_else(|e| error_response(&e));
        }
    }
    match execute(inner, &parts, &q, &body, &route, verb, decision.conflict) {
        Ok(r) => r,
        Err(e) => error_response(&e),
    }
}

fn execute(
    inner: &Arc<Inner>,
    parts: &http::request::Parts,
    q: &HashMap<String, String>,
    body: &Bytes,
    route: &Route,
    verb: Verb,
    inject_conflict: bool,
) -> Result<Response<ApiBody>, ApiError> {
    let dry_run = match q.get("dryRun").map(String::as_str) {
        None | Some("") => false,
        Some("All") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "Invalid value: {other:?}: supported values: \"All\""
            )));
        }
    };
    // DELETE carries it in its DeleteOptions body too.
    let dry_run = dry_run
        || (verb == Verb::Delete
            && serde_json::from_slice::<Value>(body).ok().is_some_and(|v| {
                v.get("dryRun")
                    .and_then(Value::as_array)
                    .is_some_and(|a| a.iter().any(|x| x == "All"))
            }));
    let mut store = inner.store.lock().unwrap_or_else(|p| p.into_inner());
    store.dry_run = dry_run
        && matches!(
            verb,
            Verb::Create | Verb::Update | Verb::Patch | Verb::Delete
        );
    let result = execute_locked(
        inner,
        &mut store,
        parts,
        q,
        body,
        route,
        verb,
        inject_conflict,
    );
    store.dry_run = false;
    result
}

#[allow(clippy::too_many_arguments)]
fn execute_locked(
    inner: &Arc<Inner>,
    store: &mut Store,
    parts: &http::request::Parts,
    q: &HashMap<String, String>,
    body: &Bytes,
    route: &Route,
    verb: Verb,
    inject_conflict: bool,
) -> Result<Response<ApiBody>, ApiError> {
    let kind = &route.kind;
    let ns = route.ns.as_deref();
    let name = route.name.as_deref().unwrap_or_default();
    match verb {
        Verb::Get => Ok(json_response(200, store.get(kind, ns, name)?)),
        Verb::List => {
            let mut opts = list_opts(q)?;
            // resourceVersion=0 is served whole, as from the real server's watch cache.
            if q.get("resourceVersion").is_some_and(|v| v == "0") && opts.cont.is_none() {
                opts.limit = None;
            }
            Ok(json_response(200, store.list(kind, ns, &opts)?))
        }
        Verb::Watch => {
            let opts = list_opts(q)?;
            let timeout =
                match q.get("timeoutSeconds") {
                    Some(t) => Duration::from_secs(t.parse().map_err(|_| {
                        ApiError::bad_request(format!("invalid timeoutSeconds {t:?}"))
                    })?),
                    None => Duration::from_secs(1800),
                };
            let rv = match q.get("resourceVersion").map(String::as_str) {
                None | Some("") | Some("0") => None,
                Some(v) => Some(v.parse::<u64>().map_err(|_| {
                    ApiError::bad_request(format!("invalid resource version {v:?}"))
                })?),
            };
            let bookmark = q.get("sendInitialEvents").is_some_and(|v| v == "true");
            match store.watch(kind, ns, opts.labels, opts.fields, rv, bookmark) {
                Ok((first, rx)) => {
                    let bookmarks = q
                        .get("allowWatchBookmarks")
                        .is_some_and(|v| v == "true")
                        .then(|| Bookmarks {
                            inner: inner.clone(),
                            kind: kind.kind.clone(),
                            api_version: kind.api_version.clone(),
                            next: Box::pin(tokio::time::sleep(BOOKMARK_EVERY)),
                        });
                    Ok(watch_response(first, Some(rx), timeout, bookmarks))
                }
                Err(e) => {
                    let status =
                        Bytes::from(serde_json::to_vec(&e.to_status()).unwrap_or_default());
                    Ok(watch_response(
                        vec![(EvType::Error, status)],
                        None,
                        timeout,
                        None,
                    ))
                }
            }
        }
        Verb::Create => {
            let w = store.create(kind, ns, parse_json(body)?, None)?;
            Ok(json_response(201, w.bytes))
        }
        Verb::Update => {
            let w = store.update(
                kind,
                ns,
                name,
                parse_json(body)?,
                route.status,
                WriteKind::Put,
                inject_conflict,
                apply::Ownership::Updated {
                    manager: update_manager(q, &parts.headers),
                },
            )?;
            Ok(json_response(200, w.bytes))
        }
        Verb::Patch => {
            let ct = parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            let current = || {
                store
                    .current(kind, ns, name)?
                    .ok_or_else(|| ApiError::not_found(kind_subject(kind, name)))
            };
            let mut ownership = apply::Ownership::Updated {
                manager: update_manager(q, &parts.headers),
            };
            let patched = match ct.as_str() {
                "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
                    if ct.starts_with("application/strategic") && kind.custom {
                        return Err(ApiError::unsupported_media_type());
                    }
                    let patch = parse_json(body)?;
                    let mut cur = current()?;
                    json_patch::merge(&mut cur, &patch);
                    cur
                }
                "application/json-patch+json" => {
                    let patch: json_patch::Patch = serde_json::from_slice(body)
                        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
                    let mut cur = current()?;
                    json_patch_as_apiserver(&mut cur, &patch)
                        .map_err(|e| ApiError::unprocessable(e.to_string()))?;
                    cur
                }
                "application/apply-patch+yaml" => {
                    if q.get("fieldManager").is_none_or(String::is_empty) {
                        return Err(ApiError::invalid(
                            "meta.k8s.io",
                            "PatchOptions",
                            "",
                            "fieldManager",
                            "Required value: is required for apply patch".into(),
                        ));
                    }
                    let patch = serde_json::from_slice::<Value>(body).map_err(|e| {
                        ApiError::bad_request(format!(
                            "error decoding apply patch (the in-process cluster accepts JSON, which is YAML): {e}"
                        ))
                    })?;
                    if !patch.is_object() {
                        return Err(ApiError::bad_request("apply patch must be an object"));
                    }
                    let current = store.current(kind, ns, name)?;
                    if current.is_none() && route.status {
                        return Err(ApiError::not_found(kind_subject(kind, name)));
                    }
                    if patch.pointer("/metadata/name").and_then(Value::as_str) != Some(name) {
                        return Err(ApiError::bad_request(format!(
                            "the name of the object ({}) does not match the name on the URL ({name})",
                            patch
                                .pointer("/metadata/name")
                                .and_then(Value::as_str)
                                .unwrap_or_default()
                        )));
                    }
                    let applied = apply::apply(
                        current.as_ref(),
                        &apply::ApplyRequest {
                            body: &patch,
                            manager: q
                                .get("fieldManager")
                                .map(String::as_str)
                                .unwrap_or_default(),
                            force: q.get("force").is_some_and(|f| f == "true"),
                            status_only: route.status,
                            skip_status: kind.status,
                            api_version: &kind.api_version,
                            now: &store.now(),
                        },
                    )?;
                    if current.is_none() {
                        let w = store.create(kind, ns, applied.object, Some(applied.managed))?;
                        return Ok(json_response(201, w.bytes));
                    }
                    ownership = apply::Ownership::Applied(applied.managed);
                    applied.object
                }
                _ => return Err(ApiError::unsupported_media_type()),
            };
            let w = store.update(
                kind,
                ns,
                name,
                patched,
                route.status,
                WriteKind::Patch,
                inject_conflict,
                ownership,
            )?;
            Ok(json_response(200, w.bytes))
        }
        Verb::Delete => {
            let opts = delete_opts(q, body)?;
            if route.name.is_some() {
                Ok(json_response(200, store.delete(kind, ns, name, &opts)?))
            } else {
                Ok(json_response(
                    200,
                    store.delete_collection(kind, ns, &list_opts(q)?, &opts)?,
                ))
            }
        }
        Verb::Other => Err(ApiError::method_not_allowed()),
    }
}

fn kind_subject<'a>(kind: &'a Kind, name: &'a str) -> super::error::Subject<'a> {
    super::error::Subject {
        group: &kind.gr.group,
        plural: &kind.gr.plural,
        name,
    }
}

/// Applies a JSON patch as kube-apiserver does (its evanphx/json-patch): a `test` of a member
/// missing from an object that exists passes when the value tested is `null`. kube-runtime's
/// finalizer helper relies on it: it adds the first finalizer after `test /metadata/finalizers`
/// against `null`. Everything else follows RFC 6902 (json-patch). The caller discards `doc` on
/// error.
fn json_patch_as_apiserver(
    doc: &mut Value,
    patch: &[json_patch::PatchOperation],
) -> Result<(), json_patch::PatchError> {
    for op in patch {
        if let json_patch::PatchOperation::Test(test) = op
            && test.value.is_null()
            && is_missing_member(doc, test.path.as_str())
        {
            continue;
        }
        json_patch::patch(doc, std::slice::from_ref(op))?;
    }
    Ok(())
}

/// Whether the JSON pointer `path` names a member missing from an object that exists.
fn is_missing_member(doc: &Value, path: &str) -> bool {
    let Some((parent, key)) = path.rsplit_once('/') else {
        return false;
    };
    let key = key.replace("~1", "/").replace("~0", "~");
    doc.pointer(parent)
        .and_then(Value::as_object)
        .is_some_and(|o| !o.contains_key(&key))
}

#[cfg(test)]
mod tests;

/// The field manager of a plain update or patch: its `fieldManager`, else (as the real server
/// names it) the client's User-Agent up to the first `/`.
fn update_manager<'a>(q: &'a HashMap<String, String>, headers: &'a http::HeaderMap) -> &'a str {
    q.get("fieldManager")
        .map(String::as_str)
        .filter(|m| !m.is_empty())
        .or_else(|| {
            headers
                .get(http::header::USER_AGENT)
                .and_then(|v| v.to_str().ok())
                .and_then(|ua| ua.split('/').next())
                .filter(|m| !m.is_empty())
        })
        .unwrap_or("unknown")
}
