//! The API requests of a client: [`ApiMetrics`], a tower layer that counts them by verb and
//! code, times them by verb, resource and code, and counts the bytes of their answers.

use std::task::{Context, Poll};
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The labels of `actorcile_api_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiLabels {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`, or
    /// the HTTP method in lower case for anything else.
    pub verb: String,
    /// The HTTP status code, or `error` when no response came (connection refused, timeout).
    pub code: String,
}

/// Counts a client's API requests by verb and status code, as `actorcile_api_requests_total`:
/// a tower layer for [`kube::client::ClientBuilder::with_layer`].
///
/// ```
/// # async fn build() -> Result<(), Box<dyn std::error::Error>> {
/// use actorcile::metrics::{ApiMetrics, Registry};
///
/// let mut registry = Registry::default();
/// let api_metrics = ApiMetrics::new(&mut registry);
/// let config = kube::Config::infer().await?;
/// let client: kube::Client = kube::client::ClientBuilder::try_from(config)?
///     .with_layer(&api_metrics)
///     .build();
/// # Ok(()) }
/// ```
///
/// It also counts the bytes of the answers' bodies, watch streams included, by verb, as
/// `actorcile_api_response_bytes_total` (what the API server sent this client, before TLS).
///
/// And it times every request, from its sending to the answer's headers (a watch: until its
/// stream began), by verb, resource and code, as the histogram
/// `actorcile_api_request_duration_seconds` (client-go's `rest_client_request_duration_seconds`,
/// which has the verb and the host). The resource is the path's: `configmaps`, or
/// `clusters/status` for a subresource; never an object's name, so the series stay as few as the
/// kinds the operator talks to.
///
/// Each write (`create`, `update`, `patch`, `delete`, `deletecollection`) also runs in a span
/// `api_write` (level `info`), a child of the caller's span, with the fields `verb`,
/// `resource`, `namespace`, `name` (empty for a create, whose path names none) and `code`: a
/// reconcile's writes are children of its `reconcile` span (see
/// [`telemetry`](crate::telemetry)), so a trace runs from why the reconcile ran (its `trigger`)
/// to each write it made and how long each took. Reads and watches have no span of their own.
#[derive(Clone, Debug)]
pub struct ApiMetrics {
    requests: Family<ApiLabels, Counter>,
    bytes: Family<VerbLabel, Counter>,
    latency: Family<LatencyLabels, Histogram, fn() -> Histogram>,
}

/// The labels of `actorcile_api_request_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LatencyLabels {
    /// As [`ApiLabels::verb`].
    pub verb: String,
    /// The resource the path names (`configmaps`, `leases`, `clusters/status`), or `other` for a
    /// path outside `/api` and `/apis` (discovery, `/version`).
    pub resource: String,
    /// As [`ApiLabels::code`].
    pub code: String,
}

/// The latency histogram's buckets, in seconds: client-go's for
/// `rest_client_request_duration_seconds`, so dashboards built for it read these alike.
const LATENCY_BUCKETS: [f64; 12] = [
    0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
];

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

/// The label of `actorcile_api_response_bytes_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerbLabel {
    /// As [`ApiLabels::verb`].
    pub verb: String,
}

impl ApiMetrics {
    /// Register `actorcile_api_requests_total`, `actorcile_api_response_bytes_total` and
    /// `actorcile_api_request_duration_seconds` in `registry`.
    pub fn new(registry: &mut Registry) -> Self {
        let requests = Family::<ApiLabels, Counter>::default();
        registry.register(
            "actorcile_api_requests",
            "Kubernetes API requests, by verb and status code",
            requests.clone(),
        );
        let bytes = Family::<VerbLabel, Counter>::default();
        registry.register(
            "actorcile_api_response_bytes",
            "Bytes of the Kubernetes API's answer bodies (watch streams included), by verb",
            bytes.clone(),
        );
        let latency: Family<LatencyLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(latency_histogram);
        registry.register(
            "actorcile_api_request_duration_seconds",
            "Kubernetes API request latency until the answer's headers, by verb, resource and code",
            latency.clone(),
        );
        Self {
            requests,
            bytes,
            latency,
        }
    }

    /// Answer bytes counted for `verb` so far.
    pub fn response_bytes(&self, verb: &str) -> u64 {
        self.bytes
            .get_or_create(&VerbLabel { verb: verb.into() })
            .get()
    }

    /// Requests counted with `verb` and `code` so far.
    pub fn count(&self, verb: &str, code: &str) -> u64 {
        self.requests
            .get_or_create(&ApiLabels {
                verb: verb.into(),
                code: code.into(),
            })
            .get()
    }
}

impl<S> tower::Layer<S> for ApiMetrics {
    type Service = ApiMetricsService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        ApiMetricsService {
            inner,
            requests: self.requests.clone(),
            bytes: self.bytes.clone(),
            latency: self.latency.clone(),
        }
    }
}

