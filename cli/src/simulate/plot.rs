//! The plot: fraction Ready over virtual time, one line per policy, as SVG or PNG (written by
//! [`crate::plot_file`]).

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::report::Comparison;
use crate::plot_file::{self, PlotError};

/// Plot size in pixels.
const SIZE: (u32, u32) = (1000, 600);

/// Draw `comparison` to `path` (`.svg` or `.png`).
pub fn plot(path: &Path, comparison: &Comparison) -> Result<(), PlotError> {
    plot_file::write(path, SIZE, |root| draw(root, comparison))
}

/// The points up to `t_max`, ending exactly at `t_max` (the series is a step function).
fn clip(series: &[(f64, f64)], t_max: f64) -> Vec<(f64, f64)> {
    let mut out: Vec<(f64, f64)> = series.iter().copied().filter(|p| p.0 <= t_max).collect();
    if let Some(&(t, f)) = out.last()
        && t < t_max
        && series.len() > out.len()
    {
        out.push((t_max, f));
    }
    out
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    c: &Comparison,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    let run_end = c
        .results
        .iter()
        .flat_map(|r| r.series.last().map(|p| p.0))
        .fold(0.0f64, f64::max)
        .max(1.0);
    // When every line is flat long before the end, end the axis a little after the last change
    // (and say so), or the interesting part would be squeezed against the left edge.
    let last_change = c
        .results
        .iter()
        .flat_map(|r| {
            r.series
                .windows(2)
                .filter(|w| w[1].1 != w[0].1)
                .map(|w| w[1].0)
                .next_back()
        })
        .fold(0.0f64, f64::max);
    let t_max = if last_change * 1.25 < run_end * 0.8 {
        (last_change * 1.25).max(10.0).min(run_end)
    } else {
        run_end
    };
    // Minutes on the axis once it is longer than ten minutes.
    let (scale, unit) = if t_max > 600.0 {
        (60.0, "min")
    } else {
        (1.0, "s")
    };
    let x_desc = if t_max < run_end {
        format!(
            "virtual time ({unit}); no line changes after {:.0} s, the runs lasted up to {:.0} s",
            last_change, run_end
        )
    } else {
        format!("virtual time ({unit})")
    };
    let s = &c.scenario;
    let title = format!(
        "{}: {} objects, seed {} — Ready over virtual time",
        s.name, s.objects, s.seed
    );
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 22))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..t_max / scale, 0f64..100f64)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc("Ready (% of objects)")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .axis_desc_style(("sans-serif", 16))
        .label_style(("sans-serif", 13))
        .draw()?;
    for (i, r) in c.results.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                clip(&r.series, t_max)
                    .into_iter()
                    .map(|(t, f)| (t / scale, f * 100.0)),
                color.stroke_width(2),
            ))?
            .label(format!(
                "{} ({:.1}% Ready at the end)",
                r.policy,
                100.0 * r.ready_at_end as f64 / r.objects.max(1) as f64
            ))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3))
            });
    }
    chart
        .configure_series_labels()
        .label_font(("sans-serif", 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::report::{Percentiles, PolicyResult, ScenarioSummary};
    use super::*;

    fn comparison() -> Comparison {
        let r = |name: &str, speed: f64| PolicyResult {
            policy: name.into(),
            objects: 100,
            ready_at_end: 100,
            time_to_ready: Percentiles::default(),
            virtual_seconds: 60.0,
            runs: 0,
            restarts: 0,
            quarantined: 0,
            status_writes: 0,
            peak_in_flight: 0,
            peak_live_actors: 0,
            api_requests: 0,
            api_writes: 0,
            injected_errors: 0,
            injected_conflicts: 0,
            escalated: None,
            not_ready: Default::default(),
            wall_seconds: 0.0,
            series: (0..=60)
                .map(|t| (t as f64, (t as f64 * speed / 60.0).min(1.0)))
                .collect(),
        };
        Comparison {
            scenario: ScenarioSummary {
                name: "plot-test".into(),
                objects: 100,
                duration_seconds: 60.0,
                seed: 1,
            },
            results: vec![r("quick-policy", 2.0), r("slow-policy", 1.0)],
        }
    }

    #[test]
    fn flat_tails_are_clipped_but_stated() {
        let s = [(0.0, 0.0), (1.0, 0.5), (2.0, 1.0), (3.0, 1.0), (100.0, 1.0)];
        assert_eq!(
            clip(&s, 10.0),
            vec![(0.0, 0.0), (1.0, 0.5), (2.0, 1.0), (3.0, 1.0), (10.0, 1.0)]
        );
        assert_eq!(clip(&s, 100.0), s.to_vec());
        let mut c = comparison();
        for r in &mut c.results {
            r.series.push((3600.0, 1.0));
        }
        let dir = std::env::temp_dir().join(format!("actorcile-sim-clip-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let svg = dir.join("clipped.svg");
        plot(&svg, &c).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(
            text.contains("no line changes after 60 s"),
            "the clipping is stated"
        );
        assert!(text.contains("lasted up to 3600 s"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn svg_and_png_are_written() {
        let dir = std::env::temp_dir().join(format!("actorcile-sim-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let svg = dir.join("out.svg");
        plot(&svg, &comparison()).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(text.starts_with("<svg"), "{}", &text[..text.len().min(80)]);
        for needle in [
            "quick-policy",
            "slow-policy",
            "virtual time (s)",
            "Ready (% of objects)",
        ] {
            assert!(text.contains(needle), "svg lacks {needle}");
        }
        let png = dir.join("out.PNG");
        plot(&png, &comparison()).unwrap();
        let bytes = std::fs::read(&png).unwrap();
        assert!(bytes.len() > 1000, "{} bytes", bytes.len());
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        let e = plot(&dir.join("out.jpg"), &comparison()).unwrap_err();
        assert!(matches!(e, PlotError::Format(_)), "{e}");
        let e = plot(&dir.join("missing-dir").join("x.svg"), &comparison()).unwrap_err();
        assert!(matches!(e, PlotError::Draw { .. }), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
