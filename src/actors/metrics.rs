//! The runtime's counters: cheap atomics shared by every controller, read with
//! [`Metrics::snapshot`].

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// Runtime-wide counters, shared by every controller. Cheap atomics; read with
/// [`Metrics::snapshot`].
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    // Every pass touches these from whichever worker runs it: no `runs` counter of its own (it
    // is the sum of the two below), and peaks are read before they are raised, so a pass makes
    // as few read-modify-writes of these shared cache lines as it can.
    pub(super) provision_runs: AtomicU64,
    pub(super) deprovision_runs: AtomicU64,
    pub(super) restarts: AtomicU64,
    pub(super) quarantined: AtomicU64,
    pub(super) status_writes: AtomicU64,
    pub(super) in_flight: AtomicU64,
    pub(super) peak_in_flight: AtomicU64,
    pub(super) live_actors: AtomicU64,
    pub(super) peak_live_actors: AtomicU64,
    pub(super) passivations: AtomicU64,
    pub(super) activations: AtomicU64,
    pub(super) spawns: AtomicU64,
    pub(super) status_conflicts: AtomicU64,
    pub(super) ignored: AtomicU64,
}

/// A point-in-time copy of the runtime's counters ([`RuntimeHandle::metrics`](crate::runtime::RuntimeHandle::metrics)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MetricsSnapshot {
    /// Provisioner passes started (provision + deprovision).
    pub runs: u64,
    /// Provision passes.
    pub provision_runs: u64,
    /// Deprovision passes.
    pub deprovision_runs: u64,
    /// Resource actors restarted after a failure or panic.
    pub restarts: u64,
    /// Resources quarantined past the restart intensity.
    pub quarantined: u64,
    /// Status patches sent (only when status changed).
    pub status_writes: u64,
    /// Passes running right now.
    pub in_flight: u64,
    /// Most passes ever running at once.
    pub peak_in_flight: u64,
    /// Resource actors alive right now.
    pub live_actors: u64,
    /// Most resource actors ever alive at once.
    pub peak_live_actors: u64,
    /// Passivations: an actor with nothing due handed its object back (the actor itself is
    /// kept to adopt the next activation, or stopped past the idle bound).
    pub passivations: u64,
    /// Activations: an actor began serving an object (its first activation, a re-activation
    /// after passivation, or a restart).
    pub activations: u64,
    /// Resource actors spawned. Most activations spawn none: an actor that passivated adopts
    /// the next activation.
    pub spawns: u64,
    /// Status patches refused because the object changed since the pass read it (the object
    /// runs again on the newer version).
    pub status_conflicts: u64,
    /// Passes skipped because the object carries the ignore annotation
    /// ([`IGNORE_ANNOTATION`](crate::triggers::IGNORE_ANNOTATION)).
    pub ignored: u64,
}

impl Metrics {
    /// Copy the counters.
    pub(crate) fn snapshot(&self) -> MetricsSnapshot {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        MetricsSnapshot {
            runs: l(&self.provision_runs) + l(&self.deprovision_runs),
            provision_runs: l(&self.provision_runs),
            deprovision_runs: l(&self.deprovision_runs),
            restarts: l(&self.restarts),
            quarantined: l(&self.quarantined),
            status_writes: l(&self.status_writes),
            in_flight: l(&self.in_flight),
            peak_in_flight: l(&self.peak_in_flight),
            live_actors: l(&self.live_actors),
            peak_live_actors: l(&self.peak_live_actors),
            passivations: l(&self.passivations),
            activations: l(&self.activations),
            spawns: l(&self.spawns),
            status_conflicts: l(&self.status_conflicts),
            ignored: l(&self.ignored),
        }
    }

    pub(super) fn run_started(&self, deleting: bool) -> InFlight<'_> {
        if deleting {
            self.deprovision_runs.fetch_add(1, Ordering::Relaxed);
        } else {
            self.provision_runs.fetch_add(1, Ordering::Relaxed);
        }
        let now = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        raise_peak(&self.peak_in_flight, now);
        InFlight(self)
    }

    /// Every actor start is an activation: counts both, and the peak of live actors.
    pub(super) fn actor_started(&self) {
        Self::inc(&self.activations);
        let live = self.live_actors.fetch_add(1, Ordering::Relaxed) + 1;
        raise_peak(&self.peak_live_actors, live);
    }

    pub(super) fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn dec(counter: &AtomicU64) {
        counter.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Raise `peak` to `value` if it is higher (a plain load first: most calls raise nothing).
fn raise_peak(peak: &AtomicU64, value: u64) {
    if value > peak.load(Ordering::Relaxed) {
        peak.fetch_max(value, Ordering::Relaxed);
    }
}

/// Decrements the in-flight gauge when a pass ends, even by panic.
pub(super) struct InFlight<'a>(&'a Metrics);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        Metrics::dec(&self.0.in_flight);
    }
}
