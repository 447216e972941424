//! Scenarios: the workload a simulation runs and the API faults it runs under.
//!
//! A scenario is TOML; every field has a default, unknown fields are refused, and values are
//! range-checked, with errors naming the field:
//!
//! ```toml
//! name = "flaky"
//! objects = 1000          # resources created before the runtime starts
//! duration = "1h"         # virtual time limit (stops earlier once everything is Ready)
//! sample_every = "1s"     # readiness sampling interval (virtual time), for the plot
//! stop_when_ready = true  # stop once every object is Ready; false: run the whole duration
//! seed = 42               # seeds provisioner behaviour, policy jitter and API faults
//!
//! [provisioner]           # each object's tree: `steps` steps in series
//! steps = 3
//! latency = "20ms"        # virtual time one step visit takes ...
//! latency_jitter = "30ms" # ... plus a uniform extra in [0, latency_jitter]
//! min_yields = 0          # each step yields a number of times drawn per object
//! max_yields = 3          # uniformly from [min_yields, max_yields] before it is done
//! yield_after = "2s"      # the yield's delay; omit to use the policy's yield_delay
//! failure_rate = 0.05     # per step visit: probability of a transient failure ...
//! panic_rate = 0.01       # ... and of a panic (the actor fails; the supervisor restarts it)
//!
//! [nodes]                 # optional: each tree ends with `nodes(..)` on the simulated provider
//! control_planes = 1      # nodes per object's cluster, by role
//! workers = 2
//! latency = "50ms"        # each provider call takes latency + U[0, latency_jitter]
//! latency_jitter = "50ms"
//! failure_rate = 0.02     # fraction of provider calls that fail
//! stuck_rate = 0.0        # fraction of started nodes that never run
//!
//! [faults]                # the in-process cluster's fault injection
//! latency = "2ms"
//! latency_jitter = "3ms"
//! error_rate = 0.01       # fraction of requests answered 500
//! conflict_rate = 0.02    # fraction of writes to existing objects answered 409
//! # seed = 5              # default: derived from the scenario's seed
//! ```
//!
//! The built-in scenarios are the files in `cli/scenarios/` (compiled in).

use std::path::Path;
use std::time::Duration;

use actorcile::cluster::Faults;
use serde::{Deserialize, Serialize};

use super::mix;

/// The most objects a scenario may create.
pub const MAX_OBJECTS: usize = 1_000_000;
/// The most readiness samples one run may take (`duration / sample_every`).
pub const MAX_SAMPLES: u128 = 1_000_000;

/// Built-in scenarios: name and TOML text (the files in `cli/scenarios/`).
pub const BUILT_INS: &[(&str, &str)] = &[
    ("steady", include_str!("../../scenarios/steady.toml")),
    ("flaky", include_str!("../../scenarios/flaky.toml")),
    ("panicky", include_str!("../../scenarios/panicky.toml")),
    ("slow-api", include_str!("../../scenarios/slow-api.toml")),
    ("infra", include_str!("../../scenarios/infra.toml")),
    ("hour-10k", include_str!("../../scenarios/hour-10k.toml")),
];

/// A workload plus API faults, run once per compared policy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Scenario {
    /// Shown in reports and the plot title (default: the file's stem).
    pub name: String,
    /// One line for humans.
    pub description: String,
    /// How many resources are created before the runtime starts.
    pub objects: usize,
    /// Virtual time limit of one run; a run stops earlier once every object is Ready.
    #[serde(with = "humantime_serde")]
    pub duration: Duration,
    /// Readiness is sampled this often (virtual time) for the plot.
    #[serde(with = "humantime_serde")]
    pub sample_every: Duration,
    /// Stop a run as soon as every object is Ready (default); `false` runs the whole `duration`,
    /// e.g. to measure the steady-state cost of polling.
    pub stop_when_ready: bool,
    /// Seeds every random choice: provisioner behaviour, policy jitter (when the policy sets no
    /// `seed`), API faults (when `faults.seed` is not set).
    pub seed: u64,
    /// What each object's provisioner tree does.
    pub provisioner: Workload,
    /// API faults the in-process cluster injects.
    pub faults: ApiFaults,
    /// Nodes on the simulated infrastructure provider, converged by each tree's last step.
    pub nodes: Option<NodesSpec>,
}

