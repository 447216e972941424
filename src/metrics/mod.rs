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
//! | `actorcile_reconciles_total` | counter | `controller`, `result` | reconciles that ended, by result (`done`, `yield`, `waiting`, `failed`, `terminal`, `user_action_required`, `cancelled`: cut because its object moved on) | `controller_runtime_reconcile_total` (`result`: `success`, `requeue`, `requeue_after`, `error`) |
//! | `actorcile_reconcile_triggers_total` | counter | `controller`, `trigger` | reconciles that started, by why they ran ([`Trigger`](crate::triggers::Trigger): `created`, `listed`, `spec`, `deletion`, `changed`, `related`, `secret`, `config`, `reference`, `external`, `yield`, `requeue`, `poll`, `backoff`, `restart`, `shard`, `again`) | — |
//! | `actorcile_reconcile_duration_seconds` | histogram | `controller` | how long a reconcile took | `controller_runtime_reconcile_time_seconds` |
//! | `actorcile_reconcile_wait_seconds` | histogram | `controller` | from a reconcile becoming due to its start (waiting for a reconcile slot) | `workqueue_queue_duration_seconds` |
//! | `actorcile_objects` | gauge | `controller` | objects in the runtime's cache | — |
//! | `actorcile_wake_ups` | gauge | `controller` | wake-ups armed by live actors (yields, backoffs, polls) | `workqueue_depth` counts these too, once due |
//! | `actorcile_reconciles_waiting` | gauge | `controller` | due reconciles and activations waiting for a reconcile slot | `workqueue_depth` |
//! | `actorcile_reconciles_running` | gauge | `controller` | reconciles running now | `controller_runtime_active_workers` |
//! | `actorcile_reconcile_longest_running_seconds` | gauge | `controller` | how long the longest-running reconcile has run (0 when none runs) | `workqueue_longest_running_processor_seconds` |
//! | `actorcile_events_total` | counter | `controller` | Kubernetes Events published | — |
//! | `actorcile_events_dropped_total` | counter | `controller` | Events not published: the object's Event budget was spent | — |
//! | `actorcile_reconciles_in_flight` | gauge | | reconciles running now, over every controller | the sum of `controller_runtime_active_workers` |
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
//! | `actorcile_kind_synced` | gauge | `controller` | 1 once the controller's first list is in the cache; 0 while it lists, or while the API server refuses its list or watch | — |
//! | `actorcile_watches_down` | gauge | | watch tasks that stopped and wait for their restart (`/readyz` fails meanwhile) | — |
//! | `actorcile_watch_restarts_total` | counter | | watch tasks started again after they stopped (a panic, or their stream ended); `/readyz` fails until each runs again | — |
//! | `actorcile_status_rejected_total` | counter | | status patches refused as invalid (422: a CRD validation rule or the schema), retried with backoff | — |
//! | `actorcile_write_timeouts_total` | counter | | writes of the runtime's own (status, finalizer, Event…) abandoned unanswered at the policy's `write_timeout`, each retried | — |
//! | `actorcile_api_requests_total` | counter | `verb`, `code` | API requests of a client built with [`ApiMetrics`] | `rest_client_requests_total` (`method`, `code`) |
//! | `actorcile_api_request_duration_seconds` | histogram | `verb`, `resource`, `code` | latency of the API requests of a client built with [`ApiMetrics`], until the answer's headers | `rest_client_request_duration_seconds` (`verb`, `host`) |
//! | `actorcile_api_response_bytes_total` | counter | `verb` | bytes of the answers' bodies (watch streams included) of a client built with [`ApiMetrics`] | `rest_client_response_size_bytes` (a histogram, watches not counted) |
//!
//! | `process_cpu_seconds_total`, `process_resident_memory_bytes`, `process_virtual_memory_bytes`, `process_open_fds`, `process_max_fds`, `process_threads`, `process_start_time_seconds` | | | the operator process ([`ProcessCollector`]) | the same names (client_golang's process collector) |
//!
//! `controller_runtime_reconcile_errors_total` is `actorcile_reconciles_total{result="failed"}`.
//! Passive objects (no live actor) are `actorcile_objects` minus `actorcile_actors_live`.
//!
//! [`RuntimeBuilder::metrics_registry`]: crate::runtime::RuntimeBuilder::metrics_registry
//! [`RuntimeBuilder::admin`]: crate::runtime::RuntimeBuilder::admin

use std::sync::Arc;

pub use prometheus_client;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
pub use prometheus_client::registry::Registry;

mod api;
mod process;

