//! Results: one [`RunResult`] per runtime (the child's JSON line) and the [`BenchReport`] the
//! parent prints as a table or as one JSON line.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::args::{RuntimeKind, Workload};

/// `operator`: the two phases of the workload, and what was left at the end.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OperatorPhases {
    /// Seconds from the runtime's start until the observer saw every object Ready.
    pub ready_seconds: f64,
    /// Seconds from the deletion of every object until the observer saw every one gone (its
    /// child deleted and its finalizer removed by the runtime).
    pub deleted_seconds: f64,
    /// Bench objects still in the API at the end (0 when every one was deleted).
    pub objects_left: u64,
    /// Child ConfigMaps still in the API at the end (0 when every one was deleted).
    pub children_left: u64,
}

/// `restart`: the list alone, and the restart with changes coming in.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RestartPhases {
    /// Seconds from the first runtime's start until every object had run once, no changes
    /// coming in: the list alone.
    pub list_alone_seconds: f64,
    /// Changes written while the listed objects ran (the restart).
    pub changes: u64,
    /// Seconds from the restart until every change had been seen by a run.
    pub all_changes_seconds: f64,
    /// Changes written once the runtime was watching (after its client sent the watch request
    /// that follows its list): a change written earlier waits for the runtime's list to arrive
    /// whole, as it must (a watch starts where its list ended), whatever the runtime's queue
    /// does.
    pub watching_changes: u64,
    /// Median change→run latency of `watching_changes`, in milliseconds.
    pub watching_p50_ms: Option<f64>,
    /// 99th percentile change→run latency of `watching_changes`, in milliseconds.
    pub watching_p99_ms: Option<f64>,
}

impl RestartPhases {
    /// How much longer the list took with changes coming in than alone (`seconds` ÷
    /// `list_alone_seconds`).
    pub fn list_slowdown(&self, seconds: f64) -> Option<f64> {
        ratio(Some(seconds), Some(self.list_alone_seconds))
    }
}

/// What one runtime achieved on the workload (printed by its child process as one JSON line).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// Which runtime.
    pub runtime: RuntimeKind,
    /// Number of objects.
    pub objects: u32,
    /// Reconcile runs from the start until every object was done.
    pub runs: u64,
    /// Seconds from the runtime's start until every object converged (was done; `operator`:
    /// until every object was Ready, then deleted and gone; `restart`: until the last listed
    /// object had run, changes coming in).
    pub seconds: f64,
    /// `runs / seconds`.
    pub runs_per_sec: f64,
    /// CPU time (user + system, every thread) the child used over the same window. The
    /// in-process cluster serves the runtime's requests in the same process, so its share is
    /// in here too, alike for both runtimes. Less disturbed than `seconds` by other processes
    /// on a shared machine.
    pub cpu_seconds: f64,
    /// CPU time (user + system) the API server's processes used over the same window:
    /// kube-apiserver and etcd on envtest (`null` in process, where `cpu_seconds` includes the
    /// server, and against a kubeconfig's cluster, whose processes the bench cannot see). On
    /// a real API server most of a run's CPU is the server's: the load the runtime puts on it.
    #[serde(default)]
    pub server_cpu_seconds: Option<f64>,
    /// Median event→run latency in milliseconds (`null` without samples; `restart`: change→run).
    pub p50_ms: Option<f64>,
    /// 99th percentile event→run latency in milliseconds (`null` without samples).
    pub p99_ms: Option<f64>,
    /// Number of latency samples.
    pub latency_samples: u64,
    /// HTTP requests the runtime's client sent from the start until every object was done.
    pub api_requests: u64,
    /// Peak resident set size of the child process (`VmHWM`) since the runtime started (reset
    /// at the baseline), in bytes; controller-runtime's: its own process's peak.
    pub peak_rss_bytes: u64,
    /// Resident set size just before the runtime started (objects created), in bytes.
    pub baseline_rss_bytes: u64,
    /// `peak_rss_bytes / objects`.
    pub rss_per_object_bytes: u64,
    /// Resident set size before the objects were created, in bytes: `baseline_rss_bytes` minus
    /// this is what the objects cost where they are stored (the in-process cluster holds them
    /// in the same process).
    #[serde(default)]
    pub rss_before_objects_bytes: u64,
    /// Resident set size once the runtime was idle after converging (actorcile: its actors
    /// passivated), as the process stands, in bytes (`operator`: at all Ready, before the
    /// deletion; `null` for `restart`).
    #[serde(default)]
    pub idle_rss_bytes: Option<u64>,
    /// Status writes (PATCH or PUT of `…/status`) the runtime's client made and the server
    /// accepted, until the end of the run.
    pub status_writes: u64,
    /// Seconds from the runtime's first status write sent to its last one answered (`null`
    /// without status writes): the part of `seconds` comparable with a raw write loop
    /// (`examples/write_ceiling.rs`), without start-up, list and observer.
    pub status_write_seconds: Option<f64>,
    /// `operator`: its two phases (`null` for other workloads).
    pub operator: Option<OperatorPhases>,
    /// `restart`: the list alone and the changes (absent for other workloads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart: Option<RestartPhases>,
    /// With `--repeat`: the seconds of every run of this runtime, in the order run (this result
    /// is the median one). Empty in a child's own line.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub seconds_per_repeat: Vec<f64>,
}