/// The `nodes(..)` step each object's tree ends with, on
/// [`SimulatedProvider`](actorcile::providers::simulated::SimulatedProvider).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodesSpec {
    /// Control-plane nodes per object's cluster.
    pub control_planes: usize,
    /// Worker nodes per object's cluster.
    pub workers: usize,
    /// Virtual time each provider call takes.
    #[serde(with = "humantime_serde")]
    pub latency: Duration,
    /// Uniform extra time in `[0, latency_jitter]` per call.
    #[serde(with = "humantime_serde")]
    pub latency_jitter: Duration,
    /// Fraction of provider calls that fail.
    pub failure_rate: f64,
    /// Fraction of started nodes that never run.
    pub stuck_rate: f64,
}

impl Default for NodesSpec {
    fn default() -> Self {
        Self {
            control_planes: 1,
            workers: 0,
            latency: Duration::ZERO,
            latency_jitter: Duration::ZERO,
            failure_rate: 0.0,
            stuck_rate: 0.0,
        }
    }
}

impl Default for Scenario {
    fn default() -> Self {
        Self {
            name: "custom".into(),
            description: String::new(),
            objects: 1000,
            duration: Duration::from_secs(3600),
            sample_every: Duration::from_secs(1),
            stop_when_ready: true,
            seed: 0,
            provisioner: Workload::default(),
            faults: ApiFaults::default(),
            nodes: None,
        }
    }
}

/// The provisioner tree of every object: `steps` steps in series, whose behaviour on each visit
/// is drawn from a generator seeded by (scenario seed, object name, reconcile number, step).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Workload {
    /// Steps in the serial tree (1–64).
    pub steps: u32,
    /// Virtual time one step visit takes (a run holds its concurrency slot meanwhile).
    #[serde(with = "humantime_serde")]
    pub latency: Duration,
    /// Uniform extra time in `[0, latency_jitter]` per step visit.
    #[serde(with = "humantime_serde")]
    pub latency_jitter: Duration,
    /// Fewest yields a step makes before it is done.
    pub min_yields: u32,
    /// Most yields a step makes before it is done (drawn per object and step).
    pub max_yields: u32,
    /// Delay of each yield; `None` (the default: omit it) uses the policy's `yield_delay`.
    #[serde(with = "humantime_serde")]
    pub yield_after: Option<Duration>,
    /// Per step visit: probability of a transient failure (`Outcome::Failed`).
    pub failure_rate: f64,
    /// Per step visit: probability of a panic (the resource actor fails and is restarted per
    /// the policy).
    pub panic_rate: f64,
}

impl Default for Workload {
    fn default() -> Self {
        Self {
            steps: 3,
            latency: Duration::from_millis(20),
            latency_jitter: Duration::from_millis(10),
            min_yields: 0,
            max_yields: 2,
            yield_after: None,
            failure_rate: 0.0,
            panic_rate: 0.0,
        }
    }
}

/// API faults, mapped onto the in-process cluster's [`Faults`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApiFaults {
    /// Added to every request.
    #[serde(with = "humantime_serde")]
    pub latency: Duration,
    /// Uniform extra delay in `[0, latency_jitter]` per request.
    #[serde(with = "humantime_serde")]
    pub latency_jitter: Duration,
    /// Fraction of (non-watch) requests answered `500`.
    pub error_rate: f64,
    /// Fraction of writes to existing objects answered `409 Conflict`.
    pub conflict_rate: f64,
    /// Seed of the fault generator (default: derived from the scenario's seed).
    pub seed: Option<u64>,
}

