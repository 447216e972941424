//! Tracing set-up for an operator binary (feature `operator`): plain or JSON lines on stderr,
//! filtered like `RUST_LOG`. Optional: an operator with its own subscriber skips it.
//!
//! Every reconcile runs in a span `reconcile` with the fields `kind`, `namespace`, `name`, `generation` and
//! (once it ended) `outcome`, so each log line of a reconcile names its object.
//!
//! ```no_run
//! use actorcile::telemetry::{LogFormat, init_tracing};
//! init_tracing(LogFormat::Json, "info,actorcile=debug").expect("a valid filter");
//! ```
//!
//! With the feature `otel`, the same spans are exported over OTLP ([`Otlp`]): one span per reconcile,
//! with those fields as attributes, to an OpenTelemetry collector.

use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::Error;

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[non_exhaustive]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Plain,
    /// One JSON object per line, with the current span's fields (for log collectors).
    Json,
}

/// Install a global subscriber writing `format` lines to stderr, filtered by `filter` (the
/// `RUST_LOG` syntax: `info`, `info,actorcile=debug`, ...). Fails with [`Error::Invalid`] on a
/// filter that does not parse, and when a global subscriber is already set.
pub fn init_tracing(format: LogFormat, filter: &str) -> Result<(), Error> {
    install(format, filter, None::<tracing_subscriber::layer::Identity>)
}

/// The subscriber of [`init_tracing`], with `extra` (an exporter's layer) beside the log lines.
fn install<L>(format: LogFormat, filter: &str, extra: Option<L>) -> Result<(), Error>
where
    L: tracing_subscriber::Layer<
            tracing_subscriber::layer::Layered<EnvFilter, tracing_subscriber::Registry>,
        > + Send
        + Sync
        + 'static,
{
    let filter = EnvFilter::builder()
        .parse(filter)
        .map_err(|e| Error::Invalid {
            field: crate::runtime::Setting::LogFilter,
            problem: format!("{filter:?}: {e}"),
        })?;
    let registry = tracing_subscriber::registry().with(filter).with(extra);
    let result = match format {
        LogFormat::Plain => registry
            .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
            .try_init(),
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_current_span(true)
                    .with_span_list(false)
                    .with_writer(std::io::stderr),
            )
            .try_init(),
    };
    result.map_err(|e| Error::Invalid {
        field: crate::runtime::Setting::TracingSubscriber,
        problem: e.to_string(),
    })
}

/// Spans exported over OTLP (plain HTTP, protobuf) to an OpenTelemetry collector, in batches from a
/// thread of their own (feature `otel`). [`Otlp::layer`] is a tracing layer to add to a
/// subscriber; [`init_tracing_with_otlp`] installs one with it. Call [`Otlp::shutdown`]
/// before the process ends, or the last batch is lost.
///
/// ```no_run
/// use actorcile::telemetry::{LogFormat, Otlp, init_tracing_with_otlp};
/// let otlp = Otlp::new("http://otel-collector:4318/v1/traces", "my-operator")
///     .expect("a valid endpoint");
/// init_tracing_with_otlp(LogFormat::Json, "info", &otlp).expect("a valid filter");
/// // ... run the operator ...
/// otlp.shutdown().expect("the last spans exported");
/// ```
#[cfg(feature = "otel")]
#[derive(Clone, Debug)]
pub struct Otlp {
    provider: opentelemetry_sdk::trace::SdkTracerProvider,
}

#[cfg(feature = "otel")]
impl Otlp {
    /// Export to `endpoint`, the collector's traces URL (e.g.
    /// `http://otel-collector:4318/v1/traces`), as service `service_name`. Fails with
    /// [`Error::Invalid`] on an endpoint that is not an `http` URL: the exporter is built
    /// without TLS, for a collector agent on the node or a sidecar, which forwards further.
    pub fn new(endpoint: &str, service_name: &str) -> Result<Self, Error> {
        use opentelemetry_otlp::{Protocol, WithExportConfig};
        let invalid = |problem: String| Error::Invalid {
            field: crate::runtime::Setting::OtlpEndpoint,
            problem,
        };
        let url = url::Url::parse(endpoint).map_err(|e| invalid(format!("{endpoint:?}: {e}")))?;
        match url.scheme() {
            "http" => {}
            "https" => {
                return Err(invalid(format!(
                    "{endpoint:?}: https is not supported (no TLS in the exporter): export over \
                     http to a collector agent on the node or a sidecar"
                )));
            }
            _ => return Err(invalid(format!("{endpoint:?}: not an http URL"))),
        }
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(endpoint)
            .build()
            .map_err(|e| invalid(format!("{endpoint:?}: {e}")))?;
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(
                opentelemetry_sdk::Resource::builder()
                    .with_service_name(service_name.to_string())
                    .build(),
            )
            .build();
        Ok(Self { provider })
    }

    /// A tracing layer that exports every span (and the events in it) through this exporter.
    pub fn layer<S>(&self) -> impl tracing_subscriber::Layer<S> + use<S>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        use opentelemetry::trace::TracerProvider as _;
        tracing_opentelemetry::layer().with_tracer(self.provider.tracer("actorcile"))
    }

    /// Export what is buffered now (blocks until the collector answered or the export timed
    /// out; from async code, call it in `spawn_blocking`).
    pub fn flush(&self) -> Result<(), Error> {
        self.provider.force_flush().map_err(|e| Error::Invalid {
            field: crate::runtime::Setting::OtlpExport,
            problem: e.to_string(),
        })
    }

    /// Export what is buffered and stop the exporter's thread (blocks like [`Otlp::flush`]).
    pub fn shutdown(self) -> Result<(), Error> {
        self.provider.shutdown().map_err(|e| Error::Invalid {
            field: crate::runtime::Setting::OtlpExport,
            problem: e.to_string(),
        })
    }
}

/// [`init_tracing`], with the spans also exported through `otlp` (feature `otel`).
#[cfg(feature = "otel")]
pub fn init_tracing_with_otlp(format: LogFormat, filter: &str, otlp: &Otlp) -> Result<(), Error> {
    install(format, filter, Some(otlp.layer()))
}

/// The exporter [`RuntimeArgs::init_tracing`](crate::cli::RuntimeArgs::init_tracing)
/// installed, until [`shutdown_otlp`].
#[cfg(feature = "otel")]
static INSTALLED: std::sync::Mutex<Option<Otlp>> = std::sync::Mutex::new(None);

/// Keep `otlp` until [`shutdown_otlp`].
#[cfg(all(feature = "otel", feature = "cli"))]
pub(crate) fn keep_otlp(otlp: Otlp) {
    *INSTALLED.lock().unwrap_or_else(|e| e.into_inner()) = Some(otlp);
}

/// Export the spans still buffered by the exporter
/// [`RuntimeArgs::init_tracing`](crate::cli::RuntimeArgs::init_tracing) installed, and stop
/// it; nothing without one (feature `otel`). Blocks until the collector answered or the
/// export timed out.
#[cfg(feature = "otel")]
pub fn shutdown_otlp() -> Result<(), Error> {
    let otlp = INSTALLED.lock().unwrap_or_else(|e| e.into_inner()).take();
    otlp.map_or(Ok(()), Otlp::shutdown)
}
