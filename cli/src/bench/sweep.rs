//! A sweep: the same comparison at several sizes (`--objects 1000,10000,…`), reported as cost
//! per object against the number of objects, as a table and (`--plot`) a log-scale plot.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use serde::{Deserialize, Serialize};

use super::args::{RuntimeKind, Workload};
use super::report::{BenchReport, RunResult, aligned, human_bytes, run_of};
use crate::plot_file::{self, PlotError};

/// One line of a plot panel: whose, its label's suffix, and its (objects, value) points.
type Line<'a> = (RuntimeKind, &'a str, Vec<(f64, f64)>);

/// Plot size in pixels (two panels side by side).
const SIZE: (u32, u32) = (1200, 520);

impl RunResult {
    /// CPU microseconds per reconcile run.
    pub fn cpu_micros_per_run(&self) -> Option<f64> {
        (self.runs > 0).then(|| self.cpu_seconds * 1e6 / self.runs as f64)
    }

    /// Peak resident memory the runtime added per object (over the memory with the objects
    /// created, before the runtime started).
    pub fn peak_added_per_object(&self) -> u64 {
        self.peak_rss_bytes.saturating_sub(self.baseline_rss_bytes) / u64::from(self.objects)
    }

    /// Resident memory the idle runtime holds per object, as the process stands (`None` when
    /// not measured).
    pub fn idle_added_per_object(&self) -> Option<u64> {
        self.idle_rss_bytes
            .map(|idle| idle.saturating_sub(self.baseline_rss_bytes) / u64::from(self.objects))
    }

    /// Resident memory per object where the objects are stored (the in-process cluster lives
    /// in the runtime's process; for a real apiserver this is only the set-up client's share).
    pub fn stored_per_object(&self) -> u64 {
        self.baseline_rss_bytes
            .saturating_sub(self.rss_before_objects_bytes)
            / u64::from(self.objects)
    }
}

/// Every size's comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepReport {
    /// Which workload.
    pub workload: Workload,
    /// `in-process`, `envtest` or `kubeconfig`.
    pub backend: String,
    /// One comparison per size, in the order run.
    pub sizes: Vec<BenchReport>,
}

impl SweepReport {
    /// The report as one line of JSON.
    pub fn to_json_line(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// Cost per object against size, one row per size and runtime.
    pub fn to_table(&self) -> String {
        let mut rows = vec![
            [
                "objects",
                "runtime",
                "seconds",
                "CPU s",
                "CPU µs/run",
                "peak added/obj",
                "idle/obj",
                "stored/obj",
            ]
            .map(String::from)
            .to_vec(),
        ];
        for report in &self.sizes {
            for r in &report.runs {
                rows.push(vec![
                    report.objects.to_string(),
                    r.runtime.to_string(),
                    format!("{:.3}", r.seconds),
                    format!("{:.3}", r.cpu_seconds),
                    r.cpu_micros_per_run()
                        .map_or_else(|| "-".into(), |v| format!("{v:.2}")),
                    human_bytes(r.peak_added_per_object()),
                    r.idle_added_per_object()
                        .map_or_else(|| "-".into(), human_bytes),
                    human_bytes(r.stored_per_object()),
                ]);
            }
        }
        let mut out = format!(
            "sweep: workload {}  backend {}  (each size's median run)\n",
            self.workload, self.backend
        );
        out.push_str(&aligned(&rows, 2));
        out.push_str(SWEEP_LEGEND);
        out
    }

    /// One runtime's points: (objects, value) for every size where `value` has one.
    fn points(
        &self,
        rt: RuntimeKind,
        value: impl Fn(&RunResult) -> Option<f64>,
    ) -> Vec<(f64, f64)> {
        self.sizes
            .iter()
            .filter_map(|report| {
                let run = run_of(&report.runs, rt)?;
                Some((f64::from(report.objects), value(run)?))
            })
            .collect()
    }

    /// Draws CPU per run and memory per object against objects to `path` (`.svg` or `.png`).
    pub fn plot(&self, path: &Path) -> Result<(), PlotError> {
        plot_file::write(path, SIZE, |root| self.draw(root))
    }

    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
        root.fill(&WHITE)?;
        let title = format!(
            "bench --workload {} ({}): cost per object against objects",
            self.workload, self.backend
        );
        let root = root.titled(&title, ("sans-serif", 22))?;
        let (left, right) = root.split_horizontally(SIZE.0 / 2);
        let runtimes = [RuntimeKind::Actorcile, RuntimeKind::KubeRuntime];
        let cpu: Vec<Line> = runtimes
            .iter()
            .map(|&rt| (rt, "", self.points(rt, RunResult::cpu_micros_per_run)))
            .collect();
        self.panel(&left, "CPU µs per run", &cpu)?;
        let kib = |b: u64| b as f64 / 1024.0;
        let mut memory = Vec::new();
        for &rt in &runtimes {
            let peak = self.points(rt, |r| Some(kib(r.peak_added_per_object())));
            let idle = self.points(rt, |r| r.idle_added_per_object().map(kib));
            memory.push((rt, " peak", peak));
            memory.push((rt, " idle", idle));
        }
        self.panel(&right, "resident KiB added per object", &memory)
    }

