//! What a simulation reports: per policy, a readable table and one JSON object.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::scenario::Scenario;

/// Virtual seconds (from the runtime's start) until a fraction of the objects was first Ready;
/// `None`: not reached within the run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Percentiles {
    /// 50 % Ready.
    pub p50: Option<f64>,
    /// 90 % Ready.
    pub p90: Option<f64>,
    /// 99 % Ready.
    pub p99: Option<f64>,
    /// Every object Ready.
    pub p100: Option<f64>,
}

/// The outcome of one policy on the scenario.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PolicyResult {
    /// The policy's name (built-in name or file stem).
    pub policy: String,
    /// Objects in the scenario.
    pub objects: usize,
    /// Objects Ready when the run stopped.
    pub ready_at_end: usize,
    /// When 50/90/99/100 % were first Ready.
    pub time_to_ready: Percentiles,
    /// Virtual seconds the run lasted.
    pub virtual_seconds: f64,
    /// Provisioner reconciles started.
    pub runs: u64,
    /// Resource actors restarted after a panic.
    pub restarts: u64,
    /// Resources quarantined past the restart intensity.
    pub quarantined: u64,
    /// Status patches the runtime sent.
    pub status_writes: u64,
    /// Most reconciles in flight at once.
    pub peak_in_flight: u64,
    /// Most resource actors alive at once (bounded by the policy's `max_live_actors`).
    pub peak_live_actors: u64,
    /// API requests the runtime made (set-up and the readiness observer excluded).
    pub api_requests: u64,
    /// Of which writes (create, update, patch, delete).
    pub api_writes: u64,
    /// Requests answered with an injected 500.
    pub injected_errors: u64,
    /// Writes answered with an injected 409.
    pub injected_conflicts: u64,
    /// Set when a manager escalated (restart intensity exceeded with `on_exhausted = "escalate"`);
    /// the run stopped there.
    pub escalated: Option<String>,
    /// Objects not Ready when the run stopped, by the reason of their Ready condition
    /// (`NoStatus`: never written), read from the API after the run.
    pub not_ready: BTreeMap<String, usize>,
    /// Wall-clock seconds the run took (the only field that varies between identical runs).
    pub wall_seconds: f64,
    /// Fraction Ready over virtual time: `(seconds, fraction)`, sampled every `sample_every`
    /// (not in the JSON report).
    #[serde(skip)]
    pub series: Vec<(f64, f64)>,
}

impl PolicyResult {
    /// This result without its wall-clock time, for comparing runs.
    #[cfg(test)]
    pub fn deterministic(&self) -> PolicyResult {
        PolicyResult {
            wall_seconds: 0.0,
            ..self.clone()
        }
    }
}

/// What the scenario was, for the report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ScenarioSummary {
    /// Its name.
    pub name: String,
    /// Objects.
    pub objects: usize,
    /// Virtual time limit in seconds.
    pub duration_seconds: f64,
    /// Its seed.
    pub seed: u64,
}

impl From<&Scenario> for ScenarioSummary {
    fn from(s: &Scenario) -> Self {
        Self {
            name: s.name.clone(),
            objects: s.objects,
            duration_seconds: s.duration.as_secs_f64(),
            seed: s.seed,
        }
    }
}

/// Every policy's result on one scenario.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Comparison {
    /// The scenario.
    pub scenario: ScenarioSummary,
    /// One result per policy, in the order given.
    pub results: Vec<PolicyResult>,
}

fn secs(v: Option<f64>) -> String {
    match v {
        None => "never".into(),
        Some(s) if s < 600.0 => format!("{s:.1}s"),
        Some(s) => {
            let m = (s / 60.0).floor();
            format!("{m:.0}m{:04.1}s", s - m * 60.0)
        }
    }
}

