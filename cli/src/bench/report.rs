//! Results: one [`RunResult`] per runtime (the child's JSON line) and the [`BenchReport`] the
//! parent prints as a table or as one JSON line.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::args::{RuntimeKind, Workload};

/// What one runtime achieved on the workload (printed by its child process as one JSON line).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// Which runtime.
    pub runtime: RuntimeKind,
    /// Number of objects.
    pub objects: u32,
    /// Reconcile runs from the start until every object was done.
    pub runs: u64,
    /// Seconds from the runtime's start until every object was done.
    pub seconds: f64,
    /// `runs / seconds`.
    pub runs_per_sec: f64,
    /// CPU time (user + system, every thread) the child used over the same window. The
    /// in-process cluster serves the runtime's requests in the same process, so its share is
    /// in here too, alike for both runtimes. Less disturbed than `seconds` by other processes
    /// on a shared machine (0 in results from before this field existed).
    #[serde(default)]
    pub cpu_seconds: f64,
    /// Median event→run latency in milliseconds (`null` without samples).
    pub p50_ms: Option<f64>,
    /// 99th percentile event→run latency in milliseconds (`null` without samples).
    pub p99_ms: Option<f64>,
    /// Number of latency samples.
    pub latency_samples: u64,
    /// HTTP requests the runtime's client sent from the start until every object was done.
    pub api_requests: u64,
    /// Peak resident set size of the child process (`VmHWM`), in bytes.
    pub peak_rss_bytes: u64,
    /// Resident set size just before the runtime started (objects created), in bytes.
    pub baseline_rss_bytes: u64,
    /// `peak_rss_bytes / objects`.
    pub rss_per_object_bytes: u64,
    /// With `--repeat`: the seconds of every run of this runtime, in the order run (this result
    /// is the median one). Empty in a child's own line.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub seconds_per_repeat: Vec<f64>,
}

/// The median of one runtime's repeated runs (by seconds; the lower middle one for an even
/// count), with every run's seconds recorded in it.
pub fn median_run(mut runs: Vec<RunResult>) -> Option<RunResult> {
    let all: Vec<f64> = runs.iter().map(|r| r.seconds).collect();
    runs.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
    let mid = runs.len().checked_sub(1)? / 2;
    let mut m = runs.swap_remove(mid);
    if all.len() > 1 {
        m.seconds_per_repeat = all;
    }
    Some(m)
}

/// The whole comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    /// Which workload.
    pub workload: Workload,
    /// Number of objects.
    pub objects: u32,
    /// `in-process`, `envtest` or `kubeconfig`.
    pub backend: String,
    /// Reconcile concurrency limit (both runtimes).
    pub concurrency: u16,
    /// One entry per runtime, in the order run.
    pub runs: Vec<RunResult>,
    /// actorcile's runs/s divided by kube-runtime's (`null` unless both ran).
    pub ratio: Option<f64>,
}

impl BenchReport {
    /// Builds the report and computes the ratio.
    pub fn new(
        workload: Workload,
        objects: u32,
        backend: &str,
        concurrency: u16,
        runs: Vec<RunResult>,
    ) -> Self {
        let rate = |rt: RuntimeKind| {
            runs.iter()
                .find(|r| r.runtime == rt)
                .map(|r| r.runs_per_sec)
        };
        let ratio = match (rate(RuntimeKind::Actorcile), rate(RuntimeKind::KubeRuntime)) {
            (Some(a), Some(k)) if k > 0.0 => Some(a / k),
            _ => None,
        };
        Self {
            workload,
            objects,
            backend: backend.to_string(),
            concurrency,
            runs,
            ratio,
        }
    }

    /// The report as one line of JSON.
    pub fn to_json_line(&self) -> String {
        // Serializing plain data with string keys cannot fail.
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// The report as a readable table.
    pub fn to_table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "workload {}  objects {}  backend {}  concurrency {}",
            self.workload, self.objects, self.backend, self.concurrency
        );
        let header = [
            "runtime",
            "runs",
            "seconds",
            "CPU s",
            "runs/s",
            "p50 ms",
            "p99 ms",
            "API reqs",
            "peak RSS",
            "RSS/object",
            "RSS added",
        ];
        let mut rows: Vec<[String; 11]> = vec![header.map(str::to_string)];
        for r in &self.runs {
            rows.push([
                r.runtime.to_string(),
                r.runs.to_string(),
                format!("{:.3}", r.seconds),
                format!("{:.3}", r.cpu_seconds),
                format!("{:.0}", r.runs_per_sec),
                opt_ms(r.p50_ms),
                opt_ms(r.p99_ms),
                r.api_requests.to_string(),
                human_bytes(r.peak_rss_bytes),
                human_bytes(r.rss_per_object_bytes),
                human_bytes(r.peak_rss_bytes.saturating_sub(r.baseline_rss_bytes)),
            ]);
        }
        let mut widths = [0usize; 11];
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        for row in &rows {
            let mut line = String::new();
            for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
                if i == 0 {
                    let _ = write!(line, "{cell:<w$}");
                } else {
                    let _ = write!(line, "  {cell:>w$}");
                }
            }
            let _ = writeln!(out, "{}", line.trim_end());
        }
        for r in self
            .runs
            .iter()
            .filter(|r| !r.seconds_per_repeat.is_empty())
        {
            let secs: Vec<String> = r
                .seconds_per_repeat
                .iter()
                .map(|s| format!("{s:.3}"))
                .collect();
            let _ = writeln!(
                out,
                "{} seconds per repeat: {} (the median run is shown)",
                r.runtime,
                secs.join(", ")
            );
        }
        match self.ratio {
            Some(ratio) => {
                let _ = writeln!(out, "ratio actorcile / kube-runtime (runs/s): {ratio:.2}");
            }
            None => {
                let _ = writeln!(
                    out,
                    "ratio actorcile / kube-runtime (runs/s): n/a (both runtimes must run)"
                );
            }
        }
        out
    }
}

