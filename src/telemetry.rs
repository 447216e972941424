//! Tracing set-up for an operator binary (feature `operator`): plain or JSON lines on stderr,
//! filtered like `RUST_LOG`. Optional: an operator with its own subscriber skips it.
//!
//! Every reconcile runs in a span `reconcile` with the fields `kind`, `namespace`, `name`,
//! `generation`, `trigger` (why it ran: a [`Trigger`](crate::triggers::Trigger)),
//! `trigger_object` (the object that caused it, when one did: `Secret shop/tls`, a related
//! object, a reference) and (once it ended) `outcome`, so each log line of a reconcile names
//! its object and its cause. With [`ApiMetrics`](crate::metrics::ApiMetrics) on the client, each
//! write the reconcile makes is a child span `api_write` (verb, resource, namespace, name, code).
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

/// Spans exported over OTLP/HTTP (protobuf) to an OpenTelemetry collector, in batches from a
/// thread of their own (feature `otel`). [`Otlp::layer`] is a tracing layer to add to a
/// subscriber; [`init_tracing_with_otlp`] installs one with it. Call [`Otlp::shutdown`]
/// before the process exits, or the last batch is lost.
///
/// An `https` endpoint is reached over TLS (rustls, with the crypto provider of kube's: the
/// process's default, else the feature `ring`'s or `aws-lc-rs`'s), trusting the system's roots,
/// or only the CA of [`Otlp::with_ca_file`] (a collector whose certificate a cluster's own CA
/// signed, mounted from a Secret or ConfigMap).
///
/// ```no_run
/// use actorcile::telemetry::{LogFormat, Otlp, init_tracing_with_otlp};
/// let otlp = Otlp::new("https://otel-collector:4318/v1/traces", "my-operator")
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
    /// Export to `endpoint`, the collector's traces URL (`http://otel-collector:4318/v1/traces`,
    /// or `https://…` for TLS with the system's roots), as service `service_name`. Fails with
    /// [`Error::Invalid`] on an endpoint that is not an `http` or `https` URL, or an `https` one
    /// without a crypto provider or system roots.
    pub fn new(endpoint: &str, service_name: &str) -> Result<Self, Error> {
        Self::build(endpoint, service_name, None)
    }

    /// As [`Otlp::new`], an `https` endpoint trusting only the certificates of the PEM file
    /// `ca_file` (read once, now). Fails with [`Error::Invalid`] on an `http` endpoint (the CA
    /// would go unused), or a file that cannot be read or holds no certificate.
    pub fn with_ca_file(
        endpoint: &str,
        service_name: &str,
        ca_file: &std::path::Path,
    ) -> Result<Self, Error> {
        Self::build(endpoint, service_name, Some(ca_file))
    }

    fn build(
        endpoint: &str,
        service_name: &str,
        ca_file: Option<&std::path::Path>,
    ) -> Result<Self, Error> {
        use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
        let invalid = |problem: String| Error::Invalid {
            field: crate::runtime::Setting::OtlpEndpoint,
            problem,
        };
        let url = url::Url::parse(endpoint).map_err(|e| invalid(format!("{endpoint:?}: {e}")))?;
        let builder = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(endpoint);
        // The exporter's HTTP client is always built here, given its TLS configuration: reqwest
        // built without a crypto provider of its own panics building one without it.
        let roots = match (url.scheme(), ca_file) {
            ("http", None) => otlp_tls::Roots::Unused,
            ("http", Some(_)) => {
                return Err(invalid(format!(
                    "{endpoint:?}: a CA file is given for an http endpoint (use https)"
                )));
            }
            ("https", Some(ca_file)) => otlp_tls::Roots::File(ca_file),
            ("https", None) => otlp_tls::Roots::System,
            _ => return Err(invalid(format!("{endpoint:?}: not an http or https URL"))),
        };
        let tls = otlp_tls::client_config(roots).map_err(|e| Error::Invalid {
            field: crate::runtime::Setting::OtlpCaFile,
            problem: e,
        })?;
        let builder = builder.with_http_client(otlp_tls::http_client(tls).map_err(invalid)?);
        let exporter = builder
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

/// The OTLP exporter's TLS: a rustls client configuration and the blocking HTTP client built
/// on it.
#[cfg(feature = "otel")]
mod otlp_tls {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;

    /// The certificates a collector's is checked against.
    pub(super) enum Roots<'a> {
        /// None: a plain http endpoint.
        Unused,
        /// Only those of a PEM file.
        File(&'a std::path::Path),
        /// The system's.
        System,
    }

    /// A rustls configuration trusting `roots`.
    pub(super) fn client_config(which: Roots<'_>) -> Result<rustls::ClientConfig, String> {
        let provider = crate::tls::crypto_provider().ok_or(
            "no rustls crypto provider is installed, and neither feature ring nor aws-lc-rs is on",
        )?;
        let mut roots = rustls::RootCertStore::empty();
        match which {
            Roots::Unused => {}
            Roots::File(path) => {
                let certs = CertificateDer::pem_file_iter(path)
                    .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                if certs.is_empty() {
                    return Err(format!("{}: no certificate in the file", path.display()));
                }
                for cert in certs {
                    roots
                        .add(cert)
                        .map_err(|e| format!("{}: {e}", path.display()))?;
                }
            }
            Roots::System => {
                let found = rustls_native_certs::load_native_certs();
                roots.add_parsable_certificates(found.certs);
                if roots.is_empty() {
                    return Err(format!(
                        "no system root certificate found ({:?}): name the collector's CA",
                        found.errors
                    ));
                }
            }
        }
        Ok(rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth())
    }

    /// A blocking client over `tls`. Built on a thread of its own: reqwest's blocking client
    /// starts a runtime of its own, which panics inside another's (the caller's `#[tokio::main]`).
    pub(super) fn http_client(
        tls: rustls::ClientConfig,
    ) -> Result<reqwest::blocking::Client, String> {
        std::thread::spawn(move || {
            reqwest::blocking::Client::builder()
                .tls_backend_preconfigured(tls)
                .build()
                .map_err(|e| e.to_string())
        })
        .join()
        .map_err(|_| "building the HTTP client panicked".to_string())?
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
