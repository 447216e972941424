//! SIGTERM and SIGINT as one stream (feature `operator`), for
//! [`RuntimeBuilder::run`](crate::runtime::RuntimeBuilder::run).

use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::Error;

/// Both termination signals. Listening starts at creation: a signal that comes before
/// [`Signals::next`] is awaited is not lost.
pub(crate) struct Signals {
    term: Signal,
    int: Signal,
}

impl Signals {
    pub(crate) fn new() -> Result<Self, Error> {
        let listen = |kind: SignalKind, name: &str| {
            signal(kind).map_err(|e| Error::Invalid {
                field: crate::runtime::Setting::SignalHandling,
                problem: format!("cannot listen for {name}: {e}"),
            })
        };
        Ok(Self {
            term: listen(SignalKind::terminate(), "SIGTERM")?,
            int: listen(SignalKind::interrupt(), "SIGINT")?,
        })
    }

    /// The next signal's name.
    pub(crate) async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

/// What stops a running runtime: the termination signals ([`RuntimeBuilder::run`]), or a
/// future the caller gives ([`RuntimeBuilder::run_until`]), which stops it once (a second stop,
/// which signals can give, never comes from it).
///
/// [`RuntimeBuilder::run`]: crate::runtime::RuntimeBuilder::run
/// [`RuntimeBuilder::run_until`]: crate::runtime::RuntimeBuilder::run_until
pub(crate) enum Stop<F> {
    Signals(Signals),
    Until(Option<std::pin::Pin<Box<F>>>),
}

impl<F: std::future::Future<Output = ()>> Stop<F> {
    /// Until the next stop; its name. Cancel-safe: the caller's future is kept between calls.
    pub(crate) async fn next(&mut self) -> &'static str {
        match self {
            Stop::Signals(s) => s.next().await,
            Stop::Until(Some(f)) => {
                f.as_mut().await;
                *self = Stop::Until(None);
                "shutdown"
            }
            Stop::Until(None) => std::future::pending().await,
        }
    }
}
