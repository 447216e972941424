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
                field: "signal handling".into(),
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
