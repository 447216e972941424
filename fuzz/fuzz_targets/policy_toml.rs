//! Supervisor policies from TOML, and their durations as the runtime uses them: any text is a
//! policy or a typed error, never a panic; a policy that loads validates and round-trips; and
//! whatever durations it holds, the restart supervisor, the error backoff, the timers and the
//! Lease writers compute with them without overflow and within what the policy says.

#![no_main]

use std::time::Duration;

use actorcile::fuzzing;
use actorcile::policy::{KindPolicy, SupervisorPolicy};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (&str, Vec<(bool, u32)>, u32, u64)| {
    let (text, gaps, attempts, seed) = input;
    let Ok(policy) = SupervisorPolicy::from_toml(text) else {
        return;
    };
    let again = toml_round_trip(&policy);
    assert_eq!(again.as_ref(), Some(&policy), "{text:?}");
    in_use(&policy.kind, &gaps, attempts, seed);
    for kind in policy.kinds.values() {
        in_use(kind, &gaps, attempts, seed);
    }
    for d in [
        policy.runtime.dependency_watch_idle,
        policy.runtime.shutdown_timeout,
        policy.lease.retry_period,
    ] {
        assert!(fuzzing::wake_deadline(d).is_some(), "a timer cannot hold {d:?}");
    }
    assert_eq!(
        u64::try_from(fuzzing::lease_seconds(&policy)).ok(),
        Some(policy.lease.duration.as_secs()),
        "leaseDurationSeconds of {:?}",
        policy.lease.duration
    );
});

/// What the runtime computes from a kind's durations, checked.
fn in_use(policy: &KindPolicy, gaps: &[(bool, u32)], attempts: u32, seed: u64) {
    // Failures of one object's actor, `gaps` apart (seconds or milliseconds).
    let gaps: Vec<Duration> = gaps
        .iter()
        .take(64)
        .map(|&(seconds, n)| {
            if seconds {
                Duration::from_secs(n.into())
            } else {
                Duration::from_millis(n.into())
            }
        })
        .collect();
    let restart = &policy.restart;
    let decisions = fuzzing::restart_decisions(restart, &gaps, seed);
    // Jitter adds up to the delay itself.
    let longest = restart.backoff.max.saturating_mul(2);
    let mut times = Vec::new();
    let mut at = Duration::ZERO;
    for (i, decision) in decisions.iter().enumerate() {
        at = at.saturating_add(gaps[i]);
        times.push(at);
        let within = times.iter().filter(|t| at - **t <= restart.window).count();
        match decision {
            None => assert!(
                within > restart.max_restarts as usize,
                "exhausted at failure {i} with {within} within the window: {restart:?}"
            ),
            Some(delay) => {
                assert!(
                    within <= restart.max_restarts as usize,
                    "restarted at failure {i} with {within} within the window: {restart:?}"
                );
                assert!(*delay <= longest, "restart delay {delay:?}: {restart:?}");
            }
        }
    }
    let backoff = &policy.error_backoff;
    for delay in fuzzing::error_backoff(backoff, attempts, 8, Some(seed)) {
        assert!(
            delay <= backoff.max.saturating_mul(2),
            "error backoff {delay:?} after {attempts} attempts: {backoff:?}"
        );
    }
    for d in [
        Some(policy.yield_delay),
        Some(policy.dependency_poll),
        Some(policy.lock_expiry),
        policy.poll_interval,
        policy.idle_timeout,
        policy.reconcile_timeout,
        policy.write_timeout,
        Some(backoff.max),
        Some(restart.backoff.max),
    ]
    .into_iter()
    .flatten()
    {
        assert!(fuzzing::wake_deadline(d).is_some(), "a timer cannot hold {d:?}");
    }
}

/// The policy written as TOML and read back.
fn toml_round_trip(p: &SupervisorPolicy) -> Option<SupervisorPolicy> {
    let text = toml::to_string(p).ok()?;
    SupervisorPolicy::from_toml(&text).ok()
}
