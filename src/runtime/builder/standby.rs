//! Running until a signal ([`RuntimeBuilder::run`]): with leader election, a replica waits on standby for the Lease.

use super::*;

impl RuntimeBuilder {
    /// Start, run until SIGTERM or SIGINT (or a manager escalates), then shut down gracefully
    /// ([`RuntimeHandle::shutdown`]): no new reconciles, in-flight reconciles finish within the
    /// policy's shutdown timeout, timers and waiters dropped; `Ok(())`. A second signal during
    /// the shutdown stops everything at once and returns [`Error::Interrupted`]. It never
    /// exits the process: `main` decides.
    ///
    /// ```no_run
    /// # use actorcile::prelude::*;
    /// # #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
    /// # #[kube(group = "example.com", version = "v1", kind = "App", namespaced, status = "ResourceStatus")]
    /// # struct AppSpec {}
    /// # async fn run(client: kube::Client) -> Result<(), actorcile::Error> {
    /// let tree = step("deploy", |_cx: Context<App>| async { Outcome::Done });
    /// Runtime::builder(client, OperatorNames::new("app-operator", "example.com"))
    ///     .controller(Controller::<App>::new(tree))
    ///     .admin("127.0.0.1:8080".parse().unwrap())
    ///     .run()
    ///     .await
    /// # }
    /// ```
    pub async fn run(self) -> Result<(), Error> {
        // Listening before the start: a signal during start-up is not lost.
        let signals = crate::signals::Signals::new()?;
        let result = self
            .run_stopping_on(crate::signals::Stop::<std::future::Pending<()>>::Signals(
                signals,
            ))
            .await;
        // The last spans of the exporter the flags installed, if any.
        #[cfg(feature = "otel")]
        if let Ok(Err(e)) = tokio::task::spawn_blocking(crate::telemetry::shutdown_otlp).await {
            tracing::warn!(error = %e, "the last spans were not exported");
        }
        result
    }

    /// [`RuntimeBuilder::run`], stopped by `signals`.
    pub(super) async fn run_stopping_on<F: Future<Output = ()>>(
        mut self,
        mut signals: crate::signals::Stop<F>,
    ) -> Result<(), Error> {
        let Some(election) = self.leader.take() else {
            let handle = self.start().await?;
            return run_with(handle, &mut signals, None).await;
        };
        self.validate()?;
        let client = self.client()?;
        election.validate(&self.policy)?;
        // Probes and metrics answer while this replica stands by.
        let early = self.prepare().await?;
        let health = early.health.clone();
        health.set_standby(true);
        self.early = Some(early);
        let warm = election.warm_standby;
        let slots = self.policy.runtime.max_concurrent_reconciles;
        let mut elector = crate::leader::Elector::new(client, election, &self.policy);
        // A warm standby watches and caches while it waits: its takeover starts with the
        // objects in hand, not with a list.
        let standby = if warm {
            self.gated = true;
            Standby::Warm(Box::new(self.start().await?))
        } else {
            Standby::Cold(Box::new(self))
        };
        let elected = tokio::select! {
            _ = elector.acquire() => true,
            signal = signals.next() => {
                tracing::info!(signal, "stopping while standing by");
                false
            }
        };
        let handle = match (elected, standby) {
            (false, Standby::Warm(handle)) => {
                handle.shutdown().await;
                return Ok(());
            }
            (false, Standby::Cold(_)) => return Ok(()),
            (true, Standby::Warm(handle)) => {
                handle.lead(slots);
                *handle
            }
            (true, Standby::Cold(builder)) => builder.start().await?,
        };
        health.set_standby(false);
        let result = run_with(handle, &mut signals, Some(&mut elector)).await;
        if !matches!(result, Err(Error::LeadershipLost)) {
            elector.release().await;
        }
        result
    }

    /// Start, run until `shutdown` completes (e.g. SIGTERM) or a manager escalates, then shut
    /// down gracefully. With [leader election](RuntimeBuilder::leader_election), as
    /// [`RuntimeBuilder::run`]: stand by until the Lease is held (`shutdown` ends the wait), run,
    /// and return [`Error::LeadershipLost`] if it is lost.
    pub async fn run_until(self, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
        if self.leader.is_some() {
            let stop = crate::signals::Stop::Until(Some(Box::pin(shutdown)));
            return self.run_stopping_on(stop).await;
        }
        let mut handle = self.start().await?;
        let result = tokio::select! {
            _ = shutdown => Ok(()),
            e = handle.escalated() => Err(e),
        };
        handle.shutdown().await;
        result
    }
}

/// [`RuntimeBuilder::run`] once it runs the controllers: until a signal, an escalation or the
/// loss of the Lease, then stop.
async fn run_with<F: Future<Output = ()>>(
    mut handle: RuntimeHandle,
    signals: &mut crate::signals::Stop<F>,
    elector: Option<&mut crate::leader::Elector>,
) -> Result<(), Error> {
    let abort = handle.aborter();
    // Resolves when leadership is lost: every run must stop at once (fencing).
    let lost = async {
        match elector {
            Some(e) => e.hold().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(lost);
    let result = tokio::select! {
        signal = signals.next() => {
            tracing::info!(signal, "shutting down gracefully (again to stop at once)");
            Ok(())
        }
        e = handle.escalated() => Err(e),
        _ = &mut lost => {
            abort.abort();
            return Err(Error::LeadershipLost);
        }
    };
    // The Lease is still renewed while the shutdown waits for the runs in flight.
    tokio::select! {
        _ = handle.shutdown() => result,
        signal = signals.next() => {
            tracing::warn!(signal, "second signal: stopping at once");
            abort.abort();
            Err(Error::Interrupted)
        }
        _ = &mut lost => {
            abort.abort();
            Err(Error::LeadershipLost)
        }
    }
}