impl RunResult {
    /// The fastest and slowest of `seconds_per_repeat` (`None` with a single run).
    pub fn spread(&self) -> Option<(f64, f64)> {
        let min = self.seconds_per_repeat.iter().copied().reduce(f64::min)?;
        let max = self.seconds_per_repeat.iter().copied().reduce(f64::max)?;
        (self.seconds_per_repeat.len() > 1).then_some((min, max))
    }
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

/// The run of `runtime` among `runs`, if it ran.
pub fn run_of(runs: &[RunResult], runtime: RuntimeKind) -> Option<&RunResult> {
    runs.iter().find(|r| r.runtime == runtime)
}

/// `a ÷ b` when both are there and `b > 0`.
fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
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
    /// One entry per runtime, in the order run (each runtime's median run).
    pub runs: Vec<RunResult>,
    /// The headline: kube-runtime's `seconds` ÷ actorcile's `seconds` (median runs), the time
    /// until every object converged. Above 1, actorcile converged faster. `null` unless both
    /// ran.
    pub speedup_converge: Option<f64>,
    /// With `--repeat`: `speedup_converge` of each round (kube-runtime's run ÷ actorcile's run
    /// of the same round), in the order run; its minimum and maximum are the headline's spread.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub speedup_converge_per_repeat: Vec<f64>,
    /// `operator`: kube-runtime's `ready_seconds` ÷ actorcile's (time until every object was
    /// Ready; above 1, actorcile was faster).
    pub speedup_ready: Option<f64>,
    /// `operator`: kube-runtime's `deleted_seconds` ÷ actorcile's (time from the deletion until
    /// every object was gone; above 1, actorcile was faster).
    pub speedup_deleted: Option<f64>,
    /// kube-runtime's `cpu_seconds` ÷ actorcile's (above 1, actorcile used less CPU).
    pub cpu_ratio: Option<f64>,
    /// kube-runtime's `server_cpu_seconds` ÷ actorcile's (above 1, actorcile cost the API
    /// server less CPU; `null` unless both were read).
    #[serde(default)]
    pub server_cpu_ratio: Option<f64>,
    /// With the floor run (`--runtimes …,floor`): kube-runtime's `seconds` ÷ the floor's, the
    /// speedup of actorcile's requests alone, with no runtime; where the API server sets the
    /// pace, about the most a runtime sending them can reach (`null` unless both ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speedup_floor: Option<f64>,
    /// With the floor run: actorcile's `seconds` ÷ the floor's (1: actorcile took no longer than
    /// its requests alone; `null` unless both ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actorcile_over_floor: Option<f64>,
    /// With controller-runtime (`--runtimes …,controller-runtime`): its `seconds` ÷
    /// actorcile's (above 1, actorcile converged faster; `null` unless both ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speedup_controller_runtime: Option<f64>,
    /// With controller-runtime: actorcile's RSS added (its peak minus the bench process's
    /// memory before the runtime started) ÷ controller-runtime's (its whole process's peak);
    /// below 1, actorcile needed less memory (`null` unless both ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_vs_controller_runtime: Option<f64>,
}