impl ApiFaults {
    /// The cluster's fault settings for a scenario seeded with `scenario_seed`.
    pub fn to_faults(&self, scenario_seed: u64) -> Faults {
        Faults {
            latency: self.latency,
            latency_jitter: self.latency_jitter,
            error_rate: self.error_rate,
            conflict_rate: self.conflict_rate,
            seed: self.seed.unwrap_or_else(|| mix(&[scenario_seed, 0xFA017])),
        }
    }
}

/// A scenario that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The file could not be read.
    #[error("cannot read scenario file {path}: {error}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        error: std::io::Error,
    },
    /// The TOML does not parse, or names an unknown or mistyped field (the message names it).
    #[error("invalid scenario {origin}: {message}")]
    Parse {
        /// File or built-in name.
        origin: String,
        /// The parser's message.
        message: String,
    },
    /// A field has a value out of range.
    #[error("invalid scenario {origin}: field `{field}` {reason}")]
    Invalid {
        /// File or built-in name.
        origin: String,
        /// Dotted path of the field.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// Neither a built-in name nor an existing file.
    #[error("unknown scenario `{0}`: not a built-in ({built_ins}) and no such file", built_ins = super::built_in_names(BUILT_INS))]
    Unknown(String),
}

fn check_rate(field: &str, v: f64) -> Result<(), (String, String)> {
    if v.is_finite() && (0.0..=1.0).contains(&v) {
        Ok(())
    } else {
        Err((field.into(), format!("must be within [0, 1], got {v}")))
    }
}

impl Scenario {
    /// Parse and validate TOML; `origin` names the source in errors and is the default `name`.
    pub fn from_toml(text: &str, origin: &str) -> Result<Self, ScenarioError> {
        let has_name = toml::from_str::<toml::Table>(text)
            .map(|t| t.contains_key("name"))
            .unwrap_or(false);
        let mut s: Scenario = toml::from_str(text).map_err(|e| ScenarioError::Parse {
            origin: origin.into(),
            message: e.to_string(),
        })?;
        if !has_name {
            s.name = origin.into();
        }
        s.validate_as(origin)?;
        Ok(s)
    }

