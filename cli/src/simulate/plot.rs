//! The plot: fraction Ready over virtual time, one line per policy, as SVG or PNG (plotters).
//!
//! Text is laid out (and, for PNG, drawn) with an embedded subset of DejaVu Sans (Latin-1; see
//! `font/LICENSE-DejaVu`), so no system font is needed.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::report::Comparison;

/// Plot size in pixels.
const SIZE: (u32, u32) = (1000, 600);
/// The embedded font.
static FONT: &[u8] = include_bytes!("font/DejaVuSans-subset.ttf");

/// The plot could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The file name's extension is neither `.svg` nor `.png`.
    #[error("cannot plot to {0}: the file name must end in .svg or .png")]
    Format(String),
    /// The font could not be loaded (a build problem).
    #[error("the embedded font is invalid")]
    Font,
    /// Drawing or writing failed.
    #[error("cannot draw {path}: {message}")]
    Draw {
        /// The file.
        path: String,
        /// Why.
        message: String,
    },
}

/// The image formats a plot can be written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Scalable vector graphics.
    Svg,
    /// A bitmap.
    Png,
}

/// The format a path asks for (by extension, case-insensitive).
pub fn format_of(path: &Path) -> Result<Format, PlotError> {
    match path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
        .as_deref()
    {
        Some("svg") => Ok(Format::Svg),
        Some("png") => Ok(Format::Png),
        _ => Err(PlotError::Format(path.display().to_string())),
    }
}

fn register_font() -> Result<(), PlotError> {
    static RESULT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *RESULT.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).is_ok()
    });
    if ok { Ok(()) } else { Err(PlotError::Font) }
}

/// Draw `comparison` to `path` (`.svg` or `.png`).
pub fn plot(path: &Path, comparison: &Comparison) -> Result<(), PlotError> {
    let format = format_of(path)?;
    register_font()?;
    let draw_err = |e: String| PlotError::Draw {
        path: path.display().to_string(),
        message: e,
    };
    match format {
        Format::Svg => {
            let root = SVGBackend::new(path, SIZE).into_drawing_area();
            draw(&root, comparison).map_err(|e| draw_err(e.to_string()))?;
            root.present().map_err(|e| draw_err(e.to_string()))
        }
        Format::Png => {
            let root = BitMapBackend::new(path, SIZE).into_drawing_area();
            draw(&root, comparison).map_err(|e| draw_err(e.to_string()))?;
            root.present().map_err(|e| draw_err(e.to_string()))
        }
    }
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    c: &Comparison,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    let t_max = c
        .results
        .iter()
        .flat_map(|r| r.series.last().map(|p| p.0))
        .fold(0.0f64, f64::max)
        .max(1.0);
    // Minutes on the axis once the run is longer than ten minutes.
    let (scale, unit) = if t_max > 600.0 {
        (60.0, "min")
    } else {
        (1.0, "s")
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
        .x_desc(format!("virtual time ({unit})"))
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
                r.series.iter().map(|(t, f)| (t / scale, f * 100.0)),
                color.stroke_width(2),
            ))?
            .label(r.policy.as_str())
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