/// The service of [`ApiMetrics`].
#[derive(Clone, Debug)]
pub struct ApiMetricsService<S> {
    inner: S,
    requests: Family<ApiLabels, Counter>,
    bytes: Family<VerbLabel, Counter>,
    latency: Family<LatencyLabels, Histogram, fn() -> Histogram>,
}

/// An answer's body as [`ApiMetricsService`] reconciles it on: counted as it is read.
pub type CountedBody<E> = http_body_util::combinators::UnsyncBoxBody<bytes::Bytes, E>;

impl<S, B, R> tower::Service<http::Request<B>> for ApiMetricsService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    R: http_body::Body<Data = bytes::Bytes> + Send + 'static,
{
    type Response = http::Response<CountedBody<R::Error>>;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        use http_body_util::BodyExt;
        use tracing::Instrument;
        let verb = verb_of(req.method(), req.uri());
        let resource = resource_of(req.uri());
        let span = write_span(&verb, &resource, req.uri());
        let write = span.clone();
        let requests = self.requests.clone();
        let bytes = self.bytes.clone();
        let latency = self.latency.clone();
        let sent = Instant::now();
        let fut = self.inner.call(req);
        Box::pin(
            async move {
                let res = fut.await;
                let took = sent.elapsed();
                let code = match &res {
                    Ok(r) => r.status().as_u16().to_string(),
                    Err(_) => "error".to_string(),
                };
                write.record("code", code.as_str());
                let counter = bytes
                    .get_or_create(&VerbLabel { verb: verb.clone() })
                    .clone();
                latency
                    .get_or_create(&LatencyLabels {
                        verb: verb.clone(),
                        resource,
                        code: code.clone(),
                    })
                    .observe(took.as_secs_f64());
                requests.get_or_create(&ApiLabels { verb, code }).inc();
                res.map(|r| {
                    r.map(|body| {
                        body.map_frame(move |frame| {
                            if let Some(data) = frame.data_ref() {
                                counter.inc_by(data.len() as u64);
                            }
                            frame
                        })
                        .boxed_unsync()
                    })
                })
            }
            .instrument(span),
        )
    }
}

/// The span of a write request (none for a read or a watch), a child of the current span.
fn write_span(verb: &str, resource: &str, uri: &http::Uri) -> tracing::Span {
    if !matches!(
        verb,
        "create" | "update" | "patch" | "delete" | "deletecollection"
    ) {
        return tracing::Span::none();
    }
    let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    let rest = resource_segments(&segments);
    let namespace = match segments.iter().position(|s| *s == "namespaces") {
        Some(i) if segments.len() > i + 2 => segments[i + 1],
        _ => "",
    };
    let name = rest.get(1).copied().unwrap_or("");
    tracing::info_span!(
        "api_write",
        verb,
        resource,
        namespace,
        name,
        code = tracing::field::Empty,
    )
}

/// The Kubernetes verb of a request: from its method, whether its path names one object or a
/// collection, and its `watch` parameter.
fn verb_of(method: &http::Method, uri: &http::Uri) -> String {
    let watch = uri
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
    let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    let collection = resource_segments(&segments).len() == 1;
    match *method {
        http::Method::GET if watch => "watch",
        http::Method::GET if collection => "list",
        http::Method::GET => "get",
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE if collection => "deletecollection",
        http::Method::DELETE => "delete",
        ref other => return other.as_str().to_lowercase(),
    }
    .to_string()
}

