//! Prometheus metrics (feature `operator`), with
//! [`prometheus-client`](https://docs.rs/prometheus-client): the runtime's figures, collected at
//! each scrape from the counters the runtime keeps anyway, and the API requests of a client.
//!
//! Give the runtime a [`Registry`] with [`RuntimeBuilder::metrics_registry`] (register your
//! own metrics in it first) and an admin address with [`RuntimeBuilder::admin`]: `/metrics`
//! serves it in the OpenMetrics text format.
//!
//! The crate is re-exported as [`actorcile::metrics::prometheus_client`](prometheus_client), so
//! an operator's own metrics use the version the runtime registers with, without pinning it:
//!
//! ```
//! use actorcile::metrics::prometheus_client::metrics::counter::Counter;
//! use actorcile::metrics::prometheus_client::registry::Registry;
//!
//! let mut registry = Registry::default();
//! let backups: Counter = Counter::default();
//! registry.register("myoperator_backups", "Backups taken", backups.clone());
//! // Runtime::builder(client, names).metrics_registry(registry).admin(addr) ...
//! ```
//!
//! # The metrics
//!
//! | name | type | labels | what it counts | controller-runtime's |
//! |---|---|---|---|---|
//! | `actorcile_build_info` | gauge | `application`, `version`, `revision`, `actorcile_version` | always 1: what the operator is ([`RuntimeBuilder::service`](crate::runtime::RuntimeBuilder::service); without it the application is the operator's name, its version and revision `unknown`) | kubebuilder's `build_info` convention |
//! | `actorcile_reconciles_total` | counter | `controller`, `result` | reconciles that ended, by result (`done`, `yield`, `waiting`, `failed`, `terminal`, `user_action_required`) | `controller_runtime_reconcile_total` (`result`: `success`, `requeue`, `requeue_after`, `error`) |
//! | `actorcile_reconcile_duration_seconds` | histogram | `controller` | how long a reconcile took | `controller_runtime_reconcile_time_seconds` |
//! | `actorcile_reconcile_wait_seconds` | histogram | `controller` | from a reconcile becoming due to its start (waiting for a reconcile slot) | `workqueue_queue_duration_seconds` |
//! | `actorcile_objects` | gauge | `controller` | objects in the runtime's cache | — |
//! | `actorcile_wake_ups` | gauge | `controller` | wake-ups armed by live actors (yields, backoffs, polls) | `workqueue_depth` counts these too, once due |
//! | `actorcile_reconciles_waiting` | gauge | `controller` | due reconciles and activations waiting for a reconcile slot | `workqueue_depth` |
//! | `actorcile_events_total` | counter | `controller` | Kubernetes Events published | — |
//! | `actorcile_events_dropped_total` | counter | `controller` | Events not published: the object's Event budget was spent | — |
//! | `actorcile_reconciles_in_flight` | gauge | | reconciles running now | `controller_runtime_active_workers` |
//! | `actorcile_max_concurrent_reconciles` | gauge | | the reconcile slots | `controller_runtime_max_concurrent_reconciles` |
//! | `actorcile_leader` | gauge | | 1 while this replica runs the controllers (it leads, or there is no election) | `leader_election_master_status` |
//! | `actorcile_shards` | gauge | | with sharding: how many shards there are | |
//! | `actorcile_shards_held` | gauge | | with sharding: the shards this replica holds | |
//! | `actorcile_actors_live` | gauge | | resource actors serving an object | — |
//! | `actorcile_activations_total` | counter | | objects given a live actor (first, after passivation, after a restart) | — |
//! | `actorcile_passivations_total` | counter | | actors that handed their idle object back | — |
//! | `actorcile_restarts_total` | counter | | resource actors restarted after a failure or panic | `controller_runtime_reconcile_panics_total` counts panics |
//! | `actorcile_quarantined_total` | counter | | objects past the restart intensity | — |
//! | `actorcile_status_writes_total` | counter | | status patches sent | — |
//! | `actorcile_status_conflicts_total` | counter | | status patches refused with 409 (the object runs again) | — |
//! | `actorcile_reference_index_waited_on` | gauge | | targets resources wait on to become Ready | — |
//! | `actorcile_reference_index_missing` | gauge | | targets resources found missing (re-checked when they appear) | — |
//! | `actorcile_reference_index_waiting` | gauge | | resources waiting on a target (each remembers at most 64 targets; older waits fall back to the dependency poll) | — |
//! | `actorcile_reference_index_holding` | gauge | | resources holding references | — |
//! | `actorcile_watch_restarts_total` | counter | | watch tasks started again after they stopped (a panic, or their stream ended); `/readyz` fails until each runs again | — |
//! | `actorcile_status_rejected_total` | counter | | status patches refused as invalid (422: a CRD validation rule or the schema), retried with backoff | — |
//! | `actorcile_write_timeouts_total` | counter | | writes of the runtime's own (status, finalizer, Event…) abandoned unanswered at the policy's `write_timeout`, each retried | — |
//! | `actorcile_api_requests_total` | counter | `verb`, `code` | API requests of a client built with [`ApiMetrics`] | `rest_client_requests_total` (`method`, `code`) |
//! | `actorcile_api_response_bytes_total` | counter | `verb` | bytes of the answers' bodies (watch streams included) of a client built with [`ApiMetrics`] | `rest_client_response_size_bytes` (a histogram, watches not counted) |
//!
//! `controller_runtime_reconcile_errors_total` is `actorcile_reconciles_total{result="failed"}`.
//! Passive objects (no live actor) are `actorcile_objects` minus `actorcile_actors_live`.
//!
//! [`RuntimeBuilder::metrics_registry`]: crate::runtime::RuntimeBuilder::metrics_registry
//! [`RuntimeBuilder::admin`]: crate::runtime::RuntimeBuilder::admin