impl BenchReport {
    /// Builds the report from each runtime's median run (whose `seconds_per_repeat` are in the
    /// order run, so the n-th of each runtime are the same round) and computes the ratios.
    pub fn new(
        workload: Workload,
        objects: u32,
        backend: &str,
        concurrency: u16,
        runs: Vec<RunResult>,
    ) -> Self {
        let of = |rt: RuntimeKind| run_of(&runs, rt);
        let (ac, kr) = (of(RuntimeKind::Actorcile), of(RuntimeKind::KubeRuntime));
        let floor = of(RuntimeKind::Floor).map(|r| r.seconds);
        let speedup_floor = ratio(kr.map(|r| r.seconds), floor);
        let cr = of(RuntimeKind::ControllerRuntime);
        let speedup_controller_runtime = ratio(cr.map(|r| r.seconds), ac.map(|r| r.seconds));
        let added = |r: &RunResult| r.peak_rss_bytes.saturating_sub(r.baseline_rss_bytes) as f64;
        let memory_vs_controller_runtime = ratio(ac.map(added), cr.map(added));
        let actorcile_over_floor = ratio(ac.map(|r| r.seconds), floor);
        let field = |r: Option<&RunResult>, f: fn(&RunResult) -> Option<f64>| r.and_then(f);
        let speedup = |f: fn(&RunResult) -> Option<f64>| ratio(field(kr, f), field(ac, f));
        let speedup_converge = speedup(|r| Some(r.seconds));
        let speedup_ready = speedup(|r| r.operator.map(|p| p.ready_seconds));
        let speedup_deleted = speedup(|r| r.operator.map(|p| p.deleted_seconds));
        let cpu_ratio = speedup(|r| Some(r.cpu_seconds));
        let server_cpu_ratio = speedup(|r| r.server_cpu_seconds);
        let speedup_converge_per_repeat = match (ac, kr) {
            (Some(ac), Some(kr)) if ac.seconds_per_repeat.len() == kr.seconds_per_repeat.len() => {
                ac.seconds_per_repeat
                    .iter()
                    .zip(&kr.seconds_per_repeat)
                    .filter_map(|(&a, &k)| ratio(Some(k), Some(a)))
                    .collect()
            }
            _ => Vec::new(),
        };
        Self {
            workload,
            objects,
            backend: backend.to_string(),
            concurrency,
            runs,
            speedup_converge,
            speedup_converge_per_repeat,
            speedup_ready,
            speedup_deleted,
            cpu_ratio,
            server_cpu_ratio,
            speedup_floor,
            actorcile_over_floor,
            speedup_controller_runtime,
            memory_vs_controller_runtime,
        }
    }