    /// Read a scenario file; its stem is the default name.
    pub fn from_file(path: &Path) -> Result<Self, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|error| ScenarioError::Io {
            path: path.display().to_string(),
            error,
        })?;
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.display().to_string());
        Self::from_toml(&text, &stem).map_err(|e| match e {
            ScenarioError::Parse { message, .. } => ScenarioError::Parse {
                origin: path.display().to_string(),
                message,
            },
            ScenarioError::Invalid { field, reason, .. } => ScenarioError::Invalid {
                origin: path.display().to_string(),
                field,
                reason,
            },
            other => other,
        })
    }

    /// A built-in scenario by name.
    pub fn built_in(name: &str) -> Option<Self> {
        BUILT_INS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(n, text)| Self::from_toml(text, n).expect("built-in scenarios are valid"))
    }

    /// A built-in name, else a TOML file.
    pub fn resolve(spec: &str) -> Result<Self, ScenarioError> {
        if let Some(s) = Self::built_in(spec) {
            return Ok(s);
        }
        let path = Path::new(spec);
        if path.exists() || spec.ends_with(".toml") || spec.contains(std::path::MAIN_SEPARATOR) {
            return Self::from_file(path);
        }
        Err(ScenarioError::Unknown(spec.into()))
    }

    /// Check the values a type cannot express.
    pub fn validate(&self) -> Result<(), ScenarioError> {
        self.validate_as(&self.name)
    }

    fn validate_as(&self, origin: &str) -> Result<(), ScenarioError> {
        self.check()
            .map_err(|(field, reason)| ScenarioError::Invalid {
                origin: origin.into(),
                field,
                reason,
            })
    }

    fn check(&self) -> Result<(), (String, String)> {
        let bad = |f: &str, r: &str| Err((f.to_string(), r.to_string()));
        if self.name.trim().is_empty() {
            return bad("name", "must not be empty");
        }
        if self.objects == 0 || self.objects > MAX_OBJECTS {
            return bad("objects", &format!("must be within 1..={MAX_OBJECTS}"));
        }
        if self.duration.is_zero() {
            return bad("duration", "must be longer than zero");
        }
        if self.duration > Duration::from_secs(366 * 24 * 3600) {
            return bad("duration", "must be at most a year");
        }
        if self.sample_every.is_zero() || self.sample_every > self.duration {
            return bad(
                "sample_every",
                "must be longer than zero and at most the duration",
            );
        }
        if self.duration.as_nanos() / self.sample_every.as_nanos() > MAX_SAMPLES {
            return bad(
                "sample_every",
                &format!("gives more than {MAX_SAMPLES} samples over `duration`"),
            );
        }
        let w = &self.provisioner;
        if !(1..=64).contains(&w.steps) {
            return bad("provisioner.steps", "must be within 1..=64");
        }
        if w.min_yields > w.max_yields {
            return bad("provisioner.min_yields", "must not exceed max_yields");
        }
        if w.max_yields > 10_000 {
            return bad("provisioner.max_yields", "must be at most 10000");
        }
        if w.yield_after
            .is_some_and(|d| d.is_zero() || d > Duration::from_secs(24 * 3600))
        {
            return bad(
                "provisioner.yield_after",
                "must be longer than zero and at most a day",
            );
        }
        if w.latency.saturating_add(w.latency_jitter) > Duration::from_secs(24 * 3600) {
            return bad(
                "provisioner.latency",
                "plus latency_jitter must be at most a day",
            );
        }
        check_rate("provisioner.failure_rate", w.failure_rate)?;
        check_rate("provisioner.panic_rate", w.panic_rate)?;
        if w.failure_rate + w.panic_rate > 1.0 {
            return bad(
                "provisioner.panic_rate",
                "plus failure_rate must not exceed 1",
            );
        }
        if let Some(n) = &self.nodes {
            if n.control_planes + n.workers > 100 {
                return bad("nodes.workers", "plus control_planes must be at most 100");
            }
            if n.latency.saturating_add(n.latency_jitter) > Duration::from_secs(24 * 3600) {
                return bad("nodes.latency", "plus latency_jitter must be at most a day");
            }
            check_rate("nodes.failure_rate", n.failure_rate)?;
            check_rate("nodes.stuck_rate", n.stuck_rate)?;
        }
        let f = &self.faults;
        check_rate("faults.error_rate", f.error_rate)?;
        check_rate("faults.conflict_rate", f.conflict_rate)?;
        if f.error_rate >= 1.0 {
            return bad(
                "faults.error_rate",
                "must be below 1 (nothing could ever succeed)",
            );
        }
        if f.latency.saturating_add(f.latency_jitter) > Duration::from_secs(3600) {
            return bad(
                "faults.latency",
                "plus latency_jitter must be at most an hour",
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_ins_parse_and_carry_their_names() {
        for (name, _) in BUILT_INS {
            let s = Scenario::built_in(name).unwrap();
            assert_eq!(&s.name, name);
        }
        assert!(Scenario::built_in("nope").is_none());
        let f = Scenario::built_in("flaky").unwrap();
        assert_eq!(f.seed, 42);
        assert_eq!(f.provisioner.failure_rate, 0.05);
        assert_eq!(f.faults.conflict_rate, 0.02);
        assert_eq!(
            Scenario::built_in("slow-api")
                .unwrap()
                .provisioner
                .yield_after,
            None
        );
    }

    #[test]
    fn unknown_field_is_named() {
        let e = Scenario::from_toml("objects = 10\nbogus_knob = 1", "t").unwrap_err();
        assert!(e.to_string().contains("bogus_knob"), "{e}");
        let e = Scenario::from_toml("[provisioner]\npanic_ratio = 0.1", "t").unwrap_err();
        assert!(e.to_string().contains("panic_ratio"), "{e}");
        let e = Scenario::from_toml("[faults]\nlatency = \"soon\"", "t").unwrap_err();
        assert!(e.to_string().contains("latency"), "{e}");
    }

    #[test]
    fn out_of_range_values_are_named() {
        let cases = [
            (
                "[provisioner]\nfailure_rate = 1.5",
                "provisioner.failure_rate",
            ),
            ("[provisioner]\npanic_rate = -0.1", "provisioner.panic_rate"),
            (
                "[provisioner]\nfailure_rate = 0.6\npanic_rate = 0.6",
                "provisioner.panic_rate",
            ),
            ("[faults]\nerror_rate = 2.0", "faults.error_rate"),
            ("[faults]\nconflict_rate = nan", "faults.conflict_rate"),
            ("objects = 0", "objects"),
            ("duration = \"0s\"", "duration"),
            ("sample_every = \"0s\"", "sample_every"),
            (
                "duration = \"100h\"\nsample_every = \"1ms\"",
                "sample_every",
            ),
            ("[provisioner]\nsteps = 0", "provisioner.steps"),
            (
                "[provisioner]\nmin_yields = 3\nmax_yields = 1",
                "provisioner.min_yields",
            ),
            ("sample_every = \"5000y\"", "sample_every"),
            (
                "[provisioner]\nyield_after = \"0s\"",
                "provisioner.yield_after",
            ),
            (
                "[provisioner]\nyield_after = \"30000y\"",
                "provisioner.yield_after",
            ),
            (
                "[provisioner]\nlatency = \"300000000000y\"\nlatency_jitter = \"300000000000y\"",
                "provisioner.latency",
            ),
        ];
        for (text, field) in cases {
            let e = Scenario::from_toml(text, "t").unwrap_err();
            assert!(
                matches!(&e, ScenarioError::Invalid { field: f, .. } if f == field),
                "{text:?}: {e}"
            );
            assert!(e.to_string().contains(field), "{e}");
        }
    }

    #[test]
    fn files_and_names_resolve() {
        let dir = std::env::temp_dir().join(format!("actorcile-sim-scn-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("mine.toml");
        std::fs::write(&p, "objects = 5\n[provisioner]\nsteps = 1").unwrap();
        let s = Scenario::resolve(p.to_str().unwrap()).unwrap();
        assert_eq!(s.name, "mine");
        assert_eq!(s.objects, 5);
        std::fs::write(&p, "objects = 5\n[provisioner]\nfailure_rate = 3").unwrap();
        let e = Scenario::resolve(p.to_str().unwrap()).unwrap_err();
        assert!(e.to_string().contains("provisioner.failure_rate"), "{e}");
        assert!(e.to_string().contains("mine.toml"), "{e}");
        let e = Scenario::resolve("no-such-scenario").unwrap_err();
        assert!(matches!(e, ScenarioError::Unknown(_)), "{e}");
        assert!(e.to_string().contains("flaky"), "lists the built-ins: {e}");
        let e = Scenario::resolve(dir.join("missing.toml").to_str().unwrap()).unwrap_err();
        assert!(matches!(e, ScenarioError::Io { .. }), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn fault_seed_defaults_from_the_scenario_seed() {
        let f = ApiFaults {
            error_rate: 0.1,
            ..ApiFaults::default()
        };
        assert_eq!(f.to_faults(1).seed, f.to_faults(1).seed);
        assert_ne!(f.to_faults(1).seed, f.to_faults(2).seed);
        let pinned = ApiFaults {
            seed: Some(9),
            ..f.clone()
        };
        assert_eq!(pinned.to_faults(1).seed, 9);
        assert_eq!(pinned.to_faults(1).error_rate, 0.1);
    }
}