fn opt_ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.2}"))
}

/// Bytes as B / KiB / MiB / GiB with one decimal.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = b as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(runtime: RuntimeKind, rps: f64) -> RunResult {
        RunResult {
            runtime,
            objects: 10,
            runs: 20,
            seconds: 20.0 / rps,
            runs_per_sec: rps,
            cpu_seconds: 0.25,
            p50_ms: Some(1.5),
            p99_ms: None,
            latency_samples: 10,
            api_requests: 3,
            peak_rss_bytes: 10 * 1024 * 1024,
            baseline_rss_bytes: 5 * 1024 * 1024,
            rss_per_object_bytes: 1024 * 1024,
            seconds_per_repeat: Vec::new(),
        }
    }

    #[test]
    fn median_run_picks_the_middle_by_seconds_and_keeps_every_run() {
        let runs = vec![
            run(RuntimeKind::Actorcile, 10.0),
            run(RuntimeKind::Actorcile, 40.0),
            run(RuntimeKind::Actorcile, 20.0),
        ];
        let m = median_run(runs).unwrap();
        assert_eq!(m.runs_per_sec, 20.0);
        assert_eq!(m.seconds_per_repeat, vec![2.0, 0.5, 1.0]);
        let one = median_run(vec![run(RuntimeKind::KubeRuntime, 5.0)]).unwrap();
        assert!(
            one.seconds_per_repeat.is_empty(),
            "a single run lists no repeats"
        );
        assert!(median_run(Vec::new()).is_none());
        let report = BenchReport::new(Workload::Noop, 10, "in-process", 64, vec![m, one]);
        assert!(
            report
                .to_table()
                .contains("actorcile seconds per repeat: 2.000, 0.500, 1.000")
        );
        assert!(
            report
                .to_json_line()
                .contains("\"seconds_per_repeat\":[2.0,0.5,1.0]")
        );
    }

    #[test]
    fn json_shape() {
        let report = BenchReport::new(
            Workload::Yield,
            10,
            "in-process",
            64,
            vec![
                run(RuntimeKind::Actorcile, 300.0),
                run(RuntimeKind::KubeRuntime, 100.0),
            ],
        );
        let line = report.to_json_line();
        assert!(!line.contains('\n'));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["workload"], "yield");
        assert_eq!(v["objects"], 10);
        assert_eq!(v["backend"], "in-process");
        assert_eq!(v["ratio"], 3.0);
        let runs = v["runs"].as_array().unwrap();
        assert_eq!(runs[0]["runtime"], "actorcile");
        assert_eq!(runs[1]["runtime"], "kube-runtime");
        for key in [
            "objects",
            "runs",
            "seconds",
            "runs_per_sec",
            "cpu_seconds",
            "p50_ms",
            "p99_ms",
            "api_requests",
            "peak_rss_bytes",
            "rss_per_object_bytes",
        ] {
            assert!(runs[0].get(key).is_some(), "missing {key}");
        }
        assert_eq!(runs[0]["p50_ms"], 1.5);
        assert!(runs[0]["p99_ms"].is_null());
        // And it reads back.
        let back: BenchReport = serde_json::from_str(&line).unwrap();
        assert_eq!(back, report);
    }

    #[test]
    fn ratio_needs_both_runtimes() {
        let one = BenchReport::new(
            Workload::Noop,
            10,
            "envtest",
            4,
            vec![run(RuntimeKind::KubeRuntime, 5.0)],
        );
        assert_eq!(one.ratio, None);
        assert!(
            serde_json::from_str::<serde_json::Value>(&one.to_json_line()).unwrap()["ratio"]
                .is_null()
        );
        let zero = BenchReport::new(
            Workload::Noop,
            10,
            "envtest",
            4,
            vec![
                run(RuntimeKind::KubeRuntime, 0.0),
                run(RuntimeKind::Actorcile, 5.0),
            ],
        );
        assert_eq!(zero.ratio, None);
    }

    #[test]
    fn table_lists_each_runtime() {
        let report = BenchReport::new(
            Workload::Noop,
            10,
            "in-process",
            64,
            vec![
                run(RuntimeKind::Actorcile, 200.0),
                run(RuntimeKind::KubeRuntime, 100.0),
            ],
        );
        let table = report.to_table();
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].contains("workload noop"));
        assert!(lines[1].starts_with("runtime"));
        assert!(lines[2].starts_with("actorcile") && lines[2].contains("200"));
        assert!(lines[3].starts_with("kube-runtime") && lines[3].contains("10.0 MiB"));
        assert!(
            lines[3].trim_end().ends_with("5.0 MiB"),
            "RSS added = peak - baseline: {}",
            lines[3]
        );
        assert!(lines[4].contains("2.00"));
    }

    #[test]
    fn human_bytes_units() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(2048), "2.0 KiB");
        assert_eq!(human_bytes(3 * 1024 * 1024 + 512 * 1024), "3.5 MiB");
    }
}
