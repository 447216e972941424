//! Tracing set-up for an operator binary (feature `operator`): plain or JSON lines on stderr,
//! filtered like `RUST_LOG`. Optional: an operator with its own subscriber skips it.
//!
//! Every pass runs in a span `run` with the fields `kind`, `namespace`, `name`, `generation` and
//! (once it ended) `outcome`, so each log line of a pass names its object.
//!
//! ```no_run
//! use actorcile::telemetry::{LogFormat, init_tracing};
//! init_tracing(LogFormat::Json, "info,actorcile=debug").expect("a valid filter");
//! ```

use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::Error;

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "operator", derive(clap::ValueEnum))]
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
    let filter = EnvFilter::builder()
        .parse(filter)
        .map_err(|e| Error::Invalid {
            field: "log filter".into(),
            problem: format!("{filter:?}: {e}"),
        })?;
    let registry = tracing_subscriber::registry().with(filter);
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
        field: "tracing subscriber".into(),
        problem: e.to_string(),
    })
}