pub use api::{ApiLabels, ApiMetrics, ApiMetricsService, CountedBody, LatencyLabels, VerbLabel};
pub use process::ProcessCollector;

use crate::counters::{KindMetricsSnapshot, Metrics, MetricsSnapshot};

/// The runtime's figures, read at each scrape.
#[derive(Debug)]
pub(crate) struct RuntimeCollector {
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) health: Arc<crate::health::Health>,
    pub(crate) max_concurrent_reconciles: u64,
    /// The adaptive limit on the reconcile slots, when the runtime has one.
    pub(crate) adaptive: Option<crate::adaptive::AdaptiveConcurrency>,
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

/// One gauge of `value`, without labels.
fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: u64) -> std::fmt::Result {
    ConstGauge::new(value as i64).encode(encoder.encode_descriptor(
        name,
        help,
        None,
        MetricType::Gauge,
    )?)
}

/// A snapshot's cumulative buckets as counts per bucket: prometheus-client's encoder sums them
/// into the cumulative `_bucket` series itself.
fn per_bucket(cumulative: &[(f64, u64)]) -> Vec<(f64, u64)> {
    let mut below = 0;
    cumulative
        .iter()
        .map(|&(le, n)| {
            let here = n.saturating_sub(below);
            below = n;
            (le, here)
        })
        .collect()
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
        {
            let mut family = e.encode_descriptor(
                "actorcile_reconcile_triggers",
                "Reconciles that started, by controller and why they ran",
                None,
                MetricType::Counter,
            )?;
            for k in &kinds {
                for (trigger, n) in &k.triggers {
                    let labels = [
                        ("controller", k.kind.as_str()),
                        ("trigger", trigger.as_str()),
                    ];
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
                        &per_bucket(&h.buckets),
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
            "actorcile_reconciles_running",
            "Reconciles running now",
            MetricType::Gauge,
            |k| k.running,
        )?;
        {
            let mut family = e.encode_descriptor(
                "actorcile_reconcile_longest_running_seconds",
                "How long the longest-running reconcile has run (0 when none runs)",
                None,
                MetricType::Gauge,
            )?;
            for k in &kinds {
                let labels = [("controller", k.kind.as_str())];
                ConstGauge::new(k.longest_running.as_secs_f64())
                    .encode(family.encode_family(&labels)?)?;
            }
        }
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
        {
            let mut family = e.encode_descriptor(
                "actorcile_kind_synced",
                "1 once the controller's first list is in the cache; 0 while it lists, or while the API server refuses its list or watch",
                None,
                MetricType::Gauge,
            )?;
            for (kind, synced) in self.health.kinds_synced() {
                let labels = [("controller", kind.as_str())];
                ConstGauge::new(i64::from(synced)).encode(family.encode_family(&labels)?)?;
            }
        }
        gauge(
            e,
            "actorcile_watches_down",
            "Watch tasks that stopped and wait for their restart (/readyz fails meanwhile)",
            self.health.watches_down() as u64,
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
        if let Some(adaptive) = &self.adaptive {
            gauge(
                e,
                "actorcile_reconcile_slots_limit",
                "Reconcile slots the adaptive concurrency limit lets reconciles use now (with adaptive concurrency)",
                adaptive.limit() as u64,
            )?;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The encoded `_bucket` series are the snapshot's cumulative counts, `+Inf` the count.
    #[test]
    fn histogram_buckets_are_encoded_cumulative_once() {
        let snapshot = [(0.1, 2), (0.5, 5), (f64::INFINITY, 6)];
        assert_eq!(
            per_bucket(&snapshot),
            [(0.1, 2), (0.5, 3), (f64::INFINITY, 1)]
        );
        struct One;
        impl std::fmt::Debug for One {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("One")
            }
        }
        impl Collector for One {
            fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
                encoder
                    .encode_descriptor("h", "h", None, MetricType::Histogram)?
                    .encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                        1.0,
                        6,
                        &per_bucket(&[(0.1, 2), (0.5, 5), (f64::INFINITY, 6)]),
                        None,
                    )
            }
        }
        let mut registry = Registry::default();
        registry.register_collector(Box::new(One));
        let mut scrape = String::new();
        prometheus_client::encoding::text::encode(&mut scrape, &registry).unwrap();
        for line in [
            r#"h_bucket{le="0.1"} 2"#,
            r#"h_bucket{le="0.5"} 5"#,
            r#"h_bucket{le="+Inf"} 6"#,
            "h_count 6",
        ] {
            assert!(scrape.contains(line), "{line} not in\n{scrape}");
        }
    }
}
