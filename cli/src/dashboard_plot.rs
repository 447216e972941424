//! `plot-dashboard`: the main panels of the example operator's Grafana dashboard
//! (`examples/operator/chart/files/dashboard.json`), drawn from a file of timed scrapes of a real
//! run's `/metrics` (`example-operator demo --scrape-to FILE`), with plotters (Grafana itself is
//! under a licence this project does not take in).
//!
//! Each panel computes what its PromQL query does, over the scrapes instead of a Prometheus
//! server: a rate is a counter's increase between two scrapes over their interval; a quantile is
//! read from the increase of the histogram's cumulative buckets, linearly within a bucket, as
//! `histogram_quantile` does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::plot_file::{self, PlotError};

/// `actorcile plot-dashboard`'s arguments.
#[derive(Debug, clap::Args)]
pub struct PlotDashboardArgs {
    /// The scrapes: each `/metrics` answer after a line `# at SECONDS`.
    scrapes: PathBuf,
    /// The picture (`.svg` or `.png`).
    #[arg(long, default_value = "dashboard.png")]
    out: PathBuf,
}

/// One scrape: when, and each series' value by its text (`name{labels}`).
struct Scrape {
    at: f64,
    series: BTreeMap<String, f64>,
}

/// The scrapes of `text`.
fn parse(text: &str) -> Vec<Scrape> {
    let mut scrapes: Vec<Scrape> = Vec::new();
    for line in text.lines() {
        if let Some(at) = line.strip_prefix("# at ") {
            if let Ok(at) = at.trim().parse() {
                scrapes.push(Scrape {
                    at,
                    series: BTreeMap::new(),
                });
            }
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (Some(scrape), Some((series, value))) = (scrapes.last_mut(), line.rsplit_once(' '))
        else {
            continue;
        };
        if let Ok(v) = value.parse::<f64>() {
            scrape.series.insert(series.to_string(), v);
        }
    }
    scrapes
}

/// A series' name and labels.
fn split(series: &str) -> (&str, BTreeMap<&str, &str>) {
    let Some((name, rest)) = series.split_once('{') else {
        return (series, BTreeMap::new());
    };
    let labels = rest
        .trim_end_matches('}')
        .split("\",")
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k, v.trim_matches('"')))
        .collect();
    (name, labels)
}

/// Sum of the series named `name` in `s`, grouped by the label `by` (`""`: one group).
fn summed(s: &Scrape, name: &str, by: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for (series, v) in &s.series {
        let (n, labels) = split(series);
        if n == name {
            let key = labels.get(by).copied().unwrap_or_default().to_string();
            *out.entry(key).or_insert(0.0) += v;
        }
    }
    out
}

/// A line per group: `rate(sum by (by) (name))` between consecutive scrapes.
fn rates(scrapes: &[Scrape], name: &str, by: &str) -> BTreeMap<String, Vec<(f64, f64)>> {
    let mut lines: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for w in scrapes.windows(2) {
        let (a, b) = (summed(&w[0], name, by), summed(&w[1], name, by));
        let dt = (w[1].at - w[0].at).max(1e-3);
        for (k, vb) in &b {
            let va = a.get(k).copied().unwrap_or(0.0);
            lines
                .entry(k.clone())
                .or_default()
                .push((w[1].at, ((vb - va) / dt).max(0.0)));
        }
    }
    lines
}

/// A line per group: `sum by (by) (name)` at each scrape.
fn gauges(scrapes: &[Scrape], name: &str, by: &str) -> BTreeMap<String, Vec<(f64, f64)>> {
    let mut lines: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for s in scrapes {
        for (k, v) in summed(s, name, by) {
            lines.entry(k).or_default().push((s.at, v));
        }
    }
    lines
}

/// The `q` quantile of histogram `name` (summed over its series) over each `window` scrapes,
/// as `histogram_quantile` reads the buckets' increase; `None` where nothing was observed.
fn quantile(scrapes: &[Scrape], name: &str, q: f64, window: usize) -> Vec<(f64, f64)> {
    let buckets = |s: &Scrape| -> Vec<(f64, f64)> {
        let mut by_le: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
        for (series, v) in &s.series {
            let (n, labels) = split(series);
            if n == format!("{name}_bucket")
                && let Some(le) = labels.get("le")
            {
                let le: f64 = if *le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap_or(f64::INFINITY)
                };
                by_le.entry(le.to_bits()).or_insert((le, 0.0)).1 += v;
            }
        }
        let mut out: Vec<(f64, f64)> = by_le.into_values().collect();
        out.sort_by(|a, b| a.0.total_cmp(&b.0));
        out
    };
    let mut points = Vec::new();
    for i in window..scrapes.len() {
        let (a, b) = (buckets(&scrapes[i - window]), buckets(&scrapes[i]));
        let inc: Vec<(f64, f64)> = b
            .iter()
            .map(|(le, vb)| {
                let va = a.iter().find(|(l, _)| l == le).map_or(0.0, |(_, v)| *v);
                (*le, vb - va)
            })
            .collect();
        let Some(&(_, total)) = inc.last() else {
            continue;
        };
        if total <= 0.0 {
            continue;
        }
        let rank = q * total;
        let mut lower = (0.0, 0.0);
        for &(le, count) in &inc {
            if count >= rank {
                let value = if le.is_infinite() {
                    lower.0
                } else {
                    lower.0 + (le - lower.0) * (rank - lower.1) / (count - lower.1).max(1e-9)
                };
                points.push((scrapes[i].at, value));
                break;
            }
            lower = (le, count);
        }
    }
    points
}