    /// One log-log panel: a line per (runtime, label suffix, points).
    fn panel<DB: DrawingBackend>(
        &self,
        area: &DrawingArea<DB, Shift>,
        y_desc: &str,
        lines: &[Line],
    ) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
        let all = lines.iter().flat_map(|l| l.2.iter());
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        for &(x, y) in all {
            x0 = x0.min(x);
            x1 = x1.max(x);
            if y > 0.0 {
                y0 = y0.min(y);
                y1 = y1.max(y);
            }
        }
        if x0 > x1 || y0 > y1 {
            return Ok(()); // nothing measured
        }
        let mut chart = ChartBuilder::on(area)
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(65)
            .build_cartesian_2d(
                (x0 / 1.5..x1 * 1.5).log_scale(),
                (y0 / 2.0..y1 * 2.0)
                    .log_scale()
                    .with_key_points(log_ticks(y0 / 2.0, y1 * 2.0)),
            )?;
        chart
            .configure_mesh()
            .x_desc("objects")
            .y_desc(y_desc)
            .x_label_formatter(&|v| format!("{v:.0}"))
            .y_label_formatter(&|v| {
                if *v >= 1.0 {
                    format!("{v:.0}")
                } else {
                    format!("{v:.3}")
                        .trim_end_matches('0')
                        .trim_end_matches('.')
                        .to_string()
                }
            })
            .light_line_style(WHITE)
            .axis_desc_style(("sans-serif", 16))
            .label_style(("sans-serif", 13))
            .draw()?;
        for (i, (rt, suffix, points)) in lines.iter().enumerate() {
            let color = match rt {
                RuntimeKind::Actorcile => Palette99::pick(0),
                RuntimeKind::KubeRuntime => Palette99::pick(1),
                RuntimeKind::Floor => Palette99::pick(2),
                RuntimeKind::ControllerRuntime => Palette99::pick(3),
            }
            .to_rgba();
            let dashed = suffix.contains("idle");
            let style = color.stroke_width(if dashed { 1 } else { 2 });
            chart
                .draw_series(LineSeries::new(points.iter().copied(), style))?
                .label(format!("{rt}{suffix}"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], style));
            chart.draw_series(points.iter().map(|&p| {
                if i % 2 == 1 && dashed {
                    Circle::new(p, 3, color.filled()).into_dyn()
                } else {
                    Cross::new(p, 4, color.stroke_width(2)).into_dyn()
                }
            }))?;
        }
        chart
            .configure_series_labels()
            .label_font(("sans-serif", 14))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .draw()?;
        Ok(())
    }
}

/// Labels for a log axis from `lo` to `hi`: 1, 2 and 5 of every decade in it (plotters' own
/// choice labels only powers of ten, which leaves a panel spanning one decade with one label).
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let mut ticks = Vec::new();
    let mut decade = 10f64.powf(lo.log10().floor());
    while decade <= hi {
        for m in [1.0, 2.0, 5.0] {
            let t = decade * m;
            if (lo..=hi).contains(&t) {
                ticks.push(t);
            }
        }
        decade *= 10.0;
    }
    ticks
}