    /// The report as one line of JSON.
    pub fn to_json_line(&self) -> String {
        // Serializing plain data with string keys cannot fail.
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// The report as a readable table, the headline and the legend.
    pub fn to_table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "workload {}  objects {}  backend {}  concurrency {}",
            self.workload, self.objects, self.backend, self.concurrency
        );
        let operator = self.runs.iter().any(|r| r.operator.is_some());
        let restart = self.runs.iter().any(|r| r.restart.is_some());
        let writes = self.runs.iter().any(|r| r.status_writes > 0);
        let server = self.runs.iter().any(|r| r.server_cpu_seconds.is_some());
        let spread = self.runs.iter().any(|r| r.spread().is_some());
        let mut columns: Vec<Column> = vec![
            ("runtime", Box::new(|r| r.runtime.to_string())),
            ("seconds", Box::new(|r| format!("{:.3}", r.seconds))),
        ];
        if spread {
            columns.push((
                "min–max s",
                Box::new(|r| {
                    r.spread()
                        .map_or_else(|| "-".into(), |(a, b)| format!("{a:.3}–{b:.3}"))
                }),
            ));
        }
        if operator {
            columns.push((
                "ready s",
                Box::new(|r| opt_secs(r.operator.map(|p| p.ready_seconds))),
            ));
            columns.push((
                "deleted s",
                Box::new(|r| opt_secs(r.operator.map(|p| p.deleted_seconds))),
            ));
        }
        if restart {
            columns.push((
                "alone s",
                Box::new(|r| opt_secs(r.restart.map(|p| p.list_alone_seconds))),
            ));
            columns.push((
                "× alone",
                Box::new(|r| {
                    r.restart
                        .and_then(|p| p.list_slowdown(r.seconds))
                        .map_or_else(|| "-".into(), |x| format!("{x:.2}"))
                }),
            ));
            columns.push((
                "changes",
                Box::new(|r| {
                    r.restart
                        .map_or_else(|| "-".into(), |p| p.changes.to_string())
                }),
            ));
            columns.push((
                "watching p50/p99 ms",
                Box::new(|r| {
                    r.restart.map_or_else(
                        || "-".into(),
                        |p| {
                            format!(
                                "{}/{}",
                                opt_ms(p.watching_p50_ms),
                                opt_ms(p.watching_p99_ms)
                            )
                        },
                    )
                }),
            ));
        }
        columns.push(("CPU s", Box::new(|r| format!("{:.3}", r.cpu_seconds))));
        if server {
            columns.push(("server CPU s", Box::new(|r| opt_secs(r.server_cpu_seconds))));
        }
        columns.extend::<[Column; 5]>([
            ("API reqs", Box::new(|r| r.api_requests.to_string())),
            ("runs", Box::new(|r| r.runs.to_string())),
            ("runs/s", Box::new(|r| format!("{:.0}", r.runs_per_sec))),
            ("p50 ms", Box::new(|r| opt_ms(r.p50_ms))),
            ("p99 ms", Box::new(|r| opt_ms(r.p99_ms))),
        ]);
        if writes {
            columns.push(("writes s", Box::new(|r| opt_secs(r.status_write_seconds))));
        }
        columns.extend::<[Column; 2]>([
            ("peak RSS", Box::new(|r| human_bytes(r.peak_rss_bytes))),
            (
                "RSS added",
                Box::new(|r| human_bytes(r.peak_rss_bytes.saturating_sub(r.baseline_rss_bytes))),
            ),
        ]);
        let mut rows: Vec<Vec<String>> = vec![columns.iter().map(|c| c.0.to_string()).collect()];
        for r in &self.runs {
            rows.push(columns.iter().map(|c| (c.1)(r)).collect());
        }
        out.push_str(&aligned(&rows, 1));
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
        let _ = writeln!(out, "{}", self.headline());
        if let Some(floor) = self.floor_line() {
            let _ = writeln!(out, "{floor}");
        }
        if let Some(cr) = self.controller_runtime_line() {
            let _ = writeln!(out, "{cr}");
        }
        out.push('\n');
        out.push_str(LEGEND);
        out
    }

    /// The headline: how much sooner actorcile converged than kube-runtime, with the cost beside.
    pub fn headline(&self) -> String {
        let of = |rt: RuntimeKind| run_of(&self.runs, rt);
        let (Some(speedup), Some(ac), Some(kr)) = (
            self.speedup_converge,
            of(RuntimeKind::Actorcile),
            of(RuntimeKind::KubeRuntime),
        ) else {
            return "speedup (kube-runtime seconds ÷ actorcile seconds): n/a (both runtimes must run)"
                .into();
        };
        let mut line = format!(
            "speedup to converge (kube-runtime seconds ÷ actorcile seconds; > 1: actorcile faster): {speedup:.2}"
        );
        let per_round = &self.speedup_converge_per_repeat;
        if let (Some(min), Some(max)) = (
            per_round.iter().copied().reduce(f64::min),
            per_round.iter().copied().reduce(f64::max),
        ) && per_round.len() > 1
        {
            let _ = write!(line, " (rounds {min:.2}–{max:.2})");
        }
        if let (Some(ready), Some(deleted)) = (self.speedup_ready, self.speedup_deleted) {
            let _ = write!(
                line,
                "; to all Ready {ready:.2}, to all deleted {deleted:.2}"
            );
        }
        let _ = write!(
            line,
            "\n  actorcile {:.3} s, {:.3} CPU s, {} API reqs, {} peak RSS; kube-runtime {:.3} s, {:.3} CPU s, {} API reqs, {} peak RSS",
            ac.seconds,
            ac.cpu_seconds,
            ac.api_requests,
            human_bytes(ac.peak_rss_bytes),
            kr.seconds,
            kr.cpu_seconds,
            kr.api_requests,
            human_bytes(kr.peak_rss_bytes),
        );
        if let (Some(a), Some(k)) = (ac.server_cpu_seconds, kr.server_cpu_seconds) {
            let _ = write!(
                line,
                "\n  API server CPU s: actorcile {a:.3}, kube-runtime {k:.3}"
            );
        }
        line
    }

    /// With controller-runtime and actorcile: how they compare.
    pub fn controller_runtime_line(&self) -> Option<String> {
        let speedup = self.speedup_controller_runtime?;
        let mut line = format!(
            "against controller-runtime (its seconds ÷ actorcile seconds; > 1: actorcile faster): {speedup:.2}"
        );
        let of = |rt: RuntimeKind| run_of(&self.runs, rt);
        if let (Some(ac), Some(cr)) = (
            of(RuntimeKind::Actorcile).and_then(|r| r.operator),
            of(RuntimeKind::ControllerRuntime).and_then(|r| r.operator),
        ) && let (Some(ready), Some(deleted)) = (
            ratio(Some(cr.ready_seconds), Some(ac.ready_seconds)),
            ratio(Some(cr.deleted_seconds), Some(ac.deleted_seconds)),
        ) {
            let _ = write!(
                line,
                "; to all Ready {ready:.2}, to all deleted {deleted:.2}"
            );
        }
        if let Some(m) = self.memory_vs_controller_runtime {
            let _ = write!(line, "; actorcile's RSS added is {m:.2}× its");
        }
        Some(line)
    }

    /// With the floor run: its time, and how far each runtime is from it.
    pub fn floor_line(&self) -> Option<String> {
        let floor = run_of(&self.runs, RuntimeKind::Floor)?;
        let mut line = format!(
            "floor (actorcile's requests, no runtime): {:.3} s",
            floor.seconds
        );
        if let Some(p) = floor.operator {
            let _ = write!(
                line,
                " (to all Ready {:.3}, to all deleted {:.3})",
                p.ready_seconds, p.deleted_seconds
            );
        }
        if let Some(x) = self.actorcile_over_floor {
            let _ = write!(line, "; actorcile took {x:.2}× its time");
        }
        if let Some(x) = self.speedup_floor {
            let _ = write!(
                line,
                "; kube-runtime seconds ÷ floor seconds {x:.2} (the speedup of the requests \
                 alone)"
            );
        }
        Some(line)
    }
}