use std::sync::Arc;
use std::task::{Context, Poll};

pub use prometheus_client;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
pub use prometheus_client::registry::Registry;

use crate::counters::{KindMetricsSnapshot, Metrics, MetricsSnapshot};

/// The runtime's figures, read at each scrape.
#[derive(Debug)]
pub(crate) struct RuntimeCollector {
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) health: Arc<crate::health::Health>,
    pub(crate) max_concurrent_reconciles: u64,
    /// What the operator is ([`RuntimeBuilder::service`](crate::runtime::RuntimeBuilder::service)).
    pub(crate) service: crate::names::ServiceDescriptor,
}

fn counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: u64,
) -> std::fmt::Result {
    ConstCounter::new(value).encode(encoder.encode_descriptor(
        name,
        help,
        None,
        MetricType::Counter,
    )?)
}

fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: u64) -> std::fmt::Result {
    ConstGauge::new(value as i64).encode(encoder.encode_descriptor(
        name,
        help,
        None,
        MetricType::Gauge,
    )?)
}

/// One family over the controllers: `value` of each, labelled with its kind.
fn per_kind(
    encoder: &mut DescriptorEncoder,
    kinds: &[KindMetricsSnapshot],
    name: &str,
    help: &str,
    metric_type: MetricType,
    value: impl Fn(&KindMetricsSnapshot) -> u64,
) -> std::fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, None, metric_type)?;
    for k in kinds {
        let labels = [("controller", k.kind.as_str())];
        let metric = family.encode_family(&labels)?;
        match metric_type {
            MetricType::Counter => ConstCounter::new(value(k)).encode(metric)?,
            _ => ConstGauge::new(value(k) as i64).encode(metric)?,
        }
    }
    Ok(())
}