impl Comparison {
    /// The report as one line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a report always serializes")
    }

    /// The readable table.
    pub fn table(&self) -> String {
        let s = &self.scenario;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "scenario {}: {} objects, seed {}, at most {} of virtual time",
            s.name,
            s.objects,
            s.seed,
            secs(Some(s.duration_seconds))
        );
        let header = [
            "policy",
            "50% Ready",
            "90% Ready",
            "99% Ready",
            "100% Ready",
            "Ready at end",
            "runs",
            "restarts",
            "quarantined",
            "API requests",
            "peak in flight",
            "peak live actors",
            "wall",
        ];
        let rows: Vec<Vec<String>> = self
            .results
            .iter()
            .map(|r| {
                let t = &r.time_to_ready;
                vec![
                    r.policy.clone(),
                    secs(t.p50),
                    secs(t.p90),
                    secs(t.p99),
                    secs(t.p100),
                    format!(
                        "{}/{} ({:.1}%)",
                        r.ready_at_end,
                        r.objects,
                        100.0 * r.ready_at_end as f64 / r.objects.max(1) as f64
                    ),
                    r.runs.to_string(),
                    r.restarts.to_string(),
                    r.quarantined.to_string(),
                    r.api_requests.to_string(),
                    r.peak_in_flight.to_string(),
                    r.peak_live_actors.to_string(),
                    format!("{:.1}s", r.wall_seconds),
                ]
            })
            .collect();
        let widths: Vec<usize> = (0..header.len())
            .map(|i| {
                rows.iter()
                    .map(|r| r[i].chars().count())
                    .chain([header[i].len()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |cells: &[String]| {
            cells
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    if i == 0 {
                        format!("{c:<w$}", w = widths[i])
                    } else {
                        format!("{c:>w$}", w = widths[i])
                    }
                })
                .collect::<Vec<_>>()
                .join("  ")
        };
        let head: Vec<String> = header.iter().map(|h| h.to_string()).collect();
        let _ = writeln!(out, "{}", line(&head));
        let _ = writeln!(
            out,
            "{}",
            widths
                .iter()
                .map(|w| "-".repeat(*w))
                .collect::<Vec<_>>()
                .join("  ")
        );
        for r in &rows {
            let _ = writeln!(out, "{}", line(r));
        }
        for r in &self.results {
            if !r.not_ready.is_empty() {
                let reasons: Vec<String> = r
                    .not_ready
                    .iter()
                    .map(|(k, v)| format!("{v} {k}"))
                    .collect();
                let _ = writeln!(
                    out,
                    "{}: not Ready at the end: {}",
                    r.policy,
                    reasons.join(", ")
                );
            }
            if let Some(e) = &r.escalated {
                let _ = writeln!(out, "{}: stopped, a manager escalated: {e}", r.policy);
            }
        }
        let _ = writeln!(
            out,
            "times are virtual, from the runtime's start; API requests exclude set-up and the readiness observer"
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(name: &str, p100: Option<f64>) -> PolicyResult {
        PolicyResult {
            policy: name.into(),
            objects: 10,
            ready_at_end: if p100.is_some() { 10 } else { 7 },
            time_to_ready: Percentiles {
                p50: Some(1.25),
                p90: Some(700.0),
                p99: p100,
                p100,
            },
            virtual_seconds: 3600.0,
            runs: 42,
            restarts: 3,
            quarantined: 1,
            status_writes: 20,
            peak_in_flight: 8,
            peak_live_actors: 30,
            api_requests: 99,
            api_writes: 50,
            injected_errors: 2,
            injected_conflicts: 1,
            escalated: None,
            not_ready: if p100.is_some() {
                BTreeMap::new()
            } else {
                [("Quarantined".to_string(), 3)].into()
            },
            wall_seconds: 0.5,
            series: vec![(0.0, 0.0), (1.0, 0.5)],
        }
    }

    #[test]
    fn table_and_json_show_every_policy() {
        let c = Comparison {
            scenario: ScenarioSummary {
                name: "s".into(),
                objects: 10,
                duration_seconds: 3600.0,
                seed: 1,
            },
            results: vec![result("fast-one", Some(30.0)), result("stuck-one", None)],
        };
        let t = c.table();
        assert!(t.contains("fast-one") && t.contains("stuck-one"), "{t}");
        assert!(t.contains("never"), "{t}");
        assert!(t.contains("11m40.0s"), "{t}");
        assert!(t.contains("7/10 (70.0%)"), "{t}");
        assert!(
            t.contains("stuck-one: not Ready at the end: 3 Quarantined"),
            "{t}"
        );
        let j: serde_json::Value = serde_json::from_str(&c.to_json()).unwrap();
        assert!(!c.to_json().contains('\n'));
        assert_eq!(
            j["results"][1]["time_to_ready"]["p100"],
            serde_json::Value::Null
        );
        assert_eq!(j["results"][0]["time_to_ready"]["p100"], 30.0);
        assert_eq!(j["results"][0]["restarts"], 3);
        assert!(j["results"][0].get("series").is_none());
        assert_eq!(j["scenario"]["name"], "s");
    }
}