/// A column of the table: its header and how a run's cell reads.
type Column = (&'static str, Box<dyn Fn(&RunResult) -> String>);

/// What each column of the table means (printed after the table and in `bench --help`).
pub const LEGEND: &str = "\
Columns (each runtime's median run of --repeat, by seconds):
  seconds    wall time from the runtime's start until every object converged (operator: Ready,
             then deleted and gone)
  min–max s  the fastest and slowest of the repeated runs' seconds
  ready s    operator: start until every object was seen Ready
  deleted s  operator: deletion of every object until every one was gone (child deleted,
             finalizer removed)
  alone s    restart: the same list without changes (a first runtime's start until every object
             had run once); `seconds` is the restart's, changes coming in
  × alone    restart: seconds ÷ alone s
  changes    restart: changes written while the listed objects ran; p50/p99 are change→run
  watching   restart: change→run of the changes written once the runtime was watching (its
             watch request sent, after its list); earlier ones wait for the list to arrive
  CPU s      CPU time (user + system) of the runtime's process over `seconds`; includes the
             in-process API server when it serves the objects (alike for both)
  server CPU envtest: CPU time (user + system) of kube-apiserver and etcd over `seconds`, the
             load the runtime put on the API server (column `server CPU s`)
  API reqs   HTTP requests the runtime's own client sent (each watch counts once); set-up, the
             deletion and the observer use another client and are not counted
  runs       reconcile runs (kube-runtime also runs on the echo of its own writes: compare
             seconds, not runs/s)
  runs/s     runs ÷ seconds
  p50/p99 ms event-to-run latency percentiles, as defined per workload in BENCHMARKS.md
  writes s   first status write sent until the last one answered: the part of `seconds`
             comparable with a raw write loop (examples/write_ceiling.rs)
  peak RSS   peak resident memory of the runtime's process (with the in-process cluster and its
             objects, alike for both)
  RSS added  peak RSS minus the resident memory just before the runtime started (the bench's own
             state per object in place, free allocator pages returned)
speedup = kube-runtime seconds ÷ actorcile seconds (> 1: actorcile converged faster); rounds:
  the same ratio for each round of --repeat.
floor (with --runtimes actorcile,kube-runtime,floor; operator and status): no runtime, a plain
  loop over one watch sending actorcile's requests: the time the requests alone take here.
controller-runtime (with --envtest or --kubeconfig; operator and status): the Go program in
  tools/bench-controller-runtime, in a process of its own. Its CPU s is that process's plus the
  bench's observer (as in the other runtimes' processes); its API reqs, runs and peak RSS are its
  own, and all of its memory counts as RSS added.
";

/// `rows` as lines of columns two spaces apart, each as wide as its widest cell: the first
/// `left` columns aligned left, the others right.
pub fn aligned(rows: &[Vec<String>], left: usize) -> String {
    let mut widths: Vec<usize> = Vec::new();
    for row in rows {
        widths.resize(widths.len().max(row.len()), 0);
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(&widths).enumerate() {
            let pad = w - cell.chars().count();
            let sep = if i == 0 { "" } else { "  " };
            if i < left {
                let _ = write!(line, "{sep}{cell}{:pad$}", "");
            } else {
                let _ = write!(line, "{sep}{:pad$}{cell}", "");
            }
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    out
}

fn opt_secs(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.3}"))
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
mod tests;