/// What the sweep table's columns mean.
pub const SWEEP_LEGEND: &str = "\
Sweep columns:
  CPU µs/run      CPU s ÷ runs
  peak added/obj  (peak RSS − the baseline) ÷ objects; the baseline is the RSS just before the
                  runtime starts: the objects created (in process, and one full list served),
                  the bench's own state per object in place, free allocator pages returned
  idle/obj        (RSS once idle − the baseline) ÷ objects, free allocator pages returned
                  again: actorcile read after its actors passivated, both 0.3 s after converging
  stored/obj      (the baseline − RSS before the objects were created) ÷ objects: the in-process
                  cluster's own cost per object and the bench's (alike for both)
";

#[cfg(test)]
mod tests {
    use super::*;

    fn run(runtime: RuntimeKind, objects: u32, cpu: f64) -> RunResult {
        RunResult {
            runtime,
            objects,
            runs: u64::from(objects),
            seconds: 1.0,
            runs_per_sec: f64::from(objects),
            cpu_seconds: cpu,
            server_cpu_seconds: None,
            p50_ms: None,
            p99_ms: None,
            latency_samples: 0,
            api_requests: 1,
            peak_rss_bytes: 100 << 20,
            baseline_rss_bytes: 50 << 20,
            rss_per_object_bytes: 0,
            rss_before_objects_bytes: 10 << 20,
            idle_rss_bytes: Some(60 << 20),
            status_writes: 0,
            status_write_seconds: None,
            operator: None,
            restart: None,
            seconds_per_repeat: Vec::new(),
        }
    }

    fn sweep() -> SweepReport {
        let sizes = [1_000u32, 10_000, 100_000]
            .iter()
            .map(|&n| {
                BenchReport::new(
                    Workload::Noop,
                    n,
                    "in-process",
                    64,
                    vec![
                        run(RuntimeKind::Actorcile, n, f64::from(n) * 2e-6),
                        run(RuntimeKind::KubeRuntime, n, f64::from(n) * 3e-6),
                    ],
                )
            })
            .collect();
        SweepReport {
            workload: Workload::Noop,
            backend: "in-process".into(),
            sizes,
        }
    }

    #[test]
    fn per_object_figures() {
        let r = run(RuntimeKind::Actorcile, 1024, 0.001024);
        assert_eq!(r.cpu_micros_per_run(), Some(1.0));
        assert_eq!(r.peak_added_per_object(), 50 << 10);
        assert_eq!(r.idle_added_per_object(), Some(10 << 10));
        assert_eq!(r.stored_per_object(), 40 << 10);
        let none = RunResult {
            runs: 0,
            idle_rss_bytes: None,
            ..r
        };
        assert_eq!(none.cpu_micros_per_run(), None);
        assert_eq!(none.idle_added_per_object(), None);
    }

    #[test]
    fn a_log_axis_is_labelled_at_one_two_and_five_of_each_decade() {
        assert_eq!(log_ticks(1.9, 24.0), [2.0, 5.0, 10.0, 20.0]);
        assert_eq!(log_ticks(0.5, 1.0), [0.5, 1.0]);
        assert_eq!(log_ticks(150.0, 180.0), Vec::<f64>::new());
    }

    #[test]
    fn the_table_has_a_row_per_size_and_runtime() {
        let table = sweep().to_table();
        let rows: Vec<&str> = table
            .lines()
            .filter(|l| l.starts_with(|c: char| c.is_ascii_digit()))
            .collect();
        assert_eq!(rows.len(), 6, "{table}");
        assert!(rows[0].starts_with("1000") && rows[0].contains("actorcile"));
        assert!(
            rows[0].contains("2.00") && rows[1].contains("3.00"),
            "{table}"
        );
        let back: SweepReport = serde_json::from_str(&sweep().to_json_line()).unwrap();
        let objects: Vec<u32> = back.sizes.iter().map(|r| r.objects).collect();
        assert_eq!(objects, [1_000, 10_000, 100_000]);
        assert!(back.sizes.iter().all(|r| r.runs.len() == 2));
    }

    #[test]
    fn the_plot_has_both_runtimes_on_log_axes() {
        let dir = std::env::temp_dir().join(format!("actorcile-sweep-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let svg = dir.join("sweep.svg");
        sweep().plot(&svg).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        for needle in [
            "actorcile",
            "kube-runtime",
            "actorcile idle",
            "kube-runtime peak",
            "CPU µs per run",
            "objects",
            "100000",
        ] {
            assert!(text.contains(needle), "svg lacks {needle}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