impl Collector for RuntimeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let kinds = self.metrics.kinds();
        let e = &mut encoder;
        {
            let mut family = e.encode_descriptor(
                "actorcile_build_info",
                "What the operator is: its application, version and revision, and the actorcile version (always 1)",
                None,
                MetricType::Gauge,
            )?;
            let s = &self.service;
            let labels = [
                ("application", s.application.as_str()),
                ("version", s.version.as_str()),
                ("revision", s.revision.as_str()),
                ("actorcile_version", env!("CARGO_PKG_VERSION")),
            ];
            ConstGauge::new(1i64).encode(family.encode_family(&labels)?)?;
        }
        {
            let mut family = e.encode_descriptor(
                "actorcile_reconciles",
                "Reconciles that ended, by controller and result",
                None,
                MetricType::Counter,
            )?;
            for k in &kinds {
                for (result, n) in &k.reconciles {
                    let labels = [("controller", k.kind.as_str()), ("result", result.as_str())];
                    ConstCounter::new(*n).encode(family.encode_family(&labels)?)?;
                }
            }
        }
        for (name, help, pick) in [
            (
                "actorcile_reconcile_duration_seconds",
                "How long a reconcile took",
                (|k: &KindMetricsSnapshot| &k.reconcile_duration) as fn(&_) -> &_,
            ),
            (
                "actorcile_reconcile_wait_seconds",
                "From a reconcile becoming due to its start (waiting for a reconcile slot)",
                |k: &KindMetricsSnapshot| &k.due_to_start,
            ),
        ] {
            let mut family = e.encode_descriptor(name, help, None, MetricType::Histogram)?;
            for k in &kinds {
                let h = pick(k);
                let labels = [("controller", k.kind.as_str())];
                family
                    .encode_family(&labels)?
                    .encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                        h.sum_seconds,
                        h.count,
                        &h.buckets,
                        None,
                    )?;
            }
        }
        per_kind(
            e,
            &kinds,
            "actorcile_objects",
            "Objects in the runtime's cache",
            MetricType::Gauge,
            |k| k.objects,
        )?;
        per_kind(
            e,
            &kinds,
            "actorcile_wake_ups",
            "Wake-ups armed by live resource actors (yields, backoffs, polls)",
            MetricType::Gauge,
            |k| k.wake_ups,
        )?;
        per_kind(
            e,
            &kinds,
            "actorcile_reconciles_waiting",
            "Due reconciles and activations waiting for a reconcile slot",
            MetricType::Gauge,
            |k| k.waiting,
        )?;
        per_kind(
            e,
            &kinds,
            "actorcile_events",
            "Kubernetes Events published",
            MetricType::Counter,
            |k| k.events,
        )?;
        per_kind(
            e,
            &kinds,
            "actorcile_events_dropped",
            "Events not published: the object's Event budget was spent",
            MetricType::Counter,
            |k| k.events_dropped,
        )?;
        let m: MetricsSnapshot = self.metrics.snapshot();
        gauge(
            e,
            "actorcile_reconciles_in_flight",
            "Passes running now",
            m.in_flight,
        )?;
        gauge(
            e,
            "actorcile_leader",
            "1 while this replica runs the controllers (it leads, or there is no election)",
            u64::from(self.health.leading()),
        )?;
        if let Some(n) = self.health.shard_count() {
            gauge(
                e,
                "actorcile_shards",
                "Shards the objects are split into (with sharding)",
                u64::from(n),
            )?;
            gauge(
                e,
                "actorcile_shards_held",
                "Shards this replica holds and runs the objects of (with sharding)",
                self.health.shards_held().len() as u64,
            )?;
        }
        if let Some(index) = self
            .metrics
            .reference_index
            .get()
            .and_then(std::sync::Weak::upgrade)
        {
            let sizes: crate::references::IndexSizes = index.sizes();
            gauge(
                e,
                "actorcile_reference_index_waited_on",
                "Targets resources wait on to become Ready",
                sizes.waited_on as u64,
            )?;
            gauge(
                e,
                "actorcile_reference_index_missing",
                "Targets resources found missing (re-checked when they appear)",
                sizes.missing as u64,
            )?;
            gauge(
                e,
                "actorcile_reference_index_waiting",
                "Resources waiting on a target (each remembers at most 64 targets)",
                sizes.waiting as u64,
            )?;
            gauge(
                e,
                "actorcile_reference_index_holding",
                "Resources holding references",
                sizes.holding as u64,
            )?;
        }
        gauge(
            e,
            "actorcile_max_concurrent_reconciles",
            "Reconcile slots: the most reconciles running at once",
            self.max_concurrent_reconciles,
        )?;
        gauge(
            e,
            "actorcile_actors_live",
            "Resource actors serving an object",
            m.live_actors,
        )?;
        counter(
            e,
            "actorcile_activations",
            "Objects given a live actor (first, after passivation, after a restart)",
            m.activations,
        )?;
        counter(
            e,
            "actorcile_passivations",
            "Resource actors that handed their idle object back",
            m.passivations,
        )?;
        counter(
            e,
            "actorcile_restarts",
            "Resource actors restarted after a failure or panic",
            m.restarts,
        )?;
        counter(
            e,
            "actorcile_quarantined",
            "Objects quarantined past the restart intensity",
            m.quarantined,
        )?;
        counter(
            e,
            "actorcile_status_writes",
            "Status patches sent",
            m.status_writes,
        )?;
        counter(
            e,
            "actorcile_watch_restarts",
            "Watch tasks started again after they stopped (a panic, or their stream ended)",
            m.watch_restarts,
        )?;
        counter(
            e,
            "actorcile_status_conflicts",
            "Status patches refused because the object changed (it runs again)",
            m.status_conflicts,
        )?;
        counter(
            e,
            "actorcile_status_rejected",
            "Status patches refused as invalid (a CRD validation rule or the schema), retried with backoff",
            m.status_rejected,
        )?;
        counter(
            e,
            "actorcile_write_timeouts",
            "Writes of the runtime's own abandoned unanswered at the policy's write_timeout",
            m.write_timeouts,
        )?;
        Ok(())
    }
}

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
#[derive(Clone, Debug)]
pub struct ApiMetrics {
    requests: Family<ApiLabels, Counter>,
    bytes: Family<VerbLabel, Counter>,
}