/// The path's segments from the resource on: past `/api/v1/` or `/apis/<group>/<version>/`, and
/// past `namespaces/<ns>/` for a namespaced kind's (empty outside `/api` and `/apis`).
fn resource_segments<'a>(segments: &'a [&'a str]) -> &'a [&'a str] {
    let rest: &[&str] = match segments.first() {
        Some(&"api") => segments.get(2..).unwrap_or_default(),
        Some(&"apis") => segments.get(3..).unwrap_or_default(),
        _ => &[],
    };
    match rest {
        // A Namespace's own subresources, not a namespaced collection.
        ["namespaces", _, "status" | "finalize"] => rest,
        ["namespaces", _, more @ ..] if !more.is_empty() => more,
        _ => rest,
    }
}

/// The resource a request's path names, with its subresource (`clusters/status`), never the
/// object's name: `resource[/name[/subresource]]` becomes `resource[/subresource]`.
fn resource_of(uri: &http::Uri) -> String {
    let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    match resource_segments(&segments) {
        [] => "other".to_string(),
        [resource] | [resource, _] => (*resource).to_string(),
        [resource, _, subresource, ..] => format!("{resource}/{subresource}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Instrument;

    #[test]
    fn verbs_of_requests() {
        let cases = [
            (
                "GET",
                "/api/v1/namespaces/a/configmaps?watch=true&rv=1",
                "watch",
            ),
            ("GET", "/api/v1/namespaces/a/configmaps", "list"),
            ("GET", "/apis/example.com/v1/widgets?limit=500", "list"),
            ("GET", "/api/v1/namespaces/a/configmaps/x", "get"),
            ("GET", "/api/v1/namespaces/a", "get"),
            ("GET", "/api/v1/namespaces", "list"),
            (
                "PATCH",
                "/apis/example.com/v1/namespaces/a/widgets/x/status",
                "patch",
            ),
            ("POST", "/api/v1/namespaces/a/events", "create"),
            (
                "PUT",
                "/apis/coordination.k8s.io/v1/namespaces/a/leases/l",
                "update",
            ),
            ("DELETE", "/api/v1/namespaces/a/configmaps/x", "delete"),
            (
                "DELETE",
                "/api/v1/namespaces/a/configmaps",
                "deletecollection",
            ),
        ];
        for (method, uri, verb) in cases {
            let m: http::Method = method.parse().unwrap();
            let u: http::Uri = uri.parse().unwrap();
            assert_eq!(verb_of(&m, &u), verb, "{method} {uri}");
        }
    }

    #[test]
    fn resources_of_requests_name_no_object() {
        let cases = [
            ("/api/v1/namespaces/a/configmaps?watch=true", "configmaps"),
            ("/api/v1/namespaces/a/configmaps/x", "configmaps"),
            ("/api/v1/namespaces/a", "namespaces"),
            ("/api/v1/namespaces", "namespaces"),
            ("/api/v1/namespaces/a/status", "namespaces/status"),
            (
                "/apis/example.com/v1/namespaces/a/widgets/x/status",
                "widgets/status",
            ),
            ("/apis/example.com/v1/widgets", "widgets"),
            ("/apis/example.com/v1/widgets/x", "widgets"),
            ("/apis/example.com/v1", "other"),
            ("/version", "other"),
        ];
        for (uri, resource) in cases {
            let u: http::Uri = uri.parse().unwrap();
            assert_eq!(resource_of(&u), resource, "{uri}");
        }
    }

    #[tokio::test]
    async fn answer_bytes_are_counted_by_verb_as_they_are_read() {
        let cluster = crate::cluster::ApiServer::new();
        let mut registry = Registry::default();
        let metrics = ApiMetrics::new(&mut registry);
        let service = tower::ServiceBuilder::new()
            .layer(&metrics)
            .service(cluster.service());
        let client = kube::Client::new(service, "default");
        let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
            kube::Api::namespaced(client.clone(), "default");
        let mut cm = k8s_openapi::api::core::v1::ConfigMap::default();
        cm.metadata.name = Some("a".into());
        api.create(&Default::default(), &cm).await.unwrap();
        assert!(metrics.response_bytes("create") > 0);
        let req = http::Request::get("/api/v1/namespaces/default/configmaps")
            .body(Vec::new())
            .unwrap();
        let text = client.request_text(req).await.unwrap();
        assert_eq!(metrics.response_bytes("list"), text.len() as u64);
        assert_eq!(metrics.count("list", "200"), 1);
        let mut scrape = String::new();
        prometheus_client::encoding::text::encode(&mut scrape, &registry).unwrap();
        for series in [
            r#"actorcile_api_request_duration_seconds_count{verb="create",resource="configmaps",code="201"} 1"#,
            r#"actorcile_api_request_duration_seconds_count{verb="list",resource="configmaps",code="200"} 1"#,
        ] {
            assert!(scrape.contains(series), "{series} not in\n{scrape}");
        }
    }

    #[tokio::test]
    async fn each_write_is_a_span_of_its_own_under_the_callers() {
        let spans = crate::span_capture::Spans::default();
        let _capture = spans.capture();
        let cluster = crate::cluster::ApiServer::new();
        let metrics = ApiMetrics::new(&mut Registry::default());
        let service = tower::ServiceBuilder::new()
            .layer(&metrics)
            .service(cluster.service());
        let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
            kube::Api::namespaced(kube::Client::new(service, "default"), "default");
        let mut cm = k8s_openapi::api::core::v1::ConfigMap::default();
        cm.metadata.name = Some("settings".into());
        async {
            api.create(&Default::default(), &cm).await.unwrap();
            api.get("settings").await.unwrap();
            api.delete("settings", &Default::default()).await.unwrap();
            assert!(api.get("settings").await.is_err());
        }
        .instrument(tracing::info_span!("reconcile"))
        .await;
        let writes = spans.named("api_write");
        let seen: Vec<_> = writes
            .iter()
            .map(|s| {
                (
                    s.field("verb").unwrap_or_default(),
                    s.field("resource").unwrap_or_default(),
                    s.field("namespace").unwrap_or_default(),
                    s.field("name").unwrap_or_default(),
                    s.field("code").unwrap_or_default(),
                    s.parent.as_deref().unwrap_or_default(),
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                ("create", "configmaps", "default", "", "201", "reconcile"),
                (
                    "delete",
                    "configmaps",
                    "default",
                    "settings",
                    "200",
                    "reconcile"
                ),
            ],
            "the reads have no span; each write has one, under the caller's"
        );
    }
}
