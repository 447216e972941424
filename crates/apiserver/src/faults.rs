//! Fault injection: latency, injected 500s and 409s, deterministic from a seed.

use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// Faults the in-process cluster injects into requests.
///
/// `Default` injects nothing. Every random decision is drawn from one generator seeded with `seed`, in the
/// order requests arrive, so the same sequence of requests under the same seed meets the same faults
/// (under a paused tokio clock the arrival order is itself deterministic).
///
/// Loadable from TOML (or any serde format). Durations accept a string in humantime's format
/// (`"150ms"`, `"2s"`, `"250us"`, `"1m"`, `"1s 500ms"`), a bare number of milliseconds, or serde's
/// `{ secs, nanos }` table:
///
/// ```
/// # use actorcile_apiserver::Faults;
/// let f: Faults = toml::from_str(r#"
///     latency = "5ms"
///     latency_jitter = 2
///     error_rate = 0.01
///     conflict_rate = 0.05
///     seed = 42
/// "#).unwrap();
/// assert_eq!(f.latency, std::time::Duration::from_millis(5));
/// assert_eq!(f.latency_jitter, std::time::Duration::from_millis(2));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// Added to every request (watches included, before the stream starts), with `tokio::time::sleep`.
    #[serde(deserialize_with = "de_duration")]
    pub latency: Duration,
    /// A uniformly random extra delay in `[0, latency_jitter]` added to `latency`.
    #[serde(deserialize_with = "de_duration")]
    pub latency_jitter: Duration,
    /// Fraction (0.0–1.0) of non-watch requests answered `500 InternalError` without any effect.
    pub error_rate: f64,
    /// Fraction (0.0–1.0) of writes to existing objects (update, patch, status writes) answered
    /// `409 Conflict` without any effect, as if another writer had won the race.
    pub conflict_rate: f64,
    /// Seed of the fault generator.
    pub seed: u64,
}

impl Faults {
    /// True when nothing is injected.
    pub fn is_none(&self) -> bool {
        self.latency.is_zero()
            && self.latency_jitter.is_zero()
            && self.error_rate <= 0.0
            && self.conflict_rate <= 0.0
    }
}

/// What the fault generator decided for one request.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Decision {
    pub(crate) delay: Duration,
    pub(crate) error: bool,
    pub(crate) conflict: bool,
}

/// The seeded generator plus the current settings.
#[derive(Debug)]
pub(crate) struct FaultState {
    pub(crate) faults: Faults,
    rng: fastrand::Rng,
}

impl FaultState {
    pub(crate) fn new(faults: Faults) -> FaultState {
        FaultState {
            rng: fastrand::Rng::with_seed(faults.seed),
            faults,
        }
    }

    /// Draws the decisions for one request. Always draws the same number of values so that the stream of
    /// decisions depends only on the request order, not on which kinds of requests came before.
    pub(crate) fn decide(&mut self, is_watch: bool, is_write_existing: bool) -> Decision {
        if self.faults.is_none() {
            return Decision::default();
        }
        let jitter = self.rng.f64();
        let e = self.rng.f64();
        let c = self.rng.f64();
        let f = &self.faults;
        Decision {
            delay: f.latency.saturating_add(f.latency_jitter.mul_f64(jitter)),
            error: !is_watch && e < f.error_rate,
            conflict: is_write_existing && c < f.conflict_rate,
        }
    }
}

fn de_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Repr {
        Millis(u64),
        Float(f64),
        Text(String),
        Table {
            secs: u64,
            #[serde(default)]
            nanos: u32,
        },
    }
    use serde::de::Error;
    match Repr::deserialize(d)? {
        Repr::Millis(ms) => Ok(Duration::from_millis(ms)),
        Repr::Float(ms) => Duration::try_from_secs_f64(ms / 1000.0)
            .map_err(|_| D::Error::custom(format!("invalid duration {ms}"))),
        Repr::Table { secs, nanos } => Ok(Duration::new(secs, nanos)),
        Repr::Text(s) => {
            parse_duration(&s).ok_or_else(|| D::Error::custom(format!("invalid duration {s:?}")))
        }
    }
}

/// A duration in humantime's format: `"150ms"`, `"2s"`, `"250us"`, `"100ns"`, `"1m"`,
/// `"1h 30m"` (the scenario files' format too).
fn parse_duration(s: &str) -> Option<Duration> {
    humantime::parse_duration(s.trim()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("150ms"), Some(Duration::from_millis(150)));
        assert_eq!(
            parse_duration("1s 500ms"),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(parse_duration("250us"), Some(Duration::from_micros(250)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("5"), None);
        assert_eq!(parse_duration("abc"), None);
        let f: Faults = toml::from_str("latency = { secs = 1, nanos = 5 }").unwrap();
        assert_eq!(f.latency, Duration::new(1, 5));
        assert!(toml::from_str::<Faults>("latency = \"fast\"").is_err());
        assert!(toml::from_str::<Faults>("nonsense = 1").is_err());
        // Out of range: an error, not a panic.
        assert_eq!(parse_duration("1e300s"), None);
        assert_eq!(parse_duration("100000000000000000000s"), None);
        assert!(toml::from_str::<Faults>("latency = 1e300").is_err());
        assert!(toml::from_str::<Faults>("latency = -1.0").is_err());
    }

    #[test]
    fn same_seed_same_decisions() {
        let faults = Faults {
            error_rate: 0.3,
            conflict_rate: 0.3,
            seed: 7,
            ..Faults::default()
        };
        let run = || {
            let mut s = FaultState::new(faults.clone());
            (0..200)
                .map(|_| {
                    let d = s.decide(false, true);
                    (d.error, d.conflict)
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(run(), run());
        let errors = run().iter().filter(|d| d.0).count();
        assert!((30..90).contains(&errors), "{errors}");
    }
}