/// A panel: its title, its y axis, its lines.
struct Panel {
    title: &'static str,
    unit: &'static str,
    lines: Vec<(String, Vec<(f64, f64)>)>,
}

/// The dashboard's four main panels, from `scrapes`.
fn panels(scrapes: &[Scrape]) -> Vec<Panel> {
    let named = |prefix: &str, lines: BTreeMap<String, Vec<(f64, f64)>>| {
        lines
            .into_iter()
            .filter(|(_, l)| l.iter().any(|p| p.1 > 0.0))
            .map(|(k, l)| (format!("{prefix}{k}"), l))
            .collect::<Vec<_>>()
    };
    let mut queue = named(
        "waiting ",
        gauges(scrapes, "actorcile_reconciles_waiting", "controller"),
    );
    queue.extend(named(
        "running ",
        gauges(scrapes, "actorcile_reconciles_running", "controller"),
    ));
    let mut durations = Vec::new();
    for (q, label) in [(0.5, "p50"), (0.99, "p99")] {
        durations.push((
            format!("reconcile {label}"),
            quantile(scrapes, "actorcile_reconcile_duration_seconds", q, 4)
                .into_iter()
                .map(|(t, v)| (t, v * 1000.0))
                .collect(),
        ));
    }
    vec![
        Panel {
            title: "Reconciles per second, by result",
            unit: "reconciles/s",
            lines: named("", rates(scrapes, "actorcile_reconciles_total", "result")),
        },
        Panel {
            title: "Reconcile duration (p50, p99 over 1 s)",
            unit: "ms",
            lines: durations,
        },
        Panel {
            title: "Queue: reconciles waiting for a slot, running",
            unit: "reconciles",
            lines: queue,
        },
        Panel {
            title: "API requests per second, by verb",
            unit: "requests/s",
            lines: named("", rates(scrapes, "actorcile_api_requests_total", "verb")),
        },
    ]
}

/// Draw the panels of `args.scrapes` to `args.out`.
pub fn run(args: PlotDashboardArgs) -> Result<(), String> {
    let text = std::fs::read_to_string(&args.scrapes)
        .map_err(|e| format!("{}: {e}", args.scrapes.display()))?;
    let scrapes = parse(&text);
    if scrapes.len() < 3 {
        return Err(format!(
            "{}: {} scrapes; at least 3 are needed (a longer run)",
            args.scrapes.display(),
            scrapes.len()
        ));
    }
    let panels = panels(&scrapes);
    plot(&args.out, &panels).map_err(|e| e.to_string())?;
    println!(
        "{}: {} scrapes over {:.1} s",
        args.out.display(),
        scrapes.len(),
        scrapes.last().map_or(0.0, |s| s.at)
    );
    Ok(())
}

fn plot(path: &Path, panels: &[Panel]) -> Result<(), PlotError> {
    plot_file::write(path, (1200, 800), |root| draw(root, panels))
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    panels: &[Panel],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    let t_max = panels
        .iter()
        .flat_map(|p| p.lines.iter().flat_map(|(_, l)| l.last().map(|p| p.0)))
        .fold(1.0f64, f64::max);
    for (area, panel) in root.split_evenly((2, 2)).iter().zip(panels) {
        let y_max = panel
            .lines
            .iter()
            .flat_map(|(_, l)| l.iter().map(|p| p.1))
            .fold(0.0f64, f64::max)
            .max(1.0)
            * 1.1;
        let mut chart = ChartBuilder::on(area)
            .caption(panel.title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..t_max, 0f64..y_max)?;
        chart
            .configure_mesh()
            .x_desc("time (s)")
            .y_desc(panel.unit)
            .axis_desc_style(("sans-serif", 13))
            .label_style(("sans-serif", 11))
            .draw()?;
        for (i, (name, line)) in panel.lines.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(line.iter().copied(), color.stroke_width(2)))?
                .label(name.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(3))
                });
        }
        chart
            .configure_series_labels()
            .label_font(("sans-serif", 12))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two scrapes a second apart: rates are increases per second, and a quantile falls in the
    /// bucket that holds it, linearly.
    #[test]
    fn rates_and_quantiles_are_promql_s() {
        let mut text = String::new();
        for (at, done, b1, b2, inf) in [(0.0, 0, 0, 0, 0), (1.0, 10, 50, 90, 100)] {
            text.push_str(&format!(
                "# at {at}\n\
                 actorcile_reconciles_total{{controller=\"A\",result=\"done\"}} {done}\n\
                 actorcile_reconciles_total{{controller=\"B\",result=\"done\"}} {done}\n\
                 h_bucket{{le=\"0.1\"}} {b1}\nh_bucket{{le=\"0.2\"}} {b2}\nh_bucket{{le=\"+Inf\"}} {inf}\n"
            ));
        }
        let scrapes = parse(&text);
        assert_eq!(scrapes.len(), 2);
        let r = rates(&scrapes, "actorcile_reconciles_total", "result");
        assert_eq!(r["done"], vec![(1.0, 20.0)]);
        // The 50th of 100 is the last of the first bucket; the 70th is half-way into the second.
        assert_eq!(quantile(&scrapes, "h", 0.5, 1), vec![(1.0, 0.1)]);
        let p70 = quantile(&scrapes, "h", 0.7, 1)[0].1;
        assert!((p70 - 0.15).abs() < 1e-9, "{p70}");
    }
}