/// The label of `actorcile_api_response_bytes_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerbLabel {
    /// As [`ApiLabels::verb`].
    pub verb: String,
}

impl ApiMetrics {
    /// Register `actorcile_api_requests_total` and `actorcile_api_response_bytes_total` in
    /// `registry`.
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
        Self { requests, bytes }
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
        }
    }
}

/// The service of [`ApiMetrics`].
#[derive(Clone, Debug)]
pub struct ApiMetricsService<S> {
    inner: S,
    requests: Family<ApiLabels, Counter>,
    bytes: Family<VerbLabel, Counter>,
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
        let verb = verb_of(req.method(), req.uri());
        let requests = self.requests.clone();
        let bytes = self.bytes.clone();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let res = fut.await;
            let code = match &res {
                Ok(r) => r.status().as_u16().to_string(),
                Err(_) => "error".to_string(),
            };
            let counter = bytes
                .get_or_create(&VerbLabel { verb: verb.clone() })
                .clone();
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
        })
    }
}

/// The Kubernetes verb of a request: from its method, whether its path names one object or a
/// collection, and its `watch` parameter.
fn verb_of(method: &http::Method, uri: &http::Uri) -> String {
    let watch = uri
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
    let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    // /api/v1/... or /apis/group/version/...; then namespaces/<ns>/ for namespaced kinds.
    let mut rest: &[&str] = match segments.first() {
        Some(&"api") => segments.get(2..).unwrap_or_default(),
        Some(&"apis") => segments.get(3..).unwrap_or_default(),
        _ => &[],
    };
    if rest.first() == Some(&"namespaces") && rest.len() >= 3 {
        rest = &rest[2..];
    }
    let collection = rest.len() == 1;
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

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
